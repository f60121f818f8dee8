// The host side of the bounded dQ ordering waits (src/api/wait_timeouts.hpp), without a GPU: the bound's variable
// (every rejected form, with the variable and the rule in the message) and the report of a filled record (named,
// once). The device side runs in tests/kernels/test_wait_bound_gpu.cpp.
#include <gtest/gtest.h>

#include <string>

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

TEST(WaitTimeoutReport, AnEmptyRecordReportsNothing) {
  kernels::WaitTimeoutRecord record{};
  EXPECT_TRUE(take_wait_timeout(record, 0).ok());
}

TEST(WaitTimeoutReport, AFilledRecordIsReportedOnceNamingTheWait) {
  kernels::WaitTimeoutRecord record{};
  record.cta = 17;
  record.dq_index = 305;
  record.expected = 9;
  record.observed = 4;
  record.bound_ms = 200;
  record.filled = 1;
  const Status s = take_wait_timeout(record, 3);
  EXPECT_EQ(s.code(), StatusCode::kWaitTimeout);
  EXPECT_EQ(std::string(status_code_name(s.code())), "wait-timeout");
  for (const char* words : {"device 3", "CTA 17", "more than 200 ms", "dQ tile 305", "contribution 9",
                            "stood at 4", "dQ is wrong", "sm_margin", "DASH_WAIT_TIMEOUT_SECONDS"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  EXPECT_EQ(record.filled, 0) << "reporting clears the record, so the device can fill it again";
  EXPECT_TRUE(take_wait_timeout(record, 3).ok()) << "reported once";
}

}  // namespace
}  // namespace dash
