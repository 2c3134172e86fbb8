// The stderr report for an allocation that finally failed (see oom.cpp).
#pragma once

#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace detail {

// `api` names the failing call; cached_unused = pool bytes reserved and not in use on that
// device; held = device bytes this process holds there (pool segments + pass-through).
void report_oom(const format::OomRecord& r, const char* api, std::uint64_t cached_unused,
                std::uint64_t held) noexcept;

}  // namespace detail
}  // namespace gpuheap
