// gtest helpers shared by the pool's unit tests (test_pool.cpp, test_pool_safety.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "pool/pool.h"

namespace gpuheap::pool::test_util {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

inline std::uintptr_t addr(const PoolBlock& b) { return reinterpret_cast<std::uintptr_t>(b.ptr); }

inline PoolBlock must_alloc(Pool& p, std::size_t n) {
  PoolBlock b;
  EXPECT_EQ(p.allocate(n, &b), PoolStatus::ok) << n;
  return b;
}

}  // namespace gpuheap::pool::test_util
