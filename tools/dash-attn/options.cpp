// Flag parsing shared by the dash-attn subcommands (options.hpp): the parser, the shape flags and the shape
// checks. Every rejection throws UsageError through FlagParser::fail with a message naming the flag; the
// rules of the library itself are not repeated here but asked of dash::validate.
#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>

#include "api/validate.hpp"
#include "json.hpp"

namespace dash::cli {
namespace {

// Width of the "--flag VALUE" column of the usage text.
constexpr size_t kFlagColumn = 26;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxSms = 4096;
// Tile visits plan and emulate model (the planner's expansion and the DAG, or the emulator's jobs): plan takes about
// 2 minutes and 0.9 GiB at 2^24 on a 2-core machine, which is where the bound is.
constexpr long long kMaxTileVisits = 1LL << 24;
// The float64 reference (check's, emulate's) costs about 10 ns per (query row, key row, head dim) element of each
// head on one core of a 2-core machine, and runs one thread per sequence: 2^36 elements, four times check's default
// shape, are about 11 minutes of one core.
constexpr long long kMaxReferenceElements = 1LL << 36;
constexpr double kReferenceNsPerElement = 10.0;
constexpr double kNsPerSecond = 1e9;
constexpr double kSecondsPerMinute = 60.0;

template <class T>
bool parse_number(const std::string& text, T* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty();
}

std::string to_text(double value) { return format_number(value); }

}  // namespace

FlagParser::Flag* FlagParser::find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void FlagParser::add_int(const std::string& name, const std::string& help, int64_t* target, int64_t min_value,
                         int64_t max_value, const std::string& default_text) {
  Flag f{name, "N", help, default_text.empty() ? std::to_string(*target) : default_text, nullptr};
  f.set = [this, name, target, min_value, max_value](const std::string& text) {
    int64_t value = 0;
    if (!parse_number(text, &value)) fail("--" + name + ": '" + text + "' is not an integer");
    if (value < min_value || value > max_value) {
      fail("--" + name + ": " + text + " is outside [" + std::to_string(min_value) + ", " + std::to_string(max_value) +
           "]");
    }
    *target = value;
  };
  flags_.push_back(std::move(f));
}

void FlagParser::add_double(const std::string& name, const std::string& help, double* target, double min_value,
                            const std::string& default_text) {
  Flag f{name, "X", help, default_text.empty() ? to_text(*target) : default_text, nullptr};
  f.set = [this, name, target, min_value](const std::string& text) {
    double value = 0.0;
    if (!parse_number(text, &value) || !std::isfinite(value)) {
      fail("--" + name + ": '" + text + "' is not a finite number");
    }
    if (value < min_value) fail("--" + name + ": " + text + " is below " + to_text(min_value));
    *target = value;
  };
  flags_.push_back(std::move(f));
}

void FlagParser::add_string(const std::string& name, const std::string& value_name, const std::string& help,
                            std::string* target, const std::string& default_text) {
  Flag f{name, value_name, help, default_text.empty() ? *target : default_text, nullptr};
  f.set = [target](const std::string& text) { *target = text; };
  flags_.push_back(std::move(f));
}

void FlagParser::add_switch(const std::string& name, const std::string& help, bool* target) {
  Flag f{name, "", help, "", nullptr};
  f.set = [target](const std::string&) { *target = true; };
  flags_.push_back(std::move(f));
}

void FlagParser::add_int_list(const std::string& name, const std::string& value_name, const std::string& help,
                              std::vector<int64_t>* target, int64_t min_value, int64_t max_value,
                              const std::string& default_text) {
  Flag f{name, value_name, help, default_text, nullptr};
  f.set = [this, name, target, min_value, max_value](const std::string& text) {
    const auto trimmed = [](const std::string& entry) {
      const size_t first = entry.find_first_not_of(' ');
      return first == std::string::npos ? std::string() : entry.substr(first, entry.find_last_not_of(' ') + 1 - first);
    };
    if (trimmed(text).empty()) fail("--" + name + ": the list is empty");
    std::vector<int64_t> values;
    for (size_t begin = 0;;) {
      const size_t comma = text.find(',', begin);
      const std::string entry = trimmed(text.substr(begin, comma == std::string::npos ? comma : comma - begin));
      const std::string where = "entry " + std::to_string(values.size()) + " of '" + text + "'";
      int64_t value = 0;
      if (entry.empty()) fail("--" + name + ": " + where + " is empty");
      if (!parse_number(entry, &value)) fail("--" + name + ": '" + entry + "' (" + where + ") is not an integer");
      if (value < min_value || value > max_value) {
        fail("--" + name + ": " + entry + " (" + where + ") is outside [" + std::to_string(min_value) + ", " +
             std::to_string(max_value) + "]");
      }
      values.push_back(value);
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    *target = std::move(values);
  };
  flags_.push_back(std::move(f));
}

bool FlagParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << usage();
      return false;
    }
    if (arg.rfind("--", 0) != 0) fail("unexpected argument '" + arg + "'");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    Flag* flag = find(name);
    if (flag == nullptr) fail("unknown flag '--" + name + "'");
    if (flag->value_name.empty()) {
      if (eq != std::string::npos) fail("--" + name + " takes no value");
      flag->set("");
    } else if (eq != std::string::npos) {
      flag->set(arg.substr(eq + 1));
    } else {
      if (i + 1 == args.size()) fail("--" + name + " needs a value");
      flag->set(args[++i]);
    }
    flag->seen = true;
  }
  return true;
}

bool FlagParser::given(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

void FlagParser::fail(const std::string& message) const { throw UsageError(message, usage()); }

std::string FlagParser::usage() const {
  std::ostringstream out;
  out << "usage: dash-attn " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const Flag& f : flags_) {
    std::string left = "  --" + f.name + (f.value_name.empty() ? "" : " " + f.value_name);
    left.resize(std::max(left.size() + 1, kFlagColumn), ' ');
    std::string help = f.help + (f.default_text.empty() ? "" : " (default: " + f.default_text + ")");
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1)) {
      help.insert(at + 1, kFlagColumn, ' ');
    }
    out << left << help << "\n";
  }
  std::string help_flag = "  --help";
  help_flag.resize(kFlagColumn, ' ');
  out << help_flag << "this text\n";
  return out.str();
}

void add_shape_flags(FlagParser& parser, ShapeFlags* f, bool with_sms) {
  parser.add_int("batch", "batch size", &f->batch, 1, kMaxBatchOrHeads);
  parser.add_int("heads", "query heads", &f->heads, 1, kMaxBatchOrHeads);
  parser.add_int("heads-kv", "key/value heads, dividing --heads (GQA/MQA)", &f->heads_kv, 1, kMaxBatchOrHeads,
                 "--heads");
  parser.add_int("seqlen", "query and key length", &f->seqlen, 1, kMaxSeqlen);
  parser.add_int("seqlen-q", "query length", &f->seqlen_q, 1, kMaxSeqlen, "--seqlen");
  parser.add_int("seqlen-k", "key/value length", &f->seqlen_k, 1, kMaxSeqlen, "--seqlen");
  parser.add_int("head-dim", "head dimension (picks the kernel's tile shape)", &f->head_dim, 1, kMaxHeadDim);
  parser.add_switch("causal", "causal mask, aligned to the bottom-right corner (default: full mask)", &f->causal);
  if (with_sms) parser.add_int("sms", "SMs, i.e. persistent CTAs", &f->sms, 1, kMaxSms);
}

void add_sm_margin_flag(FlagParser& parser, int64_t* sm_margin) {
  parser.add_int("sm-margin",
                 "SMs left to other work (FA3's sm_margin), below the SM count: the kernels\n"
                 "run on the SMs left, and the schedules are planned for them",
                 sm_margin, 0, kMaxSms);
}

void check_sm_margin_fits_device(int64_t sm_margin, const FlagParser& parser) {
  DeviceInfo device;
  if (Status s = current_device_info(&device); !s.ok()) parser.fail(s.message());
  if (sm_margin >= device.multiprocessor_count) {
    parser.fail("--sm-margin " + std::to_string(sm_margin) + " must be less than the SM count of device " +
                std::to_string(device.index) + " (" + std::to_string(device.multiprocessor_count) +
                "): at least one SM must run the kernels");
  }
}

void add_window_flags(FlagParser& parser, WindowFlags* flags) {
  parser.add_int_list("window", "L,R",
                      "sliding window (FlashAttention's window_size): keys a query row sees\n"
                      "before (L) and after (R) its diagonal, -1: all; --causal makes R 0",
                      &flags->pair, kNoWindowBound, kMaxSeqlen, "-1,-1");
  parser.add_int("window-left", "the same as --window's L (window_size[0])", &flags->left, kNoWindowBound, kMaxSeqlen);
  parser.add_int("window-right", "the same as --window's R (window_size[1])", &flags->right, kNoWindowBound,
                 kMaxSeqlen);
}

void add_softcap_flag(FlagParser& parser, double* softcap) {
  parser.add_double("softcap",
                    "cap the scaled scores to X tanh(score / X) (Gemma 2's logit softcapping);\n"
                    "0: no capping",
                    softcap, 0.0);
}

void WindowFlags::resolve(const FlagParser& parser) {
  if (!parser.given("window")) return;
  if (parser.given("window-left") || parser.given("window-right")) {
    parser.fail("--window L,R sets both bounds: give it or --window-left/--window-right, not both");
  }
  if (pair.size() != 2) {
    parser.fail("--window takes two bounds, L,R (-1 for an open side), got " + std::to_string(pair.size()));
  }
  left = pair[0];
  right = pair[1];
}

std::vector<std::string> given_shape_flags(const FlagParser& parser) {
  std::vector<std::string> given;
  for (const char* name :
       {"batch", "heads", "heads-kv", "seqlen", "seqlen-q", "seqlen-k", "head-dim", "causal", "window", "window-left",
        "window-right", "softcap", "cu-seqlens", "cu-seqlens-k", "keys-within-queries"}) {
    if (parser.given(name)) given.push_back(std::string("--") + name);
  }
  return given;
}

AttentionShape make_shape(const ShapeFlags& f, const FlagParser& parser) {
  AttentionShape s;
  s.batch = f.batch;
  s.heads_q = f.heads;
  s.heads_kv = f.heads_kv > 0 ? f.heads_kv : f.heads;
  s.seqlen_q = f.seqlen_q > 0 ? f.seqlen_q : f.seqlen;
  s.seqlen_k = f.seqlen_k > 0 ? f.seqlen_k : f.seqlen;
  s.head_dim = f.head_dim;
  s.causal = f.causal;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  if (s.heads_q % s.heads_kv != 0) {
    parser.fail("--heads-kv " + std::to_string(s.heads_kv) + " does not divide --heads " + std::to_string(s.heads_q));
  }
  return s;
}

void check_library_accepts(const AttentionShape& shape, const FlagParser& parser) {
  if (const Status status = validate(shape); !status.ok()) {
    parser.fail("the library refuses this shape: " + status.message());
  }
}

void check_library_accepts_backward(const AttentionShape& shape, const FlagParser& parser) {
  check_library_accepts(shape, parser);
  if (const Status status = check_backward_head_dim(shape); !status.ok()) {
    parser.fail("the library refuses this shape for the backward: " + status.message());
  }
}

void check_problem_size(const TiledProblem& p, const FlagParser& parser) {
  // Multiplied out in 64 bits from the per-axis counts, which all fit in int (unlike their products).
  const long long visits = 1LL * p.batch * p.heads_kv * p.group_size * p.real_q_tiles() * p.num_kv_tiles();
  if (visits > kMaxTileVisits) {
    parser.fail("the shape has " + std::to_string(visits) + " (key/value tile, query tile) visits; at most " +
                std::to_string(kMaxTileVisits) + " (2^24) are supported, the bound of the planner's model (" +
                "about 2 minutes and 0.9 GiB there): lower --batch, --heads, --seqlen (--seqlen-q, --seqlen-k) or " +
                "the maxima of --cu-seqlens");
  }
}

long long reference_elements(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths) {
  // Summed in double, which cannot overflow here, and saturated on the way back to an integer.
  const auto head_elements = [&](int64_t seqlen_q, int64_t seqlen_k) {
    return static_cast<double>(shape.heads_q) * static_cast<double>(seqlen_q) * static_cast<double>(seqlen_k) *
           static_cast<double>(shape.head_dim);
  };
  double total = 0.0;
  if (lengths.empty()) {
    total = static_cast<double>(shape.batch) * head_elements(shape.seqlen_q, shape.seqlen_k);
  } else {
    for (const SequenceLengths& l : lengths) total += head_elements(l.seqlen_q, l.seqlen_k);
  }
  constexpr double kSaturated = static_cast<double>(std::numeric_limits<long long>::max() / 2);
  return static_cast<long long>(std::min(total, kSaturated));
}

void check_reference_size(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths,
                          const FlagParser& parser) {
  const long long elements = reference_elements(shape, lengths);
  if (elements <= kMaxReferenceElements) return;
  const double minutes = static_cast<double>(elements) * kReferenceNsPerElement / kNsPerSecond / kSecondsPerMinute;
  parser.fail("the float64 reference of this shape has " + std::to_string(elements) +
              " elements (heads_q * seqlen_q * seqlen_k * head_dim, summed over the batch), about " +
              format_number(minutes, 3) + " minutes of one core; at most " + std::to_string(kMaxReferenceElements) +
              " (2^36, about 11 minutes) are supported: lower --batch, --heads, --seqlen (--seqlen-q, --seqlen-k), " +
              "--head-dim or the lengths of --cu-seqlens");
}

std::string describe_shape(const AttentionShape& s) {
  std::ostringstream out;
  out << "batch " << s.batch << ", heads " << s.heads_q << " (kv " << s.heads_kv << "), seqlen_q " << s.seqlen_q
      << ", seqlen_k " << s.seqlen_k << ", head_dim " << s.head_dim << ", " << (s.causal ? "causal" : "full mask");
  if (s.window_left >= 0 || s.window_right >= 0) {
    out << ", window (" << s.window_left << ", " << s.window_right << ")";
  }
  if (s.softcap > 0.0f) out << ", softcap " << format_number(s.softcap);
  return out.str();
}

std::string describe_tiles(const TiledProblem& p) {
  std::ostringstream out;
  out << "block_q " << p.block_q << ", block_kv " << p.block_kv << "; " << p.num_kv_tiles() << " key/value x "
      << p.num_q_tiles() << " query tiles in each of " << p.num_heads() << " schedule heads (GQA group splits "
      << p.group_splits << ")";
  if (p.windowed()) {
    const auto bound = [](int b) { return b < 0 ? std::string("unbounded") : std::to_string(b); };
    out << "; sliding window left " << bound(p.window.left) << ", right "
        << (p.causal ? std::string("0 (causal)") : bound(p.window.right));
  }
  return out.str();
}

std::string problem_json(const AttentionShape& s, const TiledProblem& p, int sms,
                         const std::vector<std::pair<std::string, std::string>>& extra) {
  JsonObject o;
  o.add("batch", json_number(s.batch))
      .add("heads_q", json_number(s.heads_q))
      .add("heads_kv", json_number(s.heads_kv))
      .add("seqlen_q", json_number(s.seqlen_q))
      .add("seqlen_k", json_number(s.seqlen_k))
      .add("head_dim", json_number(s.head_dim))
      .add("causal", json_bool(p.causal))
      .add("window_left", json_number(p.window.left))
      .add("window_right", json_number(p.causal ? 0 : p.window.right))
      .add("sms", json_number(sms))
      .add("block_q", json_number(p.block_q))
      .add("block_kv", json_number(p.block_kv))
      .add("num_kv_tiles", json_number(p.num_kv_tiles()))
      .add("num_q_tiles", json_number(p.num_q_tiles()))
      .add("group_splits", json_number(p.group_splits))
      .add("schedule_heads", json_number(p.num_heads()));
  for (const auto& [key, value] : extra) o.add(key, value);
  return o.str();
}

std::string format_number(double value, int digits) {
  std::ostringstream out;
  out.precision(digits);
  out << value;
  return out.str();
}

}  // namespace dash::cli
