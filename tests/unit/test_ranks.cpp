// Several processes, several hosts (issue 35): a GPU is (host, device index), never summed
// across hosts; the identity record (format v4) names each process's rank; summary shows a
// per-rank table and the spread first; --pid/--rank/--host select traces; check's gates
// apply per GPU and name the host, device and rank of a failing peak. Crafted traces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "analyzer/trace/trace_head.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr std::uint64_t GiB = 1ull << 30;
constexpr std::uint64_t kWall = 1'700'000'000'000'000'000ull;

Result sh(const std::string& args) { return run(std::string(GPUHEAP_CLI) + " " + args); }

// The JSON document of `sh`'s output, without the warnings on stderr around it.
nlohmann::json json_of(const Result& r) {
  const auto a = r.out.find('{'), b = r.out.rfind('}');
  return nlohmann::json::parse(a == std::string::npos || b == std::string::npos ? r.out : r.out.substr(a, b - a + 1));
}

struct Proc {
  std::string host;
  std::int32_t rank = -1;  // -1: no identity record (a v3-style trace)
  std::uint32_t pid = 100;
  std::uint64_t bytes = 0;     // one segment and one allocation of this size on device 0
  std::uint64_t start_ms = 0;  // wall-clock start after kWall
  std::uint16_t version = format::kFormatVersion;
};

// One process: starts at kWall + start_ms, holds `bytes` on device 0 (of an 80 GiB GPU)
// from its first to its last event, then frees them and ends.
std::string write_proc(const Proc& p, const std::string& name) {
  const std::uint64_t wall = kWall + p.start_ms * 1'000'000;
  TraceBuilder b(wall, p.pid);
  b.data.resize(format::kFileHeaderSize);
  std::memcpy(b.data.data() + 8, &p.version, 2);
  format::ProcessRecord pr;
  pr.pid = p.pid, pr.ppid = 1, pr.wall_ns = wall, pr.mono_ns = TraceBuilder::kMono;
  pr.hostname = p.host, pr.cmdline = std::string_view("python\0train.py", 15), pr.version = "0.1.0";
  pr.exe = "/usr/bin/python3";
  b.put(pr);
  if (p.rank >= 0) b.put(format::IdentityRecord{p.rank, p.rank % 8, 16, format::RankSource::torchrun});
  b.put(format::DeviceRecord{0, 80 * GiB, "Test GPU"});
  const std::uint64_t ptr = 0x7f0000000000ull;
  b.segment(ptr, p.bytes, false);
  b.alloc(ptr, p.bytes, p.bytes);
  b.tick(1'000'000'000);  // held for a second
  b.free(ptr);
  b.completed(ptr);
  b.segment(ptr, p.bytes, false, /*is_free=*/true);
  b.end();
  return b.write(name);
}

// Two ranks on two hosts, each holding 60 GiB of its own 80 GiB GPU at the same time.
std::string two_hosts() {
  return write_proc({"node-a", 0, 4001, 60 * GiB, 0}, "rk_a0.gh") + " " +
         write_proc({"node-b", 1, 4001, 60 * GiB, 0}, "rk_b1.gh");
}

}  // namespace

TEST(Ranks, IdentityRecordRoundTrips) {
  unsigned char buf[64];
  format::IdentityRecord id{7, 3, 16, format::RankSource::slurm};
  const std::size_t n = format::encode(buf, sizeof buf, id);
  ASSERT_EQ(n, format::kFrameHeaderSize + 13);
  format::Record r;
  std::size_t used = 0;
  ASSERT_EQ(format::decode_frame(buf, n, r, &used), format::FrameStatus::ok);
  EXPECT_EQ(used, n);
  EXPECT_EQ(r.type, format::RecordType::identity);
  EXPECT_EQ(r.identity.rank, 7);
  EXPECT_EQ(r.identity.local_rank, 3);
  EXPECT_EQ(r.identity.world_size, 16);
  EXPECT_EQ(r.identity.source, format::RankSource::slurm);
  buf[format::kFrameHeaderSize + 12] = 9;  // no such source
  EXPECT_EQ(format::decode_frame(buf, n, r, &used), format::FrameStatus::corrupt);
}

TEST(Ranks, TraceHeadReadsRankAndHost) {
  const auto p = write_proc({"node-b", 5, 77, GiB, 0}, "rk_head.gh");
  const TraceHead h = read_trace_head(p);
  EXPECT_EQ(h.hostname, "node-b");
  EXPECT_EQ(h.pid, 77u);
  EXPECT_EQ(h.rank, 5);
  EXPECT_EQ(h.local_rank, 5);
  EXPECT_EQ(h.world_size, 16);
  auto d = sh("dump " + p);
  EXPECT_NE(d.out.find("identity rank=5 local_rank=5 world_size=16 source=torchrun"), std::string::npos) << d.out;
  auto t = json_of(sh("summary -q --json " + p))["trace"];
  EXPECT_EQ(t["rank"], 5);
  EXPECT_EQ(t["local_rank"], 5);
  EXPECT_EQ(t["world_size"], 16);
  EXPECT_EQ(t["rank_source"], "torchrun");
}

// The case: device 0 of two hosts is two GPUs. Summing them gave "peak 120 GiB" and
// failed a 100 GiB gate that each GPU meets.
TEST(Ranks, TwoHostsAreNeverSummed) {
  const std::string traces = two_hosts();
  auto c = sh("check -q --max-reserved 100GiB " + traces);
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("peak reserved bytes 60.0 GiB (64424509440 B) on device 0 of host node-"), std::string::npos)
      << c.out;
  auto s = sh("summary -q " + traces);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("device 0 of host node-a (rank 0): peak allocated 60.0 GiB"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("device 0 of host node-b (rank 1): peak allocated 60.0 GiB"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("120 GiB"), std::string::npos) << s.out;
  auto j = nlohmann::json::parse(sh("summary -q --json " + traces).out);
  EXPECT_EQ(j["schema"], "gpuheap.summary/2");
  ASSERT_EQ(j["merged"]["devices"].size(), 2u) << j["merged"].dump();
  for (const auto& d : j["merged"]["devices"]) EXPECT_EQ(d["reserved_bytes"]["peak"], 60 * GiB);
  EXPECT_EQ(j["merged"]["devices"][0]["host"], "node-a");
  EXPECT_EQ(j["merged"]["devices"][1]["host"], "node-b");
}

// Processes of one host on one device still add up: they share that GPU.
TEST(Ranks, OneHostOneDeviceStillAddsUp) {
  const std::string traces = write_proc({"node-a", 0, 4001, 60 * GiB, 0}, "rk_same0.gh") + " " +
                             write_proc({"node-a", 1, 4002, 60 * GiB, 0}, "rk_same1.gh");
  auto c = sh("check -q --max-reserved 100GiB " + traces);
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("peak reserved bytes 120 GiB (128849018880 B) on device 0 (ranks 0, 1) exceeds"),
            std::string::npos)
      << c.out;
}

// A gate fails on one GPU: the message names its host, device and rank.
TEST(Ranks, PerGpuGateNamesHostDeviceAndRank) {
  const std::string traces = write_proc({"node-a", 0, 4001, 60 * GiB, 0}, "rk_g0.gh") + " " +
                             write_proc({"node-b", 1, 4001, 90 * GiB, 0}, "rk_g1.gh");
  auto c = sh("check -q --max-reserved 80GiB " + traces);
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("FAIL: peak reserved bytes 90.0 GiB (96636764160 B) on device 0 of host node-b (rank 1) "
                       "exceeds --max-reserved 80.0 GiB"),
            std::string::npos)
      << c.out;
  // The rank that meets the limit alone passes it.
  EXPECT_EQ(sh("check -q --max-reserved 80GiB --rank 0 " + traces).code, 0);
  EXPECT_EQ(sh("check -q --max-reserved 80GiB --host node-b " + traces).code, 1);
}

// The per-rank table comes first, ordered by rank, with the spread across ranks.
// check --baseline names what grew on the GPU whose peak failed the gate: its own sites, not
// those of device 0 added up over both hosts (120 GiB -> 130 GiB).
TEST(Ranks, BaselineGrowthIsOfTheGateGpu) {
  const std::string base = TraceBuilder::dir() + "/rk_base.json";
  auto b = sh("summary -q --json " + two_hosts() + " > " + base + " 2>/dev/null");
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string now = write_proc({"node-a", 0, 4001, 60 * GiB, 0}, "rk_now_a0.gh") + " " +
                          write_proc({"node-b", 1, 4001, 70 * GiB, 0}, "rk_now_b1.gh");
  auto c = sh("check -q --baseline " + base + " " + now);
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("peak requested bytes 70.0 GiB (75161927680 B) on device 0 of host node-b"), std::string::npos)
      << c.out;
  EXPECT_NE(c.out.find("grew: +10.0 GiB at "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("(60.0 GiB -> 70.0 GiB)"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("120 GiB"), std::string::npos) << c.out;
}

// Two hosts' processes may share a pid: each CSV row names its host and rank.
TEST(Ranks, CsvRowsNameHostAndRank) {
  const std::string out = TraceBuilder::dir() + "/rk_two.csv";
  auto e = sh("export -q --force --format csv -o " + out + " " + two_hosts());
  ASSERT_EQ(e.code, 0) << e.out;
  std::ifstream f(out);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(line.substr(line.size() - 10), ",host,rank");
  std::map<std::string, int> rows;  // "pid,...,host,rank" -> rows
  while (std::getline(f, line)) {
    const auto pid = line.substr(0, line.find(','));
    const auto who = line.substr(line.rfind(',', line.rfind(',') - 1) + 1);
    ++rows[pid + " " + who];
  }
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_GT(rows["4001 node-a,0"], 0);
  EXPECT_EQ(rows["4001 node-a,0"], rows["4001 node-b,1"]);
}

TEST(Ranks, PerRankTableAndSpread) {
  const std::string traces = write_proc({"node-b", 2, 302, 30 * GiB, 20}, "rk_t2.gh") + " " +
                             write_proc({"node-a", 0, 300, 10 * GiB, 0}, "rk_t0.gh") + " " +
                             write_proc({"node-a", 1, 301, 20 * GiB, 10}, "rk_t1.gh");
  auto s = sh("summary -q " + traces);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(s.out.rfind("Processes: 3 traces", 0), 0u) << s.out;
  const auto r0 = s.out.find("    0 node-a"), r1 = s.out.find("    1 node-a"), r2 = s.out.find("    2 node-b");
  ASSERT_NE(r0, std::string::npos) << s.out;
  ASSERT_NE(r1, std::string::npos) << s.out;
  ASSERT_NE(r2, std::string::npos) << s.out;
  EXPECT_LT(r0, r1);
  EXPECT_LT(r1, r2);
  EXPECT_LT(r2, s.out.find("##### process 1 of 3"));
  // Rank 2's peak: 30 GiB, 20 ms after the earliest start plus its first event.
  EXPECT_NE(s.out.find("30.0 GiB       30.0 GiB"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("Spread across 3 ranks:"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("peak requested: max 30.0 GiB at rank 2 (host node-b, device 0), min 10.0 GiB at rank 0 "
                       "(host node-a, device 0), max/min 3.00"),
            std::string::npos)
      << s.out;

  auto j = nlohmann::json::parse(sh("summary -q --json " + traces).out);
  const auto& rows = j["ranks"]["rows"];
  ASSERT_EQ(rows.size(), 3u) << j["ranks"].dump();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rows[i]["rank"], i);
  EXPECT_EQ(rows[2]["host"], "node-b");
  EXPECT_EQ(rows[2]["pid"], 302);
  EXPECT_EQ(rows[2]["peak_requested"], 30 * GiB);
  EXPECT_EQ(rows[2]["world_size"], 16);
  EXPECT_EQ(rows[0]["leaked_bytes"], 0);
  // Times on one axis: rank 2 started 20 ms after rank 0, and peaked one event (1 us) in.
  EXPECT_EQ(rows[0]["peak_ns"], 2000);
  EXPECT_EQ(rows[2]["peak_ns"], 20'002'000);
  EXPECT_EQ(j["ranks"]["spread"]["peak_requested"]["max_row"], 2);
  EXPECT_EQ(j["ranks"]["spread"]["peak_requested"]["min_row"], 0);
  EXPECT_DOUBLE_EQ(j["ranks"]["spread"]["peak_requested"]["max_over_min"].get<double>(), 3.0);
}

TEST(Ranks, SelectByRankHostPid) {
  const std::string traces = write_proc({"node-a", 0, 500, 10 * GiB, 0}, "rk_s0.gh") + " " +
                             write_proc({"node-a", 1, 501, 20 * GiB, 0}, "rk_s1.gh") + " " +
                             write_proc({"node-b", 2, 502, 30 * GiB, 0}, "rk_s2.gh");
  auto pids = [](const std::string& json_out) {
    auto j = nlohmann::json::parse(json_out);
    std::vector<int> v;
    if (j.contains("processes"))
      for (const auto& p : j["processes"]) v.push_back(p["trace"]["pid"].get<int>());
    else v.push_back(j["trace"]["pid"].get<int>());
    return v;
  };
  EXPECT_EQ(pids(sh("summary -q --json --rank 1 " + traces).out), (std::vector<int>{501}));
  EXPECT_EQ(pids(sh("summary -q --json --rank 2,0 " + traces).out), (std::vector<int>{500, 502}));
  EXPECT_EQ(pids(sh("summary -q --json --host node-a " + traces).out), (std::vector<int>{500, 501}));
  EXPECT_EQ(pids(sh("summary -q --json --pid 502 --pid 501 " + traces).out), (std::vector<int>{501, 502}));
  EXPECT_EQ(pids(sh("summary -q --json --host node-a --rank 2 --rank 1 " + traces).out), (std::vector<int>{501}));
  auto none = sh("summary -q --rank 7 " + traces);
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("--rank 7: no trace matches (the traces are of pid 500 on node-a rank 0; "),
            std::string::npos)
      << none.out;
  // A trace without an identity record has no rank: --rank never selects it.
  const std::string old = write_proc({"node-c", -1, 600, GiB, 0, 3}, "rk_v3.gh");
  auto v3 = sh("summary -q --rank 0 " + old);
  EXPECT_EQ(v3.code, 2) << v3.out;
  EXPECT_NE(v3.out.find("pid 600 on node-c (no rank)"), std::string::npos) << v3.out;
  EXPECT_EQ(sh("summary -q --host node-c " + old).code, 0);
}

// A version-3 trace (no identity record) reads as before; its row says "-" for the rank.
TEST(Ranks, OlderTracesWithoutRanks) {
  const std::string traces = write_proc({"node-a", -1, 700, GiB, 0, 3}, "rk_old0.gh") + " " +
                             write_proc({"node-a", -1, 701, 2 * GiB, 0, 3}, "rk_old1.gh");
  auto s = sh("summary -q " + traces);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("      - node-a"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("Spread across 2 processes:"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("max 2.00 GiB at pid 701 (device 0)"), std::string::npos) << s.out;
  // One host: the merged view names the device alone, as before.
  EXPECT_NE(s.out.find("  device 0: peak allocated 3.00 GiB"), std::string::npos) << s.out;
}

// The report: the rank table's data, every chart on one time axis, each merged GPU its own
// chart with its peak marked.
TEST(Ranks, ReportSharesOneTimeAxis) {
  const std::string traces = write_proc({"node-a", 0, 800, 10 * GiB, 0}, "rk_r0.gh") + " " +
                             write_proc({"node-b", 1, 801, 20 * GiB, 500}, "rk_r1.gh");
  const std::string html = TraceBuilder::dir() + "/rk_report.html";
  auto r = sh("report -q --force -o " + html + " " + traces);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string page = slurp(html);
  auto a = page.find("id=\"gpuheap-data\">");
  ASSERT_NE(a, std::string::npos);
  a += std::string("id=\"gpuheap-data\">").size();
  auto data = nlohmann::json::parse(page.substr(a, page.find("</script>", a) - a));
  EXPECT_EQ(data["summary"]["ranks"]["rows"].size(), 2u);
  ASSERT_TRUE(data.contains("time_axis"));
  EXPECT_NEAR(data["time_axis"]["max"].get<double>(), 1.5, 0.01);
  std::vector<std::string> labels;
  for (const auto& t : data["timelines"]) labels.push_back(t["label"]);
  ASSERT_EQ(labels.size(), 4u);
  EXPECT_EQ(labels[0], "cuda:0 Test GPU (rank 0, pid 800 on node-a)");
  EXPECT_EQ(labels[1], "cuda:0 Test GPU (rank 1, pid 801 on node-b)");
  EXPECT_EQ(labels[3], "device 0 of host node-b (rank 1): its one process");
  // Rank 1 started 0.5 s later: its chart begins there, and its peak is marked there.
  const auto& t1 = data["timelines"][1];
  EXPECT_NEAR(t1["t"][0].get<double>(), 0.5, 0.001);
  bool peak = false;
  for (const auto& m : t1["markers"]) peak |= m["kind"] == "peak" && std::abs(m["t"].get<double>() - 0.500002) < 1e-6;
  EXPECT_TRUE(peak) << t1["markers"].dump();
  bool merged_peak = false;
  for (const auto& m : data["timelines"][3]["markers"]) merged_peak |= m["kind"] == "peak";
  EXPECT_TRUE(merged_peak);
  // --rank applies to the report as well.
  auto one = sh("report -q --force --rank 1 -o " + html + " " + traces);
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(slurp(html).find("node-a"), std::string::npos);
}

// The shipped traces are of format versions 2 and 3 (no identity record): they read as
// before, alone and together (no rank: "-" rows, null in JSON), and --host/--pid select them.
TEST(Ranks, ShippedOlderTracesStillRead) {
  const std::string v2 = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h200-gpt-train-v2.trace.zst";
  const std::string v3 = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
  for (const auto& p : {v2, v3}) {
    const TraceHead h = read_trace_head(p);
    EXPECT_EQ(h.hostname, "vm") << p;
    EXPECT_EQ(h.rank, -1) << p;
    auto one = sh("summary -q " + p);
    EXPECT_EQ(one.code, 0) << one.out;
    EXPECT_EQ(one.out.find("Processes:"), std::string::npos) << p;  // one trace: no table
    EXPECT_FALSE(json_of(sh("summary -q --json " + p))["trace"].contains("rank")) << p;
  }
  auto j = json_of(sh("summary -q --json " + v2 + " " + v3));
  const auto& rows = j["ranks"]["rows"];
  ASSERT_EQ(rows.size(), 2u) << j["ranks"].dump();
  for (const auto& r : rows) {
    EXPECT_TRUE(r["rank"].is_null());
    EXPECT_EQ(r["host"], "vm");
    EXPECT_GT(r["peak_requested"].get<std::int64_t>(), 0);
  }
  EXPECT_EQ(rows[0]["pid"], 595);                // no ranks: in the order given
  ASSERT_EQ(j["merged"]["devices"].size(), 1u);  // one host, device 0 of both: one GPU
  EXPECT_EQ(j["merged"]["devices"][0]["processes"], nlohmann::json::array({0, 1}));
  auto r = sh("summary -q --rank 0 " + v2 + " " + v3);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("pid 595 on vm (no rank); pid 862 on vm (no rank)"), std::string::npos) << r.out;
  auto p = json_of(sh("summary -q --json --host vm --pid 862 " + v2 + " " + v3));
  EXPECT_EQ(p["trace"]["pid"], 862);
}
