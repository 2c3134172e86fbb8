// `gpuheap diff A B`: per-device totals, bytes by category and per-site differences; with
// --fail-on, a CI gate (analyzer/summary/diff.h).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/model/analysis.h"
#include "analyzer/summary/diff.h"

namespace gpuheap::cli {
namespace {

struct DiffCliOptions {
  std::string a, b;  // the traces: from A to B
  bool all_frames = false, quiet = false, json = false;
  int top = 20;
  DebuginfodOptions debuginfod;
  // The CI gate: metric names as check's --max-* limits, plus count.
  std::vector<std::string> fail_on;
  std::string tolerance_bytes;  // SIZE ("" when not given)
  DiffGate gate;
};

void add_diff_options(CLI::App* cmd, DiffCliOptions& o) {
  cmd->add_option("A", o.a, "The trace to compare from")->required();
  cmd->add_option("B", o.b, "The trace to compare with A")->required();
  cmd->add_option("--top", o.top, "Rows shown (default 20)")->check(whole_number(1, kMaxListed));
  cmd->add_flag("--all-frames", o.all_frames, "Keep gpuheap/CUDA-internal frames");
  cmd->add_flag("-q,--quiet", o.quiet, kQuietHelp);
  add_debuginfod(cmd, o.debuginfod);
  cmd->add_flag("--json", o.json, "One JSON document (schema gpuheap.diff/1)");
  cmd->add_option("--fail-on", o.fail_on,
                  "Exit 1 when one of these metrics (comma-separated) grows from A to B beyond the tolerance on any "
                  "device")
      ->delimiter(',')
      ->check(CLI::IsMember({"requested", "allocated", "reserved", "leaked", "count"}));
  cmd->add_option("--tolerance", o.gate.tolerance_pct, "Growth allowed with --fail-on, in % of A (default 5)")
      ->check(finite_non_negative());
  cmd->add_option("--tolerance-bytes", o.tolerance_bytes, "Growth up to SIZE never fails with --fail-on (default 0)")
      ->check(size_value())
      ->type_name("SIZE");
  cmd->footer(kSizeRule);
  cmd->add_flag("--allow-truncated", o.gate.allow_truncated,
                "With --fail-on, compare a trace without an end record instead of failing");
}

int run_diff(DiffCliOptions o) {
  o.debuginfod.apply();
  AnalyzeOptions aopt;
  aopt.progress = !o.quiet;
  auto a = analyze({o.a}, aopt);
  auto b = analyze({o.b}, aopt);
  const Model& ma = *a.traces[0];
  const Model& mb = *b.traces[0];
  DiffGate& gate = o.gate;
  for (const auto& name : o.fail_on) {
    auto m = diff_metric_from(name);
    if (m && std::find(gate.fail_on.begin(), gate.fail_on.end(), *m) == gate.fail_on.end()) gate.fail_on.push_back(*m);
  }
  if (auto slack = size_opt(o.tolerance_bytes)) gate.tolerance_bytes = *slack;
  // One resolver per trace for the sites and the categories: each stack symbolized once.
  SiteLists sa(a, o.all_frames), sb(b, o.all_frames);
  auto rows = diff_sites(ma, mb, sa.res(0), sb.res(0));
  auto devs = diff_devices(ma, mb);
  auto cats = diff_categories(ma, sa.categories(0), mb, sb.categories(0));
  auto verdict = diff_verdict(ma, mb, devs, gate);
  auto lines = verdict_lines(verdict, gate);
  auto top = static_cast<std::size_t>(o.top);
  if (o.json) {
    auto doc = diff_json(devs, rows, top, ma, mb, verdict, gate);
    doc["categories"] = diff_categories_json(cats);
    std::cout << doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    // stdout holds only the document; the gate's lines go to the CI log.
    for (const auto& l : lines) std::fprintf(stderr, "gpuheap diff: %s\n", l.c_str());
  } else {
    std::cout << diff_totals_text(devs, ma, mb);
    std::cout << diff_categories_text(cats);
    std::cout << diff_text(rows, top, ma, mb);
    for (const auto& l : lines) std::cout << "gpuheap diff: " << l << "\n";
  }
  flush_or_throw();
  return verdict.failed() ? 1 : 0;
}

}  // namespace

Command add_diff(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<DiffCliOptions>();
  auto*
      cmd = app.add_subcommand("diff",
                               "Per-device totals and per-site differences between two traces (--fail-on: a CI gate)");
  add_diff_options(cmd, *o);
  add_verbose(cmd, verbose);
  return {cmd, [o] { return run_diff(*o); }};
}

}  // namespace gpuheap::cli
