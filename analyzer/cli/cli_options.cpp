#include "analyzer/cli/cli_options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/units.h"
#include "analyzer/symbolize/debuginfo.h"
#include "common/parse.h"

namespace gpuheap::cli {

// CLI11's NonNegativeNumber lets "nan" and "inf" through (nan > limit is false, so
// --tolerance nan passed every check).
const CLI::Validator& finite_non_negative() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(d) || d < 0)
          return "a finite number >= 0 is needed, not '" + s + "'";
        return {};
      },
      "FINITE>=0", "finite non-negative number");
  return v;
}

CLI::Validator whole_number(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(s.c_str(), &end, 10);
        bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return fmt::format("needs a whole number from {} to {}, not '{}'", lo, hi, s);
        return {};
      },
      fmt::format("INT in [{}..{}]", lo, hi), "whole number");
}

namespace {
std::string size_error(const std::string& s) {
  try {
    parse_size(s);
    return {};
  } catch (const UsageError& e) {
    return e.what();
  }
}
}  // namespace

const CLI::Validator& size_value() {
  static const CLI::Validator v([](std::string& s) { return size_error(s); }, "SIZE", "size with a unit");
  return v;
}

const CLI::Validator& size_list() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        std::size_t from = 0;
        while (from <= s.size()) {
          std::size_t comma = s.find(',', from);
          if (comma == std::string::npos) comma = s.size();
          if (std::string e = size_error(s.substr(from, comma - from)); !e.empty()) return e;
          from = comma + 1;
        }
        return {};
      },
      "SIZE,...", "sizes with units");
  return v;
}

std::optional<std::uint64_t> size_opt(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return parse_size(s);
}

// A full disk or a closed pipe must not leave a silently cut baseline behind with exit 0.
void flush_or_throw() {
  std::cout.flush();
  bool bad = !std::cout.good();
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) bad = true;
  if (bad) throw InputError(fmt::format("cannot write the output: {}", std::strerror(errno ? errno : EIO)));
}

void DebuginfodOptions::apply() const { configure_debuginfod(on, timeout_s); }

void add_debuginfod(CLI::App* cmd, DebuginfodOptions& o) {
  cmd->add_flag("--debuginfod", o.on, "Ask the debuginfod servers in DEBUGINFOD_URLS for missing debug info");
  cmd->add_option("--debuginfod-timeout", o.timeout_s, "Seconds per download with --debuginfod (default 10)")
      ->check(finite_non_negative());
}

void add_verbose(CLI::App* cmd, bool& verbose) {
  cmd->add_flag("-v,--verbose", verbose, "List the trace's modules that are not on this machine");
}

void add_window(CLI::App* cmd, WindowSpec& window, std::string& growth_phase) {
  cmd->add_option("--phase", window.phase, "Only the time inside this phase's instances (NAME)");
  cmd->add_option("--time", window.time, "Only FROM:TO (seconds from the start, or phase/mark names; either optional)");
  cmd->add_option("--after", window.after, "Only after TIME (seconds) or the end of phase/mark NAME's first instance");
  cmd->add_option("--growth-phase", growth_phase, "Phase whose instances measure growth (default: most repeated)");
}

void add_output_file(CLI::App* cmd, std::string& output, bool& force, const std::string& what) {
  cmd->add_option("-o,--output", output, what + " (- = stdout); an existing one needs --force")->required();
  cmd->add_flag("--force", force, "Replace an existing output file (never one of the traces)");
}

void add_traces_quiet_debuginfod(CLI::App* cmd, std::vector<std::string>& traces, bool& quiet,
                                 DebuginfodOptions& debuginfod) {
  cmd->add_option("traces", traces, kTracesHelp)->required();
  cmd->add_flag("-q,--quiet", quiet, kQuietHelp);
  add_debuginfod(cmd, debuginfod);
}

namespace {

// "A,B,C" -> A, B, C (an empty item is a usage error: "--rank 1,,2" is a typo).
std::vector<std::string> split_list(const std::string& flag, const std::string& v) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = v.find(',', at);
    out.push_back(v.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (out.back().empty()) throw CLI::ValidationError(flag, "an empty item in '" + v + "'");
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::int64_t list_number(const std::string& flag, const std::string& item) {
  std::uint64_t x = 0;
  if (!common::parse_uint(item.c_str(), &x) || x > 0x7FFFFFFFFFFFFFFFull)
    throw CLI::ValidationError(flag, "a number >= 0 is needed, not '" + item + "'");
  return static_cast<std::int64_t>(x);
}

}  // namespace

void add_select(CLI::App* cmd, TraceSelection& sel) {
  // One value per occurrence (a comma-separated list), so that the traces after `--pid 5`
  // stay positional; repeated occurrences add up. CLI11's own delimiter would count the
  // split items against that one value.
  auto add = [cmd](const char* flag, const char* type, const char* help, auto take) {
    cmd->add_option_function<std::vector<std::string>>(
           flag,
           [flag, take](const std::vector<std::string>& v) {
             for (const auto& s : v)
               for (auto& item : split_list(flag, s)) take(flag, std::move(item));
           },
           help)
        ->type_name(type)
        ->expected(1)
        ->allow_extra_args(false)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  };
  add("--pid", "PID[,PID...]", "Only the traces of these processes",
      [&sel](const char* f, const std::string& item) { sel.pids.push_back(list_number(f, item)); });
  add("--rank", "N[,N...]", "Only the traces of these ranks (from RANK, SLURM_PROCID, ...)",
      [&sel](const char* f, const std::string& item) { sel.ranks.push_back(list_number(f, item)); });
  add("--host", "HOST[,HOST...]", "Only the traces recorded on these hosts",
      [&sel](const char*, std::string item) { sel.hosts.push_back(std::move(item)); });
}

}  // namespace gpuheap::cli
