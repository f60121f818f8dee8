// The dash-attn subcommand table. A subcommand is one function in its own cmd_<name>.cpp; adding one
// takes that file, a line in kCommands (main.cpp) and a line in CMakeLists.txt.
#pragma once

#include <string>
#include <vector>

namespace dash::cli {

// Runs a subcommand on the words after its name and returns the exit code. Throws UsageError
// (options.hpp) for a bad command line.
using CommandFunction = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* summary;
  CommandFunction run;
};

int cmd_plan(const std::vector<std::string>& args);
int cmd_emulate(const std::vector<std::string>& args);
int cmd_check(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_prove(const std::vector<std::string>& args);

}  // namespace dash::cli
