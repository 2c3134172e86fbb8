// summary --json's torch_memory_stats (analyzer/model/torch_stats.cpp) on golden_prog's "pooled"
// pattern under the preload (simcuda): every torch.cuda.memory_stats() key equals the
// summary stat it maps to, and the driver-allocation counts follow from the pattern.
#include "tests/golden/golden.h"

namespace gpuheap::golden {
namespace {

// torch's array stats and the summary --json metric each one maps to (docs/summary-json.md).
const std::pair<const char*, const char*> kArrays[] = {
    {"allocation", "allocations"},
    {"segment", "segments"},
    {"active", "active_allocs"},
    {"inactive_split", "inactive_split"},
    {"allocated_bytes", "allocated_bytes"},
    {"reserved_bytes", "reserved_bytes"},
    {"active_bytes", "active_bytes"},
    {"inactive_split_bytes", "inactive_split_bytes"},
    {"requested_bytes", "requested_bytes"},
};
const char* const kFields[] = {"current", "peak", "allocated", "freed"};

// Each torch key against the summary's own stat; returns how many keys were compared.
int expect_mapped(const json& d, bool pools) {
  const json& t = d.at("torch_memory_stats");
  int n = 0;
  for (auto [torch, ours] : kArrays)
    for (const char* f : kFields) {
      EXPECT_EQ(t.at(std::string(torch) + ".all." + f), d.at(ours).at(f)) << torch << " " << f;
      ++n;
      for (const char* pool : {"large_pool", "small_pool"}) {
        std::string key = std::string(torch) + "." + pool + "." + f;
        if (pools) {
          EXPECT_EQ(t.at(key), d.at(ours).at(pool).at(f)) << key;
          ++n;
        } else {
          EXPECT_FALSE(t.contains(key)) << key;
        }
      }
    }
  for (const char* f : kFields) {
    EXPECT_EQ(t.at(std::string("oversize_allocations.") + f), d.at("oversize_allocations").at(f));
    EXPECT_EQ(t.at(std::string("oversize_segments.") + f), d.at("oversize_segments").at(f));
    n += 2;
  }
  EXPECT_EQ(t.at("num_ooms"), d.at("num_ooms"));
  EXPECT_EQ(t.at("num_alloc_retries"), d.at("num_alloc_retries"));
  return n + 2;
}

TEST(GoldenTorchStats, PooledKeysEqualTheSummaryStats) {
  Prog p = run_prog("pooled", {"GPUHEAP_SEAL_US=0"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  json j = summary_json({p.trace()});
  const json& d = j["devices"].at(0);
  ASSERT_TRUE(d.contains("torch_memory_stats")) << d.dump();
  // 9 arrays x 4 fields x 3 pools, 2 single stats x 4, num_ooms, num_alloc_retries.
  EXPECT_EQ(expect_mapped(d, true), 9 * 4 * 3 + 8 + 2);
  const json& t = d["torch_memory_stats"];
  // The pattern: one 2 MiB small and one 20 MiB large segment, both kept to the end.
  EXPECT_EQ(t["num_device_alloc"], 2);
  EXPECT_EQ(t["num_device_free"], 0);
  EXPECT_EQ(t["segment.small_pool.peak"], 1);
  EXPECT_EQ(t["requested_bytes.all.peak"], 2 * 1000 + 2000 + 3 * MiB);
  EXPECT_EQ(t["reserved_bytes.all.current"], 2 * MiB + 20 * MiB);
}

// Without the pool every allocation is the driver's: no honest pool split, and each
// allocation is one device alloc (golden_prog "pooled": 5 allocations, all freed).
TEST(GoldenTorchStats, NoPoolLeavesThePoolSplitOut) {
  NoPoolRun np = run_without_pool("pooled");
  ASSERT_EQ(np.cli.status, 0) << np.cli.err;
  ASSERT_EQ(np.traces.size(), 1u) << np.cli.err;
  json j = summary_json({np.traces[0]});
  const json& d = j["devices"].at(0);
  EXPECT_EQ(expect_mapped(d, false), 9 * 4 + 8 + 2);
  const json& t = d["torch_memory_stats"];
  EXPECT_EQ(t["num_device_alloc"], 5);
  EXPECT_EQ(t["num_device_free"], 5);
  EXPECT_EQ(t["segment.all.allocated"], 0);  // pass-through allocations are not pool segments
}

}  // namespace
}  // namespace gpuheap::golden
