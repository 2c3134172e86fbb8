// Test helper: a report timeline's category areas ({"names", "bytes"}: one series per
// category) must add up to its requested line at every point, as the report promises.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>

namespace gpuheap::test {

// Checks the sums (one failure per point that differs); returns the index of the highest
// requested point (the first of equals).
inline std::size_t areas_sum_to_requested(const nlohmann::json& categories, const nlohmann::json& requested) {
  const auto& series = categories["bytes"];
  EXPECT_EQ(categories["names"].size(), series.size());
  std::size_t peak = 0;
  for (std::size_t i = 0; i < requested.size(); ++i) {
    std::uint64_t sum = 0;
    for (const auto& v : series) sum += v[i].get<std::uint64_t>();
    EXPECT_EQ(sum, requested[i].get<std::uint64_t>()) << "point " << i;
    if (requested[i].get<std::uint64_t>() > requested[peak].get<std::uint64_t>()) peak = i;
  }
  return peak;
}

}  // namespace gpuheap::test
