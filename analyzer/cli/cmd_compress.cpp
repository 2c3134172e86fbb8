// `gpuheap compress TRACE...`: TRACE.zst, verified, then the original removed
// (analyzer/trace/trace_files.h).
#include <cstdio>
#include <memory>

#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/trace/trace_files.h"

namespace gpuheap::cli {
namespace {

struct CompressCliOptions {
  CompressOptions compress;
  std::vector<std::string> traces;
};

int run_compress(const CompressCliOptions& o) {
  for (const auto& t : o.traces) {
    auto r = compress_trace(t, o.compress);
    std::printf("gpuheap compress: %s -> %s: %llu -> %llu bytes (%.1fx)\n", t.c_str(), r.output.c_str(),
                static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.bytes_after),
                r.bytes_after ? static_cast<double>(r.bytes_before) / static_cast<double>(r.bytes_after) : 0.0);
  }
  flush_or_throw();
  return 0;
}

}  // namespace

Command add_compress(CLI::App& app) {
  auto o = std::make_shared<CompressCliOptions>();
  auto* cmd = app.add_subcommand("compress",
                                 "Compress traces with zstd into TRACE.zst (verified, then the "
                                 "original is removed)");
  cmd->add_option("traces", o->traces, kTracesHelp)->required();
  cmd->add_flag("-k,--keep", o->compress.keep, "Keep the original trace");
  cmd->add_flag("-f,--force", o->compress.force, "Replace an existing TRACE.zst");
  return {cmd, [o] { return run_compress(*o); }};
}

}  // namespace gpuheap::cli
