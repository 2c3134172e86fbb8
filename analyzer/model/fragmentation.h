// One fragmentation figure for summary, replay and its sweep (docs/cli.md, "Fragmentation"):
// the free bytes inside pool segments that hold at least one live block (PyTorch's
// inactive_split_bytes: neither a request larger than the pieces nor empty_cache() can use
// them), taken at the first moment reserved bytes reached their peak. The pool grew to that
// peak because no free piece held the request, so these bytes are what the peak paid for
// and could not use.
#pragma once

#include <cstdint>
#include <string>

namespace gpuheap {

// "fragmentation cost 40.7 MiB here (10.4% of the 392 MiB reserved): with it gone the peak
// reserved would have been 351 MiB"
std::string fragmentation_at_peak(std::uint64_t cost, std::uint64_t reserved);

}  // namespace gpuheap
