// `gpuheap symbolize TRACE...`: the frames stored in the traces, where the modules are
// (analyzer/symbolize/symbolize_trace.h).
#include <cstdio>
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/symbolize/symbolize_trace.h"

namespace gpuheap::cli {
namespace {

struct SymbolizeCliOptions {
  SymbolizeTraceOptions symbolize;
  std::vector<std::string> traces;
  DebuginfodOptions debuginfod;
};

int run_symbolize(const SymbolizeCliOptions& o) {
  o.debuginfod.apply();
  for (const auto& t : o.traces) {
    auto r = symbolize_trace(t, o.symbolize);
    if (r.rewritten)
      std::printf("gpuheap symbolize: %s: stored the frames of %llu ips (%llu already stored, %llu not found here)\n",
                  t.c_str(), static_cast<unsigned long long>(r.added), static_cast<unsigned long long>(r.already),
                  static_cast<unsigned long long>(r.unresolved));
    else
      std::printf("gpuheap symbolize: %s: unchanged: %llu ips, %llu already stored, %llu not found here\n", t.c_str(),
                  static_cast<unsigned long long>(r.ips), static_cast<unsigned long long>(r.already),
                  static_cast<unsigned long long>(r.unresolved));
  }
  flush_or_throw();
  return 0;
}

}  // namespace

Command add_symbolize(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<SymbolizeCliOptions>();
  auto* cmd = app.add_subcommand("symbolize", "Store symbolized frames in traces (run where the modules are)");
  cmd->add_option("traces", o->traces, kTracesHelp)->required();
  cmd->add_flag("--allow-truncated", o->symbolize.allow_truncated,
                "Symbolize a trace without an end record (killed or still running) instead of failing");
  add_verbose(cmd, verbose);
  add_debuginfod(cmd, o->debuginfod);
  return {cmd, [o] { return run_symbolize(*o); }};
}

}  // namespace gpuheap::cli
