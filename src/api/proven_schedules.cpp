#include "api/proven_schedules.hpp"

#include <map>
#include <mutex>
#include <string>

#include "planner/expanded_schedule.hpp"
#include "planner/validator.hpp"

namespace dash {
namespace {

// Every field that defines a plan, spelled out (padding bytes would make a raw-byte key unreliable).
using PlanKey = std::string;

PlanKey key_of(const SchedulePlan& plan) {
  const TiledProblem& p = plan.problem;
  std::string key;
  for (long long field : {static_cast<long long>(plan.kind), static_cast<long long>(plan.dispatch),
                          static_cast<long long>(plan.num_ctas), static_cast<long long>(plan.num_units),
                          static_cast<long long>(plan.jobs_per_unit), static_cast<long long>(p.batch),
                          static_cast<long long>(p.heads_kv), static_cast<long long>(p.group_size),
                          static_cast<long long>(p.group_splits), static_cast<long long>(p.seqlen_q),
                          static_cast<long long>(p.seqlen_k), static_cast<long long>(p.block_q),
                          static_cast<long long>(p.block_kv), static_cast<long long>(p.causal)}) {
    key += std::to_string(field) + ',';
  }
  return key;
}

}  // namespace

Status prove_schedule(const SchedulePlan& plan) {
  static std::mutex mutex;
  static std::map<PlanKey, std::string> verdicts;  // empty string = proven safe
  const PlanKey key = key_of(plan);
  {
    std::lock_guard lock(mutex);
    if (const auto it = verdicts.find(key); it != verdicts.end()) {
      if (it->second.empty()) return Status::success();
      return {StatusCode::kScheduleRejected, it->second};
    }
  }
  const ValidationReport report = validate_schedule(expand_schedule(plan));
  const std::string verdict =
      report.ok() ? std::string() : "the " + std::string(schedule_name(plan.kind)) +
                                        " plan failed validation for this shape: " + report.summary();
  std::lock_guard lock(mutex);
  verdicts.emplace(key, verdict);
  if (verdict.empty()) return Status::success();
  return {StatusCode::kScheduleRejected, verdict};
}

}  // namespace dash
