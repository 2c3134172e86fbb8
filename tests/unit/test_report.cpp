// Reports: torch-style cells, text summary rows, JSON schema keys, diff ordering.
#include <gtest/gtest.h>

#include "analyzer/base/units.h"
#include "analyzer/summary/report.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {
constexpr std::uint64_t kSeg = 0x7f0000000000ull;
constexpr std::uint64_t MiB = 1u << 20;

TraceBuilder sample_trace() {
  TraceBuilder b;
  b.module(0x400000, 0x500000, "/nonexistent/app");
  b.stack(1, {0x401000, 0x402000});
  b.stack(2, {0x403000});
  b.segment(kSeg, 20 * MiB, false);
  b.alloc(kSeg, 3 * MiB, 3 * MiB, 1);
  b.alloc(kSeg + 3 * MiB, 1000, 1024, 2);
  b.alloc(kSeg + 4 * MiB, 2 * MiB, 2 * MiB, 1);
  b.free(kSeg + 4 * MiB);
  b.completed(kSeg + 4 * MiB);
  b.alloc(0x9000000, 4096, 4096, 2, AllocKind::async);
  b.end();
  return b;
}
}  // namespace

TEST(Units, TorchCells) {
  EXPECT_EQ(torch_size_cell(3584, 3584), "  3584 B  ");
  EXPECT_EQ(torch_size_cell(786431, 786431), "786431 B  ");  // < 768 KiB stays in bytes
  EXPECT_EQ(torch_size_cell(786432, 786432), "   768 KiB");
  EXPECT_EQ(torch_size_cell(3 * MiB, 3 * MiB), "  3072 KiB");  // < 768 MiB stays in KiB
  EXPECT_EQ(torch_size_cell(805306368, 805306368), "   768 MiB");
  EXPECT_EQ(torch_size_cell(1024, 805306368), "     0 MiB");  // unit from the "all" row
  EXPECT_EQ(torch_count_cell(5, 5), "      5   ");
  EXPECT_EQ(torch_count_cell(749999, 749999), " 749999   ");
  EXPECT_EQ(torch_count_cell(750000, 750000), "    750 K ");
  EXPECT_EQ(torch_count_cell(2'000'000'000, 2'000'000'000), "   2000 M ");
  EXPECT_EQ(torch_size_cell(1, 1).size(), 10u);
}

TEST(Units, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(3 * MiB), "3.00 MiB");
  EXPECT_EQ(human_bytes(200 * MiB), "200 MiB");
}

TEST(Report, TextSummaryRowsAndValues) {
  auto a = analyze_one(sample_trace(), "rep.gh");
  SummaryOptions o;
  o.pools = true;  // the large/small pool rows (not in the default view since issue 17)
  auto t = summary_text(a, o);
  EXPECT_NE(t.find("command:   python train.py"), std::string::npos) << t;
  EXPECT_NE(t.find("pid:       100 (ppid 1) on testhost"), std::string::npos);
  EXPECT_NE(t.find("truncated: no"), std::string::npos);
  EXPECT_NE(t.find("gpuheap memory summary, device ID 0 (Test GPU)"), std::string::npos);
  EXPECT_NE(t.find("CUDA OOMs: 0"), std::string::npos);
  EXPECT_NE(t.find("cudaMalloc retries: 0"), std::string::npos);
  EXPECT_NE(t.find("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "), std::string::npos);
  // Allocated: current 3 MiB + 1 KiB, peak 5 MiB + 1 KiB, total alloc 5 MiB + 1 KiB, freed 2 MiB (KiB units).
  EXPECT_NE(t.find(" Allocated memory      |   3073 KiB |   5121 KiB |   5121 KiB |   2048 KiB "), std::string::npos)
      << t;
  EXPECT_NE(t.find(" GPU reserved memory   |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   "), std::string::npos)
      << t;
  EXPECT_NE(t.find(" Allocations           |       2    |       3    |       3    |       1    "), std::string::npos);
  for (const char* row :
       {"Active memory", "Requested memory", "Non-releasable memory", "Active allocs", "GPU reserved segments",
        "Non-releasable allocs", "Oversize allocations", "Oversize GPU segments", "from large pool", "from small pool"})
    EXPECT_NE(t.find(row), std::string::npos) << row;
  EXPECT_NE(t.find(" Async (stream-ord.)   |   4096 B   |   4096 B   |   4096 B   |       1    "), std::string::npos)
      << t;
  // Every table line is 75 columns.
  std::size_t start = t.find(std::string(75, '='));
  std::size_t stop = t.find("\n\n", start);
  std::string table = t.substr(start, stop - start);
  std::size_t p = 0;
  while (p < table.size()) {
    auto e = table.find('\n', p);
    if (e == std::string::npos) e = table.size();
    EXPECT_EQ(e - p, 75u) << table.substr(p, e - p);
    p = e + 1;
  }
  // Requested bytes first, the pool's block bytes beside them.
  EXPECT_NE(t.find("Peak memory consumers, device 0: peak 5.00 MiB requested (5.00 MiB allocated)"), std::string::npos)
      << t;
  EXPECT_NE(t.find("#1    5.00 MiB requested   5.00 MiB allocated (100.0% of peak) in 2 allocations"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("Leaks (live at the end of the trace): 3.00 MiB requested (3.00 MiB allocated) in 3 allocations"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("#2    4.98 KiB requested   5.00 KiB allocated in 2 allocations"), std::string::npos) << t;
  EXPECT_NE(t.find("#2  2 allocations (4.98 KiB requested, 5.00 KiB allocated in total)"), std::string::npos) << t;
  EXPECT_NE(t.find("Fragmentation at peak reserved, device 0"), std::string::npos) << t;
}

TEST(Report, JsonRequiredKeys) {
  auto a = analyze_one(sample_trace(), "rep.gh");
  SummaryOptions o;
  auto j = summary_json(a, o);
  EXPECT_EQ(j["schema"], "gpuheap.summary/2");
  for (const char* k : {"trace", "leaks", "leaked_bytes", "peak_consumers", "most_allocations", "temporary",
                        "fragmentation", "ooms", "timeline", "devices"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"truncated", "events", "path", "pid", "command", "duration_ns"})
    EXPECT_TRUE(j["trace"].contains(k)) << k;
  const auto& d = j["devices"][0];
  for (const char* k :
       {"device", "name", "total_memory", "requested_bytes", "allocated_bytes", "active_bytes", "reserved_bytes",
        "inactive_split_bytes", "allocations", "segments", "num_ooms", "num_alloc_retries"})
    EXPECT_TRUE(d.contains(k)) << k;
  EXPECT_EQ(d["allocated_bytes"]["peak"], 5 * MiB + 1024);
  EXPECT_EQ(d["allocated_bytes"]["large_pool"]["peak"], 5 * MiB + 1024);
  EXPECT_EQ(d["allocated_bytes"]["small_pool"]["peak"], 0);
  EXPECT_EQ(d["reserved_bytes"]["current"], 20 * MiB);
  EXPECT_EQ(d["segments"]["current"], 1);
  EXPECT_EQ(j["trace"]["command"], nlohmann::json({"python", "train.py"}));
  EXPECT_EQ(j["trace"]["truncated"], false);
  EXPECT_EQ(j["leaked_bytes"], 3 * MiB + 1000 + 4096);  // requested
  EXPECT_EQ(j["leaked_allocated_bytes"], 3 * MiB + 1024 + 4096);
  ASSERT_EQ(j["leaks"].size(), 2u);
  EXPECT_EQ(j["leaks"][1]["bytes"], 1000 + 4096);
  EXPECT_EQ(j["leaks"][1]["allocated_bytes"], 1024 + 4096);
  EXPECT_EQ(j["devices"].size(), 1u);  // the GPU only
  EXPECT_TRUE(j["host"]["other_kinds"].empty());
  EXPECT_EQ(j["devices"][0]["peak_held"]["bytes"], 5 * MiB + 1000);
  EXPECT_EQ(j["devices"][0]["peak_held"]["allocated_bytes"], 5 * MiB + 1024);
  ASSERT_EQ(j["fragmentation"].size(), 1u);
  EXPECT_EQ(j["fragmentation"][0]["at"], "peak_allocated");
  EXPECT_EQ(j["fragmentation"][0]["allocated"], 5 * MiB + 1024);
  ASSERT_FALSE(j["peak_consumers"].empty());
  EXPECT_EQ(j["peak_consumers"][0]["bytes"], 5 * MiB);
  EXPECT_EQ(j["peak_consumers"][0]["count"], 2);
  const auto& st = j["peak_consumers"][0]["stack"];
  ASSERT_EQ(st.size(), 2u);
  for (const char* k : {"function", "file", "line", "module"}) EXPECT_TRUE(st[0].contains(k)) << k;
  EXPECT_EQ(st[0]["module"], "/nonexistent/app");
  EXPECT_FALSE(j["timeline"][0]["points"].empty());
}

TEST(Report, DiffMatchesSitesBySymbolizedStackNotAddress) {
  // Same code loaded at different addresses in A and B: sites must match.
  auto make = [](std::uint64_t base, std::uint64_t s1, std::uint64_t s2, std::uint64_t s3) {
    TraceBuilder b;
    b.module(base, base + 0x100000, "/nonexistent/lib.so");
    b.stack(1, {base + 0x1000});
    b.stack(2, {base + 0x2000});
    b.stack(3, {base + 0x3000});
    std::uint64_t p = 0x1000000;
    for (auto [st, sz] : {std::pair{1u, s1}, std::pair{2u, s2}, std::pair{3u, s3}}) {
      if (sz == 0) continue;
      b.alloc(p, sz, sz, st, AllocKind::device_passthrough);
      b.free(p, AllocKind::device_passthrough);
      p += 0x10000000;
    }
    b.end();
    return b;
  };
  auto a = analyze_one(make(0x400000, 1 * MiB, 10 * MiB, 5 * MiB), "diffa.gh");
  auto b = analyze_one(make(0x7f1200000000ull, 2 * MiB, 4 * MiB, 5 * MiB), "diffb.gh");
  auto rows = diff_sites(*a.traces[0], *b.traces[0], false);
  ASSERT_EQ(rows.size(), 2u);  // site 3 is unchanged
  EXPECT_EQ(rows[0].d_peak(), -static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(rows[0].d_total(), -static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(rows[1].d_peak(), static_cast<std::int64_t>(1 * MiB));
  auto text = diff_text(rows, 10, *a.traces[0], *b.traces[0]);
  EXPECT_NE(text.find("peak -6.00 MiB (10.0 MiB -> 4.00 MiB)"), std::string::npos) << text;
}
