// The "proven on the CPU before it runs on the GPU" rule of the API: every schedule plan passes the proof
// (prove_plan: coverage, rank permutation, deadlock freedom) before its first launch. Verdicts are cached
// per plan, so a training loop that repeats shapes pays the proof once; the cache holds the
// kProofCacheCapacity most recently used plans, so a loop over ever new shapes cannot grow it without bound
// (an evicted plan is proven again when it returns).
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "dash/status.hpp"
#include "schedule/plan.hpp"

namespace dash {

inline constexpr size_t kProofCacheCapacity = 1024;

// Verdicts by plan ("" = proven safe, otherwise why not), least recently used evicted first. Thread-safe.
class ProofCache {
 public:
  explicit ProofCache(size_t capacity) : capacity_(capacity) {}

  // The cached verdict of `plan`, which becomes the most recently used; nullopt when it is not cached.
  std::optional<std::string> find(const SchedulePlan& plan);
  // Caches `verdict` as the most recently used, evicting the least recently used beyond the capacity.
  void insert(const SchedulePlan& plan, std::string verdict);
  size_t size() const;

 private:
  struct Entry {
    std::string key;
    std::string verdict;
  };

  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> by_recency_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
};

// kOk if `plan` was proven safe (now or earlier); kScheduleRejected with the proof's finding if not.
Status prove_schedule(const SchedulePlan& plan);

}  // namespace dash
