// dash-attn prove: plans and proves the backward schedules of one shape as the API does before a first launch
// (make_schedule_plan, then prove_plan), and prints how long each took, the process's peak resident memory
// during the proof, how many head classes and tile visits the proof enumerated, and its verdict (the planner's
// plans are proven by their schedules' structure and enumerate no visit, unless --enumerate; the shift schedules
// under a sliding window are always enumerated). A sliding window (--window L,R or --window-left/--window-right) is
// planned as the library plans the shape's; a varlen batch (--cu-seqlens, varlen.hpp) is planned from its maxima and
// proven for every length vector the plan admits (plan_varlen_schedule, prove_varlen_plan), as the library does
// before a varlen backward. With --reference it also runs the expanding validator (on the batch's own lengths for a
// varlen batch), measured the same way, and fails unless both agree; it holds every tile visit in memory, so shapes
// past kMaxReferenceVisits are refused with it. It proves only shapes the library accepts. No GPU needed.
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
#include "planner/varlen_plan.hpp"
#include "varlen.hpp"

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
// --reference expands every tile visit: about 48 bytes and 0.5 us each (measured on a 2-core machine), so 2^26
// visits are about 3 GiB and half a minute per schedule. std::bad_alloc, not a verdict, lies beyond a few times that.
constexpr long long kMaxReferenceVisits = 1LL << 26;
constexpr double kReferenceBytesPerVisit = 48.0;
constexpr double kBytesPerGib = 1024.0 * 1024.0 * 1024.0;

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

std::string memory_text(long long kib) {
  return kib < 0 ? "-" : format_number(static_cast<double>(kib) / kKibPerMib, 4);
}

std::string header(bool reference) {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << "schedule" << std::right << std::setw(kSecondsWidth) << "plan-s"
      << std::setw(kSecondsWidth) << "prove-s" << std::setw(kMemoryWidth) << "peak-MiB" << std::setw(kCountWidth)
      << "classes" << std::setw(kVisitsWidth) << "visits" << std::setw(kCountWidth) << "threads";
  if (reference) out << std::setw(kSecondsWidth) << "ref-s" << std::setw(kMemoryWidth) << "ref-MiB";
  out << "  verdict";
  return out.str();
}

// The tile visits the expanding validator holds for `problem` (the maximum problem of a varlen batch).
long long tile_visits(const TiledProblem& p) {
  return 1LL * p.batch * p.heads_kv * p.group_size * p.real_q_tiles() * p.num_kv_tiles();
}

void check_reference_visits(const TiledProblem& problem, const FlagParser& parser) {
  const long long visits = tile_visits(problem);
  if (visits <= kMaxReferenceVisits) return;
  parser.fail("--reference expands every tile visit of the shape, " + std::to_string(visits) + " of them (about " +
              format_number(static_cast<double>(visits) * kReferenceBytesPerVisit / kBytesPerGib, 3) +
              " GiB); at most " + std::to_string(kMaxReferenceVisits) + " (2^26, about 3 GiB) are supported: " +
              "drop --reference (the proof itself needs no expansion) or lower --batch, --heads, --seqlen " +
              "(--seqlen-q, --seqlen-k) or the maxima of --cu-seqlens");
}

// One schedule's plan, proof and (with --reference) the expanding validator's verdict, measured.
struct ProveOutcome {
  std::string rejected;  // the schedule's precondition that fails, if any
  Measured planning, proving, full;
  PlanProof proof;
  bool agree = true;
};

ProveOutcome prove_dense(const TiledProblem& problem, Schedule schedule, int sms, const ProofOptions& options,
                         bool reference) {
  ProveOutcome o;
  PlanResult planned;
  o.planning = measure([&] {
    planned = make_schedule_plan(problem, schedule, sms);
    return planned.rejected;
  });
  if (!planned.ok()) {
    o.rejected = planned.rejected;
    return o;
  }
  o.proving = measure([&] {
    o.proof = prove_plan(planned.plan, options);
    return o.proof.summary;
  });
  if (reference) {
    o.full = measure([&] { return validate_schedule(expand_schedule(planned.plan)).summary(); });
    o.agree = o.full.summary == o.proof.summary;
  }
  return o;
}

// A varlen batch's schedule: planned from the maxima and proven for every admitted length vector; the expanding
// validator checks it fitted to the batch's own lengths, and agrees when both find it valid or both do not.
ProveOutcome prove_varlen(const TiledProblem& max_problem, const VarlenBatch& batch, Schedule schedule, int sms,
                          bool reference) {
  ProveOutcome o;
  VarlenPlanResult planned;
  o.planning = measure([&] {
    planned = plan_varlen(max_problem, batch, schedule, sms);
    return planned.rejected;
  });
  if (!planned.ok()) {
    o.rejected = planned.rejected;
    return o;
  }
  o.proving = measure([&] {
    o.proof = prove_varlen_plan(planned.plan);
    return o.proof.summary;
  });
  if (reference) {
    bool valid = false;
    o.full = measure([&] {
      const ValidationReport report =
          validate_varlen_schedule(expand_varlen_schedule(planned.plan, batch.lengths), batch.lengths);
      valid = report.ok();
      return report.summary();
    });
    o.agree = valid == o.proof.ok();
  }
  return o;
}

}  // namespace

int cmd_prove(const std::vector<std::string>& args) {
  ShapeFlags shape_flags;
  WindowFlags window;
  VarlenFlags varlen_flags;
  std::string schedule_text;
  int64_t threads = 0;
  bool reference = false;
  bool enumerate = false;
  FlagParser parser("prove",
                    "Plans and proves the backward schedules of a shape as the API does before their first launch,\n"
                    "and prints the time, peak resident memory and work of each proof. No GPU needed.\n"
                    "A varlen batch (--cu-seqlens) is planned from its maxima and proven for every admitted length.");
  add_shape_flags(parser, &shape_flags);
  add_window_flags(parser, &window);
  add_varlen_flags(parser, &varlen_flags);
  parser.add_string("schedule", "NAME", "prove only this schedule (auto: the one auto picks)", &schedule_text, "all");
  parser.add_int("threads", "threads the proof may use (0: one per hardware thread)", &threads, 0, kMaxThreads);
  parser.add_switch("enumerate", "prove every schedule by enumerating its visits, not by its structure", &enumerate);
  parser.add_switch("reference",
                    "also run the validator on the expanded schedule (memory grows with the tile visits: at most\n"
                    "2^26 of them) and fail unless both verdicts agree",
                    &reference);
  if (!parser.parse(args)) return kExitOk;
  window.resolve(parser);

  const VarlenBatch varlen = make_varlen_batch(varlen_flags, &shape_flags, parser);
  if (varlen.varlen() && enumerate) {
    parser.fail(
        "--enumerate proves dense plans by their visits; a varlen batch's plan is proven by its structure "
        "for every length vector it admits: drop --enumerate or --cu-seqlens");
  }
  AttentionShape shape = make_shape(shape_flags, parser);
  window.apply(&shape);
  check_library_accepts_backward(shape, parser);
  const TiledProblem problem = make_tiled_problem(shape, window.window());
  if (reference) check_reference_visits(problem, parser);
  const int sms = static_cast<int>(shape_flags.sms);
  std::vector<Schedule> schedules;
  if (parser.given("schedule")) {
    Schedule s{};
    if (const Status status = parse_schedule(schedule_text, &s); !status.ok()) parser.fail(status.message());
    if (s == Schedule::kAuto) {
      s = varlen.varlen() ? plan_varlen(problem, varlen, s, sms).plan.plan.kind : choose_schedule(problem, sms);
    }
    schedules.push_back(s);
  } else {
    for (Schedule s : kAllSchedules) {
      if (s != Schedule::kAuto) schedules.push_back(s);
    }
  }

  const int hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  std::cout << "problem: " << describe_shape(shape) << "; " << sms << " SMs\n";
  if (varlen.varlen()) {
    std::cout << "varlen:  " << describe_varlen(varlen) << "; planned from the maxima above\n"
              << "lengths: " << describe_lengths(varlen) << " (seqlen_q/seqlen_k of each sequence)\n";
  }
  std::cout << "tiles:   " << describe_tiles(problem) << "\n"
            << "threads: " << (threads > 0 ? std::to_string(threads) : "all " + std::to_string(hardware_threads))
            << " (this machine has " << hardware_threads << " hardware threads)\n\n"
            << header(reference) << "\n";
  ProofOptions options;
  options.max_threads = static_cast<int>(threads);
  options.by_structure = !enumerate;
  bool all_proven = true;
  for (Schedule schedule : schedules) {
    std::cout << std::left << std::setw(kNameWidth) << schedule_name(schedule) << std::right;
    const ProveOutcome o = varlen.varlen() ? prove_varlen(problem, varlen, schedule, sms, reference)
                                           : prove_dense(problem, schedule, sms, options, reference);
    if (!o.rejected.empty()) {
      std::cout << std::setw(kSecondsWidth) << seconds_text(o.planning.seconds) << "  not planned: " << o.rejected
                << "\n";
      continue;
    }
    const PlanProof& proof = o.proof;
    std::cout << std::setw(kSecondsWidth) << seconds_text(o.planning.seconds) << std::setw(kSecondsWidth)
              << seconds_text(o.proving.seconds) << std::setw(kMemoryWidth) << memory_text(o.proving.peak_kib)
              << std::setw(kCountWidth) << proof.stats.head_classes << std::setw(kVisitsWidth) << proof.stats.visits
              << std::setw(kCountWidth) << proof.stats.threads;
    std::string verdict = proof.summary;
    if (proof.stats.by_structure) verdict += " (by structure)";
    if (proof.stats.streamed_fallback) verdict += " (streamed validator)";
    if (reference) {
      std::cout << std::setw(kSecondsWidth) << seconds_text(o.full.seconds) << std::setw(kMemoryWidth)
                << memory_text(o.full.peak_kib);
      if (!o.agree) {
        verdict += "; the expanding validator disagrees: " + o.full.summary;
        all_proven = false;
      }
    }
    all_proven = all_proven && proof.ok();
    std::cout << "  " << verdict << "\n";
  }
  return all_proven ? kExitOk : kExitFailure;
}

}  // namespace dash::cli
