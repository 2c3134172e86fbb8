// Shared-memory progress log between prog_load (kill mode) and test_reliability.cpp: each
// thread publishes (CLOCK_MONOTONIC ns, pairs completed) snapshots into a ring, so after a
// SIGKILL the test knows which cudaMalloc/cudaFree pairs had returned, and when.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpuheap::test {

inline constexpr int kProgressThreads = 64;
inline constexpr std::uint64_t kProgressRing = 16384;

struct ProgressEntry {
  std::uint64_t ns;     // CLOCK_MONOTONIC when the snapshot was taken
  std::uint64_t frees;  // cudaFree calls of this thread that had returned by then
};

struct ThreadProgress {
  std::uint32_t tid;
  std::atomic<std::uint64_t> count;  // snapshots written (ring index = count % ring)
  ProgressEntry ring[kProgressRing];
};

struct Progress {
  ThreadProgress threads[kProgressThreads];
};

}  // namespace gpuheap::test
