// `gpuheap dump TRACE`: every record as a line of text (dump.cpp).
#include <cstdio>
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/cli/commands.h"

namespace gpuheap::cli {
namespace {

struct DumpCliOptions {
  std::string trace;
  bool quiet = false;
};

int run_dump(const DumpCliOptions& o) {
  int rc = dump_trace(o.trace, stdout, !o.quiet);
  flush_or_throw();
  return rc;
}

}  // namespace

Command add_dump(CLI::App& app) {
  auto o = std::make_shared<DumpCliOptions>();
  auto* cmd = app.add_subcommand("dump", "Print every record of a trace as text");
  cmd->add_option("trace", o->trace, "The trace (raw or .zst)")->required();
  cmd->add_flag("-q,--quiet", o->quiet, kQuietHelp);
  return {cmd, [o] { return run_dump(*o); }};
}

}  // namespace gpuheap::cli
