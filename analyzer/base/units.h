// Size/count formatting and parsing shared by reports and checks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gpuheap {

// torch.cuda.memory_summary()'s cells (10 chars): the unit is picked from `pref` (the "all"
// row of the column) and steps B -> KiB -> MiB -> GiB -> TiB -> PiB while pref >= 768 of
// the next unit; the value is integer-divided (PyTorch's _format_size).
std::string torch_size_cell(std::int64_t sz, std::int64_t pref);
// Counts step " " -> K -> M while pref >= 750,000 of the next (PyTorch's _format_count).
std::string torch_count_cell(std::int64_t cnt, std::int64_t pref);

// "1.50 GiB", "512 B": human-readable, 3 significant digits.
std::string human_bytes(std::uint64_t b);
std::string human_duration_ns(std::uint64_t ns);

// Parses "123B", "512KiB", "1.5GiB", "2GB", "8G" (case-insensitive). Suffixes with "iB"
// and bare K/M/G/T are binary (1024); "KB"/"MB"/"GB"/"TB" are decimal (1000), as in IEC
// usage. A unit is required ("8" is refused, "0" is 0), as in GPUHEAP_LIMIT. Throws
// UsageError on anything else.
std::uint64_t parse_size(std::string_view s);

}  // namespace gpuheap
