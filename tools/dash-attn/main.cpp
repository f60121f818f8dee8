// dash-attn: the command-line front of DASH. Owns the subcommand table and the top-level usage; each
// subcommand parses its own flags (options.hpp) and prints its own results.
#include <algorithm>
#include <iostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "options.hpp"

namespace dash::cli {
namespace {

constexpr Command kCommands[] = {
    {"plan", "compare the backward schedules of a shape in the paper's DAG model; Gantt chart (no GPU)", cmd_plan},
    {"prove", "plan and prove schedules as the API does before a first launch: time and peak memory (no GPU)",
     cmd_prove},
    {"emulate", "run schedules on CPU threads with random delays and compare the gradient bits (no GPU)", cmd_emulate},
    {"check", "run the backward N times per schedule on this GPU: bitwise equality and error vs reference", cmd_check},
    {"bench", "time forward or backward (every schedule) on the paper's grid or one shape (GPU)", cmd_bench},
};

// Width of the command-name column of the usage text.
constexpr size_t kNameColumn = 10;

std::string usage() {
  std::string text =
      "usage: dash-attn <command> [flags]\n\n"
      "Deterministic attention backward schedules (DASH): plan, verify and measure them.\n\ncommands:\n";
  for (const Command& c : kCommands) {
    std::string name = c.name;
    name.resize(std::max(name.size() + 1, kNameColumn), ' ');
    text += "  " + name + c.summary + "\n";
  }
  return text + "\nRun 'dash-attn <command> --help' for the flags of a command.\n";
}

int run(std::span<char*> argv) {
  if (argv.size() < 2) {
    std::cerr << usage();
    return kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    std::cout << usage();
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(std::vector<std::string>(argv.begin() + 2, argv.end()));
    } catch (const UsageError& e) {
      std::cerr << "dash-attn " << c.name << ": " << e.what() << "\n\n" << e.usage();
      return kExitUsage;
    }
  }
  std::cerr << "dash-attn: unknown command '" << name << "'\n\n" << usage();
  return kExitUsage;
}

}  // namespace
}  // namespace dash::cli

int main(int argc, char** argv) {
  try {
    return dash::cli::run(std::span<char*>(argv, static_cast<size_t>(argc)));
  } catch (const std::exception& e) {
    std::cerr << "dash-attn: " << e.what() << "\n";
    return dash::cli::kExitFailure;
  }
}
