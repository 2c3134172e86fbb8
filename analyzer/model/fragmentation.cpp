#include "analyzer/model/fragmentation.h"

#include <fmt/format.h>

#include "analyzer/base/units.h"

namespace gpuheap {

std::string fragmentation_at_peak(std::uint64_t cost, std::uint64_t reserved) {
  const std::uint64_t c = cost < reserved ? cost : reserved;
  const double pct = reserved ? 100.0 * static_cast<double>(c) / static_cast<double>(reserved) : 0;
  return fmt::format(
      "fragmentation cost {} here ({:.1f}% of the {} reserved): with it gone the peak reserved would have been {}",
      human_bytes(c), pct, human_bytes(reserved), human_bytes(reserved - c));
}

}  // namespace gpuheap
