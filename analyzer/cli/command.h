// The `gpuheap` subcommands, one file each (cmd_*.cpp): each registers its subcommand and
// its options on the app and returns the function that runs it once the line is parsed.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace gpuheap::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand; true (*app) when the line names it
  std::function<int()> run;  // runs it over the options the parse filled in; the exit status
  // Only `run` takes what follows its options (the program): any other command refuses a
  // leftover argument.
  bool takes_program = false;
};

// `verbose`: -v/--verbose of the commands that symbolize, read by main after the command
// (the one summary of the trace's modules not found here, symbolize.h).
Command add_run(CLI::App& app, bool& verbose);
Command add_dump(CLI::App& app);
Command add_summary(CLI::App& app, bool& verbose);
Command add_check(CLI::App& app, bool& verbose);
Command add_diff(CLI::App& app, bool& verbose);
Command add_export(CLI::App& app, bool& verbose);
Command add_report(CLI::App& app, bool& verbose);
Command add_symbolize(CLI::App& app, bool& verbose);
Command add_compress(CLI::App& app);
Command add_replay(CLI::App& app, bool& verbose);
Command add_top(CLI::App& app);

}  // namespace gpuheap::cli
