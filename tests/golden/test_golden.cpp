// Golden tests: golden_prog's known patterns through the preload (simcuda) and `gpuheap
// summary`/`check`. Every expected number is derived here from the pattern and the pool's
// documented rules (512 B rounding; <= 1 MiB: small pool, 2 MiB segments; (1, 10) MiB: 20 MiB
// segments; large blocks split when more than 1 MiB remains) — never copied from output.
#include <cstdio>
#include <filesystem>

#include "tests/golden/golden.h"

namespace gpuheap::golden {
namespace {

// The "pooled" pattern (golden_prog.cpp): a0,a1,a2 = 1000 B (blocks of 1024 in one 2 MiB
// small segment), b = 3 MiB (split from a 20 MiB segment), free a1 (completed before the
// next allocation), d = 2000 B (2048 B block), then every block freed.
constexpr std::int64_t kA = 1000, kABlock = 1024, kD = 2000, kDBlock = 2048, kB = 3 * MiB;
constexpr std::int64_t kSmallSeg = 2 * MiB, kLargeSeg = 20 * MiB;
// Requested peaks after d: a0, a2, b, d live (a1 freed before d came).
constexpr std::int64_t kReqPeakSmall = 2 * kA + kD, kReqPeak = kReqPeakSmall + kB;
constexpr std::int64_t kReqTotalSmall = 3 * kA + kD, kReqTotal = kReqTotalSmall + kB;
constexpr std::int64_t kAllocPeakSmall = 2 * kABlock + kDBlock, kAllocPeak = kAllocPeakSmall + kB;
constexpr std::int64_t kAllocTotalSmall = 3 * kABlock + kDBlock, kAllocTotal = kAllocTotalSmall + kB;
constexpr std::int64_t kReserved = kSmallSeg + kLargeSeg;

const Prog& pooled() {
  static Prog p = run_prog("pooled", {"GPUHEAP_SEAL_US=0"});
  return p;
}
const json& pooled_json() {
  static json j = summary_json({pooled().trace()});
  return j;
}

TEST(GoldenPooled, RunsAndTraces) {
  ASSERT_EQ(pooled().run.status, 0) << pooled().run.err;
  ASSERT_EQ(pooled().run.traces.size(), 1u);
  ASSERT_TRUE(pooled_json().is_object());
  EXPECT_EQ(pooled_json()["trace"]["truncated"], false);
  EXPECT_EQ(pooled_json()["trace"]["has_end"], true);
}

TEST(GoldenPooled, RequestedAllocatedReserved) {
  const json& d = pooled_json()["devices"].at(0);
  EXPECT_EQ(d["device"], 0);
  EXPECT_EQ(d["requested_bytes"]["small_pool"], stat(0, kReqPeakSmall, kReqTotalSmall, kReqTotalSmall));
  EXPECT_EQ(d["requested_bytes"]["large_pool"], stat(0, kB, kB, kB));
  EXPECT_EQ(drop_pools(d["requested_bytes"]), stat(0, kReqPeak, kReqTotal, kReqTotal));
  EXPECT_EQ(d["allocated_bytes"]["small_pool"], stat(0, kAllocPeakSmall, kAllocTotalSmall, kAllocTotalSmall));
  EXPECT_EQ(d["allocated_bytes"]["large_pool"], stat(0, kB, kB, kB));
  EXPECT_EQ(drop_pools(d["allocated_bytes"]), stat(0, kAllocPeak, kAllocTotal, kAllocTotal));
  // The cache is kept: both segments are still reserved at the end.
  EXPECT_EQ(d["reserved_bytes"]["small_pool"], stat(kSmallSeg, kSmallSeg, kSmallSeg, 0));
  EXPECT_EQ(d["reserved_bytes"]["large_pool"], stat(kLargeSeg, kLargeSeg, kLargeSeg, 0));
  EXPECT_EQ(drop_pools(d["reserved_bytes"]), stat(kReserved, kReserved, kReserved, 0));
  EXPECT_EQ(drop_pools(d["segments"]), stat(2, 2, 2, 0));
  EXPECT_EQ(d["segments"]["small_pool"], stat(1, 1, 1, 0));
  EXPECT_EQ(drop_pools(d["allocations"]), stat(0, 4, 5, 5));
  EXPECT_EQ(d["allocations"]["small_pool"], stat(0, 3, 4, 4));
  // Active includes freed blocks until their GPU work completes; a1 completed before d.
  EXPECT_EQ(d["active_bytes"]["peak"], kAllocPeak);
  EXPECT_EQ(d["active_allocs"]["peak"], 4);
  EXPECT_EQ(drop_pools(d["oversize_allocations"]), stat(0, 0, 0, 0));
  EXPECT_EQ(d["num_ooms"], 0);
  // The peak consumers' moment: peak requested bytes held, the blocks beside them.
  EXPECT_EQ(d["peak_held"]["bytes"], kReqPeak);
  EXPECT_EQ(d["peak_held"]["allocated_bytes"], kAllocPeak);
}

// Non-releasable (inactive split) memory: free pieces of segments that have an active block.
TEST(GoldenPooled, InactiveSplit) {
  const json& d = pooled_json()["devices"].at(0);
  // Small segment alone peaks right after a0: everything but a0 is a free piece.
  EXPECT_EQ(d["inactive_split_bytes"]["small_pool"]["peak"], kSmallSeg - kABlock);
  EXPECT_EQ(d["inactive_split_bytes"]["large_pool"]["peak"], kLargeSeg - kB);
  // Overall peak when a1 completed: small segment a0 | hole | a2 | tail, large b | tail.
  EXPECT_EQ(d["inactive_split_bytes"]["peak"], (kSmallSeg - 2 * kABlock) + (kLargeSeg - kB));
  // Pieces: the hole and the tail of the small segment plus the large segment's tail; d
  // then goes right after a2 (best fit: the hole is too small), which keeps two pieces.
  EXPECT_EQ(d["inactive_split"]["peak"], 3);
  EXPECT_EQ(d["inactive_split"]["small_pool"]["peak"], 2);
  EXPECT_EQ(d["inactive_split"]["large_pool"]["peak"], 1);
}

TEST(GoldenPooled, TextTableRows) {
  // --pools: the large/small pool rows are out of the default view since issue 17's "fits a
  // screen or two" (docs/cli.md); the rows themselves are unchanged.
  std::string t = summary_text({"--pools", pooled().trace()});
  auto expect_row = [&](const std::string& r) {
    EXPECT_NE(t.find(r + "\n"), std::string::npos) << "missing row:\n" << r << "\nin\n" << t;
  };
  expect_row(row("Allocated memory", torch_size(0, 0), torch_size(kAllocPeak, kAllocPeak),
                 torch_size(kAllocTotal, kAllocTotal), torch_size(kAllocTotal, kAllocTotal)));
  expect_row(row("      from large pool", torch_size(0, 0), torch_size(kB, kAllocPeak), torch_size(kB, kAllocTotal),
                 torch_size(kB, kAllocTotal)));
  expect_row(row("      from small pool", torch_size(0, 0), torch_size(kAllocPeakSmall, kAllocPeak),
                 torch_size(kAllocTotalSmall, kAllocTotal), torch_size(kAllocTotalSmall, kAllocTotal)));
  expect_row(row("Requested memory", torch_size(0, 0), torch_size(kReqPeak, kReqPeak), torch_size(kReqTotal, kReqTotal),
                 torch_size(kReqTotal, kReqTotal)));
  expect_row(row("GPU reserved memory", torch_size(kReserved, kReserved), torch_size(kReserved, kReserved),
                 torch_size(kReserved, kReserved), torch_size(0, 0)));
  expect_row(row("Allocations", torch_count(0, 0), torch_count(4, 4), torch_count(5, 5), torch_count(5, 5)));
  expect_row(row("GPU reserved segments", torch_count(2, 2), torch_count(2, 2), torch_count(2, 2), torch_count(0, 0)));
  // Spot-check the formatting rule itself on these numbers: KiB below 768 MiB.
  EXPECT_EQ(torch_size(kAllocPeak, kAllocPeak), "  3076 KiB");
  EXPECT_EQ(torch_size(0, 0), "     0 B  ");
  EXPECT_NE(t.find("  truncated: no\n"), std::string::npos);
}

// Through the CLI this time: gpuheap run --simulate --no-pool.
TEST(GoldenPooled, NoPool) {
  NoPoolRun np = run_without_pool("pooled");
  const CliRun& r = np.cli;
  const auto& traces = np.traces;
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(traces.size(), 1u) << r.err;
  EXPECT_NE(r.err.find("gpuheap: trace written to " + traces[0]), std::string::npos) << r.err;
  // run passes the command's exit status through (golden_prog: 2 for an unknown mode).
  EXPECT_EQ(cli({"run", "--simulate", "-o", np.dir + "/x.%p.trace", "--", test::kProgs + "/golden_prog",
                 "no-such-mode"})
                .status,
            2);
  json j = summary_json({traces[0]});
  const json& d = j["devices"].at(0);
  // Pass-through: the driver's allocation is the block and the reservation.
  EXPECT_EQ(drop_pools(d["requested_bytes"]), stat(0, kReqPeak, kReqTotal, kReqTotal));
  EXPECT_EQ(drop_pools(d["allocated_bytes"]), stat(0, kReqPeak, kReqTotal, kReqTotal));
  EXPECT_EQ(drop_pools(d["reserved_bytes"]), stat(0, kReqPeak, kReqTotal, kReqTotal));
  EXPECT_EQ(drop_pools(d["segments"]), stat(0, 0, 0, 0));
  EXPECT_EQ(drop_pools(d["inactive_split_bytes"]), stat(0, 0, 0, 0));
  EXPECT_EQ(drop_pools(d["allocations"]), stat(0, 4, 5, 5));
  EXPECT_TRUE(j["fragmentation"].empty());
  EXPECT_EQ(j["leaked_bytes"], 0);
}

TEST(GoldenKinds, NonPooledRows) {
  Prog p = run_prog("kinds");
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  json j = summary_json({p.trace()});
  // devices[] holds GPUs only; pinned host memory is the top-level `host`.
  ASSERT_EQ(j["devices"].size(), 1u);
  const json* dev0 = &j["devices"][0];
  const json* host = &j["host"];
  ASSERT_EQ((*dev0)["device"], 0);
  auto kind = [](std::int64_t cur, std::int64_t peak, std::int64_t total, std::int64_t n, std::int64_t pn,
                 std::int64_t tn) {
    return json{{"current", cur}, {"peak", peak},     {"total", total},
                {"count", n},     {"peak_count", pn}, {"total_count", tn}};
  };
  const json& k = (*dev0)["other_kinds"];
  EXPECT_EQ(k["async"], kind(8192, 4096 + 8192, 4096 + 8192, 1, 2, 2));
  EXPECT_EQ(k["managed"], kind(0, 5000, 5000, 0, 1, 1));
  EXPECT_EQ(k["vmm_physical"], kind(2 * MiB, 6 * MiB, 6 * MiB, 1, 2, 2));
  EXPECT_EQ(k["vmm_map"], kind(2 * MiB, 6 * MiB, 6 * MiB, 1, 2, 2));
  EXPECT_EQ(k["va_reserve"], kind(8 * MiB, 8 * MiB, 8 * MiB, 1, 1, 1));
  EXPECT_FALSE(k.contains("host"));
  EXPECT_EQ((*host)["other_kinds"]["host"], kind(6000, 6000, 6000, 1, 1, 1));
  // None of it is pool memory.
  EXPECT_EQ(drop_pools((*dev0)["allocated_bytes"]), stat(0, 0, 0, 0));
  EXPECT_EQ(drop_pools((*dev0)["reserved_bytes"]), stat(0, 0, 0, 0));
  // Held device memory peaks with both VMM handles and the async block: 6 MiB + 8192.
  EXPECT_EQ((*dev0)["peak_held"]["bytes"], 6 * MiB + 8192);
  // Leaks: the live async block, the mapping, the VA range, the handle, the pinned host block;
  // leaked_bytes leaves out VA reservations and mappings (address space, not memory). These
  // kinds are not rounded by the pool: requested = allocated.
  EXPECT_EQ(j["leaked_bytes"], 8192 + 2 * MiB + 6000);
  EXPECT_EQ(j["leaked_allocated_bytes"], 8192 + 2 * MiB + 6000);

  std::string t = summary_text({p.trace()});
  auto expect_row = [&](const std::string& r) {
    EXPECT_NE(t.find(r + "\n"), std::string::npos) << "missing row:\n" << r << "\nin\n" << t;
  };
  expect_row(row("Async (stream-ord.)", torch_size(8192, 8192), torch_size(12288, 12288), torch_size(12288, 12288),
                 torch_count(1, 1)));
  expect_row(
      row("Managed memory", torch_size(0, 0), torch_size(5000, 5000), torch_size(5000, 5000), torch_count(0, 0)));
  expect_row(row("VMM physical", torch_size(2 * MiB, 2 * MiB), torch_size(6 * MiB, 6 * MiB),
                 torch_size(6 * MiB, 6 * MiB), torch_count(1, 1)));
  expect_row(
      row("Host pinned", torch_size(6000, 6000), torch_size(6000, 6000), torch_size(6000, 6000), torch_count(1, 1)));
  expect_row(row("VA reserved (addr)", torch_size(8 * MiB, 8 * MiB), torch_size(8 * MiB, 8 * MiB),
                 torch_size(8 * MiB, 8 * MiB), torch_count(1, 1)));
}

// The "sites" pattern: 5 temporaries of 4096 B, 7 x 512 B kept, one 12 MiB peak allocation
// freed at once, the 7 freed, then 2 x 300000 B leaked, each from its own function.
const Prog& sites() {
  static Prog p = run_prog("sites");
  return p;
}
const json& sites_json() {
  static json j = summary_json({sites().trace()});
  return j;
}
constexpr std::int64_t kLeak = 300000, kLeakBlock = 300032;  // requested; rounded up to 512

void expect_site(const json& site, const std::string& function, int line) {
  ASSERT_FALSE(site["stack"].empty()) << site.dump();
  const json& f = top_frame(site);
  EXPECT_NE(f["function"].get<std::string>().find(function), std::string::npos) << f.dump();
  EXPECT_EQ(basename(f["file"]), "golden_prog.cpp") << f.dump();
  EXPECT_EQ(f["line"], line) << f.dump();
}

TEST(GoldenSites, LeakNamesFunctionAndLine) {
  ASSERT_EQ(sites().run.status, 0) << sites().run.err;
  ASSERT_TRUE(sites().lines.count("leak"));
  const json& j = sites_json();
  EXPECT_EQ(j["leaked_bytes"], 2 * kLeak);  // what the program asked for
  EXPECT_EQ(j["leaked_allocated_bytes"], 2 * kLeakBlock);
  EXPECT_EQ(j["leaked_count"], 2);
  ASSERT_EQ(j["leaks"].size(), 1u);
  EXPECT_EQ(j["leaks"][0]["bytes"], 2 * kLeak);
  EXPECT_EQ(j["leaks"][0]["allocated_bytes"], 2 * kLeakBlock);
  EXPECT_EQ(j["leaks"][0]["count"], 2);
  expect_site(j["leaks"][0], "leaky_function", sites().lines.at("leak"));
  std::string t = summary_text({sites().trace()});
  char want[128];
  std::snprintf(want, sizeof want, "golden_prog.cpp:%d", sites().lines.at("leak"));
  auto at = t.find("Leaks (live at the end of the trace)");
  ASSERT_NE(at, std::string::npos) << t;
  EXPECT_NE(t.find(want, at), std::string::npos) << t;
}

TEST(GoldenSites, PeakConsumerSymbolized) {
  const json& j = sites_json();
  const std::int64_t peak = 12 * MiB + 7 * 512;  // the 12 MiB block while the 7 small ones live
  EXPECT_EQ(j["devices"][0]["peak_held"]["bytes"], peak);
  ASSERT_GE(j["peak_consumers"].size(), 2u);
  const json& top = j["peak_consumers"][0];
  EXPECT_EQ(top["bytes"], 12 * MiB);
  EXPECT_EQ(top["count"], 1);
  EXPECT_NEAR(top["percent"].get<double>(), 100.0 * (12 * MiB) / peak, 1e-9);
  expect_site(top, "peak_function", sites().lines.at("peak"));
  EXPECT_EQ(j["peak_consumers"][1]["bytes"], 7 * 512);
  expect_site(j["peak_consumers"][1], "many_small", sites().lines.at("many"));
}

TEST(GoldenSites, MostAllocationsAndTemporaries) {
  const json& j = sites_json();
  const json& most = j["most_allocations"];
  ASSERT_EQ(most.size(), 4u);
  const std::pair<const char*, std::int64_t> order[] = {{"many_small", 7},
                                                        {"make_temporaries", 5},
                                                        {"leaky_function", 2},
                                                        {"peak_function", 1}};
  const std::int64_t bytes[] = {7 * 512, 5 * 4096, 2 * kLeak, 12 * MiB};
  const std::int64_t blocks[] = {7 * 512, 5 * 4096, 2 * kLeakBlock, 12 * MiB};
  const char* names[] = {"many", "temporary", "leak", "peak"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(most[i]["count"], order[i].second);
    EXPECT_EQ(most[i]["bytes"], bytes[i]);
    EXPECT_EQ(most[i]["allocated_bytes"], blocks[i]);
    expect_site(most[i], order[i].first, sites().lines.at(names[i]));
  }
  // Temporaries: freed before the thread's next allocation. The 4096 B loop and the 12 MiB
  // block; none of the 7 kept blocks and neither leak.
  const json& tmp = j["temporary"];
  ASSERT_EQ(tmp.size(), 2u);
  EXPECT_EQ(tmp[0]["count"], 5);
  EXPECT_EQ(tmp[0]["bytes"], 5 * 4096);
  expect_site(tmp[0], "make_temporaries", sites().lines.at("temporary"));
  EXPECT_EQ(tmp[1]["count"], 1);
  EXPECT_EQ(tmp[1]["bytes"], 12 * MiB);
  expect_site(tmp[1], "peak_function", sites().lines.at("peak"));
}

// gpuheap check against the pooled trace (peaks computed above) and the sites trace's leak.
TEST(GoldenCheck, ExitCodesPerLimit) {
  const std::string pt = pooled().trace(), st = sites().trace();
  auto check = [](std::vector<std::string> args) {
    return cli([&] {
      args.insert(args.begin(), "check");
      return args;
    }());
  };
  auto n = [](std::int64_t v) { return std::to_string(v) + "B"; };  // a size needs a unit
  struct Case {
    const char* opt;
    std::int64_t value;
    std::string trace;
  } cases[] = {{"--max-requested", kReqPeak, pt},
               {"--max-allocated", kAllocPeak, pt},
               {"--max-reserved", kReserved, pt},
               {"--max-leaked", 2 * kLeak, st}};
  for (const auto& c : cases) {
    auto ok = check({c.trace, c.opt, n(c.value)});
    EXPECT_EQ(ok.status, 0) << c.opt << "\n" << ok.out << ok.err;
    EXPECT_NE(ok.out.find("ok:"), std::string::npos) << ok.out;
    auto fail = check({c.trace, c.opt, n(c.value - 1)});
    EXPECT_EQ(fail.status, 1) << c.opt << "\n" << fail.out << fail.err;
    EXPECT_NE(fail.out.find("FAIL:"), std::string::npos) << fail.out;
  }
  EXPECT_EQ(check({pt, "--max-leaked", "0"}).status, 0);
  EXPECT_EQ(check({st, "--max-leaked", "0"}).status, 1);
  EXPECT_EQ(check({pt, "--max-reserved", "not-a-size"}).status, 2);
  std::string junk = test::make_dir() + "/junk.trace";
  std::ofstream(junk) << "this is not a gpuheap trace\n";
  EXPECT_EQ(check({junk, "--max-leaked", "0"}).status, 2);
}

TEST(GoldenCheck, Baseline) {
  const std::string pt = pooled().trace();
  std::string dir = test::make_dir();
  auto write = [&](const std::string& name, const json& j) {
    std::ofstream(dir + "/" + name) << j.dump();
    return dir + "/" + name;
  };
  std::string same = write("same.json", pooled_json());
  EXPECT_EQ(cli({"check", pt, "--baseline", same, "--tolerance", "0"}).status, 0);
  // A baseline whose reserved peak is 3% lower: within 5%, not within 2%.
  json lower = pooled_json();
  const std::int64_t base = kReserved * 100 / 103;
  lower["devices"][0]["reserved_bytes"]["peak"] = base;
  std::string low = write("lower.json", lower);
  EXPECT_EQ(cli({"check", pt, "--baseline", low, "--tolerance", "5"}).status, 0);
  auto r = cli({"check", pt, "--baseline", low, "--tolerance", "2"});
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(cli({"check", pt, "--baseline", low}).status, 0);  // default tolerance 5%
  // The sites trace against the pooled baseline: it leaks where the baseline did not.
  EXPECT_EQ(cli({"check", sites().trace(), "--baseline", same}).status, 1);
  EXPECT_EQ(cli({"check", pt, "--baseline", write("bad.json", json{{"schema", "nope"}})}).status, 2);
}

// Two runs of the same program: one section per process, merged by wall clock. They ran one
// after the other, so the simultaneous peak is one process's peak, not the sum.
TEST(GoldenMulti, TwoProcesses) {
  const Prog& a = pooled();
  Prog b = run_prog("pooled", {"GPUHEAP_SEAL_US=0"});
  ASSERT_EQ(b.run.status, 0);
  json j = summary_json({a.trace(), b.trace()});
  ASSERT_EQ(j["processes"].size(), 2u);
  for (const auto& p : j["processes"]) {
    EXPECT_FALSE(p.contains("schema"));
    EXPECT_EQ(drop_pools(p["devices"][0]["allocated_bytes"]), stat(0, kAllocPeak, kAllocTotal, kAllocTotal));
  }
  EXPECT_NE(j["processes"][0]["trace"]["pid"], j["processes"][1]["trace"]["pid"]);
  const json& md = j["merged"]["devices"].at(0);
  EXPECT_EQ(md["allocated_bytes"], stat(0, kAllocPeak, 2 * kAllocTotal, 2 * kAllocTotal));
  EXPECT_EQ(md["requested_bytes"], stat(0, kReqPeak, 2 * kReqTotal, 2 * kReqTotal));
  EXPECT_EQ(md["sum_of_peaks_allocated"], 2 * kAllocPeak);
  EXPECT_EQ(md["sum_of_peaks_reserved"], 2 * kReserved);
  // The first process's cache went away when it exited, before the second one started.
  EXPECT_EQ(md["reserved_bytes"], stat(0, kReserved, 2 * kReserved, 2 * kReserved));
  EXPECT_EQ(j["merged"]["leaked_bytes"], 0);
  std::string t = summary_text({a.trace(), b.trace()});
  EXPECT_NE(t.find("##### process 1 of 2"), std::string::npos);
  EXPECT_NE(t.find("##### process 2 of 2"), std::string::npos);
  EXPECT_NE(t.find("##### merged view of 2 processes"), std::string::npos);
}

// A real trace cut inside its last record: still a report, flagged as truncated.
TEST(GoldenTruncated, CutMidRecord) {
  std::string bytes = slurp(pooled().trace());
  ASSERT_GT(bytes.size(), 100u);
  std::string cut = test::make_dir() + "/cut.trace";
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 3));
  auto r = cli({"summary", "--json", cut});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warn"), std::string::npos) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["trace"]["truncated"], true);
  EXPECT_EQ(j["trace"]["cut_mid_record"], true);
  EXPECT_EQ(j["trace"]["has_end"], false);  // the end record was the one cut
  // Everything before the cut is there.
  EXPECT_EQ(j["devices"][0]["allocated_bytes"]["peak"], kAllocPeak);
  auto t = cli({"summary", cut});
  EXPECT_EQ(t.status, 0);
  EXPECT_NE(t.out.find("truncated: yes (no end record; cut mid-record)"), std::string::npos) << t.out;
}

}  // namespace
}  // namespace gpuheap::golden

namespace gpuheap::golden {
namespace {

// The same deterministic program three times with the default fence timing: the pool's
// block choices differ (which cached block a request finds depends on when fences
// completed), the numbers a CI gate reads must not. Leaks are 28 x 2 MiB requested.
TEST(GoldenDeterminism, RequestedBytesAreTheSameEveryRun) {
  constexpr std::int64_t kLeaked = 28 * 2 * MiB;  // 58,720,256
  std::vector<json> runs;
  std::set<std::int64_t> block_totals;
  for (int i = 0; i < 3; ++i) {
    Prog p = run_prog("churn");
    ASSERT_EQ(p.run.status, 0) << p.run.err;
    runs.push_back(summary_json({p.trace()}));
    const json& j = runs.back();
    EXPECT_EQ(j["leaked_bytes"], kLeaked) << "run " << i;
    EXPECT_EQ(j["leaked_count"], 7) << "run " << i;
    EXPECT_GE(j["leaked_allocated_bytes"].get<std::int64_t>(), kLeaked) << "run " << i;
    block_totals.insert(j["most_allocations"][0]["allocated_bytes"].get<std::int64_t>());
    ASSERT_EQ(j["leaks"].size(), 1u);
    expect_site(j["leaks"][0], "churn", p.lines.at("churn_leak"));
    // The process has exited at the end record: nothing is still waiting for its stream.
    const json& d = j["devices"].at(0);
    EXPECT_EQ(d["active_bytes"]["current"], d["allocated_bytes"]["current"]) << "run " << i;
    EXPECT_EQ(d["active_allocs"]["current"], 7) << "run " << i;
    // The fragmentation section describes the peak of allocated memory.
    ASSERT_EQ(j["fragmentation"].size(), 1u);
    EXPECT_EQ(j["fragmentation"][0]["at"], "peak_allocated");
    EXPECT_EQ(j["fragmentation"][0]["allocated"], d["allocated_bytes"]["peak"]);
  }
  auto sites = [](const json& list) {
    json out = json::array();
    for (const auto& s : list) {
      json frames = json::array();  // load addresses differ (ASLR): compare what the frames name
      for (const auto& f : s["stack"]) frames.push_back({f["function"], f["file"], f["line"]});
      out.push_back({s["bytes"], s["count"], frames});
    }
    return out;
  };
  for (int i = 1; i < 3; ++i) {
    for (const char* k : {"leaks", "most_allocations", "temporary", "peak_consumers"})
      EXPECT_EQ(sites(runs[i][k]), sites(runs[0][k])) << k << ", run " << i;
    EXPECT_EQ(runs[i]["devices"][0]["peak_held"]["bytes"], runs[0]["devices"][0]["peak_held"]["bytes"]);
    EXPECT_EQ(runs[i]["devices"][0]["requested_bytes"], runs[0]["devices"][0]["requested_bytes"]);
    auto g = cli({"check", runs[i]["trace"]["path"], "--max-leaked", std::to_string(kLeaked) + "B"});
    EXPECT_EQ(g.status, 0) << g.out << g.err;
  }
  std::printf("block bytes of the busiest site over 3 runs: %zu distinct value(s)\n", block_totals.size());
}

}  // namespace
}  // namespace gpuheap::golden
