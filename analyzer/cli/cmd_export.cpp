// `gpuheap export --format F -o OUT TRACE...`: traces for other tools (analyzer/export/).
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/export/export.h"

namespace gpuheap::cli {
namespace {

struct ExportCliOptions {
  ExportOptions exporter;
  std::vector<std::string> traces;
  bool quiet = false;
  DebuginfodOptions debuginfod;
  TraceSelection select;  // --pid, --rank, --host
};

void add_export_options(CLI::App* cmd, ExportCliOptions& o) {
  ExportOptions& x = o.exporter;
  cmd->add_option("--format", x.format, "Output format: chrome, folded, speedscope, torch-snapshot, csv or rmm-csv")
      ->required()
      ->check(CLI::IsMember({"chrome", "folded", "speedscope", "torch-snapshot", "csv", "rmm-csv"}));
  cmd->add_option("--metric", x.metric, "What folded stacks weigh: peak (default), leaked, allocated or count")
      ->check(CLI::IsMember({"peak", "leaked", "allocated", "count"}));
  cmd->add_option("--device", x.device, "Only this device (event formats)");
  add_output_file(cmd, x.output, x.force, "Output file");
  cmd->add_option("--max-entries", x.max_entries,
                  "torch-snapshot: trace entries kept per device, the last ones (default 100000, as memory_viz "
                  "suggests; 0: all)")
      ->check(whole_number(0, INT64_MAX));
  cmd->add_flag("--all-frames", x.all_frames, "Keep gpuheap/CUDA-internal frames");
  add_traces_quiet_debuginfod(cmd, o.traces, o.quiet, o.debuginfod);
  add_select(cmd, o.select);
}

int run_export(ExportCliOptions o) {
  o.debuginfod.apply();
  o.exporter.progress = !o.quiet;
  o.exporter.inputs = o.traces;
  return export_command(select_traces(o.traces, o.select), o.exporter);
}

}  // namespace

Command add_export(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<ExportCliOptions>();
  auto* cmd = app.add_subcommand("export", "Convert traces for other tools (Perfetto, speedscope, memory_viz, RMM)");
  add_export_options(cmd, *o);
  add_verbose(cmd, verbose);
  return {cmd, [o] { return run_export(*o); }};
}

}  // namespace gpuheap::cli
