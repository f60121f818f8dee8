// dash-attn prove: plans and proves the backward schedules of one shape as the API does before a first launch
// (make_schedule_plan, then prove_plan), and prints how long each took, the process's peak resident memory
// during the proof, how many head classes and tile visits the proof enumerated, and its verdict (the planner's
// plans are proven by their schedules' structure and enumerate no visit, unless --enumerate; the shift schedules
// under a sliding window are always enumerated). With --reference it
// also runs the expanding validator, measured the same way, and fails unless both agree.
// It proves only shapes the library accepts. No GPU needed.
#include <chrono>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "options.hpp"
#include "planner/expanded_schedule.hpp"
#include "planner/plan_proof.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/validator.hpp"

namespace dash::cli {
namespace {

constexpr int kNameWidth = 17;
constexpr int kSecondsWidth = 10;
constexpr int kMemoryWidth = 10;
constexpr int kCountWidth = 9;
constexpr int kVisitsWidth = 13;
constexpr int kSecondsDigits = 3;
constexpr double kKibPerMib = 1024.0;
constexpr int64_t kMaxThreads = 1024;

// Peak resident memory of this process since the last reset_peak_memory(), in KiB: Linux's VmHWM, which
// writing 5 to /proc/self/clear_refs resets to the current resident size. -1 where there is no such counter.
// The reset first hands freed heap back to the system, so that an earlier measurement's leftovers do not
// count in the next one.
void reset_peak_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ofstream("/proc/self/clear_refs") << "5";
}
long long peak_memory_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(line.find_first_of("0123456789")));
  }
  return -1;
}

struct Measured {
  std::string summary;
  double seconds = 0.0;
  long long peak_kib = -1;
};

template <typename Run>
Measured measure(Run&& run) {
  reset_peak_memory();
  const auto start = std::chrono::steady_clock::now();
  Measured m;
  m.summary = run();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.peak_kib = peak_memory_kib();
  return m;
}

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(kSecondsDigits) << seconds;
  return out.str();
}

std::string memory_text(long long kib) { return kib < 0 ? "-" : format_number(static_cast<double>(kib) / kKibPerMib, 4); }

std::string header(bool reference) {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << "schedule" << std::right << std::setw(kSecondsWidth) << "plan-s"
      << std::setw(kSecondsWidth) << "prove-s" << std::setw(kMemoryWidth) << "peak-MiB" << std::setw(kCountWidth)
      << "classes" << std::setw(kVisitsWidth) << "visits" << std::setw(kCountWidth) << "threads";
  if (reference) out << std::setw(kSecondsWidth) << "ref-s" << std::setw(kMemoryWidth) << "ref-MiB";
  out << "  verdict";
  return out.str();
}

}  // namespace

int cmd_prove(const std::vector<std::string>& args) {
  ShapeFlags shape_flags;
  std::string schedule_text;
  int64_t threads = 0;
  bool reference = false;
  bool enumerate = false;
  FlagParser parser("prove",
                    "Plans and proves the backward schedules of a shape as the API does before their first launch,\n"
                    "and prints the time, peak resident memory and work of each proof. No GPU needed.");
  add_shape_flags(parser, &shape_flags);
  parser.add_string("schedule", "NAME", "prove only this schedule (auto: the one auto picks)", &schedule_text, "all");
  parser.add_int("threads", "threads the proof may use (0: one per hardware thread)", &threads, 0, kMaxThreads);
  parser.add_switch("enumerate",
                    "prove every schedule by enumerating its visits, not by its structure",
                    &enumerate);
  parser.add_switch("reference",
                    "also run the validator on the expanded schedule (memory grows with the tile visits) and\n"
                    "fail unless both verdicts agree",
                    &reference);
  if (!parser.parse(args)) return kExitOk;

  const AttentionShape shape = make_shape(shape_flags, parser);
  check_library_accepts_backward(shape, parser);
  const TiledProblem problem = make_tiled_problem(shape);
  const int sms = static_cast<int>(shape_flags.sms);
  std::vector<Schedule> schedules;
  if (parser.given("schedule")) {
    Schedule s{};
    if (const Status status = parse_schedule(schedule_text, &s); !status.ok()) parser.fail(status.message());
    schedules.push_back(s == Schedule::kAuto ? choose_schedule(problem, sms) : s);
  } else {
    for (Schedule s : kAllSchedules) {
      if (s != Schedule::kAuto) schedules.push_back(s);
    }
  }

  const int hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  std::cout << "problem: " << describe_shape(shape) << "; " << sms << " SMs\n"
            << "tiles:   " << describe_tiles(problem) << "\n"
            << "threads: " << (threads > 0 ? std::to_string(threads) : "all " + std::to_string(hardware_threads))
            << " (this machine has " << hardware_threads << " hardware threads)\n\n"
            << header(reference) << "\n";
  bool all_proven = true;
  for (Schedule schedule : schedules) {
    std::cout << std::left << std::setw(kNameWidth) << schedule_name(schedule) << std::right;
    PlanResult planned;
    const Measured planning = measure([&] {
      planned = make_schedule_plan(problem, schedule, sms);
      return planned.rejected;
    });
    if (!planned.ok()) {
      std::cout << std::setw(kSecondsWidth) << seconds_text(planning.seconds) << "  not planned: " << planned.rejected
                << "\n";
      continue;
    }
    PlanProof proof;
    const Measured proving = measure([&] {
      ProofOptions options;
      options.max_threads = static_cast<int>(threads);
      options.by_structure = !enumerate;
      proof = prove_plan(planned.plan, options);
      return proof.summary;
    });
    std::cout << std::setw(kSecondsWidth) << seconds_text(planning.seconds) << std::setw(kSecondsWidth)
              << seconds_text(proving.seconds) << std::setw(kMemoryWidth) << memory_text(proving.peak_kib)
              << std::setw(kCountWidth) << proof.stats.head_classes << std::setw(kVisitsWidth) << proof.stats.visits
              << std::setw(kCountWidth) << proof.stats.threads;
    std::string verdict = proof.summary;
    if (proof.stats.by_structure) verdict += " (by structure)";
    if (proof.stats.streamed_fallback) verdict += " (streamed validator)";
    if (reference) {
      const Measured full =
          measure([&] { return validate_schedule(expand_schedule(planned.plan)).summary(); });
      std::cout << std::setw(kSecondsWidth) << seconds_text(full.seconds) << std::setw(kMemoryWidth)
                << memory_text(full.peak_kib);
      if (full.summary != proof.summary) {
        verdict += "; the expanding validator disagrees: " + full.summary;
        all_proven = false;
      }
    }
    all_proven = all_proven && proof.ok();
    std::cout << "  " << verdict << "\n";
  }
  return all_proven ? kExitOk : kExitFailure;
}

}  // namespace dash::cli
