// Block-edge bitmaps (analyzer/model/model_edges.cpp, their per-event part in model_events.cpp) against the hash map they stand in for: the
// same random block sequences fed to a Model with bitmaps and to one without must give the
// same stats after every record (inactive_split and inactive_split_bytes read the edges),
// including unaligned, overlapping and wrapping blocks, overlapping segments, and segments
// released with blocks still active.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "analyzer/model/model.h"

using namespace gpuheap;
using format::AllocKind;
using format::RecordType;

namespace {

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;

struct Seg {
  std::uint64_t ptr, size;
  bool live = false;
};

struct Pair {
  Model bits{"bits"}, hash{"hash"};
  std::uint64_t ts = 1000;
  std::size_t fed = 0;
  Pair() { hash.disable_edge_bitmaps(); }

  void feed(const format::Record& r) {
    bits.feed(r), hash.feed(r), ++fed;
    ASSERT_EQ(bits.devices.size(), hash.devices.size());
    for (std::size_t d = 0; d < bits.devices.size(); ++d) {
      for (int m = 0; m < kNumMetrics; ++m) {
        for (int p = 0; p < 3; ++p) {
          const auto& x = bits.devices[d].stat[m][p];
          const auto& y = hash.devices[d].stat[m][p];
          ASSERT_EQ(x.current, y.current) << "metric " << m << " pool " << p << " after record " << fed;
          ASSERT_EQ(x.peak, y.peak) << "metric " << m << " pool " << p << " after record " << fed;
          ASSERT_EQ(x.allocated, y.allocated) << "metric " << m << " pool " << p << " after record " << fed;
        }
      }
    }
  }
  void segment(std::uint64_t ptr, std::uint64_t size, bool is_free) {
    format::Record r;
    r.type = is_free ? RecordType::segment_free : RecordType::segment_alloc;
    r.segment = format::SegmentRecord{++ts, 0, format::kFlagSmallPool, ptr, size};
    feed(r);
  }
  void alloc(std::uint64_t ptr, std::uint64_t size) {
    format::Record r;
    r.type = RecordType::alloc;
    r.alloc.ts = ++ts, r.alloc.tid = 1, r.alloc.device = 0, r.alloc.kind = AllocKind::device_pooled;
    r.alloc.flags = format::kFlagSmallPool, r.alloc.ptr = ptr, r.alloc.requested = size, r.alloc.size = size;
    r.alloc.stack = 1;
    feed(r);
  }
  void free(std::uint64_t ptr) {
    format::Record r;
    r.type = RecordType::free;
    r.free.ts = ++ts, r.free.tid = 1, r.free.device = 0, r.free.kind = AllocKind::device_pooled;
    r.free.flags = format::kFlagSmallPool, r.free.ptr = ptr;
    feed(r);
  }
  void completed(std::uint64_t ptr) {
    format::Record r;
    r.type = RecordType::free_completed;
    r.free_completed = format::FreeCompletedRecord{++ts, 0, ptr, 0};
    feed(r);
  }
};

struct Mix {
  int unaligned_pct = 0;  // blocks off the 512-byte grid
  int overlap_pct = 0;    // blocks at random 512-byte offsets (overlapping others)
  bool wrap = false;      // one block wrapping around the address space, into the segment below
  bool overlap_segment = false;
};

// Random allocations, frees and completions over segments of several kinds: two adjacent
// segments (a shared boundary), one too large for a bitmap, one of an odd 512-multiple
// size, one of a size off the grid; the first released and re-created now and then.
void run(std::uint64_t seed, const Mix& mix, Pair& p) {
  std::mt19937_64 rng(seed);
  // Small segments, so that edges meet often.
  std::vector<Seg> segs = {{0x10000000, 256 * KiB},
                           {0x10000000 + 256 * KiB, 256 * KiB},
                           {0x20000000, 64 * MiB},
                           {0x30000000, 128 * KiB + 3 * 512},
                           {0x40000000, 128 * KiB + 100}};
  for (auto& s : segs) p.segment(s.ptr, s.size, false), s.live = true;
  std::vector<std::uint64_t> live, pending;
  auto take = [&](std::vector<std::uint64_t>& v) {
    std::size_t i = rng() % v.size();
    std::uint64_t x = v[i];
    v[i] = v.back(), v.pop_back();
    return x;
  };
  for (int step = 0; step < 6000 && !::testing::Test::HasFatalFailure(); ++step) {
    const unsigned what = rng() % 100;
    if (what < 45 || live.empty()) {
      const auto& s = segs[rng() % segs.size()];
      std::uint64_t off, size;
      if (static_cast<int>(rng() % 100) < mix.overlap_pct) {
        off = (rng() % (s.size / 512)) * 512, size = (1 + rng() % 16) * 512;
      } else {
        // 4 KiB slots, blocks of 512 B to 4 KiB: neighbours touch often, never overlap.
        off = (rng() % (s.size / (4 * KiB))) * 4 * KiB, size = (1 + rng() % 8) * 512;
      }
      if (static_cast<int>(rng() % 100) < mix.unaligned_pct) off += 1 + rng() % 511;
      if (static_cast<int>(rng() % 100) < mix.unaligned_pct) size += 1 + rng() % 511;
      const std::uint64_t ptr = s.ptr + off;
      p.alloc(ptr, size);  // an address still live retires the old block (reused_live_ptrs)
      live.push_back(ptr);
    } else if (what < 80) {
      const std::uint64_t ptr = take(live);
      p.free(ptr);
      if (rng() % 2) p.completed(ptr);
      else pending.push_back(ptr);
    } else if (what < 95 && !pending.empty()) {
      p.completed(take(pending));
    } else if (what < 97) {
      // Release and re-create the first segment (blocks still active in it are detached).
      p.segment(segs[0].ptr, segs[0].size, true);
      p.segment(segs[0].ptr, segs[0].size, false);
    }
    if (mix.wrap && step == 3000) {
      // Starts 4 KiB into the second segment and ends 4 KiB below it, inside the first.
      p.alloc(segs[1].ptr + 4 * KiB, ~std::uint64_t{0} - 8 * KiB + 1);
      live.push_back(segs[1].ptr + 4 * KiB);
      // A block of the first segment that starts where the wrapping one ends.
      const std::uint64_t at = segs[0].ptr + segs[0].size - 4 * KiB;
      p.alloc(at, 4 * KiB), live.push_back(at);
    }
    if (mix.overlap_segment && step == 3500) {
      // A segment reaching into the odd-sized one, and a block of it that ends inside that
      // one, where a block of that one then starts.
      const std::uint64_t s3 = segs[3].ptr;
      p.segment(s3 - 64 * KiB, 128 * KiB, false);
      p.alloc(s3 - 4 * KiB, 8 * KiB), live.push_back(s3 - 4 * KiB);
      p.alloc(s3 + 4 * KiB, 4 * KiB), live.push_back(s3 + 4 * KiB);
    }
  }
}

}  // namespace

TEST(ModelEdges, AlignedBlocksMatchHashMap) {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    Pair p;
    run(seed, {}, p);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
    // The sequence did exercise the free-piece count.
    EXPECT_GT(p.bits.devices.at(0).stat[kInactiveSplit][kAllPools].peak, 10);
  }
}

TEST(ModelEdges, OverlappingBlocksMatchHashMap) {
  for (std::uint64_t seed = 11; seed <= 14; ++seed) {
    Pair p;
    run(seed, {0, 30, false, false}, p);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
  }
}

TEST(ModelEdges, UnalignedBlocksMatchHashMap) {
  for (std::uint64_t seed = 21; seed <= 24; ++seed) {
    Pair p;
    run(seed, {2, 10, false, false}, p);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
  }
}

TEST(ModelEdges, WrappingBlockAndOverlappingSegmentMatchHashMap) {
  for (std::uint64_t seed = 31; seed <= 34; ++seed) {
    Pair p;
    run(seed, {0, 0, seed % 2 == 1, seed % 2 == 0}, p);  // no other cause to leave the bitmaps
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "seed " << seed;
  }
}

// A block that ends where another ends (overlap) and one that starts there: the count of
// ends at that boundary is 2, which the segment's bitmap cannot hold; the stats must still
// follow the hash map's (compared after every record) as the blocks leave one by one, and
// blocks added after the segment moved to the hash map too.
TEST(ModelEdges, SharedEndBoundary) {
  Pair p;
  const std::uint64_t s = 0x10000000;
  p.segment(s, 2 * MiB, false);
  p.alloc(s, 8 * KiB);
  p.alloc(s + 8 * KiB, 4 * KiB);
  p.alloc(s + 4 * KiB, 4 * KiB);  // ends at 8 KiB too
  p.free(s), p.completed(s);
  p.free(s + 8 * KiB), p.completed(s + 8 * KiB);
  p.alloc(s + 8 * KiB, 4 * KiB);  // a block still ends where it starts
  p.alloc(s + 16 * KiB, 4 * KiB);
  p.alloc(s + 12 * KiB, 4 * KiB);
  p.free(s + 4 * KiB), p.completed(s + 4 * KiB);
  p.free(s + 12 * KiB), p.completed(s + 12 * KiB);
  EXPECT_EQ(p.fed, 15u);
  EXPECT_EQ(p.bits.devices.at(0).stat[kInactiveSplit][kAllPools].current, 3);  // [0,8K), [12K,16K), [20K,end)
}

// FlatMap::prefetch on a map of 64-byte slots (the live map's) must leave prefetch
// instructions in the caller: GCC 12 once deleted the calls (flat_map.h says why), and the
// replay then ran without its live-map prefetches. Now the prefetches are asm
// statements, which the compiler cannot delete; the test still checks that both lines of
// a whole-line slot (the slot and the next) are prefetched. Reads a caller's machine code (x86).
namespace {
struct Wide {
  std::uint64_t a[5];
};
__attribute__((noinline)) void prefetch_wide(const gpuheap::base::FlatMap<Wide>& m, std::uint64_t k) { m.prefetch(k); }
}  // namespace

// Optimized builds only (the release build CI and users run): at -O0 or under a sanitizer
// the hash is a call and the code is laid out otherwise.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUHEAP_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GPUHEAP_TEST_SANITIZED 1
#endif
#endif
TEST(FlatMapPrefetch, WholeLineSlotsArePrefetched) {
#if defined(__x86_64__) && defined(__OPTIMIZE__) && !defined(GPUHEAP_TEST_SANITIZED)
  const gpuheap::base::FlatMap<Wide> m;
  prefetch_wide(m, 42);  // runs, and keeps the function
  const auto* code = reinterpret_cast<const unsigned char*>(&prefetch_wide);
  int prefetches = 0;
  // prefetcht0 is 0F 18 /1. The function is a hash, two prefetches and a return (~40
  // bytes); the scan covers it whole without stopping at a C3 byte, which may also be a
  // ModRM byte or part of an offset.
  for (int i = 0; i + 2 < 96; ++i)
    if (code[i] == 0x0F && code[i + 1] == 0x18 && ((code[i + 2] >> 3) & 7) == 1) ++prefetches;
  EXPECT_GE(prefetches, 2);  // the slot, and the next one (a line each)
#else
  GTEST_SKIP() << "reads the machine code of an optimized, unsanitized x86-64 build";
#endif
}
