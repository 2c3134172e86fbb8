#include "analyzer/cli/run_finish.h"

#include <exception>

#include <spdlog/spdlog.h>

#include "analyzer/symbolize/symbolize.h"
#include "analyzer/symbolize/symbolize_trace.h"
#include "analyzer/trace/reader.h"
#include "analyzer/trace/trace_files.h"

namespace gpuheap {

namespace {

// Only a trace its process closed is rewritten: one still being written by a process that
// outlived the command would lose what it writes after the rename.
bool closed_cleanly(const std::string& path, std::string* why) {
  try {
    TraceReader rd(path);
    format::Record r;
    while (rd.next(r)) {
    }
    if (!rd.truncated()) return true;
    *why = "it has no end record (its process died or is still running)";
  } catch (const std::exception& e) {
    *why = e.what();
  }
  return false;
}

}  // namespace

std::vector<std::string> finish_traces(const std::vector<std::string>& paths, const FinishOptions& opt) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::string final_path = p;
    std::string why;
    if ((opt.symbolize || opt.compress) && !closed_cleanly(p, &why)) {
      spdlog::warn(
          "{}: left as written ({}); `gpuheap symbolize --allow-truncated` and `gpuheap compress` finish "
          "it later",
          p, why);
      out.push_back(final_path);
      continue;
    }
    if (opt.symbolize) {
      try {
        symbolize_trace(p, {});
      } catch (const std::exception& e) {
        spdlog::warn("not symbolized: {}", e.what());
      }
    }
    if (opt.compress && !is_zstd_file(p)) {
      try {
        CompressOptions c;
        c.force = opt.force;
        final_path = compress_trace(p, c).output;
      } catch (const std::exception& e) {
        spdlog::warn("not compressed: {}", e.what());
      }
    }
    out.push_back(final_path);
  }
  report_missing_modules(opt.verbose);
  return out;
}

}  // namespace gpuheap
