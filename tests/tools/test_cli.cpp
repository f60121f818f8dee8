// Tests of the dash-attn command line: runs the built binary with popen and checks exit codes, usage
// messages (including shapes the library refuses and cost models that overflow), the --json output (read
// back with a minimal JSON parser, as no JSON library is available; valid UTF-8 whatever bytes an argument holds), the
// Gantt SVG, varlen batches (--cu-seqlens) and sliding windows in plan, prove and emulate, and check's and bench's
// refusals of them before the device check (their GPU runs are the GPU tests' subject: without a GPU they stop at the
// device check), and each command's size bound, named with the flags that lower it.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "schedule/tile_config.hpp"

namespace {

// --- a minimal JSON reader: enough to check the structure and values dash-attn prints -------------
struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  bool has(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return true;
    }
    return false;
  }
  const Json& operator[](const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return v;
    }
    throw std::runtime_error("missing key '" + key + "'");
  }
};

class JsonReader {
 public:
  explicit JsonReader(std::string text) : text_(std::move(text)) {}

  // The one value the text holds; throws on malformed input or trailing garbage.
  Json read_document() {
    Json value = read_value();
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  bool consume_word(const std::string& word) {
    if (text_.compare(pos_, word.size(), word) != 0) return false;
    pos_ += word.size();
    return true;
  }

  Json read_value() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    Json v;
    const char c = text_[pos_];
    if (c == '{') {
      v.type = Json::Type::kObject;
      ++pos_;
      if (consume('}')) return v;
      do {
        skip_space();
        std::string key = read_string();
        expect(':');
        v.object.emplace_back(std::move(key), read_value());
      } while (consume(','));
      expect('}');
    } else if (c == '[') {
      v.type = Json::Type::kArray;
      ++pos_;
      if (consume(']')) return v;
      do {
        v.array.push_back(read_value());
      } while (consume(','));
      expect(']');
    } else if (c == '"') {
      v.type = Json::Type::kString;
      v.string = read_string();
    } else if (consume_word("true")) {
      v.type = Json::Type::kBool;
      v.boolean = true;
    } else if (consume_word("false")) {
      v.type = Json::Type::kBool;
    } else if (consume_word("null")) {
      v.type = Json::Type::kNull;
    } else {
      v.type = Json::Type::kNumber;
      const size_t start = pos_;
      while (pos_ < text_.size() && std::string("+-0123456789.eE").find(text_[pos_]) != std::string::npos) ++pos_;
      if (start == pos_) fail("unexpected character");
      char* end = nullptr;
      const std::string number = text_.substr(start, pos_ - start);
      v.number = std::strtod(number.c_str(), &end);
      if (end != number.c_str() + number.size()) fail("bad number '" + number + "'");
    }
    return v;
  }

  std::string read_string() {
    if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a string");
    ++pos_;
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < ' ') fail("unescaped control character");
      if (c == '\\') {
        if (pos_ >= text_.size()) fail("unfinished escape");
        const char e = text_[pos_++];
        if (e == 'n')
          c = '\n';
        else if (e == 't')
          c = '\t';
        else if (e == 'r')
          c = '\r';
        else if (e == '"' || e == '\\' || e == '/')
          c = e;
        else if (e == 'u' && pos_ + 4 <= text_.size()) {
          c = static_cast<char>(std::stoi(text_.substr(pos_, 4), nullptr, 16));
          pos_ += 4;
        } else {
          fail("bad escape");
        }
      }
      out += c;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  std::string text_;
  size_t pos_ = 0;
};

Json parse_json(const std::string& text) { return JsonReader(text).read_document(); }

// --- running the binary ----------------------------------------------------------------------------
constexpr size_t kReadChunk = 4096;

struct Output {
  int status = -1;
  std::string text;
};

// Runs dash-attn with `args` and captures stdout, or stderr with `want_stderr`.
Output run(const std::string& args, bool want_stderr = false) {
  const std::string redirect = want_stderr ? " 2>&1 1>/dev/null" : " 2>/dev/null";
  const std::string command = std::string(DASH_ATTN_BINARY) + " " + args + redirect;
  FILE* pipe = popen(command.c_str(), "r");
  Output out;
  if (pipe == nullptr) return out;
  char buffer[kReadChunk];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.text.append(buffer, n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

const Json& find_schedule(const Json& report, const std::string& name) {
  for (const Json& s : report["schedules"].array) {
    if (s["name"].string == name) return s;
  }
  throw std::runtime_error("no schedule '" + name + "' in the report");
}

// --- tests -----------------------------------------------------------------------------------------
TEST(Cli, NoCommandPrintsUsageAndFails) {
  const Output out = run("", /*want_stderr=*/true);
  EXPECT_EQ(out.status, 2);
  EXPECT_NE(out.text.find("usage: dash-attn <command>"), std::string::npos) << out.text;
}

TEST(Cli, HelpListsCommands) {
  const Output out = run("--help");
  EXPECT_EQ(out.status, 0);
  EXPECT_NE(out.text.find("plan"), std::string::npos);
  EXPECT_NE(out.text.find("emulate"), std::string::npos);
  const Output plan_help = run("plan --help");
  EXPECT_EQ(plan_help.status, 0);
  EXPECT_NE(plan_help.text.find("--preset NAME"), std::string::npos);
}

TEST(Cli, BadCommandLinesExitWithUsage) {
  for (const char* args :
       {"bogus", "plan --bogus", "plan --batch", "plan --batch x", "plan --batch -3", "plan --seqlen 0",
        "plan --reduce-cost abc", "plan --schedule fastest", "plan --heads 6 --heads-kv 4",
        "plan --preset paper-example --causal", "plan --preset nope", "plan stray", "plan --json=yes",
        "emulate --runs 1", "emulate --schedule nope", "emulate --max-delay-us -1"}) {
    SCOPED_TRACE(args);
    const Output err = run(args, /*want_stderr=*/true);
    EXPECT_EQ(err.status, 2);
    EXPECT_NE(err.text.find("usage: dash-attn"), std::string::npos) << err.text;
    EXPECT_TRUE(run(args).text.empty());
  }
  const Output unknown = run("plan --schedule fastest", /*want_stderr=*/true);
  EXPECT_NE(unknown.text.find("unknown schedule 'fastest'"), std::string::npos) << unknown.text;
}

// Exit code 2, nothing on stdout, and `message` on stderr.
::testing::AssertionResult refused_with(const std::string& args, const std::string& message) {
  const Output err = run(args, /*want_stderr=*/true);
  if (err.status != 2) return ::testing::AssertionFailure() << "exit " << err.status << ": " << err.text;
  if (err.text.find(message) == std::string::npos) {
    return ::testing::AssertionFailure() << "stderr lacks '" << message << "': " << err.text;
  }
  const Output out = run(args);
  if (!out.text.empty()) return ::testing::AssertionFailure() << "stdout is not empty: " << out.text;
  return ::testing::AssertionSuccess();
}

// plan models the GPU kernels' tiles, so it refuses what the library refuses, with the library's message.
TEST(Cli, PlanRefusesAHeadDimTheLibraryRefuses) {
  EXPECT_TRUE(
      refused_with("plan --head-dim 80",
                   "dash-attn plan: the library refuses this shape: shape.head_dim must be one of {64, 96, 128, "
                   "192, 256}, got 80"));
}

// plan models the backward, which the library has at every supported head dim (at 192 and 256 on the key split's
// 64x96 and 64x80 tiles).
TEST(Cli, PlanTakesEveryBackwardHeadDim) {
  for (const char* head_dim : {"96", "192", "256"}) {
    const Output out = run(std::string("plan --batch 2 --heads 8 --seqlen 1024 --head-dim ") + head_dim);
    EXPECT_EQ(out.status, 0) << head_dim << ": " << out.text;
  }
}

TEST(Cli, PlanRefusesASequenceTheLibraryRefuses) {
  EXPECT_TRUE(refused_with("plan --seqlen-q 1 --seqlen-k 16777216",
                           "the library refuses this shape: shape.seqlen_k must be <= 1048576"));
}

TEST(Cli, PlanRefusesABatchAboveTheGridLimit) {
  EXPECT_TRUE(refused_with("plan --batch 65536 --seqlen 128 --heads 1",
                           "the library refuses this shape: shape.batch must be <= 65535"));
}

// Without a GPU, a command that checked the device first would exit 1 ("needs a Hopper GPU").
TEST(Cli, CheckAndBenchRefuseAShapeTheLibraryRefusesBeforeTheDeviceCheck) {
  for (const char* command : {"check", "bench"}) {
    SCOPED_TRACE(command);
    EXPECT_TRUE(refused_with(std::string(command) + " --head-dim 80",
                             "the library refuses this shape: shape.head_dim must be one of {64, 96, 128, 192, 256}, "
                             "got 80"));
  }
}

// --sm-margin plans for --sms less the margin, as the library plans for the device's SMs less sm_margin.
TEST(Cli, PlanWithAnSmMarginPlansForTheSmsLeft) {
  const Output out = run("plan --preset paper-example --sm-margin 1 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_EQ(report["problem"]["sms"].number, 3);
  EXPECT_EQ(report["problem"]["sm_margin"].number, 1);
  const Output none = run("plan --preset paper-example --json");
  ASSERT_EQ(none.status, 0);
  EXPECT_EQ(parse_json(none.text)["problem"]["sm_margin"].number, 0);
  // The same as --sms 3: the model has no other notion of a margin.
  const Output fewer = run("plan --preset paper-example --sms 3 --json");
  ASSERT_EQ(fewer.status, 0);
  EXPECT_EQ(parse_json(fewer.text)["schedules"].array.size(), report["schedules"].array.size());
  EXPECT_DOUBLE_EQ(find_schedule(parse_json(fewer.text), "symmetric-shift")["makespan"].number,
                   find_schedule(report, "symmetric-shift")["makespan"].number);
  const Output table = run("plan --preset paper-example --sm-margin 1");
  EXPECT_NE(table.text.find("; 3 SMs (4 less --sm-margin 1)\n"), std::string::npos) << table.text;
}

TEST(Cli, ASmMarginMustLeaveAnSm) {
  EXPECT_TRUE(refused_with("plan --preset paper-example --sm-margin 4",
                           "--sm-margin 4 must be less than the SM count (4): at least one SM must run the kernels"));
  EXPECT_TRUE(refused_with("plan --sms 8 --sm-margin 9", "--sm-margin 9 must be less than the SM count (8)"));
  for (const char* command : {"plan", "check", "bench"}) {
    SCOPED_TRACE(command);
    EXPECT_TRUE(refused_with(std::string(command) + " --sm-margin -1", "--sm-margin: -1 is outside [0, 4096]"));
  }
}

TEST(Cli, PlanRefusesCostsThatOverflowTheModel) {
  for (const char* format : {"", " --json"}) {
    SCOPED_TRACE(format);
    EXPECT_TRUE(
        refused_with(std::string("plan --preset paper-example --compute-cost 1e308 --reduce-cost 1e308") + format,
                     "the DAG model's critical path of ascending is inf with --compute-cost 1e+308, "
                     "--reduce-cost 1e+308 and --signal-latency 0: the costs overflow double arithmetic"));
  }
  EXPECT_TRUE(refused_with("plan --preset paper-example --signal-latency 1e308", "makespan of ascending is inf"));
}

TEST(Cli, PlanRefusesNonFiniteCosts) {
  for (const char* args :
       {"--compute-cost inf", "--reduce-cost nan", "--signal-latency -inf", "--compute-cost 1e400"}) {
    SCOPED_TRACE(args);
    EXPECT_TRUE(refused_with(std::string("plan --preset paper-example ") + args, "is not a finite number"));
  }
}

TEST(Cli, PlanRefusesNegativeCosts) {
  EXPECT_TRUE(refused_with("plan --preset paper-example --reduce-cost -0.5", "--reduce-cost: -0.5 is below 0"));
  EXPECT_TRUE(refused_with("plan --preset paper-example --signal-latency -1", "--signal-latency: -1 is below 0"));
  EXPECT_TRUE(refused_with("plan --preset paper-example --compute-cost 0", "--compute-cost must be > 0"));
  EXPECT_TRUE(refused_with("plan --preset paper-example --job-overhead -1", "--job-overhead: -1 is below 0"));
  EXPECT_TRUE(refused_with("plan --preset paper-example --jitter 0.6", "--jitter must be in [0, 0.5]"));
}

TEST(Cli, PlanWithJitterAndJobOverheadReportsThem) {
  const Output out = run("plan --preset paper-example --jitter 0.2 --job-overhead 1 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json costs = parse_json(out.text)["problem"]["costs"];
  EXPECT_EQ(costs["jitter"].number, 0.2);
  EXPECT_EQ(costs["job_overhead"].number, 1);
}

TEST(Cli, PlanPaperExampleJson) {
  const Output out = run("plan --preset paper-example --json");
  ASSERT_EQ(out.status, 0);
  const Json report = parse_json(out.text);
  EXPECT_EQ(report["recommended"].string, "symmetric-shift");
  EXPECT_EQ(report["auto"].string, "shortest-first");
  const Json& problem = report["problem"];
  EXPECT_EQ(problem["num_kv_tiles"].number, 8);
  EXPECT_EQ(problem["num_q_tiles"].number, 8);
  EXPECT_EQ(problem["sms"].number, 4);
  EXPECT_TRUE(problem["causal"].boolean);
  ASSERT_EQ(report["schedules"].array.size(), 6u);
  for (const Json& s : report["schedules"].array) {
    for (const char* key : {"name", "valid", "reason", "deadlock_free", "critical_path", "makespan", "bubble_fraction",
                            "lemma_violations"}) {
      EXPECT_TRUE(s.has(key)) << key;
    }
  }
  const Json& symmetric = find_schedule(report, "symmetric-shift");
  EXPECT_TRUE(symmetric["valid"].boolean);
  EXPECT_TRUE(symmetric["deadlock_free"].boolean);
  // n + 1 = 9 tile visits per CTA, each c + r = 1 + 0.25, with no stall.
  EXPECT_DOUBLE_EQ(symmetric["makespan"].number, 9 * (1 + 0.25));
  EXPECT_DOUBLE_EQ(symmetric["critical_path"].number, 9 * (1 + 0.25));
  EXPECT_EQ(symmetric["lemma_violations"].number, 0);
  const Json& shift = find_schedule(report, "shift");
  EXPECT_FALSE(shift["valid"].boolean);
  EXPECT_NE(shift["reason"].string.find("full mask"), std::string::npos);
}

TEST(Cli, PlanScheduleFilter) {
  const Output out = run("plan --preset paper-example --schedule auto --json");
  ASSERT_EQ(out.status, 0);
  const Json report = parse_json(out.text);
  ASSERT_EQ(report["schedules"].array.size(), 1u);
  EXPECT_EQ(report["schedules"].array[0]["name"].string, "shortest-first");
}

TEST(Cli, PlanFullMaskRecommendsShift) {
  const Output out = run("plan --batch 2 --heads 8 --seqlen 2048 --head-dim 64 --json");
  ASSERT_EQ(out.status, 0);
  const Json report = parse_json(out.text);
  EXPECT_EQ(report["recommended"].string, "shift");
  EXPECT_EQ(report["auto"].string, "shift");
  EXPECT_FALSE(report["problem"]["causal"].boolean);
  const Output text = run("plan --batch 2 --heads 8 --seqlen 2048 --head-dim 64");
  EXPECT_NE(text.text.find("recommended: shift"), std::string::npos) << text.text;
}

// plan names the forward kernel the library runs (forward_kernel_choice): the short, tall and wide tiles from the
// measured lengths on a dense batch, the base tiles under a window and on a varlen batch at any length; and how its
// CTAs share the tiles: dealt round robin where all are equally long (a dense full mask), else taken from a counter
// (causal, any window, varlen).
TEST(Cli, PlanNamesTheForwardTiles) {
  struct Case {
    const char* flags;
    const char* tiles;
    int block_kv;
    const char* dispatch;  // how the CTAs share the tiles (schedule/forward_tile_order.hpp)
    bool may_pair;         // forward_may_pair: CTA pairs in builds that have them (DASH_FORWARD_PAIRED_CTAS)
  };
  const Case cases[] = {
      {"--batch 2 --seqlen 4096 --head-dim 128", "forward: 128x176 tiles (wide key tiles", 176, "round-robin", true},
      {"--batch 2 --seqlen 1024 --head-dim 128", "forward: 128x128 tiles (the head dim's base tiles at this", 128,
       "round-robin", true},
      {"--batch 2 --seqlen 300 --head-dim 128", "forward: 128x128 tiles", 128, "round-robin", false},
      {"--batch 2 --seqlen 4096 --head-dim 64", "forward: 192x128 tiles (tall query tiles", 128, "round-robin", false},
      {"--batch 2 --seqlen 512 --head-dim 64", "forward: 64x128 tiles (short query tiles", 128, "round-robin", false},
      {"--batch 2 --seqlen 4096 --head-dim 128 --window 256,0",
       "forward: 128x128 tiles (the head dim's base tiles, a "
       "left-bounded window's kernel",
       128, "counter", false},
      {"--cu-seqlens 0,4096,8192 --head-dim 128", "forward: 128x128 tiles (the head dim's base tiles, which varlen",
       128, "counter", false},
      {"--batch 1 --seqlen 4096 --head-dim 256", "forward: 128x80 tiles", 80, "round-robin", true},
      {"--batch 2 --seqlen 4096 --head-dim 128 --causal", "forward: 128x128 tiles", 128, "counter", false},
      {"--batch 2 --seqlen 4096 --head-dim 128 --window -1,64", "forward: 128x128 tiles", 128, "counter", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const Output text = run(std::string("plan --heads 8 ") + c.flags);
    ASSERT_EQ(text.status, 0) << text.text;
    EXPECT_NE(text.text.find(c.tiles), std::string::npos) << text.text;
    const Output json = run(std::string("plan --heads 8 --json ") + c.flags);
    ASSERT_EQ(json.status, 0) << json.text;
    EXPECT_EQ(parse_json(json.text)["forward_tile"]["block_kv"].number, c.block_kv);
    EXPECT_EQ(parse_json(json.text)["forward_tile"]["dispatch"].string, c.dispatch);
    const bool paired = dash::kForwardPairedCtasBuilt && c.may_pair;
    EXPECT_EQ(parse_json(json.text)["forward_tile"]["paired"].boolean, paired);
    EXPECT_EQ(text.text.find("in CTA pairs") != std::string::npos, paired) << text.text;
    const std::string dispatch_words =
        std::string(c.dispatch) == "counter" ? "from a counter" : "dealt to the CTAs round robin";
    EXPECT_NE(text.text.find(dispatch_words), std::string::npos) << text.text;
  }
}

// A sliding window is planned as the library plans the shape's window: the mask reaches the JSON in
// FlashAttention's terms, symmetric shift folds the causal band (head dim 128: a slope of 2), shift says why it
// does not apply, and auto keeps to shortest-first.
TEST(Cli, PlanWithASlidingWindow) {
  const Output out = run("plan --batch 8 --heads 16 --seqlen 2048 --head-dim 128 --causal --window-left 1023 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  const Json& problem = report["problem"];
  EXPECT_TRUE(problem["causal"].boolean);
  EXPECT_EQ(problem["window_left"].number, 1023);
  EXPECT_EQ(problem["window_right"].number, 0);
  EXPECT_EQ(report["auto"].string, "shortest-first");
  EXPECT_NE(report["auto_reason"].string.find("sliding window"), std::string::npos);
  EXPECT_EQ(report["recommended"].string, "symmetric-shift");
  const Json& symmetric = find_schedule(report, "symmetric-shift");
  EXPECT_TRUE(symmetric["valid"].boolean);
  EXPECT_EQ(symmetric["lemma_violations"].number, 0);
  // 16 key/value tiles, bands of 18 query tiles: 8 full bands and 4 folded pairs per head, 128 heads on 132 CTAs:
  // ceil(128 * 12 / 132) = 12 waves of 18 visits.
  EXPECT_DOUBLE_EQ(symmetric["makespan"].number, 12 * 18 * 1.25);
  EXPECT_NE(find_schedule(report, "shift")["reason"].string.find("full mask"), std::string::npos);
  // A right bound of 0 is the causal mask's; the table names the window after the tiles.
  const Output table =
      run("plan --batch 8 --heads 16 --seqlen 2048 --head-dim 128 --window-left 1023 "
          "--window-right 0");
  ASSERT_EQ(table.status, 0) << table.text;
  EXPECT_NE(table.text.find("; sliding window left 1023, right 0 (causal)\n"), std::string::npos) << table.text;
  // Two-sided: symmetric shift needs a right bound of 0.
  const Output two_sided = run("plan --seqlen 2048 --head-dim 64 --window-left 300 --window-right 100 --json");
  ASSERT_EQ(two_sided.status, 0) << two_sided.text;
  const Json two = parse_json(two_sided.text);
  EXPECT_FALSE(two["problem"]["causal"].boolean);
  EXPECT_EQ(two["problem"]["window_right"].number, 100);
  EXPECT_NE(find_schedule(two, "symmetric-shift")["reason"].string.find("right bound at 0"), std::string::npos);
  // Without a window the problem says so with -1 (and 0 on the right of the causal mask).
  const Output none = run("plan --preset paper-example --json");
  ASSERT_EQ(none.status, 0);
  EXPECT_EQ(parse_json(none.text)["problem"]["window_left"].number, -1);
  EXPECT_EQ(parse_json(none.text)["problem"]["window_right"].number, 0);
}

TEST(Cli, WindowFlagsAreCheckedLikeTheShapes) {
  EXPECT_TRUE(refused_with("plan --window-left -2", "--window-left: -2 is outside [-1, 16777216]"));
  EXPECT_TRUE(refused_with("emulate --window-right x", "--window-right: 'x' is not an integer"));
  EXPECT_TRUE(
      refused_with("plan --preset paper-example --window-left 100", "--preset sets the shape; drop --window-left"));
}

// --window L,R is the same window as --window-left L --window-right R, in every command; check and bench also
// take --softcap. Their bad values are refused as bad command lines, and values the library refuses with its
// message, before any device check.
TEST(Cli, WindowPairAndSoftcapFlags) {
  const Output pair = run("plan --seqlen 2048 --head-dim 64 --window 300,100 --json");
  ASSERT_EQ(pair.status, 0) << pair.text;
  const Output separate = run("plan --seqlen 2048 --head-dim 64 --window-left 300 --window-right 100 --json");
  ASSERT_EQ(separate.status, 0) << separate.text;
  EXPECT_EQ(pair.text, separate.text);
  for (const char* command : {"plan", "emulate", "check", "bench"}) {
    SCOPED_TRACE(command);
    const std::string c = command;
    EXPECT_TRUE(refused_with(c + " --window 5", "--window takes two bounds, L,R (-1 for an open side), got 1"));
    EXPECT_TRUE(refused_with(c + " --window 5,6,7", "--window takes two bounds, L,R (-1 for an open side), got 3"));
    EXPECT_TRUE(refused_with(c + " --window -2,0", "--window: "));
    EXPECT_TRUE(refused_with(c + " --window 5,6 --window-left 3",
                             "--window L,R sets both bounds: give it or --window-left/--window-right, not both"));
  }
  for (const char* command : {"check", "bench"}) {
    SCOPED_TRACE(command);
    const std::string c = command;
    EXPECT_TRUE(refused_with(c + " --softcap -1", "--softcap: -1 is below 0"));
    EXPECT_TRUE(refused_with(c + " --softcap nan", "--softcap: 'nan' is not a finite number"));
    // The library's rule (softmax_scale / softcap finite), in its words.
    EXPECT_TRUE(refused_with(c + " --head-dim 64 --softcap 1e-40",
                             "the library refuses this shape: shape.softcap must be 0 or large enough"));
  }
  for (const char* command : {"plan", "emulate"}) {
    EXPECT_NE(run(std::string(command) + " --help").text.find("--window L,R"), std::string::npos) << command;
  }
}

TEST(Cli, EmulateWithASlidingWindow) {
  const Output out =
      run("emulate --heads 2 --seqlen 256 --head-dim 16 --block-q 16 --block-kv 32 --sms 5 --causal "
          "--window-left 63 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_TRUE(report["ok"].boolean);
  EXPECT_EQ(report["problem"]["window_left"].number, 63);
  const Json& symmetric = find_schedule(report, "symmetric-shift");
  EXPECT_TRUE(symmetric["valid"].boolean);
  EXPECT_TRUE(symmetric["bitwise_identical"].boolean);
  EXPECT_TRUE(symmetric["within_tolerance"].boolean);
}

// --- varlen batches (--cu-seqlens): plan and emulate model them, check and bench run the kernels on them ---------

TEST(Cli, VarlenAndWindowFlagsAreOfferedByEveryCommand) {
  for (const char* command : {"plan", "prove", "emulate", "check", "bench"}) {
    SCOPED_TRACE(command);
    const Output help = run(std::string(command) + " --help");
    ASSERT_EQ(help.status, 0);
    for (const char* flag : {"--cu-seqlens OFFSETS", "--cu-seqlens-k OFFSETS", "--keys-within-queries", "--window L,R",
                             "--window-left", "--window-right"}) {
      EXPECT_NE(help.text.find(flag), std::string::npos) << flag;
    }
  }
}

// prove plans and proves a sliding window as the library does, and a varlen batch from its maxima for every length
// it admits; --reference's expanding validator agrees (on the batch's own lengths).
TEST(Cli, ProveTakesAWindowAndAVarlenBatch) {
  const Output windowed = run("prove --heads 4 --seqlen 1000 --causal --window 100,0 --sms 13 --reference");
  ASSERT_EQ(windowed.status, 0) << windowed.text;
  EXPECT_NE(windowed.text.find("sliding window left 100, right 0"), std::string::npos) << windowed.text;
  EXPECT_EQ(windowed.text.find("disagrees"), std::string::npos) << windowed.text;
  const Output varlen = run("prove --cu-seqlens 0,100,100,700 --heads 4 --sms 13 --reference");
  ASSERT_EQ(varlen.status, 0) << varlen.text;
  EXPECT_NE(varlen.text.find("varlen:  3 sequences, 700 query and 700 key tokens"), std::string::npos) << varlen.text;
  EXPECT_NE(varlen.text.find("lengths: 100/100, 0/0, 600/600"), std::string::npos) << varlen.text;
  std::istringstream lines(varlen.text);
  int proven = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("  valid (by structure)") != std::string::npos) ++proven;
    EXPECT_EQ(line.find("disagrees"), std::string::npos) << line;
  }
  EXPECT_EQ(proven, 5) << "every schedule of the full mask but symmetric shift: " << varlen.text;
  // Without the promise (keys of their own) the shift schedules are refused, naming the flag that makes it.
  const Output own_keys = run("prove --cu-seqlens 0,100,700 --cu-seqlens-k 0,50,400 --heads 4 --schedule shift");
  EXPECT_EQ(own_keys.status, 0) << own_keys.text;
  EXPECT_NE(own_keys.text.find("--keys-within-queries makes the promise"), std::string::npos) << own_keys.text;
  EXPECT_TRUE(refused_with("prove --cu-seqlens 0,100 --enumerate", "drop --enumerate or --cu-seqlens"));
  EXPECT_TRUE(refused_with("prove --window 1,2,3", "--window takes two bounds"));
}

// --- size bounds: a command refuses a shape past its stated bound, naming it and the flags, instead of running for
// hours or running out of memory -------------------------------------------------------------------------------

TEST(Cli, ProveReferenceRefusesAnExpansionPastItsBound) {
  // 1 x 8 x 2^20 is 2^30 visits (about 48 GiB expanded): std::bad_alloc before the bound existed.
  EXPECT_TRUE(refused_with("prove --heads 8 --seqlen 1048576 --reference",
                           "--reference expands every tile visit of the shape, 1073741824 of them"));
  EXPECT_TRUE(refused_with("prove --heads 8 --seqlen 1048576 --reference", "at most 67108864 (2^26"));
  // Negative control: the proof itself, by structure, expands nothing and takes the shape.
  const Output proof = run("prove --heads 8 --seqlen 1048576 --schedule ascending");
  EXPECT_EQ(proof.status, 0) << proof.text;
  EXPECT_NE(proof.text.find("valid (by structure)"), std::string::npos) << proof.text;
}

TEST(Cli, EmulateRefusesARunEstimatedPastItsBound) {
  // 1x1 tiles at seqlen 4096: about half a billion delayed reductions.
  EXPECT_TRUE(refused_with("emulate --block-q 1 --block-kv 1 --seqlen 4096 --heads 1",
                           "at most 600 s are allowed: lower --runs, --max-delay-us"));
  // Its float64 reference alone is bounded too.
  EXPECT_TRUE(
      refused_with("emulate --seqlen 65536 --heads 8 --head-dim 128", "the float64 reference of this shape has"));
  // Negative control: the defaults, and the same tiles on a small shape, run and finish.
  const Output small = run("emulate --block-q 1 --block-kv 1 --seqlen 32 --runs 2 --schedule ascending");
  EXPECT_EQ(small.status, 0) << small.text;
}

TEST(Cli, CheckRefusesAReferencePastItsBoundBeforeTheDevice) {
  EXPECT_TRUE(refused_with("check --heads 16 --seqlen 16384", "the float64 reference of this shape has"));
  EXPECT_TRUE(refused_with("check --heads 16 --seqlen 16384", "at most 68719476736 (2^36"));
  EXPECT_TRUE(refused_with("check --cu-seqlens 0,65536,131072 --heads 16", "summed over the batch"));
  // Negative control: a small shape passes the bound (and meets the device check, or runs, on a GPU).
  const Output small = run("check --heads 1 --seqlen 128 --head-dim 64 --schedule ascending --runs 1",
                           /*want_stderr=*/true);
  EXPECT_NE(small.status, 2) << small.text;
}

TEST(Cli, PlanNamesItsBoundAndTheFlags) {
  EXPECT_TRUE(refused_with("plan --seqlen 65536 --heads 64", "at most 16777216 (2^24) are supported"));
  EXPECT_TRUE(refused_with("plan --seqlen 65536 --heads 64", "lower --batch, --heads, --seqlen"));
}

// Whether `text` is well-formed UTF-8 (RFC 3629).
bool valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length = 1;
    unsigned low = 0x80, high = 0xBF;
    if (lead < 0x80) {
      ++i;
      continue;
    }
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      low = lead == 0xE0 ? 0xA0 : low;
      high = lead == 0xED ? 0x9F : high;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      low = lead == 0xF0 ? 0x90 : low;
      high = lead == 0xF4 ? 0x8F : high;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if (c < (k == 1 ? low : 0x80) || c > (k == 1 ? high : 0xBF)) return false;
    }
    i += length;
  }
  return true;
}

// An argument may hold any bytes; --json prints valid UTF-8 whatever they are, each ill-formed byte as U+FFFD, and
// keeps well-formed multibyte characters.
TEST(Cli, JsonIsValidUtf8WhateverTheArgumentsHold) {
  const std::string directory = testing::TempDir();
  const std::string name = "dash_attn_test_\xff\xfe_\xc3\xa9_\xed\xa0\x80.svg";
  const Output out = run("plan --seqlen 512 --heads 1 --schedule ascending --json --svg '" + directory + name + "'");
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_TRUE(valid_utf8(out.text));
  const Json report = parse_json(out.text);
  const std::string svg = report["svg"].string;
  EXPECT_NE(svg.find("dash_attn_test_\xef\xbf\xbd\xef\xbf\xbd_\xc3\xa9_"), std::string::npos) << svg;
  EXPECT_EQ(svg.find('\xff'), std::string::npos);
  std::remove((directory + name).c_str());
}

// Self-attention (no --cu-seqlens-k): the keys are the queries, so the plan promises seqlen_k <= seqlen_q and every
// schedule of the mask is planned from the maxima, proven, and fitted to the lengths: one job per key/value tile of
// each of a sequence's 16 heads (128-row key/value tiles at head dim 64), none for the empty sequence.
TEST(Cli, PlanVarlenSelfAttention) {
  const Output out = run("plan --cu-seqlens 0,100,100,3100 --causal --head-dim 64 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  const Json& problem = report["problem"];
  EXPECT_EQ(problem["batch"].number, 3);
  EXPECT_EQ(problem["seqlen_q"].number, 3000);
  EXPECT_EQ(problem["seqlen_k"].number, 3000);
  const Json& varlen = report["varlen"];
  EXPECT_EQ(varlen["sequences"].number, 3);
  EXPECT_TRUE(varlen["keys_within_queries"].boolean);
  ASSERT_EQ(varlen["seqlen_q"].array.size(), 3u);
  EXPECT_EQ(varlen["seqlen_q"].array[0].number, 100);
  EXPECT_EQ(varlen["seqlen_q"].array[1].number, 0);
  EXPECT_EQ(varlen["seqlen_k"].array[2].number, 3000);
  EXPECT_EQ(report["auto"].string, "shortest-first");
  for (const char* name : {"ascending", "descending", "shortest-first", "symmetric-shift", "nondeterministic"}) {
    SCOPED_TRACE(name);
    const Json& s = find_schedule(report, name);
    EXPECT_TRUE(s["valid"].boolean) << s["reason"].string;
    EXPECT_TRUE(s["proven_for_every_length"].boolean);
    EXPECT_TRUE(s["deadlock_free"].boolean);
    EXPECT_GT(s["makespan"].number, 0);
    const Json& jobs = s["jobs_per_sequence"];
    ASSERT_EQ(jobs.array.size(), 3u);
    EXPECT_EQ(jobs.array[0].number, 16 * 1);
    EXPECT_EQ(jobs.array[1].number, 0);
    EXPECT_EQ(jobs.array[2].number, 16 * 24);
  }
  const Json& shift = find_schedule(report, "shift");
  EXPECT_FALSE(shift["valid"].boolean);
  EXPECT_TRUE(shift["jobs_per_sequence"].array.empty());

  const Output table = run("plan --cu-seqlens 0,100,100,3100 --causal --head-dim 64");
  ASSERT_EQ(table.status, 0) << table.text;
  EXPECT_NE(table.text.find("varlen:  3 sequences, 3100 query and 3100 key tokens; every seqlen_k <= seqlen_q"),
            std::string::npos)
      << table.text;
  EXPECT_NE(table.text.find("sequences: 3, the jobs fitted to each by shortest-first"), std::string::npos)
      << table.text;
  EXPECT_NE(table.text.find("\n2                  3000         3000           24           24          384\n"),
            std::string::npos)
      << table.text;
}

// Keys of their own (--cu-seqlens-k) make no promise: the dynamic schedules take keys longer than queries, shift
// is refused with the planner's reason and a hint; auto, under the full mask on lengths short of the maxima, runs
// shortest-first.
TEST(Cli, PlanVarlenWithKeysOfTheirOwn) {
  const Output out = run("plan --cu-seqlens 0,100,100,3100 --cu-seqlens-k 0,300,310,2810 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_EQ(report["problem"]["seqlen_q"].number, 3000);
  EXPECT_EQ(report["problem"]["seqlen_k"].number, 2500);
  EXPECT_FALSE(report["varlen"]["keys_within_queries"].boolean);
  EXPECT_EQ(report["varlen"]["seqlen_k"].array[0].number, 300);
  const Json& shift = find_schedule(report, "shift");
  EXPECT_FALSE(shift["valid"].boolean);
  EXPECT_FALSE(shift["proven_for_every_length"].boolean);
  EXPECT_NE(shift["reason"].string.find("keys_within_queries"), std::string::npos) << shift["reason"].string;
  EXPECT_NE(shift["reason"].string.find("(--keys-within-queries makes the promise)"), std::string::npos);
  EXPECT_EQ(report["auto"].string, "shortest-first");
  EXPECT_NE(report["auto_reason"].string.find("shorter than the maxima: shortest-first"), std::string::npos)
      << report["auto_reason"].string;
  // 128-row key/value tiles (head dim 128): 3, 1 and 20 per head of 16 heads.
  const Json& jobs = find_schedule(report, "ascending")["jobs_per_sequence"];
  EXPECT_EQ(jobs.array.at(0).number, 16 * 3);
  EXPECT_EQ(jobs.array.at(1).number, 16 * 1);
  EXPECT_EQ(jobs.array.at(2).number, 16 * 20);
}

// auto under the full mask: shift where every sequence is at the maxima (with the promise; ascending without it), as
// for the dense maximum problem, and shortest-first where the lengths' sums show some sequence shorter.
TEST(Cli, PlanVarlenAutoUnderTheFullMaskReadsWhetherTheLengthsFillTheMaxima) {
  const auto auto_of = [](const std::string& flags) {
    const Output out = run("plan " + flags + " --json");
    EXPECT_EQ(out.status, 0) << out.text;
    const Json report = parse_json(out.text);
    return report["auto"].string + ": " + report["auto_reason"].string;
  };
  const std::string equal = auto_of("--cu-seqlens 0,1000,2000");
  EXPECT_EQ(equal.rfind("shift: full mask", 0), 0U) << equal;
  const std::string ragged = auto_of("--cu-seqlens 0,1000,2500");
  EXPECT_EQ(ragged.rfind("shortest-first: full mask on a varlen batch", 0), 0U) << ragged;
  const std::string unpromised = auto_of("--cu-seqlens 0,1000,2000 --cu-seqlens-k 0,1000,2000");
  EXPECT_EQ(unpromised.rfind("ascending: ", 0), 0U) << unpromised;
  EXPECT_NE(unpromised.find("but this varlen batch refuses shift, so ascending"), std::string::npos) << unpromised;
  // --seqlen above the longest sequence: the maxima are not filled.
  const std::string raised = auto_of("--cu-seqlens 0,1000,2000 --seqlen 1024");
  EXPECT_EQ(raised.rfind("shortest-first: ", 0), 0U) << raised;
}

// A schedule asked for by name that a dense shape refuses: the report, the reason on stderr, exit code 1, as for
// varlen batches; a schedule the shape accepts still exits 0.
TEST(Cli, PlanRefusedScheduleFails) {
  const std::string args = "plan --seqlen 1000 --seqlen-k 2000 --causal --schedule shift";
  const Output table = run(args);
  EXPECT_EQ(table.status, 1);
  EXPECT_NE(table.text.find("shift            no"), std::string::npos) << table.text;
  const Output err = run(args, /*want_stderr=*/true);
  EXPECT_NE(err.text.find("dash-attn plan: shift: shift needs the full mask"), std::string::npos) << err.text;
  const Output json = run(args + " --json");
  EXPECT_EQ(json.status, 1);
  EXPECT_FALSE(parse_json(json.text)["schedules"].array.at(0)["valid"].boolean);
  EXPECT_EQ(run("plan --seqlen 1000 --seqlen-k 2000 --causal --schedule shortest-first").status, 0);
}

// A schedule asked for by name that the batch refuses: the report, the planner's reason on stderr, exit code 1.
TEST(Cli, PlanVarlenRefusedScheduleFails) {
  const std::string args = "plan --cu-seqlens 0,100,3100 --cu-seqlens-k 0,90,2590 --schedule shift";
  const Output table = run(args);
  EXPECT_EQ(table.status, 1);
  EXPECT_NE(table.text.find("shift            no"), std::string::npos) << table.text;
  const Output err = run(args, /*want_stderr=*/true);
  EXPECT_NE(err.text.find("dash-attn plan: shift on this varlen batch: shift is proven for varlen batches only where "
                          "every sequence has seqlen_k <= seqlen_q"),
            std::string::npos)
      << err.text;
  const Output json = run(args + " --json");
  EXPECT_EQ(json.status, 1);
  const Json report = parse_json(json.text);
  ASSERT_EQ(report["schedules"].array.size(), 1u);
  EXPECT_FALSE(report["schedules"].array[0]["valid"].boolean);
  // Symmetric shift under a sliding window is refused for every promise.
  const Output window = run("plan --cu-seqlens 0,1000,3000 --causal --window-left 511 --schedule symmetric-shift");
  EXPECT_EQ(window.status, 1);
  EXPECT_NE(window.text.find("symmetric-shift under a sliding window is not proven for varlen batches"),
            std::string::npos)
      << window.text;
}

// --keys-within-queries promises what self-attention gives: shift (full mask) is then planned, proven and fitted.
TEST(Cli, PlanVarlenWithThePromise) {
  const Output out =
      run("plan --cu-seqlens 0,100,3100 --cu-seqlens-k 0,90,2590 --keys-within-queries --schedule shift --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_TRUE(report["varlen"]["keys_within_queries"].boolean);
  const Json& shift = find_schedule(report, "shift");
  EXPECT_TRUE(shift["valid"].boolean) << shift["reason"].string;
  EXPECT_TRUE(shift["proven_for_every_length"].boolean);
  EXPECT_EQ(shift["jobs_per_sequence"].array.at(1).number, 16 * 20);
}

// --seqlen-q and --seqlen-k give the maxima the plan is made for (FlashAttention's max_seqlen_q, max_seqlen_k).
TEST(Cli, PlanVarlenMaximaFromTheSeqlenFlags) {
  const Output out = run("plan --cu-seqlens 0,100,300 --seqlen-q 512 --seqlen-k 1024 --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_EQ(report["problem"]["seqlen_q"].number, 512);
  EXPECT_EQ(report["problem"]["seqlen_k"].number, 1024);
  EXPECT_EQ(report["problem"]["num_kv_tiles"].number, 8);
  // Every sequence empty: the maxima must be given.
  const Output empty = run("plan --cu-seqlens 0,0,0 --seqlen 256 --json");
  ASSERT_EQ(empty.status, 0) << empty.text;
  EXPECT_EQ(find_schedule(parse_json(empty.text), "shortest-first")["jobs_per_sequence"].array.at(1).number, 0);
}

TEST(Cli, PlanVarlenWritesGanttSvg) {
  const std::string path = testing::TempDir() + "dash_attn_test_varlen_gantt.svg";
  std::remove(path.c_str());
  const Output out = run("plan --cu-seqlens 0,100,1100 --causal --sms 8 --schedule symmetric-shift --svg " + path);
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("Gantt chart of symmetric-shift written to " + path), std::string::npos) << out.text;
  std::ifstream file(path);
  ASSERT_TRUE(file.good());
  std::stringstream content;
  content << file.rdbuf();
  EXPECT_NE(content.str().find("varlen: 2 sequences, 1100 query and 1100 key tokens"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Cli, VarlenBadCommandLines) {
  const std::pair<const char*, const char*> cases[] = {
      {"--cu-seqlens 0,100,x", "--cu-seqlens: 'x' (entry 2 of '0,100,x') is not an integer"},
      {"--cu-seqlens 0,-3", "--cu-seqlens: -3 (entry 1 of '0,-3') is outside [0, 2147483647]"},
      {"--cu-seqlens 0,3000000000", "--cu-seqlens: 3000000000 (entry 1 of '0,3000000000') is outside"},
      {"--cu-seqlens=", "--cu-seqlens: the list is empty"},
      {"--cu-seqlens 0,,5", "--cu-seqlens: entry 1 of '0,,5' is empty"},
      {"--cu-seqlens 0", "--cu-seqlens: 1 offset; a batch of b sequences needs b + 1"},
      {"--cu-seqlens 5,100", "--cu-seqlens: the first offset is 5; offsets start at 0"},
      {"--cu-seqlens 0,100,50", "--cu-seqlens: entry 2 (50) is below entry 1 (100): offsets never decrease"},
      {"--cu-seqlens 0,100 --cu-seqlens-k 0,50,40", "--cu-seqlens-k: entry 2 (40) is below entry 1 (50)"},
      {"--cu-seqlens 0,100 --cu-seqlens-k 0,10,20", "--cu-seqlens-k has 3 offsets and --cu-seqlens 2"},
      {"--cu-seqlens 0,0,0",
       "--cu-seqlens: every sequence has 0 queries; give the maximum the plan is for with "
       "--seqlen-q"},
      {"--cu-seqlens 0,100 --cu-seqlens-k 0,0", "--cu-seqlens-k: every sequence has 0 keys"},
      {"--cu-seqlens 0,100,5000 --seqlen-q 2048",
       "--cu-seqlens: sequence 1 has 4900 queries, more than --seqlen-q 2048, the maximum the plan is made for: "
       "every sequence must be within it"},
      {"--cu-seqlens 0,100,5000 --seqlen 2048", "sequence 1 has 4900 queries, more than --seqlen 2048"},
      {"--cu-seqlens 0,100,5000 --seqlen-k 2048", "--cu-seqlens: sequence 1 has 4900 keys, more than --seqlen-k 2048"},
      {"--cu-seqlens 0,10 --cu-seqlens-k 0,3000 --seqlen-k 2048", "--cu-seqlens-k: sequence 0 has 3000 keys"},
      {"--cu-seqlens 0,20000000", "sequence 0 has 20000000 queries, more than 16777216, the most --seqlen-q takes"},
      {"--cu-seqlens 0,100,200 --cu-seqlens-k 0,50,200 --keys-within-queries",
       "--keys-within-queries promises seqlen_k <= seqlen_q in every sequence, but sequence 1 has 150 keys "
       "(--cu-seqlens-k) and 100 queries (--cu-seqlens)"},
      {"--cu-seqlens 0,100 --batch 1", "--batch does not combine with --cu-seqlens"},
      {"--cu-seqlens-k 0,100", "--cu-seqlens-k describes a varlen batch: it needs --cu-seqlens"},
      {"--keys-within-queries", "--keys-within-queries describes a varlen batch: it needs --cu-seqlens"},
  };
  // check and bench refuse them before any device check (without a GPU it would exit 1, "needs a Hopper GPU").
  for (const char* command : {"plan", "emulate", "check", "bench"}) {
    for (const auto& [args, message] : cases) {
      SCOPED_TRACE(std::string(command) + " " + args);
      EXPECT_TRUE(refused_with(std::string(command) + " " + args, message));
    }
  }
  EXPECT_TRUE(
      refused_with("plan --preset paper-example --cu-seqlens 0,100", "--preset sets the shape; drop --cu-seqlens"));
  EXPECT_TRUE(refused_with("plan --cu-seqlens 0,2000000", "the library refuses this shape: shape.seqlen_q must be <="));
}

// What the GPU commands add to the varlen flags' checks, all before the device check: the library's refusals of the
// maximum shape, and for bench the SDPA anchors (dense) and a batch without rows.
TEST(Cli, CheckAndBenchRefuseVarlenBatchesTheKernelsCannotRunBeforeTheDeviceCheck) {
  for (const char* command : {"check", "bench"}) {
    SCOPED_TRACE(command);
    const std::string c = command;
    EXPECT_TRUE(refused_with(c + " --cu-seqlens 0,100 --head-dim 80",
                             "the library refuses this shape: shape.head_dim must be one of"));
    EXPECT_TRUE(
        refused_with(c + " --cu-seqlens 0,2000000", "the library refuses this shape: shape.seqlen_q must be <="));
    EXPECT_TRUE(
        refused_with(c + " --cu-seqlens 0,100 --heads 4 --heads-kv 3", "--heads-kv 3 does not divide --heads 4"));
    // softcap composes with varlen: no bad command line (a build without the kernels says so after the device
    // check), one short run where a GPU takes it.
    const std::string once =
        c == "check" ? " --runs 1 --schedule ascending" : " --iters 1 --warmup 0 --schedule ascending";
    const Output softcap = run(c + " --cu-seqlens 0,100,300 --causal --softcap 30" + once, /*want_stderr=*/true);
    EXPECT_NE(softcap.status, 2) << softcap.text;
  }
  EXPECT_TRUE(refused_with("bench --cu-seqlens 0,100 --anchors anchors.csv",
                           "--anchors merges SDPA measurements of dense shapes; it does not combine with "
                           "--cu-seqlens"));
  EXPECT_TRUE(refused_with("bench --cu-seqlens 0,0,0 --seqlen 256",
                           "--cu-seqlens: the batch has no query tokens, so nothing to time"));
  EXPECT_TRUE(refused_with("bench --fwd --cu-seqlens 0,10,20 --cu-seqlens-k 0,0,0 --seqlen-k 64",
                           "--cu-seqlens-k: the batch has no key tokens, so nothing to time"));
  // check packs padding rows after the last sequence, so a batch of empty sequences still has rows to check.
  const Output empty = run("check --cu-seqlens 0,0,0 --seqlen 256 --heads 1 --runs 1 --schedule ascending",
                           /*want_stderr=*/true);
  EXPECT_NE(empty.status, 2) << empty.text;
}

// A varlen command line the flags accept gets past them: without a GPU to the device check's message (exit 1), on a
// Hopper GPU it runs (a small batch, one schedule, so that it stays quick there).
TEST(Cli, CheckAndBenchTakeVarlenBatches) {
  const std::string batch =
      "--cu-seqlens 0,0,1,101 --cu-seqlens-k 0,0,1,90 --keys-within-queries --heads 4 "
      "--heads-kv 2 --head-dim 64 --causal --schedule ascending ";
  for (const std::string command : {"check --runs 2 ", "bench --warmup 0 --iters 1 ", "bench --fwd --iters 1 "}) {
    SCOPED_TRACE(command);
    const Output err = run(command + batch, /*want_stderr=*/true);
    const bool cannot_run = err.text.find("needs a Hopper GPU") != std::string::npos ||
                            err.text.find("this build has no varlen kernel") != std::string::npos;
    EXPECT_EQ(err.status, cannot_run ? 1 : 0) << err.text;
  }
}

TEST(Cli, EmulateVarlen) {
  const std::string shape = "emulate --heads 2 --head-dim 16 --block-q 16 --block-kv 32 --sms 5 ";
  const Output out = run(shape + "--cu-seqlens 0,100,100,260,261 --causal --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_TRUE(report["ok"].boolean);
  EXPECT_EQ(report["problem"]["batch"].number, 4);
  EXPECT_EQ(report["problem"]["seqlen_q"].number, 160);
  EXPECT_EQ(report["varlen"]["sequences"].number, 4);
  EXPECT_EQ(report["varlen"]["seqlen_q"].array.at(3).number, 1);
  for (const char* name : {"ascending", "descending", "shortest-first", "symmetric-shift"}) {
    SCOPED_TRACE(name);
    const Json& s = find_schedule(report, name);
    EXPECT_TRUE(s["valid"].boolean) << s["reason"].string;
    EXPECT_TRUE(s["bitwise_identical"].boolean);
    EXPECT_TRUE(s["within_tolerance"].boolean);
  }
  const Output table = run(shape + "--cu-seqlens 0,100,100,260,261 --causal --schedule symmetric-shift");
  ASSERT_EQ(table.status, 0) << table.text;
  EXPECT_NE(table.text.find("lengths:   100/100, 0/0, 160/160, 1/1 (seqlen_q/seqlen_k of each sequence)"),
            std::string::npos)
      << table.text;
  // Keys longer than queries under a sliding window: the dynamic schedules take them.
  const Output keys = run(shape +
                          "--cu-seqlens 0,20,20,180 --cu-seqlens-k 0,150,183,184 --causal --window-left 40 "
                          "--schedule auto --json");
  ASSERT_EQ(keys.status, 0) << keys.text;
  const Json k = parse_json(keys.text);
  EXPECT_FALSE(k["varlen"]["keys_within_queries"].boolean);
  EXPECT_EQ(k["problem"]["seqlen_k"].number, 150);
  EXPECT_TRUE(k["bitwise_identical"].boolean);
  EXPECT_TRUE(k["schedules"].array.at(0)["within_tolerance"].boolean);
}

// emulate --softcap caps the scores in the tile arithmetic and in the reference (the emulator's tests check the
// numbers); a negative or non-finite cap is refused naming the flag.
TEST(Cli, EmulateTakesSoftcap) {
  const std::string shape = "emulate --heads 2 --seqlen 200 --head-dim 16 --block-q 16 --block-kv 32 --sms 5 --causal ";
  const Output out = run(shape + "--softcap 0.5 --schedule shortest-first --json");
  ASSERT_EQ(out.status, 0) << out.text;
  const Json report = parse_json(out.text);
  EXPECT_TRUE(report["bitwise_identical"].boolean);
  EXPECT_TRUE(report["schedules"].array.at(0)["within_tolerance"].boolean);
  const Output table = run(shape + "--softcap 0.5 --schedule shortest-first");
  EXPECT_NE(table.text.find("softcap 0.5"), std::string::npos) << table.text;
  for (const char* bad : {"-1", "inf", "nan"}) {
    const Output refused = run(shape + "--softcap " + bad, /*want_stderr=*/true);
    EXPECT_NE(refused.status, 0) << bad;
    EXPECT_NE(refused.text.find("--softcap"), std::string::npos) << refused.text;
  }
}

// As plan: a schedule asked for by name that the batch refuses fails with the planner's reason.
TEST(Cli, EmulateVarlenRefusedScheduleFails) {
  const std::string args = "emulate --cu-seqlens 0,100,300 --cu-seqlens-k 0,90,250 --schedule shift";
  const Output out = run(args);
  EXPECT_EQ(out.status, 1);
  EXPECT_NE(out.text.find("not applicable: shift is proven for varlen batches only where every sequence has "
                          "seqlen_k <= seqlen_q"),
            std::string::npos)
      << out.text;
  const Output promised = run(args + " --keys-within-queries --json");
  ASSERT_EQ(promised.status, 0) << promised.text;
  EXPECT_TRUE(parse_json(promised.text)["bitwise_identical"].boolean);
}

TEST(Cli, PlanWritesGanttSvg) {
  const std::string path = testing::TempDir() + "dash_attn_test_gantt.svg";
  std::remove(path.c_str());
  const Output out = run("plan --preset paper-example --svg " + path);
  ASSERT_EQ(out.status, 0);
  EXPECT_NE(out.text.find("written to " + path), std::string::npos);
  std::ifstream file(path);
  ASSERT_TRUE(file.good());
  std::stringstream content;
  content << file.rdbuf();
  std::string svg = content.str();
  while (!svg.empty() && std::isspace(static_cast<unsigned char>(svg.back()))) svg.pop_back();
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_GE(svg.size(), 6u);
  EXPECT_EQ(svg.substr(svg.size() - 6), "</svg>");
  EXPECT_NE(svg.find("symmetric-shift"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Cli, PaperGridJson) {
  const Output out = run("plan --preset paper-grid --json");
  ASSERT_EQ(out.status, 0);
  const Json report = parse_json(out.text);
  // Head dims {64, 128} x seqlens 512..16384 (6) x {full, causal}.
  ASSERT_EQ(report["grid"].array.size(), 24u);
  for (const Json& point : report["grid"].array) {
    const Json& problem = point["problem"];
    EXPECT_EQ(problem["batch"].number * problem["seqlen_q"].number, 16384);
    EXPECT_EQ(problem["heads_q"].number * problem["head_dim"].number, 2048);
    EXPECT_EQ(problem["sms"].number, 132);
    const char* paper_schedule = problem["causal"].boolean ? "symmetric-shift" : "shift";
    EXPECT_TRUE(find_schedule(point, paper_schedule)["valid"].boolean);
    // The paper grid has one query head per key/value head; shift's rule stops at 64 key/value tiles
    // of 128 rows (seqlen 8192).
    const char* measured_fastest = problem["causal"].boolean            ? "shortest-first"
                                   : problem["seqlen_k"].number <= 8192 ? "shift"
                                                                        : "ascending";
    EXPECT_EQ(point["auto"].string, measured_fastest);
    EXPECT_FALSE(point["auto_reason"].string.empty());
  }
}

// prove plans and proves each schedule as the API does before a first launch; with --reference the expanding
// validator agrees. Heads straddle the 13-CTA waves, so the shift schedules prove several head classes:
// symmetric shift by its structure, or with --enumerate by its visits.
TEST(Cli, ProveEverySchedule) {
  for (const char* how : {"", " --enumerate"}) {
    const bool enumerate = *how != '\0';
    const Output out =
        run(std::string("prove --batch 2 --heads 8 --heads-kv 4 --seqlen 1000 --causal --sms 13 --reference") + how);
    ASSERT_EQ(out.status, 0) << out.text;
    EXPECT_NE(out.text.find("peak-MiB"), std::string::npos) << out.text;
    std::istringstream lines(out.text);
    int proven = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("shift ", 0) == 0) {
        EXPECT_NE(line.find("not planned: shift needs the full mask"), std::string::npos) << line;
      }
      if (line.rfind("symmetric-shift ", 0) == 0) {
        EXPECT_EQ(line.find("valid (by structure)") != std::string::npos, !enumerate) << line;
      }
      if (line.find("  valid") != std::string::npos) ++proven;
      EXPECT_EQ(line.find("disagrees"), std::string::npos) << line;
    }
    EXPECT_EQ(proven, 5) << out.text;
  }
  const Output one = run("prove --batch 2 --heads 8 --seqlen 1000 --schedule auto --threads 1");
  ASSERT_EQ(one.status, 0) << one.text;
  EXPECT_NE(one.text.find("\nshift "), std::string::npos) << "auto runs shift on short full-mask heads: " << one.text;
}

// The backward's tiles at d = 192 (64x96) and 256 (64x80) plan and prove under every schedule they admit: all but
// symmetric shift, whose stride needs block_kv a multiple of block_q (the line names the rule).
TEST(Cli, ProveTakesHeadDims192And256) {
  using Expected = std::pair<const char*, const char*>;  // head dim, its tiles
  for (const auto& [head_dim, tiles] : {Expected{"192", "64x96"}, Expected{"256", "64x80"}}) {
    const Output out = run(
        std::string("prove --batch 2 --heads 8 --heads-kv 4 --seqlen 1000 --causal --sms 13 --reference --head-dim ") +
        head_dim);
    ASSERT_EQ(out.status, 0) << head_dim << ": " << out.text;
    std::istringstream lines(out.text);
    int proven = 0;
    int refused_symmetric = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.find("  valid") != std::string::npos) ++proven;
      EXPECT_EQ(line.find("disagrees"), std::string::npos) << line;
      if (line.rfind("symmetric-shift ", 0) == 0) {
        EXPECT_NE(line.find(std::string("not planned: symmetric-shift needs block_kv to be a multiple of block_q, and "
                                        "the backward's tiles at this head dim are ") +
                            tiles),
                  std::string::npos)
            << line;
        ++refused_symmetric;
      }
    }
    EXPECT_EQ(proven, 4) << head_dim << ": " << out.text;
    EXPECT_EQ(refused_symmetric, 1) << head_dim << ": " << out.text;
  }
}

// At d = 192 and 256 plan refuses symmetric shift with the rule (exit 1, the planner's message on stderr) and names
// the schedules the tiles admit; auto picks shortest-first. emulate runs every accepted schedule on a ragged varlen
// batch at the 64x96 and 64x80 tiles (lengths 1, 63 and one short of, one past and one short of two key tiles) with
// the same bits in every run.
TEST(Cli, HeadDims192And256RefuseSymmetricShiftAndEmulateTheOthers) {
  struct Expected {
    const char* head_dim;
    const char* tiles;
    const char* tile_counts;
    const char* cu_seqlens;
  };
  for (const Expected& e :
       {Expected{"192", "64x96", "block_q 64, block_kv 96; 11 key/value x 16 query tiles", "0,1,64,159,256,447"},
        Expected{"256", "64x80", "block_q 64, block_kv 80; 13 key/value x 16 query tiles", "0,1,64,143,224,383"}}) {
    SCOPED_TRACE(e.head_dim);
    const std::string shape = std::string("--head-dim ") + e.head_dim + " --heads 2 --seqlen 1000 --causal ";
    const Output refused = run("plan " + shape + "--schedule symmetric-shift", /*want_stderr=*/true);
    EXPECT_EQ(refused.status, 1) << refused.text;
    EXPECT_NE(refused.text.find(std::string("dash-attn plan: symmetric-shift: symmetric-shift needs block_kv to be a "
                                            "multiple of block_q, and the backward's tiles at this head dim are ") +
                                e.tiles + " (block_q x block_kv)"),
              std::string::npos)
        << refused.text;
    const Output every = run("plan " + shape);
    ASSERT_EQ(every.status, 0) << every.text;
    EXPECT_NE(every.text.find(std::string("tiles:   ") + e.tile_counts), std::string::npos) << every.text;
    EXPECT_NE(every.text.find("auto picks:  shortest-first"), std::string::npos) << every.text;
    EXPECT_NE(every.text.find("use shortest-first or descending for causal"), std::string::npos) << every.text;
    for (const char* mask : {"--causal", "--window-left 100"}) {
      SCOPED_TRACE(mask);
      const Output out = run(std::string("emulate --head-dim ") + e.head_dim +
                             " --heads 2 --sms 7 --keys-within-queries --json --runs 3 --max-delay-us 20 " +
                             "--cu-seqlens " + e.cu_seqlens + " " + mask);
      ASSERT_EQ(out.status, 0) << out.text;
      const Json report = parse_json(out.text);
      EXPECT_TRUE(report["ok"].boolean);
      for (const char* name : {"ascending", "descending", "shortest-first"}) {
        SCOPED_TRACE(name);
        const Json& s = find_schedule(report, name);
        EXPECT_TRUE(s["valid"].boolean) << s["reason"].string;
        EXPECT_TRUE(s["bitwise_identical"].boolean);
        EXPECT_TRUE(s["within_tolerance"].boolean);
      }
      EXPECT_FALSE(find_schedule(report, "symmetric-shift")["valid"].boolean);
    }
  }
}

TEST(Cli, ProveRefusesWhatTheLibraryRefuses) {
  EXPECT_TRUE(
      refused_with("prove --head-dim 80",
                   "dash-attn prove: the library refuses this shape: shape.head_dim must be one of {64, 96, 128, "
                   "192, 256}"));
  EXPECT_TRUE(refused_with("prove --schedule fastest", "unknown schedule 'fastest'"));
  EXPECT_TRUE(refused_with("prove --threads -1", "usage: dash-attn prove"));
}

TEST(Cli, EmulateReportsBits) {
  // Eight key/value tiles of 32 rows on eight CTAs: eight partials per dQ tile, so the unordered sum
  // changes bits when the arrival order does.
  const std::string shape = "emulate --heads 2 --seqlen 256 --head-dim 16 --block-q 32 --block-kv 32 --sms 8 ";
  const Output ascending = run(shape + "--schedule ascending --json");
  ASSERT_EQ(ascending.status, 0);
  const Json a = parse_json(ascending.text);
  EXPECT_TRUE(a["bitwise_identical"].boolean);
  EXPECT_TRUE(a["schedules"].array.at(0)["within_tolerance"].boolean);
  EXPECT_EQ(a["schedules"].array.at(0)["runs"].number, 5);

  const Output nondeterministic = run(shape + "--schedule nondeterministic --max-delay-us 200 --json");
  ASSERT_EQ(nondeterministic.status, 0);
  const Json n = parse_json(nondeterministic.text);
  EXPECT_FALSE(n["bitwise_identical"].boolean);
  EXPECT_GT(n["schedules"].array.at(0)["distinct_results"].number, 1);

  const Output all = run(shape + "--json");
  ASSERT_EQ(all.status, 0);
  const Json every = parse_json(all.text);
  EXPECT_FALSE(every.has("bitwise_identical"));
  EXPECT_TRUE(every["ok"].boolean);
  for (const char* name : {"ascending", "descending", "shortest-first", "shift"}) {
    EXPECT_TRUE(find_schedule(every, name)["bitwise_identical"].boolean) << name;
  }
  EXPECT_FALSE(find_schedule(every, "symmetric-shift")["valid"].boolean);
}

TEST(Cli, EmulateRejectedScheduleFails) {
  const Output out = run("emulate --causal --schedule shift");
  EXPECT_EQ(out.status, 1);
  EXPECT_NE(out.text.find("not applicable"), std::string::npos) << out.text;
}

}  // namespace
