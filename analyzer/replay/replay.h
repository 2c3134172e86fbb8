// `gpuheap replay`: what-if analysis of a recorded trace. The trace's cudaMalloc-class
// allocations and frees (kinds pooled and device) are fed, in trace order, through
// gpuheap's own pool code (pool/, the code the preload runs) on a simulated upstream
// that hands out fake addresses and never touches memory. A freed block becomes reusable
// when the trace's free_completed record for it appears (the recorded GPU's answer to "is
// the work before this free done"), so replaying a trace under the policy it was recorded
// with reproduces the recorded segments, and so the recorded peak reserved bytes, exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/model/stats.h"
#include "analyzer/replay/replay_torch.h"
#include "pool/pool.h"

namespace gpuheap {

struct ReplayPolicy {
  enum class Kind { gpuheap, none, torch };
  Kind kind = Kind::gpuheap;
  pool::PoolConfig pool;  // Kind::gpuheap only
  TorchConfig torch;      // Kind::torch only
  std::string name = "gpuheap";
};
// "gpuheap", "gpuheap:max_split=64MiB,round=1KiB,...", "none", "torch[:max_split_size=SIZE,...]". Throws UsageError (exit 2)
// on an unknown policy, an unknown key or a bad value.
ReplayPolicy parse_policy(const std::string& text);

struct ReplayOptions {
  ReplayPolicy policy;
  std::uint64_t limit = 0;  // per-device cap on device bytes held, 0 = none
  bool progress = false;
};

struct ReplayDevice {
  int device = 0;
  std::string name;
  Stat requested, allocated, reserved;  // summary --json semantics (stats.h)
  // At the first moment reserved reached its peak:
  std::uint64_t non_releasable_at_peak = 0;  // free bytes in segments that hold a live block
  std::uint64_t largest_free_at_peak = 0;    // largest block reusable then
  std::uint64_t segments_at_peak = 0;
  std::uint64_t peak_held = 0;               // peak of reserved + other device kinds (what a limit counts)
  std::uint64_t recorded_reserved_peak = 0;  // from the trace's segment records
  std::uint64_t retries = 0;                 // the pool's release-and-retry path taken
  // Policy torch: cudaMallocs that PyTorch's allocator would not have made (TorchCallers,
  // replay_torch.h), passed straight to the driver as under `none` and left out of the
  // reserved/allocated/requested figures above (as torch's own statistics leave them out);
  // their bytes count toward the limit (peak_held). bytes: their 2 MiB-rounded sizes summed.
  std::uint64_t bypass_allocations = 0, bypass_bytes = 0, bypass_peak = 0;
};

struct ReplayOom {
  bool hit = false;
  int device = 0;
  std::uint64_t ts_ns = 0;        // since the traced process started
  std::uint64_t event_index = 0;  // 1-based index among the trace's records
  std::uint64_t requested = 0;
  std::uint64_t reserved = 0, allocated = 0, largest_free = 0;  // replayed pool at the failure
  std::uint32_t stack = 0;
  std::vector<std::string> frames;  // symbolized, innermost first
};

struct ReplayResult {
  std::string trace, policy;
  std::uint64_t limit = 0;
  std::uint64_t events = 0;             // alloc/free/free_completed records replayed
  std::uint64_t other_kind_events = 0;  // alloc/free of kinds the pool does not serve
  std::uint64_t unmatched_frees = 0;    // frees of addresses not live in the trace
  bool truncated = false;
  double seconds = 0;
  std::vector<ReplayDevice> devices;  // by device index
  ReplayOom oom;
};

// Throws InputError for unreadable / invalid traces. Stops at the first allocation that
// fails under the limit (the job would have got cudaErrorMemoryAllocation there).
ReplayResult replay_trace(const std::string& path, const ReplayOptions& opt);

std::string replay_text(const ReplayResult& r);
nlohmann::json replay_json(const ReplayResult& r);

// The smallest per-device limit, in multiples of `granularity`, under which the replay
// fits, by bisection between 0 and the unlimited replay's peak held bytes (which fits by
// construction). Assumes fitting is monotonic in the limit (exact for `none`).
struct MinLimit {
  std::uint64_t limit = 0, granularity = 0;
  int replays = 0;
  ReplayResult at_limit;
};
MinLimit find_min_limit(const std::string& path, const ReplayOptions& opt, std::uint64_t granularity);

}  // namespace gpuheap

namespace gpuheap {

// The `replay` subcommand as the CLI parsed it (analyzer/cli/cmd_replay.cpp). Returns the exit
// status: 1 when the single replay runs out of memory under --limit, else 0.
struct ReplayCli {
  std::string trace, policy = "gpuheap", limit, sweep, limits;
  bool json = false, find_min_limit = false, quiet = false;
};
int replay_command(const ReplayCli& cli);

}  // namespace gpuheap
