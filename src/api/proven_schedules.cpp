#include "api/proven_schedules.hpp"

#include <string>
#include <utility>

#include "planner/plan_proof.hpp"

namespace dash {
namespace {

// Every field that defines a plan, spelled out (padding bytes would make a raw-byte key unreliable).
std::string key_of(const SchedulePlan& plan) {
  const TiledProblem& p = plan.problem;
  std::string key;
  for (long long field :
       {static_cast<long long>(plan.kind), static_cast<long long>(plan.dispatch), static_cast<long long>(plan.num_ctas),
        static_cast<long long>(plan.num_units), static_cast<long long>(plan.jobs_per_unit),
        static_cast<long long>(p.batch), static_cast<long long>(p.heads_kv), static_cast<long long>(p.group_size),
        static_cast<long long>(p.group_splits), static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k),
        static_cast<long long>(p.block_q), static_cast<long long>(p.block_kv), static_cast<long long>(p.causal),
        static_cast<long long>(p.window.left), static_cast<long long>(p.window.right)}) {
    key += std::to_string(field) + ',';
  }
  return key;
}

}  // namespace

std::optional<std::string> ProofCache::find(const SchedulePlan& plan) {
  const std::string key = key_of(plan);
  std::lock_guard lock(mutex_);
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  by_recency_.splice(by_recency_.begin(), by_recency_, it->second);
  return it->second->verdict;
}

void ProofCache::insert(const SchedulePlan& plan, std::string verdict) {
  std::string key = key_of(plan);
  std::lock_guard lock(mutex_);
  // Two threads may prove the same new plan at once; the verdicts agree, so the second just refreshes it.
  if (const auto it = by_key_.find(key); it != by_key_.end()) {
    by_recency_.splice(by_recency_.begin(), by_recency_, it->second);
    return;
  }
  by_recency_.push_front({key, std::move(verdict)});
  by_key_.emplace(std::move(key), by_recency_.begin());
  while (by_recency_.size() > capacity_) {
    by_key_.erase(by_recency_.back().key);
    by_recency_.pop_back();
  }
}

size_t ProofCache::size() const {
  std::lock_guard lock(mutex_);
  return by_recency_.size();
}

Status prove_schedule(const SchedulePlan& plan) {
  static ProofCache verdicts(kProofCacheCapacity);
  std::optional<std::string> verdict = verdicts.find(plan);
  if (!verdict) {
    // Proven outside the lock: other threads' launches of cached plans do not wait for this proof.
    const PlanProof proof = prove_plan(plan);
    verdict = proof.ok() ? std::string()
                         : "the " + std::string(schedule_name(plan.kind)) +
                               " plan failed validation for this shape: " + proof.summary;
    verdicts.insert(plan, *verdict);
  }
  if (verdict->empty()) return Status::success();
  return {StatusCode::kScheduleRejected, *verdict};
}

}  // namespace dash
