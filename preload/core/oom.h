// The stderr report for an allocation that finally failed (see oom.cpp).
#pragma once

#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace preload {

struct LiveSite {
  std::uint32_t stack = 0;  // interned stack id (0: captured without stacks)
  std::uint64_t bytes = 0;
  std::uint32_t count = 0;
};

// `api` names the failing call; cached_unused = pool bytes reserved and not in use on that
// device; held = device bytes this process holds there (pool segments + pass-through).
// sites: the top live allocation sites on that device, largest first.
void report_oom(const format::OomRecord& r, const char* api, std::uint64_t cached_unused, std::uint64_t held,
                const LiveSite* sites, int nsites) noexcept;

// A failed allocation whose error is not out-of-memory (no device, a driver older than the
// runtime, an initialization error, the sticky error of an earlier fault): no OOM report and
// no OOM record; the first one in the process is named on one stderr line. runtime: `code`
// is a cudaError_t, else a CUresult.
void report_not_oom(const char* api, int code, bool runtime) noexcept;
bool is_out_of_memory(int code, bool runtime) noexcept;

}  // namespace preload
}  // namespace gpuheap
