// Runs the replay over one or more traces. Several traces are replayed together in
// timestamp order (aligned by each process's wall clock) so the merged per-device peaks are
// real simultaneous peaks, not sums of per-process peaks. A device is a GPU of one host:
// (hostname, device index); processes on two hosts never share one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "analyzer/model/model.h"

namespace gpuheap {

struct MergedDevice {
  std::string host;  // the process records' hostname
  int device = 0;
  std::vector<std::size_t> traces;      // indexes into Analysis::traces of the processes on it, ascending
  Stat requested, allocated, reserved;  // across processes, by aligned time
  std::int64_t sum_of_peaks_allocated = 0, sum_of_peaks_reserved = 0;
  std::uint64_t peak_allocated_wall_ns = 0;
  Timeline timeline;  // t relative to the earliest process start (wall clock)
  // The traces whose end record took memory off this GPU (their leftovers: the driver frees
  // them at exit), in that order: a sample of `timeline` each, which a pass that replays the
  // merge again (merge_order.h) takes at the same moments.
  std::vector<std::size_t> released_at_end;
};

struct Analysis {
  std::vector<std::unique_ptr<Model>> traces;
  std::vector<MergedDevice> merged;  // only with more than one trace; by host, then device
  // True when the traces come from more than one host (outputs then name each device's host).
  bool several_hosts() const;
  std::uint64_t merged_start_wall_ns = 0;
};

struct AnalyzeOptions {
  std::size_t timeline_buckets = 2048;
  bool progress = true;  // a progress bar when stderr is a TTY and it takes > 1 s
  bool warn_truncated = true;
  // Per trace (empty: none): restrict the model to these trace-clock intervals (phases.h).
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> windows;
};

// Throws InputError (and subclasses) for unreadable / invalid input.
Analysis analyze(const std::vector<std::string>& paths, const AnalyzeOptions& opt = {});

}  // namespace gpuheap
