// Options and habits several subcommands share (cmd_*.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "analyzer/model/phases.h"
#include "analyzer/trace/trace_head.h"

namespace gpuheap::cli {

// The TRACE... positional of the commands that read several traces, and their -q/--quiet.
inline constexpr const char* kTracesHelp = "One or more traces (raw or .zst)";
inline constexpr const char* kQuietHelp = "No progress line on stderr (it is shown only on a terminal, after 1 s)";

// Every number option is a finite, non-negative number (cli_options.cpp says why).
const CLI::Validator& finite_non_negative();

// A whole-number option (--top, --depth, --points, ...) from lo to hi: "--top: needs a whole
// number from 1 to 1000000, not '0'" instead of CLI11's "Value 0 not in range 0.000000 to
// 1.797e308".
CLI::Validator whole_number(long long lo, long long hi);
inline constexpr long long kMaxListed = 1000000;  // --top/--depth: "all" without overflow

// What --help says of every SIZE option: one rule for the CLI and GPUHEAP_LIMIT.
inline constexpr const char* kSizeRule =
    "SIZE: a number with a unit, as in GPUHEAP_LIMIT: 8GiB, 512MiB, 64KiB, 100B (bare 0 is 0; 8 is refused)\n";

// Checks a SIZE option (or a ','-separated list of them) as it is parsed (parse_size's rule).
const CLI::Validator& size_value();
const CLI::Validator& size_list();

// A SIZE option's value ("" when not given).
std::optional<std::uint64_t> size_opt(const std::string& s);

// A report is only as good as its last byte: throws InputError when stdout could not be
// written in full.
void flush_or_throw();

// --debuginfod on the commands that symbolize; apply() before the command reads a trace.
struct DebuginfodOptions {
  bool on = false;
  double timeout_s = 10;
  void apply() const;
};
void add_debuginfod(CLI::App* cmd, DebuginfodOptions& o);

// -o/--output FILE and --force on the commands that write one file; `what` names it.
void add_output_file(CLI::App* cmd, std::string& output, bool& force, const std::string& what);

// The TRACE... positional, -q/--quiet and --debuginfod of the commands that read traces.
void add_traces_quiet_debuginfod(CLI::App* cmd, std::vector<std::string>& traces, bool& quiet,
                                 DebuginfodOptions& debuginfod);

// -v/--verbose on the commands that symbolize: list the trace's modules not found here
// (without it, one line says how many).
void add_verbose(CLI::App* cmd, bool& verbose);

// Windows (analyzer/model/phases.h, docs/cli.md "Phases and windows"), on summary and check.
void add_window(CLI::App* cmd, WindowSpec& window, std::string& growth_phase);

// --pid, --rank, --host (each repeatable, or comma-separated): which of the given traces a
// command reads (analyzer/trace/trace_head.h; select_traces before analyze).
void add_select(CLI::App* cmd, TraceSelection& sel);

}  // namespace gpuheap::cli
