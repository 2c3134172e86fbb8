// The analyzer pipeline `gpuheap summary` (and check/diff/dump) runs on one trace, for the
// bad-input tests and the libFuzzer target: reader -> model -> text and JSON reports.
// Module paths are made relative before reporting, so the symbolizer runs its module map
// but never opens a file (a fuzzed path may name anything on this machine).
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "analyzer/cli/commands.h"
#include "analyzer/model/analysis.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"

namespace gpuheap::test {

struct PipelineResult {
  bool truncated = false;
  std::uint64_t records = 0;
  std::size_t text_bytes = 0, json_bytes = 0;
};

// Throws what the analyzer throws (InputError and subclasses for bad input); anything else
// escaping from here is a bug.
inline PipelineResult run_pipeline(const std::string& path, std::FILE* dump_sink) {
  AnalyzeOptions aopt;
  aopt.progress = false;
  aopt.warn_truncated = false;
  aopt.timeline_buckets = 64;
  Analysis a = analyze({path}, aopt);
  for (auto& m : a.traces[0]->modules) m.path.erase(0, m.path.find_first_not_of('/'));
  SummaryOptions sopt;
  sopt.top = 5;
  PipelineResult out;
  out.text_bytes = summary_text(a, sopt).size();
  // The CLI dumps with invalid UTF-8 replaced (trace strings are arbitrary bytes).
  out.json_bytes = summary_json(a, sopt).dump(1, ' ', false, nlohmann::json::error_handler_t::replace).size();
  CheckOptions copt;
  copt.max_requested = 1, copt.max_reserved = 1ull << 40, copt.max_leaked = 0;
  (void)run_check(a, copt);
  auto rows = diff_sites(*a.traces[0], *a.traces[0], false);
  out.text_bytes += diff_text(rows, 5, *a.traces[0], *a.traces[0]).size();
  if (dump_sink != nullptr) dump_trace(path, dump_sink);
  out.truncated = a.traces[0]->info.truncated;
  out.records = a.traces[0]->info.records;
  return out;
}

}  // namespace gpuheap::test
