// dash-attn emulate: runs backward schedules on CPU threads (one per persistent CTA) with random
// delays before every dQ reduction, several times each, and reports whether dQ, dK and dV kept the
// same bits and how far they are from the float64 reference, also under a sliding window (--window L,R or
// --window-left/--window-right, planned as the library plans the shape's window), with softcap (--softcap X) and on
// varlen batches
// (--cu-seqlens, varlen.hpp: each schedule planned from the maxima, its jobs fitted to each sequence as the kernels
// will fit them). Shapes whose float64 reference or emulation would run for more than a few minutes are refused,
// naming the estimate and the flags that lower it. Exit code 1 when a deterministic schedule changed bits,
// deadlocked or missed the tolerance, or
// when a schedule asked for by name does not apply.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "commands.hpp"
#include "emulator/emulator.hpp"
#include "json.hpp"
#include "options.hpp"
#include "planner/schedule_plan.hpp"
#include "schedule/schedule.hpp"
#include "varlen.hpp"

namespace dash::cli {
namespace {

// Float32 tile arithmetic over a few thousand keys stays far below this, relative to the largest gradient.
constexpr double kDefaultTolerance = 1e-4;
constexpr int64_t kDefaultRuns = 5;
constexpr int64_t kMaxRuns = 1000;
constexpr int64_t kDefaultDelayUs = 100;
constexpr int64_t kMaxDelayUs = 1000000;
constexpr int64_t kMaxBlock = 1024;
constexpr int64_t kMaxGroupSplits = 1 << 16;
constexpr int kErrorDigits = 3;
constexpr int kSecondsDigits = 3;

// The emulator's cost, measured on a 2-core machine: each delayed dQ reduction sleeps its random delay (on average
// half of --max-delay-us) plus about kSleepOverheadUs of timer slack and wake-up, on one of --sms threads that sleep
// side by side; each visit's float32 tile arithmetic costs about kTileNsPerElement per block_q * block_kv * head_dim
// element, on the machine's cores. A run estimated past kMaxEmulateSeconds is refused rather than left to run for
// hours (1x1 tiles at seqlen 4096 would take days).
constexpr double kSleepOverheadUs = 110.0;
constexpr double kTileNsPerElement = 3.0;
constexpr double kMaxEmulateSeconds = 600.0;
constexpr double kUsPerSecond = 1e6;
constexpr double kNsPerSecond = 1e9;

constexpr int kNameWidth = 17;
constexpr int kIdenticalWidth = 19;
constexpr int kDistinctWidth = 10;
constexpr int kErrorWidth = 11;

struct EmulateFlags {
  // Small enough to run every schedule in a few seconds, large enough for 4 partials per dQ tile.
  ShapeFlags shape{.batch = 1, .heads = 2, .seqlen = 512, .head_dim = 32, .sms = 4};
  WindowFlags window;
  double softcap = 0.0;
  VarlenFlags varlen;
  int64_t block_q = 0;
  int64_t block_kv = 0;
  int64_t group_splits = 0;
  std::string schedule;
  int64_t runs = kDefaultRuns;
  int64_t max_delay_us = kDefaultDelayUs;
  int64_t seed = 1;
  double tolerance = kDefaultTolerance;
  bool json = false;
};

struct Outcome {
  Schedule schedule;
  std::string rejected;  // the schedule's precondition that fails, if any
  EmulationResult result;
  double seconds = 0.0;
  int distinct = 0;  // distinct results among the runs
  bool ok = false;   // as expected: deterministic schedules identical, every schedule complete and accurate
};

// Refuses, naming the estimate, the bound and the flags that lower it, an emulation estimated past kMaxEmulateSeconds
// (the model above, with the maximum problem's visits for a varlen batch).
void check_emulation_cost(const TiledProblem& problem, const TileShape& tiles, int64_t head_dim, int64_t schedules,
                          int64_t runs, int64_t max_delay_us, int sms, const FlagParser& parser) {
  const double visits = static_cast<double>(problem.batch) * problem.heads_kv * problem.group_size *
                        problem.real_q_tiles() * problem.num_kv_tiles() * static_cast<double>(runs * schedules);
  const double sleep_us = max_delay_us > 0 ? kSleepOverheadUs + static_cast<double>(max_delay_us) / 2 : 0.0;
  const double cores = std::max(1U, std::min(std::thread::hardware_concurrency(), static_cast<unsigned>(sms)));
  const double tile_elements = static_cast<double>(tiles.block_q) * tiles.block_kv * static_cast<double>(head_dim);
  const double seconds =
      visits * (sleep_us / kUsPerSecond / sms + tile_elements * kTileNsPerElement / kNsPerSecond / cores);
  if (seconds <= kMaxEmulateSeconds) return;
  parser.fail(
      "the emulation would run about " + format_number(seconds, 3) + " s (" +
      std::to_string(static_cast<long long>(visits)) + " tile visits over --runs and the schedules, each about " +
      format_number(sleep_us, 3) + " us of delay on one of --sms " + std::to_string(sms) + " threads and " +
      format_number(tile_elements * kTileNsPerElement * kUsPerSecond / kNsPerSecond, 3) +
      " us of tile arithmetic); at most " + format_number(kMaxEmulateSeconds) +
      " s are allowed: lower --runs, --max-delay-us, --seqlen " +
      "(--seqlen-q, --seqlen-k), --batch or --heads, raise --block-q and --block-kv, or emulate one " + "--schedule");
}

int count_distinct(const std::vector<uint64_t>& hashes) {
  std::vector<uint64_t> sorted = hashes;
  std::sort(sorted.begin(), sorted.end());
  return static_cast<int>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
}

// Plans `schedule` for `problem` (of a varlen batch: for its maxima, see plan_varlen) and emulates it on `inputs`.
Outcome run_schedule(const EmulatorInputs& inputs, const TiledProblem& problem, const VarlenBatch& batch,
                     Schedule schedule, int sms, const EmulatorOptions& options, double tolerance) {
  Outcome o{schedule, {}, {}, 0.0, 0, false};
  const auto timed = [&o](const auto& emulate_plan) {
    const auto start = std::chrono::steady_clock::now();
    o.result = emulate_plan();
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (batch.varlen()) {
    const VarlenPlanResult planned = plan_varlen(problem, batch, schedule, sms);
    o.rejected = planned.rejected;
    if (planned.ok()) timed([&] { return emulate_varlen(inputs, planned.plan, options); });
  } else {
    const PlanResult planned = make_schedule_plan(problem, schedule, sms);
    o.rejected = planned.rejected;
    if (planned.ok()) timed([&] { return emulate(inputs, planned.plan, options); });
  }
  if (!o.rejected.empty()) return o;
  o.distinct = count_distinct(o.result.run_hashes);
  const bool ordered = is_deterministic(schedule);
  o.ok = o.result.completed && o.result.max_rel_error() <= tolerance && (o.result.bitwise_identical || !ordered);
  return o;
}

std::string outcome_json(const Outcome& o, double tolerance) {
  const EmulationResult& r = o.result;
  const bool ran = o.rejected.empty();
  JsonObject j;
  j.add("name", json_string(schedule_name(o.schedule)))
      .add("valid", json_bool(ran))
      .add("reason", json_string(o.rejected))
      .add("completed", json_bool(r.completed))
      .add("error", json_string(r.error))
      .add("bitwise_identical", json_bool(r.bitwise_identical))
      .add("distinct_results", json_number(o.distinct))
      .add("max_rel_error", ran ? json_number(r.max_rel_error()) : "null")
      .add("rel_errors", JsonObject()
                             .add("dq", json_number(r.error_vs_reference.dq))
                             .add("dk", json_number(r.error_vs_reference.dk))
                             .add("dv", json_number(r.error_vs_reference.dv))
                             .str())
      .add("within_tolerance", json_bool(ran && r.completed && r.max_rel_error() <= tolerance))
      .add("runs", json_number(r.runs))
      .add("seconds", json_number(o.seconds));
  return j.str();
}

std::string outcome_row(const Outcome& o, int runs) {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << schedule_name(o.schedule);
  if (!o.rejected.empty()) return out.str() + "not applicable: " + o.rejected;
  const EmulationResult& r = o.result;
  if (!r.completed) return out.str() + "FAILED: " + r.error;
  const bool ordered = is_deterministic(o.schedule);
  std::string identical = r.bitwise_identical ? "yes" : (ordered ? "NO" : "no (expected)");
  out << std::setw(kIdenticalWidth) << identical << std::setw(kDistinctWidth)
      << std::to_string(o.distinct) + "/" + std::to_string(runs);
  for (double e : {r.max_rel_error(), r.error_vs_reference.dq, r.error_vs_reference.dk, r.error_vs_reference.dv}) {
    out << std::setw(kErrorWidth) << format_number(e, kErrorDigits);
  }
  out << format_number(o.seconds, kSecondsDigits);
  return out.str();
}

std::string header() {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << "schedule" << std::setw(kIdenticalWidth) << "bitwise-identical"
      << std::setw(kDistinctWidth) << "distinct" << std::setw(kErrorWidth) << "max-error" << std::setw(kErrorWidth)
      << "dQ" << std::setw(kErrorWidth) << "dK" << std::setw(kErrorWidth) << "dV"
      << "seconds";
  return out.str();
}

}  // namespace

int cmd_emulate(const std::vector<std::string>& args) {
  EmulateFlags f;
  FlagParser parser("emulate",
                    "Runs backward schedules on CPU threads, one per persistent CTA, with float32 tile arithmetic,\n"
                    "dQ semaphores and a random delay before every dQ reduction; repeats each run and compares the\n"
                    "bits of dQ, dK and dV, and their error against a float64 reference. No GPU needed.\n"
                    "A varlen batch (--cu-seqlens) is planned from its maxima and fitted to each sequence.");
  add_shape_flags(parser, &f.shape);
  add_window_flags(parser, &f.window);
  add_softcap_flag(parser, &f.softcap);
  add_varlen_flags(parser, &f.varlen);
  parser.add_int("block-q", "query tile rows", &f.block_q, 1, kMaxBlock, "the GPU kernel's for --head-dim");
  parser.add_int("block-kv", "key/value tile rows", &f.block_kv, 1, kMaxBlock, "the GPU kernel's for --head-dim");
  parser.add_int("group-splits", "parts each GQA query-head group is split into", &f.group_splits, 1, kMaxGroupSplits,
                 "what the GPU kernels choose");
  parser.add_string("schedule", "NAME", "emulate only this schedule (auto: the one auto picks)", &f.schedule,
                    "every schedule");
  parser.add_int("runs", "runs per schedule, compared bit for bit (>= 2)", &f.runs, 2, kMaxRuns);
  parser.add_int("max-delay-us", "random delay before each dQ reduction is 0..this many microseconds", &f.max_delay_us,
                 0, kMaxDelayUs);
  parser.add_int("seed", "seeds the inputs and the delays", &f.seed, 0, std::numeric_limits<int64_t>::max());
  parser.add_double("tolerance", "largest accepted max |x - ref| / max |ref| per gradient", &f.tolerance, 0.0);
  parser.add_switch("json", "print exactly one JSON object instead of a table", &f.json);
  if (!parser.parse(args)) return kExitOk;
  f.window.resolve(parser);

  const VarlenBatch varlen = make_varlen_batch(f.varlen, &f.shape, parser);
  AttentionShape shape = make_shape(f.shape, parser);
  if (!std::isfinite(f.softcap) || !(f.softcap >= 0.0)) {
    parser.fail("--softcap must be finite and >= 0 (0: no capping), got " + format_number(f.softcap));
  }
  shape.softcap = static_cast<float>(f.softcap);
  const int sms = static_cast<int>(f.shape.sms);
  const TileShape kernel_tiles = backward_tile_shape(static_cast<int>(shape.head_dim));
  const TileShape tiles{f.block_q > 0 ? static_cast<int>(f.block_q) : kernel_tiles.block_q,
                        f.block_kv > 0 ? static_cast<int>(f.block_kv) : kernel_tiles.block_kv};
  const int64_t group_size = shape.heads_q / shape.heads_kv;
  if (f.group_splits > 0 && group_size % f.group_splits != 0) {
    parser.fail("--group-splits " + std::to_string(f.group_splits) + " does not divide the " +
                std::to_string(group_size) + " query heads per key/value head");
  }
  const TiledProblem problem = make_emulator_problem(shape, tiles, static_cast<int>(f.group_splits), f.window.window());
  check_problem_size(problem, parser);
  check_reference_size(shape, varlen.lengths, parser);
  std::vector<Schedule> schedules;
  if (parser.given("schedule")) {
    Schedule s{};
    const Status status = parse_schedule(f.schedule, &s);
    if (!status.ok()) parser.fail(status.message());
    if (s == Schedule::kAuto) {
      s = varlen.varlen() ? plan_varlen(problem, varlen, s, sms).plan.plan.kind : choose_schedule(problem, sms);
    }
    schedules.push_back(s);
  } else {
    for (Schedule s : kAllSchedules) {
      if (s != Schedule::kAuto) schedules.push_back(s);
    }
  }

  check_emulation_cost(problem, tiles, shape.head_dim, static_cast<int64_t>(schedules.size()), f.runs, f.max_delay_us,
                       sms, parser);
  EmulatorOptions options;
  options.runs = static_cast<int>(f.runs);
  options.max_delay_us = static_cast<int>(f.max_delay_us);
  options.seed = static_cast<uint64_t>(f.seed);
  const EmulatorInputs inputs =
      varlen.varlen() ? make_varlen_emulator_inputs(shape, varlen.lengths, options.seed, f.window.window())
                      : make_emulator_inputs(shape, options.seed, f.window.window());
  std::vector<Outcome> outcomes;
  bool all_ok = true;
  for (Schedule s : schedules) {
    const Outcome& o = outcomes.emplace_back(run_schedule(inputs, problem, varlen, s, sms, options, f.tolerance));
    // A schedule that does not apply to the shape is a failure only when it was asked for by name.
    const bool skipped = !o.rejected.empty() && !parser.given("schedule");
    all_ok = all_ok && (o.ok || skipped);
  }

  if (f.json) {
    std::vector<std::string> entries;
    for (const Outcome& o : outcomes) entries.push_back(outcome_json(o, f.tolerance));
    JsonObject j;
    if (outcomes.size() == 1) j.add("bitwise_identical", json_bool(outcomes.front().result.bitwise_identical));
    j.add("problem", problem_json(shape, problem, sms));
    if (varlen.varlen()) j.add("varlen", varlen_json(varlen));
    j.add("runs", json_number(options.runs))
        .add("max_delay_us", json_number(options.max_delay_us))
        .add("seed", json_number(f.seed))
        .add("tolerance", json_number(f.tolerance))
        .add("ok", json_bool(all_ok))
        .add("schedules", json_array(entries));
    std::cout << j.str() << "\n";
  } else {
    std::cout << "problem:   " << describe_shape(shape) << "; " << sms << " SMs\n";
    if (varlen.varlen()) {
      std::cout << "varlen:    " << describe_varlen(varlen) << "; planned from the maxima above\n"
                << "lengths:   " << describe_lengths(varlen) << " (seqlen_q/seqlen_k of each sequence)\n";
    }
    std::cout << "tiles:     " << describe_tiles(problem) << "\n"
              << "emulation: " << options.runs << " runs per schedule, random delay 0.." << options.max_delay_us
              << " us before each dQ reduction, seed " << f.seed << "\n"
              << "errors:    max |x - ref| / max |ref| per gradient, against the float64 reference\n\n"
              << header() << "\n";
    for (const Outcome& o : outcomes) std::cout << outcome_row(o, options.runs) << "\n";
    std::cout << "\n"
              << (all_ok ? "ok: the deterministic schedules kept their bits in every run; all match the reference"
                         : "FAILED: a schedule changed bits, did not finish or missed the tolerance")
              << " (tolerance " << format_number(f.tolerance) << ")\n";
  }
  return all_ok ? kExitOk : kExitFailure;
}

}  // namespace dash::cli
