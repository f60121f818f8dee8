// dash-attn check (GPU): runs the backward pass of one shape, or of a varlen batch (--cu-seqlens, varlen.hpp), N
// times per schedule on the current GPU, compares dQ, dK and dV bit for bit across the runs, and measures their
// error against the float64 CPU reference on the same rounded inputs (harness::tolerance_for, the GPU tests'
// tolerances). Each schedule is planned once (plan_backward; plan_varlen_backward from the batch's maxima and its
// promise) and every run launches that plan on freshly poisoned gradients; --sm-margin plans for the SMs left when
// that many are left to other work. A varlen batch is packed with kPaddingRows rows after its last sequence, which
// every run must clear to 0 (as in tests/kernels/test_sm90_varlen.cpp); each sequence's reference is computed on
// its own. Every bad command line (the varlen flags included, and a shape whose float64 reference would run for more
// than a few minutes, check_reference_size) is refused before the device is touched. Exit code 1
// when a deterministic schedule changed bits, missed the tolerance or left padding uncleared; 1 with a message when
// there is no usable GPU or the build lacks the varlen kernel.
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "harness/device_harness.hpp"
#include "harness/varlen_harness.hpp"
#include "json.hpp"
#include "options.hpp"
#include "schedule/schedule.hpp"
#include "varlen.hpp"

namespace dash::cli {
namespace {

constexpr int64_t kDefaultRuns = 20;
constexpr int64_t kMaxRuns = 100000;
constexpr int kErrorDigits = 3;
constexpr int kNameWidth = 17;
constexpr int kColumnWidth = 12;
constexpr int kIdenticalWidth = 16;  // "yes (100/100)" and a space
constexpr uint64_t kSeed = 2026;
// Rows after the last sequence of a varlen batch's packed tensors: no call may leave them other than cleared. As
// many as the GPU tests use (37: not a multiple of any tile, so a ragged last tile meets them).
constexpr int64_t kPaddingRows = 37;
// A backward that has not finished after this long is a hang.
constexpr double kWatchdogSeconds = 60.0;

struct CheckOutcome {
  Schedule schedule;
  std::string rejected;
  int differing_runs = 0;
  harness::ErrorStats dq, dk, dv;
  bool within_tolerance = false;
  size_t padding_not_cleared = 0;  // varlen: padding elements of dQ, dK and dV the first run left other than 0
};

// The gradients' bits, dQ then dK then dV (harness::Problem or harness::VarlenProblem).
template <class DeviceProblem>
std::vector<uint16_t> gradient_bits(const DeviceProblem& p) {
  std::vector<uint16_t> bits(p.q_elements() + 2 * p.kv_elements());
  p.d_dq.download(bits.data(), p.q_elements() * 2);
  p.d_dk.download(bits.data() + p.q_elements(), p.kv_elements() * 2);
  p.d_dv.download(bits.data() + p.q_elements() + p.kv_elements(), p.kv_elements() * 2);
  return bits;
}

void compare_gradients(const harness::Problem& p, CheckOutcome* o) {
  o->dq = harness::compare(p.d_dq, p.dq, p.shape.dtype);
  o->dk = harness::compare(p.d_dk, p.dk, p.shape.dtype);
  o->dv = harness::compare(p.d_dv, p.dv, p.shape.dtype);
}

// Each sequence's rows against its reference, and the padding rows against 0.
void compare_gradients(const harness::VarlenProblem& p, CheckOutcome* o) {
  const std::pair<harness::ErrorStats*, harness::PackedComparison> gradients[] = {
      {&o->dq, harness::compare_packed(p.d_dq, p.dq, p.shape.dtype)},
      {&o->dk, harness::compare_packed(p.d_dk, p.dk, p.shape.dtype)},
      {&o->dv, harness::compare_packed(p.d_dv, p.dv, p.shape.dtype)}};
  for (const auto& [stats, comparison] : gradients) {
    *stats = comparison.stats;
    o->padding_not_cleared += comparison.padding_not_cleared;
  }
}

template <class DeviceProblem>
CheckOutcome check_schedule(DeviceProblem& p, Schedule schedule, int runs, int sm_margin) {
  CheckOutcome o{schedule, {}, 0, {}, {}, {}, false, 0};
  BackwardPlan plan;
  if (Status s = harness::plan_backward_for(p, schedule, sm_margin, &plan); !s.ok()) {
    if (s.code() != StatusCode::kScheduleRejected) throw std::runtime_error(s.to_string());
    o.rejected = s.message();
    return o;
  }
  const size_t bytes = plan.workspace_bytes();
  if (p.workspace.bytes() < bytes) p.workspace = harness::DeviceBuffer(bytes);
  BackwardArgs args = harness::backward_args(p, schedule);
  args.sm_margin = sm_margin;
  std::vector<uint16_t> first;
  for (int run = 0; run < runs; ++run) {
    p.d_dq.poison();
    p.d_dk.poison();
    p.d_dv.poison();
    if (Status s = backward(args, plan, p.workspace.get(), bytes, nullptr); !s.ok()) {
      throw std::runtime_error(s.to_string());
    }
    if (!harness::synchronize_with_watchdog(nullptr, kWatchdogSeconds)) throw std::runtime_error("backward hang");
    std::vector<uint16_t> bits = gradient_bits(p);
    if (run == 0) {
      first = std::move(bits);
      compare_gradients(p, &o);
    } else if (std::memcmp(bits.data(), first.data(), bits.size() * 2) != 0) {
      ++o.differing_runs;
    }
  }
  const auto tol = harness::tolerance_for(p.shape);
  o.within_tolerance = harness::within(o.dq, tol) && harness::within(o.dk, tol) && harness::within(o.dv, tol);
  return o;
}

template <class DeviceProblem>
std::vector<CheckOutcome> check_schedules(DeviceProblem& p, const std::vector<Schedule>& schedules, int runs,
                                          int sm_margin) {
  std::vector<CheckOutcome> outcomes;
  for (Schedule s : schedules) outcomes.push_back(check_schedule(p, s, runs, sm_margin));
  return outcomes;
}

// As expected: every run ran (a schedule the shape or batch refuses counts only when asked for by name), within
// the tolerance, padding cleared, and a deterministic schedule's bits the same in every run.
bool as_expected(const CheckOutcome& o, bool named) {
  if (!o.rejected.empty()) return !named;
  return o.within_tolerance && o.padding_not_cleared == 0 && (o.differing_runs == 0 || !is_deterministic(o.schedule));
}

std::string outcome_json(const CheckOutcome& o, int runs, bool varlen) {
  const bool ran = o.rejected.empty();
  JsonObject j;
  j.add("name", json_string(schedule_name(o.schedule)))
      .add("valid", json_bool(ran))
      .add("reason", json_string(o.rejected))
      .add("bitwise_identical", json_bool(ran && o.differing_runs == 0))
      .add("differing_runs", json_number(o.differing_runs))
      .add("runs", json_number(runs))
      .add("rel_l2", JsonObject()
                         .add("dq", json_number(o.dq.relative_l2))
                         .add("dk", json_number(o.dk.relative_l2))
                         .add("dv", json_number(o.dv.relative_l2))
                         .str())
      .add("within_tolerance", json_bool(o.within_tolerance));
  if (varlen) j.add("padding_not_cleared", json_number(o.padding_not_cleared));
  return j.str();
}

}  // namespace

int cmd_check(const std::vector<std::string>& args) {
  ShapeFlags shape_flags{.batch = 4, .heads = 4, .seqlen = 1024, .head_dim = 128};
  std::string dtype = "bf16";
  std::string schedule_flag;
  int64_t runs = kDefaultRuns, sm_margin = 0;
  bool json = false;
  FlagParser parser("check",
                    "Runs the backward pass of one shape --runs times per schedule on this GPU, compares dQ, dK and\n"
                    "dV bit for bit across runs and against the float64 CPU reference on the same inputs.\n"
                    "A varlen batch (--cu-seqlens) runs packed, planned from its maxima; each sequence is compared\n"
                    "with its own reference, and the padding rows after the last must come out 0.");
  add_shape_flags(parser, &shape_flags, /*with_sms=*/false);
  WindowFlags window;
  add_window_flags(parser, &window);
  double softcap = 0.0;
  add_softcap_flag(parser, &softcap);
  VarlenFlags varlen_flags;
  add_varlen_flags(parser, &varlen_flags);
  parser.add_string("dtype", "NAME", "bf16 or fp16", &dtype);
  parser.add_string("schedule", "NAME", "check only this schedule", &schedule_flag, "every schedule");
  parser.add_int("runs", "backward runs per schedule, compared bit for bit", &runs, 1, kMaxRuns);
  add_sm_margin_flag(parser, &sm_margin);
  parser.add_switch("json", "print exactly one JSON object instead of a table", &json);
  if (!parser.parse(args)) return kExitOk;
  window.resolve(parser);
  const VarlenBatch varlen = make_varlen_batch(varlen_flags, &shape_flags, parser);
  AttentionShape shape = make_shape(shape_flags, parser);
  window.apply(&shape);
  shape.softcap = static_cast<float>(softcap);
  if (dtype != "bf16" && dtype != "fp16") parser.fail("--dtype must be bf16 or fp16, got '" + dtype + "'");
  shape.dtype = dtype == "bf16" ? DType::kBF16 : DType::kFP16;
  check_library_accepts_backward(shape, parser);
  check_reference_size(shape, varlen.lengths, parser);
  std::vector<Schedule> schedules(std::begin(kAllSchedules), std::end(kAllSchedules));
  if (parser.given("schedule")) {
    Schedule s{};
    if (Status status = parse_schedule(schedule_flag, &s); !status.ok()) parser.fail(status.message());
    schedules = {s};
  }
  if (Status s = check_current_device(); !s.ok()) {
    std::cerr << "dash-attn check needs a Hopper GPU: " << s.message() << "\n";
    return kExitFailure;
  }
  check_sm_margin_fits_device(sm_margin, parser);
  if (const std::string missing = varlen.varlen() ? missing_varlen_kernel(shape) : ""; !missing.empty()) {
    std::cerr << "dash-attn check: " << missing << "\n";
    return kExitFailure;
  }

  std::vector<CheckOutcome> outcomes;
  if (varlen.varlen()) {
    harness::VarlenProblem problem = make_device_problem(shape, varlen, kPaddingRows, kSeed, /*with_reference=*/true);
    outcomes = check_schedules(problem, schedules, static_cast<int>(runs), static_cast<int>(sm_margin));
  } else {
    harness::Problem problem = harness::make_problem(shape, kSeed);
    outcomes = check_schedules(problem, schedules, static_cast<int>(runs), static_cast<int>(sm_margin));
  }
  bool ok = true;
  for (const CheckOutcome& o : outcomes) ok = ok && as_expected(o, parser.given("schedule"));

  if (json) {
    std::vector<std::string> entries;
    for (const CheckOutcome& o : outcomes) entries.push_back(outcome_json(o, static_cast<int>(runs), varlen.varlen()));
    JsonObject j;
    if (outcomes.size() == 1) j.add("bitwise_identical", json_bool(outcomes.front().differing_runs == 0));
    j.add("shape", json_string(describe_shape(shape)));
    if (varlen.varlen()) j.add("varlen", varlen_json(varlen, {{"padding_rows", json_number(kPaddingRows)}}));
    j.add("dtype", json_string(dtype))
        .add("sm_margin", json_number(sm_margin))
        .add("ok", json_bool(ok))
        .add("schedules", json_array(entries));
    std::cout << j.str() << "\n";
    return ok ? kExitOk : kExitFailure;
  }
  std::cout << "check: " << describe_shape(shape) << ", " << dtype << ", " << runs << " runs per schedule";
  if (sm_margin > 0) std::cout << ", " << sm_margin << " SMs left to other work";
  std::cout << "\n";
  if (varlen.varlen()) {
    std::cout << "varlen: " << describe_varlen(varlen) << "; the shape above holds the maxima, planned for\n"
              << "lengths: " << describe_lengths(varlen) << " (seqlen_q/seqlen_k of each sequence), packed with "
              << kPaddingRows << " padding rows after the last, which every run must clear to 0\n";
  }
  std::cout << "\n";
  std::cout << std::left << std::setw(kNameWidth) << "schedule" << std::setw(kIdenticalWidth) << "identical"
            << std::setw(kColumnWidth) << "dQ rel_l2" << std::setw(kColumnWidth) << "dK rel_l2"
            << std::setw(kColumnWidth) << "dV rel_l2"
            << "tolerance\n";
  for (const CheckOutcome& o : outcomes) {
    std::cout << std::left << std::setw(kNameWidth) << schedule_name(o.schedule);
    if (!o.rejected.empty()) {
      std::cout << "not applicable: " << o.rejected << "\n";
      continue;
    }
    std::ostringstream identical;
    identical << (o.differing_runs == 0 ? "yes" : "NO") << " (" << runs - o.differing_runs << "/" << runs << ")";
    std::cout << std::setw(kIdenticalWidth) << identical.str();
    for (const auto* e : {&o.dq, &o.dk, &o.dv})
      std::cout << std::setw(kColumnWidth) << format_number(e->relative_l2, kErrorDigits);
    std::cout << (o.within_tolerance ? "ok" : "EXCEEDED");
    if (o.padding_not_cleared > 0) std::cout << "; PADDING: " << o.padding_not_cleared << " elements not cleared";
    std::cout << "\n";
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace dash::cli
