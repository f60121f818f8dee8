// dash-attn plan: compares the backward schedules of one shape (or of the paper's grid) in the DAG
// model: validity, deadlock freedom, critical path, simulated makespan, bubbles and lemma
// violations; says which schedule it recommends and which one `auto` runs; draws a Gantt chart.
// It plans only shapes the library accepts, and refuses costs whose model results are not finite. --sm-margin
// plans for --sms less that many SMs, as the library does with FA3's sm_margin. A sliding window (--window L,R or
// --window-left/--window-right) goes to the planner as the library's plan_backward passes the shape's.
// A varlen batch (--cu-seqlens, varlen.hpp), which the library does not take yet, is planned from the maxima
// and proven for every length vector the plan admits (planner/varlen_plan.hpp); the same table then reports each
// schedule fitted to the lengths given (validated, simulated), with each sequence's fitted job count. Exit code 1
// when a schedule named with --schedule is refused for the shape or batch, or a proven varlen plan fails on the
// lengths given.
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "commands.hpp"
#include "json.hpp"
#include "options.hpp"
#include "planner/compare.hpp"
#include "planner/dag.hpp"
#include "planner/expanded_schedule.hpp"
#include "planner/gantt_svg.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/simulator.hpp"
#include "planner/validator.hpp"
#include "planner/varlen_plan.hpp"
#include "schedule/forward_tile_order.hpp"
#include "schedule/schedule.hpp"
#include "schedule/tile_config.hpp"
#include "varlen.hpp"

namespace dash::cli {
namespace {

// The worked example of the notes: one causal head of 8 x 8 tiles (d = 64 tiles are 128 x 128) on 4 SMs.
constexpr int kExampleSeqlen = 1024;
constexpr int kExampleHeadDim = 64;
constexpr int kExampleSms = 4;
// The paper's benchmark grid: 16k tokens per batch, hidden size 2048, an H800's 132 SMs.
constexpr int kPaperTokens = 16384;
constexpr int kPaperHidden = 2048;
constexpr int kPaperSms = 132;
constexpr int kPaperHeadDims[] = {64, 128};
constexpr int kPaperSeqlens[] = {512, 1024, 2048, 4096, 8192, 16384};

constexpr int kNameWidth = 17;
constexpr int kYesNoWidth = 7;
constexpr int kFlagWidth = 15;
constexpr int kNumberWidth = 14;
constexpr int kSmallWidth = 9;
constexpr int kViolationWidth = 17;
constexpr int kPercentDigits = 3;
constexpr double kPercent = 100.0;
constexpr double kMaxJitter = 0.5;

struct PlanFlags {
  ShapeFlags shape;
  WindowFlags window;
  VarlenFlags varlen;
  int64_t sm_margin = 0;
  CostModel costs;
  std::string schedule;
  std::string svg;
  std::string preset;
  bool json = false;
};

// What a varlen batch adds to a point, per schedule in the order of comparison.schedules.
struct VarlenSchedule {
  bool proven = false;                 // planned and proven for every length vector the plan admits
  std::vector<int> jobs_per_sequence;  // the jobs fitted to each sequence; empty when not proven
};

struct VarlenPoint {
  VarlenBatch batch;
  std::vector<VarlenSchedule> schedules;
};

struct Point {
  AttentionShape shape;  // of a varlen batch: the maximum shape (batch = sequences)
  int sms;               // the SMs planned for: --sms less --sm-margin
  TiledProblem problem;
  Comparison comparison;
  std::optional<VarlenPoint> varlen;
};

// Costs near the top of the double range overflow the model's sums: the makespans become inf and the
// bubbles NaN, and a schedule "recommended" by them means nothing. Refuses such a result, naming the costs.
void check_finite_results(const Point& point, const CostModel& costs, const FlagParser& parser) {
  for (const ScheduleReport& r : point.comparison.schedules) {
    if (!r.valid) continue;
    const std::pair<const char*, double> results[] = {
        {"critical path", r.critical_path}, {"makespan", r.makespan}, {"bubble fraction", r.bubble_fraction}};
    for (const auto& [name, value] : results) {
      if (std::isfinite(value)) continue;
      parser.fail(std::string("the DAG model's ") + name + " of " + std::string(schedule_name(r.schedule)) + " is " +
                  format_number(value) + " with --compute-cost " + format_number(costs.compute) + ", --reduce-cost " +
                  format_number(costs.reduce) + " and --signal-latency " + format_number(costs.signal_latency) +
                  ": the costs overflow double arithmetic; choose smaller ones");
    }
  }
}

// The shape must be one the library accepts: plan models the GPU kernels' tiles and the API's proof.
Point evaluate(const AttentionShape& shape, SlidingWindow window, int sms, const CostModel& costs,
               const FlagParser& parser) {
  check_library_accepts_backward(shape, parser);
  Point point{shape, sms, make_tiled_problem(shape, window), {}, std::nullopt};
  check_problem_size(point.problem, parser);
  point.comparison = compare_schedules(point.problem, sms, costs);
  check_finite_results(point, costs, parser);
  return point;
}

// One schedule on a varlen batch: planned from the maxima, proven for every admitted length vector, then fitted to
// the batch's lengths, validated and simulated.
std::pair<ScheduleReport, VarlenSchedule> evaluate_varlen_schedule(const TiledProblem& max_problem,
                                                                   const VarlenBatch& batch, Schedule schedule, int sms,
                                                                   const CostModel& costs) {
  ScheduleReport report;
  report.schedule = schedule;
  VarlenSchedule fitted;
  const VarlenPlanResult planned = plan_varlen(max_problem, batch, schedule, sms);
  if (!planned.ok()) {
    report.reason = planned.rejected;
    return {report, fitted};
  }
  if (const PlanProof proof = prove_varlen_plan(planned.plan); !proof.ok()) {
    report.reason = proof.summary;
    return {report, fitted};
  }
  fitted.proven = true;
  const ExpandedSchedule expanded = expand_varlen_schedule(planned.plan, batch.lengths);
  fitted.jobs_per_sequence.assign(batch.lengths.size(), 0);
  for (const ExpandedJob& job : expanded.jobs) ++fitted.jobs_per_sequence[max_problem.kv_coord(job.job.head).batch];
  const ValidationReport validation = validate_varlen_schedule(expanded, batch.lengths);
  report.deadlock_free = validation.deadlock_free;
  if (!validation.ok()) {
    report.reason = "proven, yet on these lengths: " + validation.summary();
    return {report, fitted};
  }
  report.valid = true;
  simulate_into(&report, expanded, costs);
  return {report, fitted};
}

// compare_schedules for a varlen batch: every schedule fitted to the lengths, the recommendation by the same rule,
// and what auto runs on the batch (choose_varlen_auto's choice, or ascending where that is refused).
Point evaluate_varlen(const AttentionShape& max_shape, const VarlenBatch& batch, SlidingWindow window, int sms,
                      const CostModel& costs, const FlagParser& parser) {
  check_library_accepts_backward(max_shape, parser);
  Point point{max_shape, sms, make_tiled_problem(max_shape, window), {}, VarlenPoint{batch, {}}};
  check_problem_size(point.problem, parser);
  Comparison& c = point.comparison;
  c.problem = point.problem;
  c.num_sms = sms;
  c.costs = costs;
  const AutoChoice choice = choose_varlen_auto(point.problem, batch.lengths_fill_maxima, sms);
  c.auto_choice = plan_varlen(point.problem, batch, Schedule::kAuto, sms).plan.plan.kind;
  c.auto_reason = choice.reason;
  if (c.auto_choice != choice.schedule) {
    c.auto_reason += "; but this varlen batch refuses " + std::string(schedule_name(choice.schedule)) + ", so " +
                     std::string(schedule_name(c.auto_choice)) + ": " +
                     plan_varlen(point.problem, batch, choice.schedule, sms).rejected;
  }
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto) continue;
    auto [report, fitted] = evaluate_varlen_schedule(point.problem, batch, schedule, sms, costs);
    c.schedules.push_back(std::move(report));
    point.varlen->schedules.push_back(std::move(fitted));
  }
  c.recommended = recommended_schedule(c.schedules, c.auto_choice, c.recommended);
  check_finite_results(point, costs, parser);
  return point;
}

std::vector<AttentionShape> paper_grid() {
  std::vector<AttentionShape> grid;
  for (int head_dim : kPaperHeadDims) {
    for (int seqlen : kPaperSeqlens) {
      for (bool causal : {false, true}) {
        AttentionShape s;
        s.batch = kPaperTokens / seqlen;
        s.heads_q = s.heads_kv = kPaperHidden / head_dim;
        s.seqlen_q = s.seqlen_k = seqlen;
        s.head_dim = head_dim;
        s.causal = causal;
        s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        grid.push_back(s);
      }
    }
  }
  return grid;
}

// The schedule rows to show: all, or the one --schedule names (auto: what auto picks for this point).
bool shown(const ScheduleReport& r, const Point& point, std::optional<Schedule> only) {
  if (!only) return true;
  return r.schedule == (*only == Schedule::kAuto ? point.comparison.auto_choice : *only);
}

std::string note(const ScheduleReport& r, const Comparison& c) {
  if (!r.valid) return r.reason;
  std::string text;
  if (r.schedule == c.recommended) text = "recommended";
  if (r.schedule == c.auto_choice) text += text.empty() ? "auto" : ", auto";
  if (!is_deterministic(r.schedule)) text = "no fixed order: bits vary from run to run";
  return text;
}

// "-" where the validator never ran (a precondition failed first).
const char* deadlock_text(const ScheduleReport& r) {
  if (r.deadlock_free) return "yes";
  return r.valid || r.reason.rfind("deadlock", 0) == 0 ? "no" : "-";
}

std::string row(const ScheduleReport& r, const Comparison& c) {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << schedule_name(r.schedule) << std::setw(kYesNoWidth)
      << (r.valid ? "yes" : "no") << std::setw(kFlagWidth) << deadlock_text(r) << std::right;
  if (r.valid) {
    out << std::setw(kNumberWidth) << format_number(r.critical_path) << std::setw(kNumberWidth)
        << format_number(r.makespan) << std::setw(kSmallWidth)
        << format_number(kPercent * r.bubble_fraction, kPercentDigits) + "%" << std::setw(kViolationWidth)
        << r.lemma_violations;
  } else {
    out << std::setw(kNumberWidth) << "-" << std::setw(kNumberWidth) << "-" << std::setw(kSmallWidth) << "-"
        << std::setw(kViolationWidth) << "-";
  }
  const std::string why = note(r, c);
  if (!why.empty()) out << "  " << why;
  return out.str();
}

std::string header() {
  std::ostringstream out;
  out << std::left << std::setw(kNameWidth) << "schedule" << std::setw(kYesNoWidth) << "valid" << std::setw(kFlagWidth)
      << "deadlock-free" << std::right << std::setw(kNumberWidth) << "critical-path" << std::setw(kNumberWidth)
      << "makespan" << std::setw(kSmallWidth) << "bubble" << std::setw(kViolationWidth) << "lemma-violations"
      << "  note";
  return out.str();
}

// The forward kernel the library runs for the point (forward_kernel_choice, schedule/tile_config.hpp), as
// "128x176 tiles (wide key tiles: ...)". Without softcap: `plan` takes no --softcap, and softcap keeps the base key
// tiles.
ForwardKernelChoice forward_choice(const Point& point) {
  const MaskShape mask = point.problem.mask();
  return forward_kernel_choice(static_cast<int>(point.shape.head_dim), mask.causal, mask.window.left >= 0,
                               mask.window.right >= 0, /*softcap=*/false, point.varlen.has_value(),
                               point.shape.seqlen_q, point.shape.seqlen_k);
}

// How the forward's CTAs share the tiles (schedule/forward_tile_order.hpp): "round-robin" where they deal them among
// themselves, "counter" where they take them from a global counter.
std::string forward_dispatch(const Point& point, const ForwardKernelChoice& choice) {
  const bool deals = forward_may_deal_tiles(point.varlen.has_value(), choice.left_bounded) &&
                     forward_deals_tiles(point.problem.mask());
  return deals ? "round-robin" : "counter";
}

std::string describe_forward_dispatch(const std::string& dispatch) {
  if (dispatch == "round-robin") return "dealt to the CTAs round robin";
  return "taken by the CTAs from a counter";
}

std::string describe_forward(const Point& point) {
  const ForwardKernelChoice choice = forward_choice(point);
  const TileShape base = forward_base_tile_shape(static_cast<int>(point.shape.head_dim));
  std::string why;
  if (choice.tile.block_q == kForwardShortBlockQ) {
    why += "short query tiles from the sequence length, two CTAs per SM";
  } else if (choice.tile.block_q != base.block_q) {
    why += "tall query tiles from the sequence length";
  }
  if (choice.tile.block_kv != base.block_kv) {
    why += std::string(why.empty() ? "" : ", ") + "wide key tiles from the key length under the full mask";
  }
  if (why.empty()) {
    why = point.varlen               ? "the head dim's base tiles, which varlen batches keep at every length"
          : choice.left_bounded      ? "the head dim's base tiles, a left-bounded window's kernel"
          : point.problem.windowed() ? "the head dim's base tiles, which sliding windows keep"
                                     : "the head dim's base tiles at this length";
  }
  return std::to_string(choice.tile.block_q) + "x" + std::to_string(choice.tile.block_kv) + " tiles (" + why + "), " +
         describe_forward_dispatch(forward_dispatch(point, choice)) +
         (choice.paired ? ", in CTA pairs that share each K and V tile (TMA multicast)" : "");
}

std::string point_json(const Point& point, const CostModel& costs, std::optional<Schedule> only, const std::string& svg,
                       int64_t sm_margin) {
  const Comparison& c = point.comparison;
  std::vector<std::string> schedules;
  for (size_t i = 0; i < c.schedules.size(); ++i) {
    const ScheduleReport& r = c.schedules[i];
    if (!shown(r, point, only)) continue;
    JsonObject entry;
    entry.add("name", json_string(schedule_name(r.schedule)))
        .add("valid", json_bool(r.valid))
        .add("reason", json_string(r.reason))
        .add("deadlock_free", json_bool(r.deadlock_free))
        .add("critical_path", json_number(r.critical_path))
        .add("makespan", json_number(r.makespan))
        .add("bubble_fraction", json_number(r.bubble_fraction))
        .add("lemma_violations", json_number(r.lemma_violations));
    if (point.varlen) {
      const VarlenSchedule& fitted = point.varlen->schedules[i];
      std::vector<std::string> jobs;
      for (int n : fitted.jobs_per_sequence) jobs.push_back(json_number(n));
      entry.add("proven_for_every_length", json_bool(fitted.proven)).add("jobs_per_sequence", json_array(jobs));
    }
    schedules.push_back(entry.str());
  }
  const std::string cost_json = JsonObject()
                                    .add("compute", json_number(costs.compute))
                                    .add("reduce", json_number(costs.reduce))
                                    .add("signal_latency", json_number(costs.signal_latency))
                                    .add("job_overhead", json_number(costs.job_overhead))
                                    .add("jitter", json_number(costs.jitter))
                                    .str();
  JsonObject o;
  o.add("recommended", json_string(schedule_name(c.recommended)))
      .add("auto", json_string(schedule_name(c.auto_choice)))
      .add("auto_reason", json_string(c.auto_reason))
      .add("problem", problem_json(point.shape, point.problem, point.sms,
                                   {{"sm_margin", json_number(sm_margin)}, {"costs", cost_json}}))
      .add("schedules", json_array(schedules));
  const ForwardKernelChoice forward = forward_choice(point);
  o.add("forward_tile", JsonObject()
                            .add("block_q", json_number(forward.tile.block_q))
                            .add("block_kv", json_number(forward.tile.block_kv))
                            .add("left_bounded", json_bool(forward.left_bounded))
                            .add("paired", json_bool(forward.paired))
                            .add("dispatch", json_string(forward_dispatch(point, forward)))
                            .str());
  if (point.varlen) o.add("varlen", varlen_json(point.varlen->batch));
  if (!svg.empty()) o.add("svg", json_string(svg));
  return o.str();
}

// The schedule whose fitted jobs the sequence table shows: --schedule's, or the recommended one.
Schedule table_schedule(const Point& point, std::optional<Schedule> only) {
  if (!only) return point.comparison.recommended;
  return *only == Schedule::kAuto ? point.comparison.auto_choice : *only;
}

// One line per sequence: its lengths, tiles and the jobs `schedule` fits to it ("-" where it was not proven).
void print_sequences(const Point& point, Schedule schedule) {
  constexpr int kIndexWidth = 10;
  constexpr int kColumnWidth = 13;
  const VarlenPoint& varlen = *point.varlen;
  std::vector<int> jobs;
  for (size_t i = 0; i < varlen.schedules.size(); ++i) {
    if (point.comparison.schedules[i].schedule == schedule) jobs = varlen.schedules[i].jobs_per_sequence;
  }
  std::cout << "\nsequences: " << varlen.batch.lengths.size() << ", the jobs fitted to each by "
            << schedule_name(schedule) << "\n"
            << std::left << std::setw(kIndexWidth) << "sequence" << std::right << std::setw(kColumnWidth) << "seqlen_q"
            << std::setw(kColumnWidth) << "seqlen_k" << std::setw(kColumnWidth) << "query-tiles"
            << std::setw(kColumnWidth) << "kv-tiles" << std::setw(kColumnWidth) << "jobs"
            << "\n";
  for (size_t b = 0; b < varlen.batch.lengths.size(); ++b) {
    const SequenceLengths lengths = varlen.batch.lengths[b];
    const TiledProblem sequence = sequence_problem(point.problem, lengths);
    std::cout << std::left << std::setw(kIndexWidth) << b << std::right << std::setw(kColumnWidth) << lengths.seqlen_q
              << std::setw(kColumnWidth) << lengths.seqlen_k << std::setw(kColumnWidth) << sequence.real_q_tiles()
              << std::setw(kColumnWidth) << sequence.num_kv_tiles() << std::setw(kColumnWidth)
              << (jobs.empty() ? "-" : std::to_string(jobs[b])) << "\n";
  }
}

void print_point(const Point& point, const CostModel& costs, std::optional<Schedule> only, int64_t sm_margin) {
  std::cout << "problem: " << describe_shape(point.shape) << "; " << point.sms << " SMs";
  if (sm_margin > 0) std::cout << " (" << point.sms + sm_margin << " less --sm-margin " << sm_margin << ")";
  std::cout << "\n";
  if (point.varlen) {
    std::cout << "varlen:  " << describe_varlen(point.varlen->batch) << "; planned from the maxima above\n";
  }
  std::cout << "tiles:   " << describe_tiles(point.problem) << "\n"
            << "forward: " << describe_forward(point) << "\n"
            << "costs:   compute " << format_number(costs.compute) << ", reduce " << format_number(costs.reduce)
            << ", signal latency " << format_number(costs.signal_latency) << ", job overhead "
            << format_number(costs.job_overhead) << ", jitter " << format_number(costs.jitter) << "\n\n"
            << header() << "\n";
  for (const ScheduleReport& r : point.comparison.schedules) {
    if (shown(r, point, only)) std::cout << row(r, point.comparison) << "\n";
  }
  if (point.varlen) print_sequences(point, table_schedule(point, only));
  std::cout << "\nrecommended: " << schedule_name(point.comparison.recommended)
            << " (smallest simulated makespan among the valid deterministic schedules)\n"
            << "auto picks:  " << schedule_name(point.comparison.auto_choice) << " (" << point.comparison.auto_reason
            << ")\n";
}

void print_grid(const std::vector<Point>& points, const CostModel& costs, std::optional<Schedule> only) {
  std::cout << "paper grid: " << kPaperTokens << " tokens per batch, heads x head_dim = " << kPaperHidden
            << ", costs compute " << format_number(costs.compute) << ", reduce " << format_number(costs.reduce)
            << ", signal latency " << format_number(costs.signal_latency) << ", job overhead "
            << format_number(costs.job_overhead) << ", jitter " << format_number(costs.jitter) << "\n\n";
  constexpr int kDimWidth = 5;
  constexpr int kSeqWidth = 7;
  constexpr int kCountWidth = 6;
  constexpr int kMaskWidth = 8;
  std::cout << std::left << std::setw(kDimWidth) << "d" << std::setw(kSeqWidth) << "seqlen" << std::setw(kCountWidth)
            << "batch" << std::setw(kCountWidth) << "heads" << std::setw(kCountWidth) << "sms" << std::setw(kMaskWidth)
            << "mask" << header() << "\n";
  for (const Point& p : points) {
    for (const ScheduleReport& r : p.comparison.schedules) {
      if (!shown(r, p, only)) continue;
      std::cout << std::left << std::setw(kDimWidth) << p.shape.head_dim << std::setw(kSeqWidth) << p.shape.seqlen_q
                << std::setw(kCountWidth) << p.shape.batch << std::setw(kCountWidth) << p.shape.heads_q
                << std::setw(kCountWidth) << p.sms << std::setw(kMaskWidth) << (p.shape.causal ? "causal" : "full")
                << row(r, p.comparison) << "\n";
    }
  }
}

// Simulates `schedule` (of a varlen batch: fitted to its lengths) with a timeline and writes its Gantt chart;
// returns an error or "".
std::string write_svg(const Point& point, Schedule schedule, const CostModel& costs, const std::string& path) {
  for (const ScheduleReport& r : point.comparison.schedules) {
    if (r.schedule == schedule && !r.valid) {
      return "cannot draw " + std::string(schedule_name(schedule)) + ": " + r.reason;
    }
  }
  const ExpandedSchedule expanded =
      point.varlen ? expand_varlen_schedule(plan_varlen(point.problem, point.varlen->batch, schedule, point.sms).plan,
                                            point.varlen->batch.lengths)
                   : expand_schedule(make_schedule_plan(point.problem, schedule, point.sms).plan);
  const SimulationResult sim = simulate(expanded, costs, /*record_timeline=*/true);
  std::ofstream out(path);
  if (!out) return "cannot open '" + path + "' for writing";
  GanttOptions options;
  options.title = std::string(schedule_name(schedule)) + ": " + describe_shape(point.shape) + "; " +
                  std::to_string(point.sms) + " SMs";
  if (point.varlen) options.title += "; varlen: " + describe_varlen(point.varlen->batch);
  write_gantt_svg(expanded, sim, options, out);
  out.close();
  if (!out) return "could not write '" + path + "'";
  return {};
}

// The plan fails where --schedule named a schedule that the shape or batch refuses, and, for a varlen batch,
// where a plan proven for every admitted length vector fails on the lengths given (a flaw of the proof or of the
// fitting). Says which on stderr.
int plan_exit_code(const Point& point, std::optional<Schedule> only) {
  int code = kExitOk;
  const Comparison& c = point.comparison;
  for (size_t i = 0; i < c.schedules.size(); ++i) {
    const ScheduleReport& r = c.schedules[i];
    const bool contradicted = point.varlen && point.varlen->schedules[i].proven && !r.valid;
    const bool refused_by_name = only && shown(r, point, only) && !r.valid;
    if (!contradicted && !refused_by_name) continue;
    std::cerr << "dash-attn plan: " << schedule_name(r.schedule) << (point.varlen ? " on this varlen batch: " : ": ")
              << r.reason << "\n";
    code = kExitFailure;
  }
  return code;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  PlanFlags f;
  FlagParser parser("plan",
                    "Compares the backward schedules of a shape in the paper's DAG model (compute c and reduce r per\n"
                    "tile visit, dQ reductions in each schedule's fixed order) and recommends one. No GPU needed.");
  add_shape_flags(parser, &f.shape);
  add_window_flags(parser, &f.window);
  add_varlen_flags(parser, &f.varlen);
  parser.add_double("compute-cost", "c, one tile visit's compute (> 0)", &f.costs.compute, 0.0);
  parser.add_double("reduce-cost", "r, one dQ tile's serialized reduction", &f.costs.reduce, 0.0);
  parser.add_double("signal-latency", "delay before another SM sees a released semaphore", &f.costs.signal_latency,
                    0.0);
  parser.add_double("job-overhead", "fixed cost at the start of each job (K/V load, dK/dV store)",
                    &f.costs.job_overhead, 0.0);
  parser.add_double("jitter",
                    "coefficient of variation of each tile visit's compute, 0 to 0.5; above 0 the makespan\n"
                    "is the mean of 8 simulations (0: the paper's equal costs)",
                    &f.costs.jitter, 0.0);
  parser.add_string("schedule", "NAME", "show only this schedule (auto: the one auto picks), and draw it with --svg",
                    &f.schedule, "all");
  parser.add_string("svg", "FILE", "write the Gantt chart of the recommended schedule (or of --schedule)", &f.svg,
                    "none");
  parser.add_string("preset", "NAME",
                    "paper-example: the notes' 8x8 causal example (d 64, seqlen 1024, 1 head, 4 SMs);\n"
                    "paper-grid: the paper's grid (16k tokens, heads*d = 2048, d 64 and 128, seqlen\n"
                    "512..16384, full and causal, 132 SMs), one line per point and schedule.\n"
                    "A preset sets every shape flag but --sms",
                    &f.preset, "none");
  add_sm_margin_flag(parser, &f.sm_margin);
  parser.add_switch("json", "print exactly one JSON object instead of tables", &f.json);
  if (!parser.parse(args)) return kExitOk;
  f.window.resolve(parser);

  if (!(f.costs.compute > 0.0)) parser.fail("--compute-cost must be > 0");
  // Past 0.5 a draw of c (1 - sqrt(3) jitter) can reach zero or below: a visit that takes no time.
  if (!(f.costs.jitter >= 0.0 && f.costs.jitter <= kMaxJitter)) parser.fail("--jitter must be in [0, 0.5]");
  std::optional<Schedule> only;
  if (parser.given("schedule")) {
    Schedule s{};
    const Status status = parse_schedule(f.schedule, &s);
    if (!status.ok()) parser.fail(status.message());
    only = s;
  }
  std::vector<AttentionShape> shapes;
  VarlenBatch varlen;
  int sms = static_cast<int>(f.shape.sms);
  if (parser.given("preset")) {
    if (const std::vector<std::string> given = given_shape_flags(parser); !given.empty()) {
      parser.fail("--preset sets the shape; drop " + given.front());
    }
    if (f.preset == "paper-example") {
      f.shape.batch = f.shape.heads = 1;
      f.shape.seqlen = kExampleSeqlen;
      f.shape.head_dim = kExampleHeadDim;
      f.shape.causal = true;
      if (!parser.given("sms")) sms = kExampleSms;
      shapes.push_back(make_shape(f.shape, parser));
    } else if (f.preset == "paper-grid") {
      if (parser.given("svg")) parser.fail("--svg draws one shape; it does not combine with --preset paper-grid");
      if (!parser.given("sms")) sms = kPaperSms;
      shapes = paper_grid();
    } else {
      parser.fail("unknown preset '" + f.preset + "' (valid: paper-example, paper-grid)");
    }
  } else {
    varlen = make_varlen_batch(f.varlen, &f.shape, parser);
    shapes.push_back(make_shape(f.shape, parser));
  }

  if (f.sm_margin >= sms) {
    parser.fail("--sm-margin " + std::to_string(f.sm_margin) + " must be less than the SM count (" +
                std::to_string(sms) + "): at least one SM must run the kernels");
  }
  sms -= static_cast<int>(f.sm_margin);
  std::vector<Point> points;
  for (const AttentionShape& shape : shapes) {
    points.push_back(varlen.varlen() ? evaluate_varlen(shape, varlen, f.window.window(), sms, f.costs, parser)
                                     : evaluate(shape, f.window.window(), sms, f.costs, parser));
  }

  if (f.preset == "paper-grid") {
    if (f.json) {
      std::vector<std::string> grid;
      for (const Point& p : points) grid.push_back(point_json(p, f.costs, only, "", f.sm_margin));
      std::cout << JsonObject().add("grid", json_array(grid)).str() << "\n";
    } else {
      print_grid(points, f.costs, only);
    }
    return kExitOk;
  }

  const Point& point = points.front();
  std::optional<Schedule> drawn;
  if (parser.given("svg")) {
    drawn = !only ? point.comparison.recommended : (*only == Schedule::kAuto ? point.comparison.auto_choice : *only);
    if (const std::string error = write_svg(point, *drawn, f.costs, f.svg); !error.empty()) {
      std::cerr << "dash-attn plan: " << error << "\n";
      return kExitFailure;
    }
  }
  if (f.json) {
    std::cout << point_json(point, f.costs, only, drawn ? f.svg : "", f.sm_margin) << "\n";
  } else {
    print_point(point, f.costs, only, f.sm_margin);
    if (drawn) std::cout << "\nGantt chart of " << schedule_name(*drawn) << " written to " << f.svg << "\n";
  }
  return plan_exit_code(point, only);
}

}  // namespace dash::cli
