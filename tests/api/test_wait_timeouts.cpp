// The host side of the faults the kernels record (src/api/wait_timeouts.hpp), without a GPU: the wait bound's variable
// (every rejected form, with the variable and the rule in the message) and the report of a filled record of each
// kind (what happened and what to do, once). The device side runs in tests/kernels/test_wait_bound_gpu.cpp and
// tests/kernels/test_sm90_faults.cpp.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "api/wait_timeouts.hpp"

namespace dash {
namespace {

TEST(WaitTimeoutBound, WithoutTheVariableItIsTenMinutes) {
  long long ns = 0;
  ASSERT_TRUE(parse_wait_timeout(nullptr, &ns).ok());
  EXPECT_EQ(ns, 600'000'000'000LL);
}

TEST(WaitTimeoutBound, SecondsWholeOrDecimalBecomeNanoseconds) {
  long long ns = 0;
  ASSERT_TRUE(parse_wait_timeout("30", &ns).ok());
  EXPECT_EQ(ns, 30'000'000'000LL);
  ASSERT_TRUE(parse_wait_timeout("0.25", &ns).ok());
  EXPECT_EQ(ns, 250'000'000LL);
  ASSERT_TRUE(parse_wait_timeout("0.001", &ns).ok());
  EXPECT_EQ(ns, 1'000'000LL);
  ASSERT_TRUE(parse_wait_timeout("86400", &ns).ok());
  EXPECT_EQ(ns, 86'400'000'000'000LL);
}

TEST(WaitTimeoutBound, EveryOtherTextIsRefusedNamingTheVariableAndTheRule) {
  for (const char* text : {"", "abc", "0", "-1", "0.0005", "86401", "1e9", "nan", "inf", "5s", " ", "1 2"}) {
    SCOPED_TRACE(std::string("'") + text + "'");
    long long ns = -7;
    const Status s = parse_wait_timeout(text, &ns);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("DASH_WAIT_TIMEOUT_SECONDS: '" + std::string(text) + "' must be a number of seconds"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(ns, -7) << "a refused text leaves the bound alone";
  }
}

TEST(FaultReport, AnEmptyRecordReportsNothing) {
  kernels::FaultRecord record{};
  EXPECT_TRUE(take_fault(record, 0).ok());
}

TEST(FaultReport, AWaitTimeoutIsReportedOnceNamingTheWaitAndThePoisonedGradients) {
  kernels::FaultRecord record{};
  record.cta = 17;
  record.dq_index = 305;
  record.expected = 9;
  record.observed = 4;
  record.bound_ms = 200;
  record.kind = kernels::FaultKind::kWaitTimeout;
  const Status s = take_fault(record, 3);
  EXPECT_EQ(s.code(), StatusCode::kWaitTimeout);
  EXPECT_EQ(std::string(status_code_name(s.code())), "wait-timeout");
  for (const char* words :
       {"device 3", "CTA 17", "more than 200 ms", "dQ tile 305", "contribution 9", "stood at 4", "dQ is wrong",
        "dq, dk and dv were filled with NaN", "sm_margin", "DASH_WAIT_TIMEOUT_SECONDS"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(record.kind, kernels::FaultKind::kNone) << "reporting clears the record, so the device can fill it again";
  EXPECT_TRUE(take_fault(record, 3).ok()) << "reported once";
}

TEST(FaultReport, OfCallsOnManyThreadsExactlyOneReportsAFault) {
  constexpr int kThreads = 8;
  for (int round = 0; round < 50; ++round) {
    kernels::FaultRecord record{};
    record.kind = kernels::FaultKind::kWaitTimeout;
    std::atomic<int> reports{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] { reports += take_fault(record, 0).ok() ? 0 : 1; });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(reports.load(), 1) << "round " << round;
  }
}

kernels::FaultRecord seqlen_fault(kernels::FaultPass pass, int seqlen_q, int seqlen_k) {
  kernels::FaultRecord record{};
  record.pass = pass;
  record.sequence = 5;
  record.seqlen_q = seqlen_q;
  record.seqlen_k = seqlen_k;
  record.max_seqlen_q = 256;
  record.max_seqlen_k = 128;
  record.kind = kernels::FaultKind::kSeqlenExceedsMax;
  return record;
}

TEST(FaultReport, ALongForwardSequenceIsReportedOnceNamingItsLengthAndTheMaximum) {
  kernels::FaultRecord record = seqlen_fault(kernels::FaultPass::kForward, 300, 100);
  const Status s = take_fault(record, 1);
  EXPECT_EQ(s.code(), StatusCode::kSeqlenExceedsMax);
  EXPECT_EQ(std::string(status_code_name(s.code())), "seqlen-exceeds-max");
  for (const char* words :
       {"varlen forward on device 1", "sequence 5 has 300 query rows", "(cu_seqlens_q[6] - cu_seqlens_q[5])",
        "more than max_seqlen_q = 256", "rows of out and lse were filled with NaN", "at least the longest"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(s.message().find("key rows"), std::string::npos) << "the keys were within their maximum: " << s.message();
  EXPECT_EQ(record.kind, kernels::FaultKind::kNone);
  EXPECT_TRUE(take_fault(record, 1).ok()) << "reported once";
}

TEST(FaultReport, ALongBackwardSequenceNamesEveryLengthOverItsMaximumAndTheGradients) {
  kernels::FaultRecord keys = seqlen_fault(kernels::FaultPass::kBackward, 10, 129);
  Status s = take_fault(keys, 0);
  EXPECT_EQ(s.code(), StatusCode::kSeqlenExceedsMax);
  for (const char* words :
       {"varlen backward on device 0", "sequence 5 has 129 key rows", "(cu_seqlens_k[6] - cu_seqlens_k[5])",
        "more than max_seqlen_k = 128", "rows of dq, dk and dv were filled with NaN"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(s.message().find("query rows"), std::string::npos) << s.message();

  kernels::FaultRecord both = seqlen_fault(kernels::FaultPass::kBackward, 257, 129);
  s = take_fault(both, 0);
  EXPECT_NE(s.message().find("257 query rows (cu_seqlens_q[6] - cu_seqlens_q[5]), more than max_seqlen_q = 256, "
                             "and 129 key rows (cu_seqlens_k[6] - cu_seqlens_k[5]), more than max_seqlen_k = 128"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("keys_within_queries"), std::string::npos) << "no promise was made: " << s.message();
}

TEST(FaultReport, KeysPastTheQueriesUnderThePromiseAreNamedWithThePromise) {
  kernels::FaultRecord record = seqlen_fault(kernels::FaultPass::kForward, 100, 120);
  record.keys_within_queries = 1;
  const Status s = take_fault(record, 2);
  EXPECT_EQ(s.code(), StatusCode::kSeqlenExceedsMax);
  for (const char* words : {"sequence 5 has 120 key rows (cu_seqlens_k[6] - cu_seqlens_k[5]), more than its 100 "
                            "query rows, though the call promised keys_within_queries",
                            "without keys_within_queries unless every sequence keeps it"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(s.message().find("max_seqlen_k ="), std::string::npos) << "within the key maximum: " << s.message();
}

kernels::FaultRecord row_index_fault(int row, int index, bool repeated) {
  kernels::FaultRecord record{};
  record.merge_row = row;
  record.merge_row_index = index;
  record.merge_seqlen = 96;
  record.merge_row_repeated = repeated ? 1 : 0;
  record.kind = kernels::FaultKind::kRowIndexInvalid;
  return record;
}

TEST(FaultReport, AMergeIndexOutsideTheAccumulatorsIsReportedOnceNamingTheIndexAndTheRows) {
  kernels::FaultRecord record = row_index_fault(5, 96, false);
  const Status s = take_fault(record, 3);
  EXPECT_EQ(s.code(), StatusCode::kRowIndexInvalid);
  EXPECT_EQ(std::string(status_code_name(s.code())), "row-index-invalid");
  for (const char* words : {"merge_partial on device 3",
                            "row_index[5] = 96 is outside the accumulators' rows [0, "
                            "seqlen = 96)",
                            "acc_out and acc_lse were filled with NaN", "distinct rows in [0, seqlen)"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(record.kind, kernels::FaultKind::kNone);
  EXPECT_TRUE(take_fault(record, 3).ok()) << "reported once";
}

TEST(FaultReport, AMergeIndexNamingARowTwiceSaysSo) {
  kernels::FaultRecord record = row_index_fault(7, 6, true);
  const Status s = take_fault(record, 0);
  EXPECT_EQ(s.code(), StatusCode::kRowIndexInvalid);
  EXPECT_NE(s.message().find("row_index[7] = 6 names an accumulator row that another block row names too"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("outside"), std::string::npos) << "within the accumulators: " << s.message();
}

kernels::FaultRecord offsets_fault(kernels::FaultPass pass, bool keys, int index, int value, int previous) {
  kernels::FaultRecord record{};
  record.pass = pass;
  record.offsets_of_keys = keys ? 1 : 0;
  record.offsets_index = index;
  record.offsets_value = value;
  record.offsets_previous = previous;
  record.offsets_total = 300;
  record.kind = kernels::FaultKind::kCuSeqlensInvalid;
  return record;
}

TEST(FaultReport, OffsetsOutOfOrderAreReportedOnceNamingTheEntryAndTheRule) {
  kernels::FaultRecord decreasing = offsets_fault(kernels::FaultPass::kForward, false, 2, 100, 200);
  Status s = take_fault(decreasing, 3);
  EXPECT_EQ(s.code(), StatusCode::kCuSeqlensInvalid);
  EXPECT_EQ(std::string(status_code_name(s.code())), "cu-seqlens-invalid");
  for (const char* words : {"varlen forward on device 3", "cu_seqlens_q[2] = 100 < cu_seqlens_q[1] = 200",
                            "never decrease", "every row of out and lse was filled with NaN"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(decreasing.kind, kernels::FaultKind::kNone);
  EXPECT_TRUE(take_fault(decreasing, 3).ok()) << "reported once";

  kernels::FaultRecord first = offsets_fault(kernels::FaultPass::kBackward, true, 0, -40, 0);
  s = take_fault(first, 0);
  EXPECT_NE(s.message().find("cu_seqlens_k[0] = -40, where the offsets start at 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("every row of dq, dk and dv"), std::string::npos) << s.message();

  kernels::FaultRecord past = offsets_fault(kernels::FaultPass::kForward, false, 3, 301, 250);
  s = take_fault(past, 0);
  EXPECT_NE(s.message().find("cu_seqlens_q[3] = 301 > total_q = 300"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dash
