// `gpuheap run [OPTIONS] [--] PROGRAM [ARGS...]`: the program under the preload (run.cpp),
// its traces finished after it exits (run_finish.h).
#include <memory>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/cli/commands.h"
#include "common/parse.h"

namespace gpuheap::cli {
namespace {

constexpr std::uint64_t kMinAggregate = 64u << 10;  // the sink's smallest window

struct RunCliOptions {
  RunOptions run;
  std::string framework_pools = "off";
  std::string aggregate;
  bool no_symbolize = false, no_compress = false;
};

// `run`'s usage line names the program it takes (prefix_command: no positional option).
class RunUsage : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string u = CLI::Formatter::make_usage(app, std::move(name));
    if (!u.empty() && u.back() == '\n') u.pop_back();
    return u + " [--] PROGRAM [ARGS...]\n";
  }
};

void add_run_options(CLI::App* cmd, RunCliOptions& o, bool& verbose) {
  RunOptions& r = o.run;
  cmd->add_option("-o,--output", r.output,
                  "Trace path or pattern (GPUHEAP_OUTPUT: %p pid, %n program); a fixed name that exists needs --force");
  cmd->add_flag("--no-stacks", r.no_stacks, "Do not record call stacks (GPUHEAP_STACKS=0)");
  cmd->add_flag("--no-pool", r.no_pool, "Pass allocations through to the driver (GPUHEAP_POOL=0)");
  cmd->add_flag("--simulate", r.simulate, "Use the simulated CUDA runtime next to gpuheap (simcuda/)");
  cmd->add_option("--framework-pools", o.framework_pools,
                  "off (default): turn the PyTorch and JAX caching allocators off; keep: leave them on")
      ->check(CLI::IsMember({"off", "keep"}));
  cmd->add_option("--aggregate", o.aggregate,
                  "Keep each trace to a rolling window of about SIZE (default 64MiB) for any run length; the "
                  "summary's peaks, live set at the peak, leaks and by-site totals stay exact (GPUHEAP_AGGREGATE)")
      ->expected(0, 1)
      ->type_name("[SIZE]");
  cmd->add_option("--limit", r.limit, "Per-device memory cap (GPUHEAP_LIMIT), e.g. 8GiB");
  cmd->add_flag("--allow-no-trace", r.allow_no_trace,
                "Exit with the command's status even if a trace could not be written (else 3)");
  cmd->add_flag("--no-symbolize", o.no_symbolize,
                "Do not store symbolized frames in the trace after the program exits");
  cmd->add_flag("--no-compress", o.no_compress,
                "Leave the trace uncompressed (else TRACE.zst after the program exits)");
  cmd->add_flag("--force", r.force, "Let -o NAME replace an existing NAME or NAME.zst (else exit 2)");
  cmd->add_flag("--live", r.live,
                "Show the live view (gpuheap top) while the program runs; its output goes to --live-output");
  cmd->add_option("--live-output", r.live_output,
                  "With --live: the file for the program's stdout and stderr (default gpuheap-live.PID.out; must not "
                  "exist)");
  cmd->add_flag("-q,--quiet", r.quiet, "Print nothing but warnings and errors (as GPUHEAP_QUIET=1)");
  add_verbose(cmd, verbose);
}

// The program: what prefix_command() left on `run` (from its first positional on), or,
// after `--`, what the app kept (run_command below says why).
int run_program(RunCliOptions o, const CLI::App& cmd, bool verbose) {
  RunOptions& r = o.run;
  r.command = cmd.remaining();
  if (r.command.empty()) {
    r.command = cmd.get_parent()->remaining();  // after `--`: taken as it is
  } else if (r.command[0].size() > 1 && r.command[0][0] == '-') {
    throw UsageError(
        fmt::format("run: unknown option {} (run's options come before the program; `gpuheap run "
                    "[OPTIONS] [--] PROGRAM [ARGS...]`)",
                    r.command[0]));
  }
  r.finish.symbolize = !o.no_symbolize;
  r.finish.compress = !o.no_compress;
  r.finish.verbose = verbose;
  r.finish.force = r.force;
  r.keep_framework_pools = o.framework_pools == "keep";
  if (cmd.get_option("--aggregate")->count()) {
    r.aggregate = o.aggregate.empty() ? "64MiB" : o.aggregate;
    std::uint64_t bytes = 0;
    if (!common::parse_size(r.aggregate.c_str(), &bytes) || bytes < kMinAggregate)
      throw UsageError(fmt::format("run: --aggregate={} is not a size of at least 64KiB (e.g. 64MiB)", r.aggregate));
  }
  return run_traced(r);
}

}  // namespace

Command add_run(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<RunCliOptions>();
  auto* cmd = app.add_subcommand("run", "Run a program with gpuheap preloaded (run's options stop at the program)");
  add_run_options(cmd, *o, verbose);
  // Options stop at the program (nsys, memray, heaptrack): `gpuheap run --simulate prog -o x`
  // gives `-o x` to prog. prefix_command() sends the first positional and everything after
  // it to cmd->remaining(). After `run --`, CLI11 2.1 hands the rest of the line back to
  // the app instead (run has no positional left to fill): main sets prefix_command() on the
  // app too, which keeps it whole, in order, as app.remaining().
  cmd->prefix_command();
  cmd->formatter(std::make_shared<RunUsage>());
  return {cmd, [o, cmd, &verbose] { return run_program(*o, *cmd, verbose); }, true};
}

}  // namespace gpuheap::cli
