// `gpuheap check TRACE... --max-*|--baseline`: a CI gate, exit 1 on a limit exceeded
// (analyzer/summary/check.h).
#include <cstdio>
#include <memory>

#include "analyzer/base/error.h"
#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/model/analysis.h"
#include "analyzer/summary/check.h"

namespace gpuheap::cli {
namespace {

struct CheckCliOptions {
  CheckOptions check;
  std::vector<std::string> traces;
  // The --max-* limits as given (SIZE strings, "" when not given).
  std::string max_requested, max_allocated, max_reserved, max_leaked, max_growth;
  std::vector<std::string> max_category;  // NAME=SIZE
  bool quiet = false;
  DebuginfodOptions debuginfod;
  WindowSpec window;
  TraceSelection select;  // --pid, --rank, --host
};

void add_check_options(CLI::App* cmd, CheckCliOptions& o) {
  CheckOptions& c = o.check;
  cmd->add_option("traces", o.traces, kTracesHelp)->required();
  cmd->add_option("--max-requested", o.max_requested, "Limit on peak requested bytes (SIZE)")->check(size_value());
  cmd->add_option("--max-allocated", o.max_allocated, "Limit on peak allocated bytes (SIZE)")->check(size_value());
  cmd->add_option("--max-reserved", o.max_reserved, "Limit on peak reserved bytes (SIZE)")->check(size_value());
  cmd->add_option("--max-leaked", o.max_leaked, "Limit on bytes live at the end (SIZE)")->check(size_value());
  cmd->add_option("--max-category", o.max_category,
                  "Limit on a category's bytes at each device's peak, as NAME=SIZE (activation=24GiB, names in "
                  "docs/categories.md); may be given again");
  cmd->add_option("--max-growth", o.max_growth, "Limit on live bytes' growth from the 2nd to the last step (SIZE)")
      ->check(size_value());
  cmd->footer(kSizeRule);
  cmd->add_option("--baseline", c.baseline, "An earlier run's summary --json file (the reference)");
  cmd->add_option("--tolerance", c.tolerance_pct, "Allowed growth over the baseline in % (default 5)")
      ->check(finite_non_negative());
  cmd->add_flag("--all-frames", c.all_frames, "Keep gpuheap/CUDA-internal frames in site names");
  cmd->add_flag("--allow-truncated", c.allow_truncated,
                "Check a trace without an end record (killed or still running) instead of failing");
  cmd->add_flag("-q,--quiet", o.quiet, kQuietHelp);
  add_select(cmd, o.select);
  add_debuginfod(cmd, o.debuginfod);
  add_window(cmd, o.window, c.growth_phase);
}

// A rolling window (run --aggregate) keeps its leaks exact, not the pool's statistics,
// phases or categories: a gate on those would read the window alone and could pass a run
// whose peak came before it (docs/cli.md, --aggregate).
void refuse_window_gates(const Analysis& a, const CheckOptions& c) {
  const bool window_only = c.max_requested || c.max_allocated || c.max_reserved || c.max_growth ||
                           !c.max_category.empty() || !c.baseline.empty();
  for (const auto& t : a.traces)
    if (t->info.window && window_only)
      throw InputError("check: " + t->info.path +
                       " is a rolling window (gpuheap run --aggregate): its peak statistics, phases and "
                       "categories cover the window only, so only --max-leaked can be checked on it "
                       "(summary's Peak memory consumers give the run's exact peak)");
}

int run_check_command(CheckCliOptions o) {
  o.debuginfod.apply();
  CheckOptions& c = o.check;
  c.max_requested = size_opt(o.max_requested);
  c.max_allocated = size_opt(o.max_allocated);
  c.max_reserved = size_opt(o.max_reserved);
  c.max_leaked = size_opt(o.max_leaked);
  c.max_growth = size_opt(o.max_growth);
  for (const auto& spec : o.max_category) {
    const auto eq = spec.find('=');
    Category cat{};
    if (eq == std::string::npos || !parse_category(spec.substr(0, eq), cat))
      throw UsageError(
          "check: --max-category takes NAME=SIZE with NAME one of parameter, gradient, "
          "optimizer_state, activation, temporary, library, framework_cache, other, unknown");
    const auto limit = size_opt(spec.substr(eq + 1));
    if (!limit) throw UsageError("check: --max-category " + spec + ": no SIZE after '='");
    c.max_category.emplace_back(cat, *limit);
  }
  if (!c.max_requested && !c.max_allocated && !c.max_reserved && !c.max_leaked && !c.max_growth &&
      c.max_category.empty() && c.baseline.empty())
    throw UsageError("check: give at least one --max-* limit or --baseline");
  AnalyzeOptions aopt;
  aopt.progress = !o.quiet;
  o.traces = select_traces(o.traces, o.select);
  auto a = analyze_window(o.traces, aopt, o.window);
  if (o.window.any()) std::printf("gpuheap check: note: figures restricted to %s\n", o.window.describe().c_str());
  refuse_window_gates(a, c);
  auto r = gpuheap::run_check(a, c);
  for (const auto& n : r.notes) std::printf("gpuheap check: note: %s\n", n.c_str());
  for (const auto& p : r.passed) std::printf("gpuheap check: ok: %s\n", p.c_str());
  for (const auto& v : r.violations) std::printf("gpuheap check: FAIL: %s\n", v.c_str());
  flush_or_throw();
  return r.violations.empty() ? 0 : 1;
}

}  // namespace

Command add_check(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<CheckCliOptions>();
  auto* cmd = app.add_subcommand("check", "Fail (exit 1) when memory limits are exceeded");
  add_check_options(cmd, *o);
  add_verbose(cmd, verbose);
  return {cmd, [o] { return run_check_command(*o); }};
}

}  // namespace gpuheap::cli
