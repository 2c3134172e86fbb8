// The body of the fuzz_model targets: arbitrary bytes as a trace file through analyze(),
// without the reports. fuzz_model feeds them as a plain trace, fuzz_model_zstd wrapped in a
// zstd stream (so the fuzzer's structure-aware mutations reach the decompressing reader).
// An InputError is the clean "bad input" answer; anything else that escapes is a finding.
#pragma once

#include <cstdint>
#include <string>

#include "analyzer/base/error.h"
#include "analyzer/model/analysis.h"

namespace gpuheap::test {

inline void probe_model(const std::string& path) {
  gpuheap::AnalyzeOptions opt;
  opt.progress = false;
  opt.warn_truncated = false;
  opt.timeline_buckets = 64;
  try {
    gpuheap::Analysis a = gpuheap::analyze({path}, opt);
    // Read what the reports read (per-device totals, OOMs, leaks, peak consumers, stacks of
    // the leaks) so a model left inconsistent shows up under ASan/UBSan here.
    const gpuheap::Model& m = *a.traces[0];
    std::uint64_t sum = m.info.records + m.leaked_bytes;
    for (const auto& d : m.devices) {
      auto t = m.totals(d.device);
      sum += static_cast<std::uint64_t>(t.requested + t.allocated + t.reserved + d.held);
      for (const auto& c : d.peak_consumers) sum += m.sites.size() > c.stack ? m.sites[c.stack].allocs : c.bytes;
    }
    for (const auto& o : m.ooms) sum += o.model_held + o.top_live.size();
    for (const auto& l : m.leaks) {
      auto it = m.stacks.find(l.stack);
      if (it != m.stacks.end()) sum += it->second.size();
    }
    volatile std::uint64_t keep = sum;
    (void)keep;
  } catch (const gpuheap::InputError&) {
    // clean rejection
  }
}

}  // namespace gpuheap::test
