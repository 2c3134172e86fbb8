// `gpuheap export`: every format from one synthetic trace whose state is known, checked
// against the replay (Model) of the same trace and against the events written into it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr std::uint64_t MiB = 1u << 20;
constexpr std::uint64_t S1 = 0x7f0000000000ull, S2 = 0x7f0004000000ull, S3 = 0x7f0006000000ull;
constexpr std::uint64_t P1 = 0x9000000, P2 = 0x9100000;
// A module path that is markup, CSV, JSON and folded-syntax at once.
const char* kHostile = "/tmp/a;b,\"c\"\n<img src=x onerror=alert(1)>\xff.so";

TraceBuilder sample() {
  TraceBuilder b;
  b.module(0x400000, 0x500000, "/nonexistent/app");
  b.module(0x600000, 0x700000, kHostile);
  b.stack(1, {0x401000, 0x402000});
  b.stack(2, {0x601000, 0x402000});
  b.stack(3, {0x403000});
  b.put(format::ThreadRecord{1, "main"});
  b.segment(S1, 20 * MiB, false);
  b.alloc(S1, 3 * MiB - 100, 3 * MiB, 1);
  b.alloc(S1 + 3 * MiB, 2 * MiB, 2 * MiB, 2);
  b.alloc(S1 + 5 * MiB, 1 * MiB, 1 * MiB, 3);  // leaks
  b.free(S1 + 3 * MiB);
  b.completed(S1 + 3 * MiB);
  b.free(S1);  // never completed: active_pending_free at the end
  b.segment(S2, 2 * MiB, true);
  b.alloc(S2, 1000, 1024, 3, AllocKind::device_pooled, format::kFlagSmallPool);  // leaks
  b.alloc(P1, 4096, 4096, 1, AllocKind::device_passthrough);                     // leaks
  b.alloc(P2, 8192, 8192, 2, AllocKind::device_passthrough);
  b.free(P2, AllocKind::device_passthrough);
  format::OomRecord o;
  o.ts = b.tick(), o.tid = 1, o.device = 0, o.requested = 30 * MiB, o.device_free = 5 * MiB;
  o.device_total = 16ull << 30, o.stack = 1;
  b.put(o);
  b.segment(S3, 2 * MiB, true);
  b.segment(S3, 2 * MiB, true, true);
  b.alloc(0x5000, 64, 64, 1, AllocKind::host_pinned, 0, 1, -1);  // not device memory
  b.end();
  return b;
}

class Export : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(sample().write("export.gh"));
    AnalyzeOptions o;
    o.progress = false;
    o.warn_truncated = false;
    a_ = new Analysis(analyze({*path_}, o));
  }
  static void TearDownTestSuite() {
    delete a_;
    delete path_;
  }
  std::string exp(const std::string& fmt, const std::string& extra = "") {
    std::string out = TraceBuilder::dir() + "/export." + fmt + extra.substr(extra.find_last_of(' ') + 1);
    auto r = run(std::string(GPUHEAP_CLI) + " export -q --force --format " + fmt + " " + extra + " -o " + out + " " +
                 *path_);
    EXPECT_EQ(r.code, 0) << r.out;
    return out;
  }
  static const Model& m() { return *a_->traces[0]; }
  static std::string* path_;
  static Analysis* a_;
};
std::string* Export::path_ = nullptr;
Analysis* Export::a_ = nullptr;

std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  // The exports' fields hold no quotes except names, which these columns never carry.
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string x;
    while (std::getline(ls, x, ',')) f.push_back(x);
    if (!line.empty() && line.back() == ',') f.push_back("");
    rows.push_back(f);
  }
  return rows;
}

}  // namespace

TEST_F(Export, CsvHasEveryEventAndTheReplayTotals) {
  auto rows = csv_rows(slurp(exp("csv")));
  ASSERT_GT(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], "pid");
  ASSERT_EQ(rows[0].size(), 18u);
  EXPECT_EQ(rows[0][16], "host");
  EXPECT_EQ(rows[0][17], "rank");
  std::map<std::string, int> n;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 18u) << i;
    EXPECT_EQ(rows[i][16], "testhost") << i;
    EXPECT_EQ(rows[i][17], "") << i;  // no identity record: no rank
    ++n[rows[i][2]];
  }
  EXPECT_EQ(n["alloc"], 7);  // host_pinned included (device -1)
  EXPECT_EQ(n["free"], 3);
  EXPECT_EQ(n["free_completed"], 1);
  EXPECT_EQ(n["segment_alloc"], 3);
  EXPECT_EQ(n["segment_free"], 1);
  EXPECT_EQ(n["oom"], 1);
  // The last device-0 row's running totals are the replay's final state.
  const DeviceState* d0 = nullptr;
  for (const auto& d : m().devices)
    if (d.device == 0) d0 = &d;
  ASSERT_NE(d0, nullptr);
  std::vector<std::string> last;
  for (std::size_t i = 1; i < rows.size(); ++i)
    if (rows[i][3] == "0") last = rows[i];
  EXPECT_EQ(std::stoll(last[12]), d0->stat[kRequestedBytes][0].current);
  EXPECT_EQ(std::stoll(last[13]), d0->stat[kAllocatedBytes][0].current);
  // Active still counts A1, freed but never completed (the replay's finish() completes it).
  EXPECT_EQ(std::stoll(last[14]), static_cast<std::int64_t>(4 * MiB + 1024 + 4096));
  EXPECT_EQ(std::stoll(last[15]), d0->stat[kReservedBytes][0].current);
  EXPECT_EQ(std::stoll(last[15]), static_cast<std::int64_t>(22 * MiB + 4096));  // S1 + S2 + P1
  // --device filters.
  auto one = csv_rows(slurp(exp("csv", "--device 0")));
  EXPECT_EQ(one.size(), rows.size() - 1);  // the host allocation is gone
}

TEST_F(Export, RmmCsvPairsFreesWithTheirAllocationSizes) {
  auto text = slurp(exp("rmm-csv"));
  auto rows = csv_rows(text);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(text.substr(0, text.find('\n')), "Thread,Time,Action,Pointer,Size,Stream");
  std::regex time_re("^\\d\\d:\\d\\d:\\d\\d\\.\\d{6}$"), ptr_re("^0x[0-9a-f]+$");
  std::map<std::string, std::string> live;
  int allocs = 0, frees = 0, failures = 0;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const auto& r = rows[i];
    ASSERT_EQ(r.size(), 6u) << i;
    EXPECT_TRUE(std::regex_match(r[1], time_re)) << r[1];
    EXPECT_TRUE(std::regex_match(r[3], ptr_re)) << r[3];
    if (r[2] == "allocate") {
      ++allocs;
      live[r[3]] = r[4];
    } else if (r[2] == "free") {
      ++frees;
      ASSERT_TRUE(live.count(r[3])) << r[3];
      EXPECT_EQ(live[r[3]], r[4]);  // RMM frees carry the allocation's size
      live.erase(r[3]);
    } else {
      EXPECT_EQ(r[2], "allocate failure");
      EXPECT_EQ(r[4], std::to_string(30 * MiB));
      ++failures;
    }
  }
  EXPECT_EQ(allocs, 6);  // device memory only: not the pinned host buffer
  EXPECT_EQ(frees, 3);
  EXPECT_EQ(failures, 1);
  EXPECT_EQ(live.count(fmt::format("{:#x}", S1 + 5 * MiB)), 1u);
  EXPECT_EQ(live.count(fmt::format("{:#x}", S1)), 0u) << "S1 was freed";
}

TEST_F(Export, FoldedSumsAreTheReplaysFigures) {
  auto sum = [&](const std::string& metric, std::size_t* lines = nullptr) {
    auto text = slurp(exp("folded", "--metric " + metric));
    std::istringstream in(text);
    std::string line;
    std::uint64_t total = 0;
    std::size_t n = 0;
    while (std::getline(in, line)) {
      auto sp = line.rfind(' ');
      EXPECT_NE(sp, std::string::npos) << line;
      EXPECT_EQ(line.find('\n'), std::string::npos);
      total += std::stoull(line.substr(sp + 1));
      ++n;
    }
    if (lines) *lines = n;
    return total;
  };
  std::uint64_t peak = 0, allocated = 0, count = 0;
  for (const auto& d : m().devices)
    for (const auto& s : d.peak_consumers) peak += s.bytes;
  for (const auto& s : m().sites) allocated += s.alloc_bytes, count += s.allocs;
  EXPECT_EQ(sum("peak"), peak);
  EXPECT_EQ(sum("leaked"), m().leaked_bytes);
  EXPECT_EQ(m().leaked_bytes, 1 * MiB + 1000 + 4096 + 64);  // A3, B1, P1 and the pinned buffer
  EXPECT_EQ(sum("allocated"), allocated);
  EXPECT_EQ(sum("count"), count);
  EXPECT_EQ(count, 7u);
  // The hostile module's frame: its ';' and line break do not split the line.
  auto text = slurp(exp("folded", "--metric allocated"));
  EXPECT_NE(text.find("a:b,\"c\" <img src=x onerror=alert(1)>\xEF\xBF\xBD.so+0xfff"), std::string::npos) << text;
}

TEST_F(Export, SpeedscopeProfilesAreWellFormed) {
  auto j = nlohmann::json::parse(slurp(exp("speedscope")));
  EXPECT_EQ(j["$schema"], "https://www.speedscope.app/file-format-schema.json");
  auto nframes = j["shared"]["frames"].size();
  ASSERT_EQ(j["profiles"].size(), 4u);
  for (const auto& p : j["profiles"]) {
    EXPECT_EQ(p["type"], "sampled");
    ASSERT_EQ(p["samples"].size(), p["weights"].size());
    std::uint64_t total = 0;
    for (const auto& w : p["weights"]) total += w.get<std::uint64_t>();
    EXPECT_EQ(p["endValue"].get<std::uint64_t>(), total);
    for (const auto& s : p["samples"])
      for (const auto& i : s) EXPECT_LT(i.get<std::size_t>(), nframes);
  }
  EXPECT_EQ(j["profiles"][1]["endValue"].get<std::uint64_t>(), m().leaked_bytes);
  EXPECT_EQ(j["profiles"][3]["unit"], "none");
}

TEST_F(Export, ChromeTraceCountersEndAtTheReplayState) {
  auto j = nlohmann::json::parse(slurp(exp("chrome")));
  std::map<std::string, std::int64_t> last;
  int allocs = 0, ooms = 0;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph"));
    if (e["ph"] == "C") last[e["name"]] = e["args"]["bytes"];
    if (e["ph"] == "i" && e["name"] == "alloc") {
      ++allocs;
      if (e.contains("sf")) EXPECT_TRUE(j["stackFrames"].contains(e["sf"].get<std::string>()));
    }
    if (e["name"] == "OOM") ++ooms;
  }
  for (const auto& [id, f] : j["stackFrames"].items())
    if (f.contains("parent")) EXPECT_TRUE(j["stackFrames"].contains(f["parent"].get<std::string>())) << id;
  EXPECT_EQ(allocs, 7);
  EXPECT_EQ(ooms, 1);
  const auto& d0 = m().devices[m().devices[0].device == 0 ? 0 : 1];
  ASSERT_EQ(d0.device, 0);
  EXPECT_EQ(last["cuda:0 requested"], d0.stat[kRequestedBytes][0].current);
  EXPECT_EQ(last["cuda:0 allocated"], d0.stat[kAllocatedBytes][0].current);
  EXPECT_EQ(last["cuda:0 active"], static_cast<std::int64_t>(4 * MiB + 1024 + 4096));  // A1 still pending
  EXPECT_EQ(last["cuda:0 reserved"], d0.stat[kReservedBytes][0].current);
}

TEST_F(Export, TorchSnapshotLoadsInPythonAndAgreesWithTheEvents) {
  auto snap = exp("torch-snapshot");
  auto csv = exp("csv");
  // S1 (A1 pending, A3), S2 (B1), P1's own segment.
  auto r = run("python3 " GPUHEAP_SOURCE_DIR "/tests/unit/export/check_torch_snapshot.py " + snap + " " + csv +
               " --segments 3 --blocks 4");
  EXPECT_EQ(r.code, 0) << r.out;
  // A wrong expectation fails: the checker is not vacuous.
  auto bad = run("python3 " GPUHEAP_SOURCE_DIR "/tests/unit/export/check_torch_snapshot.py " + snap + " " + csv +
                 " --segments 4");
  EXPECT_EQ(bad.code, 1) << bad.out;
}

TEST_F(Export, TorchSnapshotOfTheShippedH200Trace) {
  std::string trace = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h200-gpt-train-v2.trace.zst";
  std::string snap = TraceBuilder::dir() + "/h200.pickle", csv = TraceBuilder::dir() + "/h200.csv";
  for (auto [fmt, out] : {std::pair{"torch-snapshot", snap}, std::pair{"csv", csv}}) {
    auto r = run(std::string(GPUHEAP_CLI) + " export -q --force --format " + fmt + " -o " + out + " " + trace);
    ASSERT_EQ(r.code, 0) << r.out;
  }
  auto r = run("python3 " GPUHEAP_SOURCE_DIR "/tests/unit/export/check_torch_snapshot.py " + snap + " " + csv);
  EXPECT_EQ(r.code, 0) << r.out;
}

// --max-entries N keeps the last N trace entries per device, as torch's
// _record_memory_history(max_entries=N) does (the default, 100000, as memory_viz suggests):
// before, every event stayed in memory (1.6 GB RSS for a 1 GB trace). The final segments are
// unchanged; what was dropped is said on stderr and in the pickle.
TEST_F(Export, TorchSnapshotKeepsTheLastMaxEntries) {
  auto full = exp("torch-snapshot");
  auto csv = exp("csv");
  std::string cut = TraceBuilder::dir() + "/export.cut.pickle";
  auto r = run(std::string(GPUHEAP_CLI) + " export -q --force --format torch-snapshot --max-entries 5 -o " + cut + " " +
               *path_);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: torch-snapshot: cuda:0: kept the last 5 of "), std::string::npos) << r.out;
  auto py = run(
      "python3 -c \"import pickle,sys; f=pickle.load(open(sys.argv[1],'rb')); c=pickle.load(open(sys.argv[2],"
      "'rb')); d=f['device_traces'][0]; assert 'gpuheap_dropped_entries' not in f; "
      "assert c['device_traces'][0]==d[-5:], 'not the last 5'; "
      "assert c['gpuheap_dropped_entries']==[len(d)-5], c['gpuheap_dropped_entries']; "
      "assert c['segments']==f['segments']; print('ok', len(d))\" " +
      full + " " + cut);
  EXPECT_EQ(py.code, 0) << py.out;
  EXPECT_EQ(py.out.rfind("ok ", 0), 0u) << py.out;
  // The truncated history is consistent backwards from the final segments (the viewer's way).
  auto chk = run("python3 " GPUHEAP_SOURCE_DIR "/tests/unit/export/check_torch_snapshot.py " + cut + " " + csv +
                 " --segments 3 --blocks 4");
  EXPECT_EQ(chk.code, 0) << chk.out;
  // 0 keeps every entry: the same bytes as below the cap.
  std::string all = TraceBuilder::dir() + "/export.all.pickle";
  ASSERT_EQ(run(std::string(GPUHEAP_CLI) + " export -q --force --format torch-snapshot --max-entries 0 -o " + all +
                " " + *path_)
                .code,
            0);
  EXPECT_EQ(run("cmp " + all + " " + full).code, 0);
}

TEST_F(Export, UsageErrors) {
  std::string cli = GPUHEAP_CLI;
  EXPECT_EQ(run(cli + " export --format nope -o /dev/null " + *path_).code, 2);
  EXPECT_EQ(run(cli + " export --format csv --metric leaked -o /dev/null " + *path_).code, 2);
  EXPECT_EQ(run(cli + " export --format rmm-csv -o /dev/null " + *path_ + " " + *path_).code, 2);
  auto r = run(cli + " export --format csv -o /nonexistent-dir/x.csv " + *path_);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(run(cli + " export --format csv -o /dev/null /nonexistent.trace").code, 2);
  // A device is written directly (no temporary file next to it), and nothing is left behind.
  EXPECT_EQ(run(cli + " export -q --format csv -o /dev/null " + *path_).code, 0);
  std::string dir = TraceBuilder::dir() + "/bad-out";
  run("mkdir -p " + dir);
  EXPECT_EQ(run(cli + " export -q --format csv -o " + dir + "/x.csv /nonexistent.trace").code, 2);
  EXPECT_EQ(run("ls -A " + dir).out, "") << "a failed export left a file";
}
