// `gpuheap report -o OUT TRACE...`: the self-contained HTML report (analyzer/export/).
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/export/export.h"

namespace gpuheap::cli {
namespace {

struct ReportCliOptions {
  ReportOptions report;
  std::vector<std::string> traces;
  bool quiet = false;
  DebuginfodOptions debuginfod;
  TraceSelection select;  // --pid, --rank, --host
};

void add_report_options(CLI::App* cmd, ReportCliOptions& o) {
  ReportOptions& r = o.report;
  add_output_file(cmd, r.output, r.force, "The HTML file");
  cmd->add_option("--points", r.points, "Timeline points per series (default 4096; peaks stay exact)")
      ->check(whole_number(16, 1 << 20));
  cmd->add_option("--max-nodes", r.max_nodes, "Flame graph nodes per graph; smaller ones merge (default 4000)")
      ->check(whole_number(16, 1 << 22));
  cmd->add_flag("--all-frames", r.all_frames, "Keep gpuheap/CUDA-internal frames");
  add_traces_quiet_debuginfod(cmd, o.traces, o.quiet, o.debuginfod);
  add_select(cmd, o.select);
}

int run_report(ReportCliOptions o) {
  o.debuginfod.apply();
  o.report.progress = !o.quiet;
  o.report.inputs = o.traces;
  return report_command(select_traces(o.traces, o.select), o.report);
}

}  // namespace

Command add_report(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<ReportCliOptions>();
  auto* cmd = app.add_subcommand("report", "Self-contained HTML report: timeline, flame graphs, tables");
  add_report_options(cmd, *o);
  add_verbose(cmd, verbose);
  return {cmd, [o] { return run_report(*o); }};
}

}  // namespace gpuheap::cli
