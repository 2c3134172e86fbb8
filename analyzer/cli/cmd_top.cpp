// `gpuheap top [TRACE... | PID... | DIR]`: a live view of a running job's traces
// (analyzer/live: followed incrementally; ncurses on a terminal, JSON or text lines else).
#include <memory>

#include "analyzer/base/error.h"
#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/live/view.h"

namespace gpuheap::cli {
namespace {

struct TopCliOptions {
  std::vector<std::string> targets;
  live::ViewOptions view;
};

int run_top(const TopCliOptions& o) {
  if (o.view.interval < 0.05) throw UsageError("top: --interval must be at least 0.05 seconds");
  live::Job job(o.targets);
  int rc = live::run_view(job, o.view);
  flush_or_throw();
  return rc;
}

}  // namespace

Command add_top(CLI::App& app) {
  auto o = std::make_shared<TopCliOptions>();
  auto* cmd = app.add_subcommand("top", "Watch a running job's GPU memory live (by device, step and line)");
  cmd->add_option("target", o->targets,
                  "Traces, a directory of traces, or the PID of a `gpuheap run` or a traced process (none: "
                  "your newest running `gpuheap run`)");
  cmd->add_flag("--once", o->view.once, "Read once, print, exit");
  cmd->add_flag("--json", o->view.json, "One JSON line per refresh (schema gpuheap.top/1)");
  cmd->add_option("--interval", o->view.interval, "Seconds between refreshes (default 1)")
      ->check(finite_non_negative());
  cmd->add_option("--top", o->view.top, "Sites per process in JSON and text lines (default 10)");
  return {cmd, [o] { return run_top(*o); }};
}

}  // namespace gpuheap::cli
