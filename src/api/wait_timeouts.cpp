// Ordering waits that gave up: the bound, the per-device records and their report (api/wait_timeouts.hpp).
#include "api/wait_timeouts.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

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

Status take_wait_timeout(kernels::WaitTimeoutRecord& record, int device) {
  // The device stores `filled` last, after a system-scope fence; the acquire keeps the fields' reads after it.
  std::atomic_ref<int> filled(record.filled);
  if (filled.load(std::memory_order_acquire) == 0) return Status::success();
  const std::string message =
      "a backward launch on device " + std::to_string(device) + " gave up the fixed order of its dQ sums: CTA " +
      std::to_string(record.cta) + " waited more than " + std::to_string(record.bound_ms) +
      " ms for dQ tile " + std::to_string(record.dq_index) + " to reach contribution " +
      std::to_string(record.expected) + " (it stood at " + std::to_string(record.observed) +
      "), so that launch ran unordered and its dQ is wrong; recompute that step. The CTAs of its static "
      "schedule could not all run at once: other kernels held SMs it was planned for. Plan the backward with "
      "sm_margin set to the SMs they take, or use a dynamic schedule (" + kWaitTimeoutVariable +
      " sets the bound)";
  filled.store(0, std::memory_order_release);
  return {StatusCode::kWaitTimeout, message};
}

Status device_wait_timeout_record(int device, kernels::WaitTimeoutRecord** record) {
  static std::mutex mutex;
  static std::unordered_map<int, kernels::WaitTimeoutRecord*> by_device;  // host-mapped, never freed
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = by_device.find(device); found != by_device.end()) {
    *record = found->second;
    return Status::success();
  }
  void* host = nullptr;
  // Portable: mapped in every context of the process; the pointer is the device's too (unified addressing).
  if (const cudaError_t e = cudaHostAlloc(&host, sizeof(kernels::WaitTimeoutRecord),
                                          cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return {StatusCode::kCudaError, std::string("cudaHostAlloc of the wait-timeout record: ") + cudaGetErrorString(e)};
  }
  *static_cast<kernels::WaitTimeoutRecord*>(host) = kernels::WaitTimeoutRecord{};
  by_device.emplace(device, static_cast<kernels::WaitTimeoutRecord*>(host));
  *record = static_cast<kernels::WaitTimeoutRecord*>(host);
  return Status::success();
}

}  // namespace dash
