// Faults the kernels report through the device: the wait bound, the per-device records and their report
// (api/wait_timeouts.hpp).
#include "api/wait_timeouts.hpp"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cuda_runtime_api.h>

#include "api/device.hpp"

namespace dash {
namespace {

constexpr double kNanosecondsPerSecond = 1e9;
constexpr double kMinWaitTimeoutSeconds = 1e-3;
// Without the variable, torch's default NCCL timeout, 10 minutes. A dQ ordering wait lasts microseconds, but one on
// CTAs kept off their SMs by other kernels (a static schedule planned without sm_margin, next to NCCL kernels that
// wait for other ranks) lasts as long as those kernels hold them, and a training step waits that long for NCCL.
constexpr long long kDefaultWaitBoundNs = 600'000'000'000LL;

struct ParsedBound {
  Status status;
  long long ns = kDefaultWaitBoundNs;
};

// "0.001", "86400": the shortest text that reads back as `seconds`.
std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

}  // namespace

Status parse_wait_timeout(const char* text, long long* bound_ns) {
  if (text == nullptr) {
    *bound_ns = kDefaultWaitBoundNs;
    return Status::success();
  }
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  const bool whole = end != text && *end == '\0' && errno == 0;
  if (!whole || !std::isfinite(seconds) || seconds < kMinWaitTimeoutSeconds || seconds > kMaxWaitTimeoutSeconds) {
    return {StatusCode::kInvalidArgument,
            std::string(kWaitTimeoutVariable) + ": '" + text + "' must be a number of seconds from " +
                seconds_text(kMinWaitTimeoutSeconds) + " to " + seconds_text(kMaxWaitTimeoutSeconds) +
                " (how long a dQ ordering wait may last before the backward gives up its order)"};
  }
  *bound_ns = static_cast<long long>(std::llround(seconds * kNanosecondsPerSecond));
  return Status::success();
}

Status wait_bound_ns(long long* bound_ns) {
  static const ParsedBound parsed = [] {
    ParsedBound p;
    p.status = parse_wait_timeout(std::getenv(kWaitTimeoutVariable), &p.ns);
    return p;
  }();
  if (!parsed.status.ok()) return parsed.status;
  *bound_ns = parsed.ns;
  return Status::success();
}

namespace {

std::string wait_timeout_message(const kernels::FaultRecord& record, int device) {
  return "a backward launch on device " + std::to_string(device) + " gave up the fixed order of its dQ sums: CTA " +
         std::to_string(record.cta) + " waited more than " + std::to_string(record.bound_ms) + " ms for dQ tile " +
         std::to_string(record.dq_index) + " to reach contribution " + std::to_string(record.expected) +
         " (it stood at " + std::to_string(record.observed) +
         "), so that launch ran unordered: its dQ is wrong, and its dq, dk and dv were filled with NaN; recompute "
         "that step. The CTAs of its static schedule could not all run at once: other kernels held SMs it was "
         "planned for. Plan the backward with sm_margin set to the SMs they take, or use a dynamic schedule (" +
         kWaitTimeoutVariable + " sets the bound)";
}

// "sequence 3 has 300 query rows (cu_seqlens_q[4] - cu_seqlens_q[3]), more than max_seqlen_q = 256": one clause per
// length over its maximum.
std::string over_maximum(int sequence, int length, int maximum, const char* side, const char* rows) {
  const std::string offsets = std::string("cu_seqlens_") + side;
  return std::to_string(length) + " " + rows + " rows (" + offsets + "[" + std::to_string(sequence + 1) + "] - " +
         offsets + "[" + std::to_string(sequence) + "]), more than max_seqlen_" + side + " = " +
         std::to_string(maximum);
}

std::string seqlen_message(const kernels::FaultRecord& record, int device) {
  const bool forward = record.pass == kernels::FaultPass::kForward;
  const bool promise_broken = record.keys_within_queries != 0 && record.seqlen_k > record.seqlen_q;
  std::string lengths;
  const auto add = [&](const std::string& clause) { lengths += (lengths.empty() ? "" : ", and ") + clause; };
  if (record.seqlen_q > record.max_seqlen_q) {
    add(over_maximum(record.sequence, record.seqlen_q, record.max_seqlen_q, "q", "query"));
  }
  if (record.seqlen_k > record.max_seqlen_k) {
    add(over_maximum(record.sequence, record.seqlen_k, record.max_seqlen_k, "k", "key"));
  } else if (promise_broken) {
    add(std::to_string(record.seqlen_k) + " key rows (cu_seqlens_k[" + std::to_string(record.sequence + 1) +
        "] - cu_seqlens_k[" + std::to_string(record.sequence) + "]), more than its " + std::to_string(record.seqlen_q) +
        " query rows, though the call promised keys_within_queries (seqlen_k <= "
        "seqlen_q for every sequence)");
  }
  return std::string("a varlen ") + (forward ? "forward" : "backward") + " on device " + std::to_string(device) +
         " was given a sequence longer than its maximum: sequence " + std::to_string(record.sequence) + " has " +
         lengths + ". The kernels handle at most the maxima, so that sequence's rows of " +
         (forward ? "out and lse" : "dq, dk and dv") +
         " were filled with NaN; recompute that call with max_seqlen_q and max_seqlen_k at least the longest "
         "sequence's lengths" +
         (promise_broken ? ", and without keys_within_queries unless every sequence keeps it" : "");
}

std::string row_index_message(const kernels::FaultRecord& record, int device) {
  const std::string entry =
      "row_index[" + std::to_string(record.merge_row) + "] = " + std::to_string(record.merge_row_index);
  const std::string rule =
      record.merge_row_repeated != 0
          ? entry +
                " names an accumulator row that another block row names too (each block "
                "row needs a row of its own)"
          : entry + " is outside the accumulators' rows [0, seqlen = " + std::to_string(record.merge_seqlen) + ")";
  return "a merge_partial on device " + std::to_string(device) +
         " was given a row_index that breaks its contract: " + rule +
         ". A block row went to no row or raced another, so that merge's acc_out and acc_lse were filled with "
         "NaN; recompute the merge with distinct rows in [0, seqlen)";
}

std::string offsets_message(const kernels::FaultRecord& record, int device) {
  const bool forward = record.pass == kernels::FaultPass::kForward;
  const std::string name = record.offsets_of_keys != 0 ? "cu_seqlens_k" : "cu_seqlens_q";
  const int i = record.offsets_index;
  const auto entry = [&](int at) { return name + "[" + std::to_string(at) + "]"; };
  std::string rule;
  if (i == 0) {
    rule = entry(0) + " = " + std::to_string(record.offsets_value) + ", where the offsets start at 0";
  } else if (record.offsets_value < record.offsets_previous) {
    rule = entry(i) + " = " + std::to_string(record.offsets_value) + " < " + entry(i - 1) + " = " +
           std::to_string(record.offsets_previous) + ", where the offsets never decrease";
  } else {
    rule = entry(i) + " = " + std::to_string(record.offsets_value) + " > " +
           (record.offsets_of_keys != 0 ? "total_k" : "total_q") + " = " + std::to_string(record.offsets_total) +
           ", where the offsets end within the packed rows";
  }
  return std::string("a varlen ") + (forward ? "forward" : "backward") + " on device " + std::to_string(device) +
         " was given offsets out of order: " + rule +
         ". Its sequences' rows were no partition of the packed rows (some never written, or written by two "
         "sequences), so every row of " +
         (forward ? "out and lse" : "dq, dk and dv") +
         " was filled with NaN; recompute that call with cu_seqlens that start at 0, never decrease and end at most "
         "at the totals";
}

}  // namespace

Status take_fault(kernels::FaultRecord& record, int device) {
  // The device stores `kind` last, after a system-scope fence; the acquire keeps the fields' reads after it.
  std::atomic_ref<kernels::FaultKind> kind(record.kind);
  kernels::FaultKind seen = kind.load(std::memory_order_acquire);
  Status status;
  switch (seen) {
    case kernels::FaultKind::kNone:
      return Status::success();
    case kernels::FaultKind::kWaitTimeout:
      status = {StatusCode::kWaitTimeout, wait_timeout_message(record, device)};
      break;
    case kernels::FaultKind::kSeqlenExceedsMax:
      status = {StatusCode::kSeqlenExceedsMax, seqlen_message(record, device)};
      break;
    case kernels::FaultKind::kRowIndexInvalid:
      status = {StatusCode::kRowIndexInvalid, row_index_message(record, device)};
      break;
    case kernels::FaultKind::kCuSeqlensInvalid:
      status = {StatusCode::kCuSeqlensInvalid, offsets_message(record, device)};
      break;
  }
  // Calls on two threads may read the record at once; the one that clears it reports it.
  if (!kind.compare_exchange_strong(seen, kernels::FaultKind::kNone, std::memory_order_acq_rel)) {
    return Status::success();
  }
  return status;
}

Status device_fault_record(int device, kernels::FaultRecord** record) {
  static std::mutex mutex;
  static std::unordered_map<int, kernels::FaultRecord*> by_device;  // host-mapped, never freed
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = by_device.find(device); found != by_device.end()) {
    *record = found->second;
    return Status::success();
  }
  void* host = nullptr;
  {
    // cudaHostAlloc is refused while a stream is captured in the global mode; relaxed, it runs outside the capture.
    const RelaxedCaptureMode relaxed;
    // Portable: mapped in every context of the process; the pointer is the device's too (unified addressing).
    if (const cudaError_t e =
            cudaHostAlloc(&host, sizeof(kernels::FaultRecord), cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return {StatusCode::kCudaError, std::string("cudaHostAlloc of device ") + std::to_string(device) +
                                          "'s fault record: " + cudaGetErrorString(e)};
    }
  }
  *static_cast<kernels::FaultRecord*>(host) = kernels::FaultRecord{};
  by_device.emplace(device, static_cast<kernels::FaultRecord*>(host));
  *record = static_cast<kernels::FaultRecord*>(host);
  return Status::success();
}

}  // namespace dash
