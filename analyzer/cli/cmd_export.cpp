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
};

void add_export_options(CLI::App* cmd, ExportCliOptions& o) {
  ExportOptions& x = o.exporter;
  cmd->add_option("--format", x.format, "Output format: chrome, folded, speedscope, torch-snapshot, csv or rmm-csv")
      ->required()
      ->check(CLI::IsMember({"chrome", "folded", "speedscope", "torch-snapshot", "csv", "rmm-csv"}));
  cmd->add_option("--metric", x.metric, "What folded stacks weigh: peak (default), leaked, allocated or count")
      ->check(CLI::IsMember({"peak", "leaked", "allocated", "count"}));
  cmd->add_option("--device", x.device, "Only this device (event formats)");
  cmd->add_option("-o,--output", x.output, "Output file (- = stdout); an existing one needs --force")->required();
  cmd->add_flag("--force", x.force, "Replace an existing output file (never one of the traces)");
  cmd->add_option("--max-entries", x.max_entries,
                  "torch-snapshot: trace entries kept per device, the last ones (default 100000, as memory_viz "
                  "suggests; 0: all)")
      ->check(whole_number(0, INT64_MAX));
  cmd->add_flag("--all-frames", x.all_frames, "Keep gpuheap/CUDA-internal frames");
  cmd->add_option("traces", o.traces, kTracesHelp)->required();
  cmd->add_flag("-q,--quiet", o.quiet, kQuietHelp);
  add_debuginfod(cmd, o.debuginfod);
}

int run_export(ExportCliOptions o) {
  o.debuginfod.apply();
  o.exporter.progress = !o.quiet;
  return export_command(o.traces, o.exporter);
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
