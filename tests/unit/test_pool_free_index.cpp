// The pool's free-block index (pool/pool_free_index.h) against the std::set ordered
// by (size, address) that it replaced: every query must return the very block the set's
// lower_bound / rbegin gave, since the pool's block choices (and replay's reproduced peaks)
// depend on it.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "pool/pool_free_index.h"

namespace {

struct Node {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Node* fl = nullptr;
  Node* fr = nullptr;
  Node* fp = nullptr;
  std::uint16_t fbin = 0;
  bool in = false;
};
using Index = gpuheap::pool::FreeIndex<Node>;
using Ref = std::set<std::pair<std::size_t, std::uintptr_t>>;

Node* expected_lower_bound(const Ref& ref, std::size_t s, std::vector<Node>& nodes) {
  auto it = ref.lower_bound({s, 0});
  if (it == ref.end()) return nullptr;
  for (Node& n : nodes)
    if (n.in && n.size == it->first && n.addr == it->second) return &n;
  return nullptr;
}

TEST(PoolFreeIndex, BinsAreNonDecreasingInSize) {
  std::size_t prev = 0;
  for (std::size_t s = 0; s < (std::size_t{1} << 22); ++s) {
    std::size_t b = Index::bin_of(s);
    ASSERT_GE(b, prev) << s;
    prev = b;
  }
  // Every multiple of 512 B up to 64 KiB has its own bin (a bin holds one size there).
  for (std::size_t s = 512; s < (std::size_t{64} << 10); s += 512) EXPECT_LT(Index::bin_of(s), Index::bin_of(s + 512));
  EXPECT_LT(Index::bin_of(SIZE_MAX), Index::kBins);
  EXPECT_GT(Index::bin_of(SIZE_MAX), Index::bin_of(SIZE_MAX / 2));
}

void random_ops(std::size_t max_size, std::size_t unit, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<Node> nodes(3000);
  Index idx;
  Ref ref;
  for (std::size_t i = 0; i < nodes.size(); ++i) nodes[i].addr = 0x10000 + i * 0x1000;
  for (int step = 0; step < 60000; ++step) {
    Node& n = nodes[rng() % nodes.size()];
    if (n.in) {
      idx.erase(&n);
      ref.erase({n.size, n.addr});
      n.in = false;
    } else {
      // Few distinct sizes too: many blocks of one size exercise the address order.
      n.size = (rng() % 4 == 0 ? 1 + rng() % 8 : 1 + rng() % (max_size / unit)) * unit;
      idx.insert(&n);
      ref.insert({n.size, n.addr});
      n.in = true;
    }
    ASSERT_EQ(idx.size(), ref.size());
    std::size_t s = (rng() % (max_size / unit + 2)) * unit + (rng() % 2 ? 0 : rng() % unit);
    ASSERT_EQ(idx.lower_bound(s), expected_lower_bound(ref, s, nodes)) << "step " << step << " s " << s;
    Node* last = idx.last();
    if (ref.empty()) {
      ASSERT_EQ(last, nullptr);
    } else {
      ASSERT_NE(last, nullptr);
      ASSERT_EQ(std::make_pair(last->size, last->addr), *ref.rbegin());
    }
    if (step % 1000 == 0)
      for (Node& m : nodes) ASSERT_EQ(m.in, idx.contains(&m));
  }
  idx.clear();
  EXPECT_TRUE(idx.empty());
  EXPECT_EQ(idx.lower_bound(0), nullptr);
}

TEST(PoolFreeIndex, MatchesAnOrderedSetSmallPoolSizes) { random_ops(std::size_t{2} << 20, 512, 1); }
TEST(PoolFreeIndex, MatchesAnOrderedSetLargeAndOddSizes) { random_ops(std::size_t{1} << 34, 1000, 2); }
TEST(PoolFreeIndex, MatchesAnOrderedSetTinySizes) { random_ops(300, 1, 3); }

}  // namespace
