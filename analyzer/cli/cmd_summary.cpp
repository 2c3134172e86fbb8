// `gpuheap summary TRACE...`: the memory summary, as text or JSON (analyzer/summary/).
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/model/analysis.h"
#include "analyzer/summary/report.h"

namespace gpuheap::cli {
namespace {

struct SummaryCliOptions {
  SummaryOptions summary;
  std::vector<std::string> traces;
  bool json = false, quiet = false;
  int top = 5;
  int depth = static_cast<int>(SummaryOptions{}.depth);
  CLI::Option* depth_option = nullptr;  // --depth given: JSON stacks are cut the same way
  TraceSelection select;                // --pid, --rank, --host
  DebuginfodOptions debuginfod;
  WindowSpec window;
};

// --device N where no trace has device N is a mistake (a typo, the wrong trace), not an
// empty report: exit 2, naming the devices there are.
void require_device(const Analysis& a, int device) {
  std::string seen;
  for (const auto& t : a.traces)
    for (const auto& d : t->devices) {
      if (d.device == device) return;
      if (d.device >= 0) seen += fmt::format("{}{}", seen.empty() ? "" : ", ", d.device);
    }
  throw InputError(fmt::format("--device {}: no such device in the trace{} ({})", device,
                               a.traces.size() > 1 ? "s" : "", seen.empty() ? "it has no device" : "devices: " + seen));
}

void add_summary_options(CLI::App* cmd, SummaryCliOptions& o) {
  SummaryOptions& s = o.summary;
  cmd->add_flag("--json", o.json, "One JSON document (schema gpuheap.summary/2)");
  cmd->add_option("--device", s.device, "Only this device (exit 2 when no trace has it)");
  cmd->add_option("--top", o.top, "Entries per list (default 5)")->check(whole_number(1, kMaxListed));
  o.depth_option = cmd->add_option("--depth", o.depth, "Frames per site below the allocator's own (default 3)")
                       ->check(whole_number(1, kMaxListed));
  cmd->add_flag("--full", s.full, "Everything: every frame of every stack, every entry of every list");
  cmd->add_flag("--include-library", s.include_library,
                "List library workspaces and handles (cuBLAS, cuDNN, ...) among the leaks too");
  cmd->add_flag("--pools", s.pools, "Add the large/small pool rows to the memory table (--full has them too)");
  cmd->add_option("--library", s.library, "Only sites of this library (NCCL, cuBLAS, PyTorch, ...; any case)");
  cmd->add_option("--group-by", s.group_by,
                  "Peak consumers summed by the label's line, function, file, module (library) or category "
                  "instead of "
                  "by stack (text)")
      ->check(CLI::IsMember({"line", "function", "file", "module", "category"}));
  add_select(cmd, o.select);
  cmd->add_flag("--all-frames", s.all_frames, "Keep gpuheap/CUDA-internal frames");
  cmd->add_option("traces", o.traces, kTracesHelp)->required();
  cmd->add_flag("-q,--quiet", o.quiet, kQuietHelp);
  add_debuginfod(cmd, o.debuginfod);
  add_window(cmd, o.window, s.growth_phase);
}

int run_summary(SummaryCliOptions o) {
  o.debuginfod.apply();
  SummaryOptions& s = o.summary;
  s.top = static_cast<std::size_t>(o.top);
  s.depth = static_cast<std::size_t>(o.depth);
  s.depth_given = o.depth_option->count() > 0;
  s.window = o.window.describe();
  o.traces = select_traces(o.traces, o.select);
  AnalyzeOptions aopt;
  aopt.progress = !o.quiet;
  auto a = analyze_window(o.traces, aopt, o.window);
  if (s.device >= 0) require_device(a, s.device);
  if (o.json) {
    // Trace strings (paths, command lines, names) are arbitrary bytes: invalid UTF-8 is
    // replaced by U+FFFD rather than making dump() throw; everything else is escaped.
    std::cout << summary_json(a, s).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << summary_text(a, s);
  }
  flush_or_throw();
  return 0;
}

}  // namespace

Command add_summary(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<SummaryCliOptions>();
  auto* cmd = app.add_subcommand("summary", "Memory summary of one or more traces");
  add_summary_options(cmd, *o);
  add_verbose(cmd, verbose);
  return {cmd, [o] { return run_summary(*o); }};
}

}  // namespace gpuheap::cli
