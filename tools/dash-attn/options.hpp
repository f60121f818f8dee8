// Flag parsing shared by the dash-attn subcommands: a small declarative parser (--name VALUE or
// --name=VALUE, switches, range-checked numbers, per-command usage text) and the attention-shape flags
// every subcommand takes. Bad input throws UsageError, which main() turns into exit code 2.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dash/attention.hpp"
#include "schedule/mask.hpp"
#include "schedule/tiled_problem.hpp"
#include "schedule/varlen.hpp"

namespace dash::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and found a problem (or could not write a file)
inline constexpr int kExitUsage = 2;

// Bounds of the shape flags that keep every tile count and index of the schedule model inside int.
inline constexpr int64_t kMaxBatchOrHeads = 1 << 16;
inline constexpr int64_t kMaxSeqlen = 1 << 24;

// A bad command line; `usage` is the usage text of the command it was meant for.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string usage) : std::runtime_error(message), usage_(std::move(usage)) {}
  const std::string& usage() const { return usage_; }

 private:
  std::string usage_;
};

class FlagParser {
 public:
  FlagParser(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}
  // The flags' setters point back at the parser.
  FlagParser(const FlagParser&) = delete;
  FlagParser& operator=(const FlagParser&) = delete;

  // `default_text` replaces the target's current value in the usage text when not empty.
  void add_int(const std::string& name, const std::string& help, int64_t* target, int64_t min_value, int64_t max_value,
               const std::string& default_text = {});
  void add_double(const std::string& name, const std::string& help, double* target, double min_value,
                  const std::string& default_text = {});
  void add_string(const std::string& name, const std::string& value_name, const std::string& help, std::string* target,
                  const std::string& default_text = {});
  void add_switch(const std::string& name, const std::string& help, bool* target);
  // A comma-separated list of integers, each in [min_value, max_value] (spaces around an entry are ignored); an
  // empty list or entry is refused.
  void add_int_list(const std::string& name, const std::string& value_name, const std::string& help,
                    std::vector<int64_t>* target, int64_t min_value, int64_t max_value,
                    const std::string& default_text);

  // Parses `args` (the words after the subcommand). Returns false when --help was given: the usage
  // text is then printed on stdout and nothing else should happen.
  bool parse(const std::vector<std::string>& args);
  bool given(const std::string& name) const;
  [[noreturn]] void fail(const std::string& message) const;
  std::string usage() const;

 private:
  struct Flag {
    std::string name;
    std::string value_name;  // empty for a switch
    std::string help;
    std::string default_text;
    std::function<void(const std::string&)> set;
    bool seen = false;
  };
  Flag* find(const std::string& name);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
};

// The shape flags; a subcommand sets its defaults before add_shape_flags().
struct ShapeFlags {
  int64_t batch = 1;
  int64_t heads = 16;
  int64_t heads_kv = 0;  // 0: same as heads
  int64_t seqlen = 4096;
  int64_t seqlen_q = 0;  // 0: --seqlen
  int64_t seqlen_k = 0;  // 0: --seqlen
  int64_t head_dim = 128;
  bool causal = false;
  int64_t sms = 132;
};

// `with_sms` false for the GPU commands, where the device decides the number of persistent CTAs.
void add_shape_flags(FlagParser& parser, ShapeFlags* flags, bool with_sms = true);
// --sm-margin N: SMs the kernels leave to other work (FA3's sm_margin), 0 to kMaxSms; the schedules are planned
// for the SM count less it.
void add_sm_margin_flag(FlagParser& parser, int64_t* sm_margin);
// Refuses, as a bad command line, an --sm-margin that is not below the current GPU's SM count (call it after
// check_current_device() succeeded).
void check_sm_margin_fits_device(int64_t sm_margin, const FlagParser& parser);

// --window L,R (or --window-left L and --window-right R): FlashAttention's sliding window (window_size), -1
// leaving a side open, --causal making R 0. Every command takes them: plan, prove and emulate plan (and prove or
// emulate) the window (make_tiled_problem), check and bench run the library's kernels under it (AttentionShape's
// window fields).
struct WindowFlags {
  int64_t left = kNoWindowBound;
  int64_t right = kNoWindowBound;
  std::vector<int64_t> pair;  // --window L,R
  SlidingWindow window() const { return SlidingWindow{static_cast<int>(left), static_cast<int>(right)}; }
  // Takes --window L,R into left and right, refusing it with --window-left or --window-right or with a count of
  // entries other than two. Call it after parse().
  void resolve(const FlagParser& parser);
  // Sets shape's window fields.
  void apply(AttentionShape* shape) const {
    shape->window_left = left;
    shape->window_right = right;
  }
};
void add_window_flags(FlagParser& parser, WindowFlags* flags);
// --softcap X: Gemma 2's score capping, softcap * tanh(score / softcap), 0 for none (check and bench, which run the
// library's softcap kernels, and emulate, whose tile arithmetic caps the scores as they do). plan has none: the cap
// changes no tile's visits, so no schedule.
void add_softcap_flag(FlagParser& parser, double* softcap);

// The shape flags given on the command line other than --sms, e.g. {"--batch", "--causal"}, the window and varlen
// flags (varlen.hpp) included: a preset replaces the shape and refuses them.
std::vector<std::string> given_shape_flags(const FlagParser& parser);
// Checks the flags together (heads divisible by heads-kv) and builds the shape, with softmax scale
// 1/sqrt(head_dim) and bf16 as dtype (the planner and emulator do not depend on it).
AttentionShape make_shape(const ShapeFlags& flags, const FlagParser& parser);

// Refuses, as a bad command line, a shape the library refuses (dash::validate, the API's own rules): the
// commands that plan or run the GPU kernels' tiling must not report on a shape the kernels cannot run.
// `emulate` does not call it: it models any head dim and tile shape on purpose.
void check_library_accepts(const AttentionShape& shape, const FlagParser& parser);
// The same for the commands that plan or run the backward: the library also refuses a backward at a head dim with
// no backward kernel (kBackwardHeadDims; every supported head dim has one now).
void check_library_accepts_backward(const AttentionShape& shape, const FlagParser& parser);

// Refuses shapes with more tile visits than the planner and emulator enumerate in reasonable memory, naming the bound
// and the flags that lower it.
void check_problem_size(const TiledProblem& problem, const FlagParser& parser);
// The elements of the float64 reference of `shape` (heads_q * seqlen_q * seqlen_k * head_dim per sequence): of
// batch sequences at the shape's lengths, or of the (seqlen_q, seqlen_k) of each of `lengths` when it is not empty.
long long reference_elements(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths);
// Refuses, naming the bound, its cost and the flags that lower it, a shape whose float64 reference (check, emulate)
// would run for more than a few minutes.
void check_reference_size(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths,
                          const FlagParser& parser);

// "batch 1, heads 16 (kv 16), seqlen_q 4096, seqlen_k 4096, head_dim 128, full mask"
std::string describe_shape(const AttentionShape& shape);
// "block_q 64, block_kv 128; 32 key/value x 64 query tiles in each of 16 schedule heads (GQA group splits 1)",
// followed under a sliding window by "; sliding window left 255, right 0 (causal)"
std::string describe_tiles(const TiledProblem& problem);
// The shape, SM count, tiling and mask (causal, and window_left, window_right in FlashAttention's terms after the
// planner's canonical form: -1 for an open side, 0 on the right for causal) as a JSON object; `extra` members
// (already encoded) are appended.
std::string problem_json(const AttentionShape& shape, const TiledProblem& problem, int sms,
                         const std::vector<std::pair<std::string, std::string>>& extra = {});
// A number as the tables print it: up to `digits` significant digits, no trailing zeros.
std::string format_number(double value, int digits = 6);

}  // namespace dash::cli
