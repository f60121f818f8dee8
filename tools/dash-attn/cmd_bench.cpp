// dash-attn bench (GPU): backward (or, with --fwd, forward) TFLOPS of every schedule on the paper's grid
// (16384 tokens, hidden 2048, head dims 64 and 128, seqlen 512..16384, full and causal), on one shape (with
// --window L,R and --softcap X where given), or on one varlen batch (--cu-seqlens, varlen.hpp: packed as FlashAttention
// packs it, no padding rows, planned from its maxima with plan_varlen_backward). Each schedule is planned once per
// shape (plan_backward or plan_varlen_backward, untimed) and launched through the plan, as a training loop does.
// Inputs, the CPU-side planning and the untimed forward that feeds the backward are made before any timing. Times
// loops of --iters back-to-back calls between CUDA events (median of kRepeats loops, after --warmup), so the host's
// checks overlap earlier calls' kernels, and reports the host time of one call (validation and launches, no planning)
// next to it; backward times include the preprocess and postprocess kernels (and a varlen call's padding-row kernel).
// FLOPs: 4 B Hq Sq Sk_avg D per forward (harness::forward_flops), 2.5 times that per backward; of a varlen batch the
// sum of each sequence's own under its mask, which the output states. --sm-margin leaves SMs free as FA3's sm_margin
// does (both passes run on the SMs left, and the backward is planned for them). --anchors merges PyTorch SDPA numbers
// measured in the same run (python/benchmarks/sdpa_anchors.py) into the Markdown table (dense shapes only). Every bad
// command line (the varlen flags included) is refused before the device is touched. Exit code 1 without a usable GPU
// or without the varlen kernel a batch needs.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string_view>

#include "commands.hpp"
#include "harness/device_harness.hpp"
#include "harness/varlen_harness.hpp"
#include "options.hpp"
#include "varlen.hpp"

namespace dash::cli {
namespace {

constexpr int64_t kDefaultWarmup = 5;
constexpr int64_t kDefaultIters = 30;
constexpr int kRepeats = 7;
constexpr int64_t kMaxIters = 100000;
constexpr int64_t kGridTokens = 16384;
constexpr int64_t kGridHidden = 2048;
constexpr int64_t kGridSeqlens[] = {512, 1024, 2048, 4096, 8192, 16384};
constexpr int64_t kGridHeadDims[] = {64, 128};
constexpr double kTera = 1e12;
constexpr double kMillisecondsPerSecond = 1e3;
constexpr uint64_t kSeed = 7;
// A varlen batch is timed packed as FlashAttention packs it: its tensors end at the last offset.
constexpr int64_t kVarlenPaddingRows = 0;
// A call that has not finished after this long is a hang.
constexpr double kWatchdogSeconds = 60.0;
// Significant digits of the TFLOPS and ratios in the Markdown table, and of the FLOP count below it.
constexpr int kTflopsDigits = 4;
constexpr int kRatioDigits = 3;
constexpr int kFlopsDigits = 4;
// The prefix of this library's implementations in the tables ("dash:<schedule>").
constexpr std::string_view kDashPrefix = "dash:";

struct Measurement {
  std::string implementation;  // "dash:<schedule>" or "sdpa:<backend>"
  double ms = 0;
  double tflops = 0;
  double host_us = 0;  // host time of one call (0 for anchors measured elsewhere)
};

struct Point {
  AttentionShape shape;  // of a varlen batch: the maxima (batch = sequences)
  VarlenBatch varlen;    // empty for a dense shape
  double forward_flops = 0;
  std::vector<Measurement> results;
};

// The mask's name in the tables and CSV, a window and softcap appended without commas (a CSV field):
// "causal window(255;-1) softcap(30)".
std::string mask_name(const AttentionShape& s) {
  std::string name = s.causal ? "causal" : "full";
  if (s.window_left >= 0 || s.window_right >= 0) {
    name += " window(" + std::to_string(s.window_left) + ";" + std::to_string(s.window_right) + ")";
  }
  if (s.softcap > 0.0f) name += " softcap(" + format_number(s.softcap) + ")";
  return name;
}

std::vector<AttentionShape> paper_grid(DType dtype) {
  std::vector<AttentionShape> grid;
  for (int64_t head_dim : kGridHeadDims) {
    for (bool causal : {false, true}) {
      for (int64_t seqlen : kGridSeqlens) {
        AttentionShape s;
        s.batch = kGridTokens / seqlen;
        s.seqlen_q = s.seqlen_k = seqlen;
        s.heads_q = s.heads_kv = kGridHidden / head_dim;
        s.head_dim = head_dim;
        s.dtype = dtype;
        s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        s.causal = causal;
        grid.push_back(s);
      }
    }
  }
  return grid;
}

double tflops(double forward_flops, bool backward, double ms) {
  const double flops = forward_flops * (backward ? harness::kBackwardFlopsPerForwardFlop : 1.0);
  return flops / (ms / kMillisecondsPerSecond) / kTera;
}

// The forward's arguments (harness::Problem or harness::VarlenProblem) with `sm_margin`.
template <class DeviceProblem>
ForwardArgs forward_args(DeviceProblem& p, int sm_margin) {
  ForwardArgs args = harness::forward_args(p);
  args.sm_margin = sm_margin;
  return args;
}

template <class DeviceProblem>
void run_forward(DeviceProblem& p, int sm_margin) {
  size_t bytes = 0;
  if (Status s = forward_workspace_size(p.shape, &bytes); !s.ok()) throw std::runtime_error(s.to_string());
  if (p.workspace.bytes() < bytes) p.workspace = harness::DeviceBuffer(bytes);
  if (Status s = forward(forward_args(p, sm_margin), p.workspace.get(), p.workspace.bytes(), nullptr); !s.ok()) {
    throw std::runtime_error(s.to_string());
  }
  if (!harness::synchronize_with_watchdog(nullptr, kWatchdogSeconds)) throw std::runtime_error("forward hang");
}

// Times the forward, or the backward of each schedule, on `p`, whose forward does `point->forward_flops`.
template <class DeviceProblem>
void measure(DeviceProblem& p, bool backward, const std::vector<Schedule>& schedules, int warmup, int iters,
             int sm_margin, Point* point) {
  run_forward(p, sm_margin);
  if (!backward) {
    const ForwardArgs args = forward_args(p, sm_margin);
    const harness::CallTiming t = harness::time_calls(
        [&] { return forward(args, p.workspace.get(), p.workspace.bytes(), nullptr); }, warmup, iters, kRepeats);
    point->results.push_back({"dash", t.gpu_ms, tflops(point->forward_flops, false, t.gpu_ms), t.host_us});
    return;
  }
  harness::use_forward_outputs_for_backward(p);
  for (Schedule schedule : schedules) {
    // Planned and proven once, outside the timing: the timed calls only check the call against the plan.
    BackwardPlan plan;
    if (Status s = harness::plan_backward_for(p, schedule, sm_margin, &plan); !s.ok()) {
      if (s.code() == StatusCode::kScheduleRejected) continue;  // not applicable to this shape or batch
      throw std::runtime_error(s.to_string());
    }
    if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = harness::DeviceBuffer(plan.workspace_bytes());
    BackwardArgs args = harness::backward_args(p, schedule);
    args.sm_margin = sm_margin;
    const harness::CallTiming t =
        harness::time_calls([&] { return dash::backward(args, plan, p.workspace.get(), p.workspace.bytes(), nullptr); },
                            warmup, iters, kRepeats);
    point->results.push_back({std::string(kDashPrefix).append(schedule_name(schedule)), t.gpu_ms,
                              tflops(point->forward_flops, true, t.gpu_ms), t.host_us});
  }
}

Point measure_point(const AttentionShape& shape, const VarlenBatch& varlen, bool backward,
                    const std::vector<Schedule>& schedules, int warmup, int iters, int sm_margin) {
  Point point{shape, varlen, 0.0, {}};
  if (varlen.varlen()) {
    point.forward_flops = harness::forward_flops(shape, varlen.lengths);
    harness::VarlenProblem p = make_device_problem(shape, varlen, kVarlenPaddingRows, kSeed, /*with_reference=*/false);
    measure(p, backward, schedules, warmup, iters, sm_margin, &point);
  } else {
    point.forward_flops = harness::forward_flops(shape);
    harness::Problem p = harness::make_problem(shape, kSeed, /*with_reference=*/false);
    measure(p, backward, schedules, warmup, iters, sm_margin, &point);
  }
  return point;
}

// SDPA rows (hdim,mask,seqlen,batch,heads,backend,direction,ms,tflops) keyed by (hdim, mask, seqlen).
using AnchorKey = std::tuple<int64_t, std::string, int64_t>;
std::map<AnchorKey, std::vector<Measurement>> read_anchors(const std::string& path, bool backward) {
  std::map<AnchorKey, std::vector<Measurement>> anchors;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read --anchors file " + path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');) f.push_back(cell);
    constexpr size_t kColumns = 9;
    if (f.size() != kColumns || f[6] != (backward ? "bwd" : "fwd")) continue;
    anchors[{std::stoll(f[0]), f[1], std::stoll(f[2])}].push_back({"sdpa:" + f[5], std::stod(f[7]), std::stod(f[8])});
  }
  return anchors;
}

// A varlen batch's CSV gains a last column, seqlens: seqlen_q/seqlen_k of each sequence, space-separated.
void write_csv(const std::vector<Point>& points, bool backward, std::ostream& out) {
  const bool varlen = !points.empty() && points.front().varlen.varlen();
  out << "direction,hdim,mask,seqlen,batch,heads,dtype,implementation,ms,tflops,host_us" << (varlen ? ",seqlens" : "")
      << "\n";
  for (const Point& p : points) {
    for (const Measurement& m : p.results) {
      out << (backward ? "bwd" : "fwd") << "," << p.shape.head_dim << "," << mask_name(p.shape) << ","
          << p.shape.seqlen_q << "," << p.shape.batch << "," << p.shape.heads_q << "," << dtype_name(p.shape.dtype)
          << "," << m.implementation << "," << m.ms << "," << m.tflops << "," << m.host_us;
      if (varlen) out << "," << describe_lengths(p.varlen, " ");
      out << "\n";
    }
  }
}

// The seqlen column: the query length, or of a varlen batch its maximum.
std::string seqlen_cell(const Point& p) {
  return p.varlen.varlen() ? "varlen, max " + std::to_string(p.shape.seqlen_q) : std::to_string(p.shape.seqlen_q);
}

// What the table's varlen row stands for: the batch, its lengths and how its FLOPs were counted.
void write_varlen_notes(const Point& p, std::ostream& out) {
  out << "\nvarlen: " << describe_varlen(p.varlen) << "; batch is the sequences, the plan made for the maxima\n\n"
      << "lengths: " << describe_lengths(p.varlen) << " (seqlen_q/seqlen_k of each sequence)\n\n"
      << "FLOPs: the sum over the sequences of each one's own, 4 Hq sq sk_avg D under its mask (sk_avg: the keys a\n"
      << "query row of the sequence sees on average, halved by its causal diagonal, counted under a window), none\n"
      << "for a sequence without queries or keys: " << format_number(p.forward_flops, kFlopsDigits) << " per forward, x"
      << format_number(harness::kBackwardFlopsPerForwardFlop) << " per backward\n";
}

// One row per shape, one column per implementation (TFLOPS); for the backward also the best
// deterministic schedule and its ratio to the nondeterministic one. A varlen batch is described below the table.
void write_markdown(const std::vector<Point>& points, bool backward, std::ostream& out) {
  std::vector<std::string> columns;
  for (const Point& p : points) {
    for (const Measurement& m : p.results) {
      if (std::find(columns.begin(), columns.end(), m.implementation) == columns.end())
        columns.push_back(m.implementation);
    }
  }
  out << "| hdim | mask | seqlen | batch | heads |";
  for (const std::string& c : columns) out << " " << c << " |";
  if (backward) out << " best deterministic | best det / nondet |";
  out << "\n|" << std::string(5, ' ') << "---|---|---|---|---|";
  for (size_t i = 0; i < columns.size() + (backward ? 2 : 0); ++i) out << "---|";
  out << "\n";
  for (const Point& p : points) {
    out << "| " << p.shape.head_dim << " | " << mask_name(p.shape) << " | " << seqlen_cell(p) << " | " << p.shape.batch
        << " | " << p.shape.heads_q << " |";
    const Measurement* best = nullptr;
    const Measurement* nondet = nullptr;
    for (const std::string& c : columns) {
      const auto it =
          std::find_if(p.results.begin(), p.results.end(), [&](const Measurement& m) { return m.implementation == c; });
      if (it == p.results.end()) {
        out << " - |";
        continue;
      }
      out << " " << format_number(it->tflops, kTflopsDigits) << " |";
      const bool dash_det = c.rfind(kDashPrefix, 0) == 0 && c != "dash:nondeterministic";
      if (dash_det && (!best || it->tflops > best->tflops)) best = &*it;
      if (c == "dash:nondeterministic") nondet = &*it;
    }
    if (backward) {
      const std::string best_cell =
          best ? best->implementation.substr(kDashPrefix.size()) + " " + format_number(best->tflops, kTflopsDigits)
               : "-";
      out << " " << best_cell << " | "
          << (best && nondet ? format_number(best->tflops / nondet->tflops, kRatioDigits) : "-") << " |";
    }
    out << "\n";
  }
  for (const Point& p : points) {
    if (p.varlen.varlen()) write_varlen_notes(p, out);
  }
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  ShapeFlags shape_flags;
  std::string dtype = "bf16";
  std::string schedule_flag, csv_path, markdown_path, anchors_path;
  int64_t warmup = kDefaultWarmup, iters = kDefaultIters, sm_margin = 0;
  bool fwd = false;
  FlagParser parser(
      "bench",
      "Times the backward pass (every schedule) or, with --fwd, the forward pass on this GPU: the paper's\n"
      "grid unless shape flags are given. TFLOPS = 4 B H Sq Sk_avg D (x 2.5 for the backward) / time;\n"
      "of a varlen batch (--cu-seqlens), the sum of each sequence's own FLOPs under its mask / time.");
  add_shape_flags(parser, &shape_flags, /*with_sms=*/false);
  WindowFlags window;
  add_window_flags(parser, &window);
  double softcap = 0.0;
  add_softcap_flag(parser, &softcap);
  VarlenFlags varlen_flags;
  add_varlen_flags(parser, &varlen_flags);
  parser.add_string("dtype", "NAME", "bf16 or fp16", &dtype);
  parser.add_switch("fwd", "benchmark the forward pass instead of the backward pass", &fwd);
  parser.add_string("schedule", "NAME", "time only this backward schedule", &schedule_flag, "every schedule");
  parser.add_int("warmup", "untimed calls before timing", &warmup, 0, kMaxIters);
  parser.add_int("iters", "back-to-back calls per timed loop (the median of 7 loops is reported)", &iters, 1,
                 kMaxIters);
  add_sm_margin_flag(parser, &sm_margin);
  parser.add_string("csv", "FILE", "also write every measurement as CSV", &csv_path);
  parser.add_string("markdown", "FILE", "also write the table as Markdown", &markdown_path);
  parser.add_string("anchors", "FILE", "merge SDPA measurements (python/benchmarks/sdpa_anchors.py CSV)",
                    &anchors_path);
  if (!parser.parse(args)) return kExitOk;
  window.resolve(parser);
  if (dtype != "bf16" && dtype != "fp16") parser.fail("--dtype must be bf16 or fp16, got '" + dtype + "'");
  const DType element = dtype == "bf16" ? DType::kBF16 : DType::kFP16;
  std::vector<Schedule> schedules(std::begin(kAllSchedules), std::end(kAllSchedules));
  if (parser.given("schedule")) {
    Schedule s{};
    if (Status status = parse_schedule(schedule_flag, &s); !status.ok()) parser.fail(status.message());
    schedules = {s};
  }
  std::vector<AttentionShape> shapes;
  VarlenBatch varlen;
  if (given_shape_flags(parser).empty()) {
    shapes = paper_grid(element);
  } else {
    varlen = make_varlen_batch(varlen_flags, &shape_flags, parser);
    AttentionShape s = make_shape(shape_flags, parser);
    s.dtype = element;
    window.apply(&s);
    s.softcap = static_cast<float>(softcap);
    if (fwd) {
      check_library_accepts(s, parser);
    } else {
      check_library_accepts_backward(s, parser);
    }
    shapes = {s};
  }
  if (varlen.varlen()) {
    if (parser.given("anchors")) {
      parser.fail("--anchors merges SDPA measurements of dense shapes; it does not combine with --cu-seqlens");
    }
    // Without --cu-seqlens-k the keys are the queries, so a batch without keys has no queries either.
    const bool no_queries = total_query_tokens(varlen) == 0;
    if (no_queries || total_key_tokens(varlen) == 0) {
      const std::string which =
          no_queries ? "--cu-seqlens: the batch has no query" : "--cu-seqlens-k: the batch has no key";
      parser.fail(which + " tokens, so nothing to time (the library refuses a packed call without rows)");
    }
  }
  if (Status s = check_current_device(); !s.ok()) {
    std::cerr << "dash-attn bench needs a Hopper GPU: " << s.message() << "\n";
    return kExitFailure;
  }
  check_sm_margin_fits_device(sm_margin, parser);
  if (const std::string missing = varlen.varlen() ? missing_varlen_kernel(shapes.front()) : ""; !missing.empty()) {
    std::cerr << "dash-attn bench: " << missing << "\n";
    return kExitFailure;
  }
  const bool backward = !fwd;
  std::map<AnchorKey, std::vector<Measurement>> anchors;
  if (!anchors_path.empty()) anchors = read_anchors(anchors_path, backward);
  std::vector<Point> points;
  for (const AttentionShape& shape : shapes) {
    Point point = measure_point(shape, varlen, backward, schedules, static_cast<int>(warmup), static_cast<int>(iters),
                                static_cast<int>(sm_margin));
    const auto it = anchors.find({shape.head_dim, mask_name(shape), shape.seqlen_q});
    if (it != anchors.end()) point.results.insert(point.results.end(), it->second.begin(), it->second.end());
    std::cerr << describe_shape(shape) << ": done\n";
    points.push_back(std::move(point));
  }
  write_markdown(points, backward, std::cout);
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    write_csv(points, backward, csv);
  }
  if (!markdown_path.empty()) {
    std::ofstream md(markdown_path);
    write_markdown(points, backward, md);
  }
  return kExitOk;
}

}  // namespace dash::cli
