// Phase markers and live counters: the gpuheap_* C API and NVTX ranges (through NVTX's
// injection, NVTX_INJECTION64_PATH) end up as phase records; prog_phases checks
// gpuheap_stats itself.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;
using gpuheap::format::PhaseOp;
using gpuheap::format::PhaseSource;

namespace {

std::vector<std::string> names(const TraceFile& t, PhaseSource src, PhaseOp op) {
  std::vector<std::string> v;
  for (auto& p : t.phases)
    if (p.source == src && p.op == op) v.push_back(p.name);
  return v;
}

}  // namespace

TEST(Phases, ApiMarksPushesAndPopsAreRecorded) {
  ProgRun r = run("prog_phases");
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  ASSERT_TRUE(t.ok && t.has_end && !t.corrupt);
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::mark), std::vector<std::string>{"start"});
  auto pushes = names(t, PhaseSource::api, PhaseOp::push);
  ASSERT_EQ(pushes.size(), 3u + 400u);
  EXPECT_EQ(pushes[0], "load");
  EXPECT_EQ(pushes[1], std::string(gpuheap::format::kMaxPhaseName, 'x'));  // cut, not refused
  EXPECT_EQ(pushes[2], "");
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::pop).size(), 403u);
  // Each thread's pushes and pops pair up on that thread.
  std::map<std::uint32_t, int> depth;
  for (auto& p : t.phases) {
    if (p.source != PhaseSource::api) continue;
    if (p.op == PhaseOp::push) ++depth[p.tid];
    if (p.op == PhaseOp::pop) EXPECT_GE(--depth[p.tid], 0);
  }
  for (auto& [tid, d] : depth) EXPECT_EQ(d, 0) << tid;
  EXPECT_EQ(depth.size(), 5u);  // main + 4 threads
  // Without NVTX_INJECTION64_PATH, NVTX calls stay NVTX's no-ops.
  EXPECT_TRUE(names(t, PhaseSource::nvtx, PhaseOp::push).empty());
}

TEST(Phases, NvtxRangesAreRecordedThroughInjection) {
  ProgRun r = run("prog_phases", {}, {"NVTX_INJECTION64_PATH=" + kBuild + "/libgpuheap.so"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_EQ(names(t, PhaseSource::nvtx, PhaseOp::mark), std::vector<std::string>{"nvtx-mark"});
  EXPECT_EQ(names(t, PhaseSource::nvtx, PhaseOp::push),
            (std::vector<std::string>{"forward", "inner?", "backward", "registered"}));
  EXPECT_EQ(names(t, PhaseSource::nvtx, PhaseOp::pop).size(), 4u);
  // The allocation inside "forward" comes after its push and before its pop.
  std::size_t api_pushes = names(t, PhaseSource::api, PhaseOp::push).size();
  EXPECT_EQ(api_pushes, 403u);
}

// gpuheap_stack_stats counts captures, cache hits and walks over every thread; prog_phases
// checks the counts and that stacks off leaves them at 0.
TEST(Phases, StackStatsCountHitsAndWalks) {
  ProgRun r = run("prog_phases", {"stacks"});
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("captures "), std::string::npos) << r.out;
  ProgRun off = run("prog_phases", {"stacks_off"}, {"GPUHEAP_STACKS=0"});
  ASSERT_EQ(off.status, 0) << off.err << off.out;
  EXPECT_NE(off.out.find("captures 0 hits 0 walks 0"), std::string::npos) << off.out;
}

namespace {
std::map<std::string, long> counters(const std::string& out) {
  std::map<std::string, long> m;
  std::istringstream in(out);
  std::string name;
  long v = 0;
  while (in >> name >> v) m[name] = v;
  return m;
}

// prog_stackmix MODE 12 K ONCE 30 on two threads: every capture counted, each thread's K + ONCE
// stacks filled once and walked about twice (the second miss fills), served from the cache after.
void expect_each_stack_walked_twice(const char* mode, int k, int once) {
  ProgRun r = run("prog_stackmix", {mode, "12", std::to_string(k), std::to_string(once), "30"});
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  auto c = counters(r.out);
  const long stacks = 2L * (k + once);
  EXPECT_EQ(c["captures"], 2L * 30 * (12 * k + once)) << r.out;
  EXPECT_EQ(c["fills"], stacks) << r.out;
  // Twice each in every run seen; the slack covers first misses of more keys than one set of
  // the 4-way table holds (their hashes follow ASLR), and is far below a cache that misses.
  EXPECT_LE(c["walks"], 3 * stacks) << r.out;
  EXPECT_EQ(c["failed"], 0) << r.out;
  EXPECT_EQ(c["hits"] + c["walks"], c["captures"]) << r.out;
}
}  // namespace

// A training step's pattern: 20 call paths x 12 layers and 20 paths once a step. With first
// misses noted in a direct-mapped table, keys sharing a slot erased each other's note and were
// walked every time (66-72 of 80 fills, 2,744-5,232 walks in 50 steps).
TEST(Phases, StackCacheHoldsATrainingStepsStacks) { expect_each_stack_walked_twice("varied", 20, 20); }

// 30 stacks a thread that reach the allocator at one stack depth (one cache key). With 16 ways
// a set they evicted each other: 4,240 walks of 15,000 captures.
TEST(Phases, StackCacheHoldsThirtyStacksAtOneStart) { expect_each_stack_walked_twice("same", 20, 10); }

namespace {
// Each thread's allocations in order, each as its stack's frames as dumped (the main thread's
// and the other's: prog_stackmix runs two).
std::map<std::string, std::vector<std::string>> stacks_by_thread(const ProgRun& r) {
  std::map<std::string, std::vector<std::string>> by;
  if (r.status != 0 || r.traces.size() != 1) return by;
  std::istringstream in(run_cmd(kBuild + "/gpuheap dump -q " + r.traces[0]).out);
  std::map<std::string, std::string> frames;  // stack id: its ips
  std::string pid;
  for (std::string line; std::getline(in, line);) {
    auto field = [&line](const std::string& k) {
      std::size_t p = line.find(" " + k + "=");
      if (p == std::string::npos) return std::string();
      p += k.size() + 2;
      return line.substr(p, line.find(' ', p) - p);
    };
    if (line.rfind("process ", 0) == 0) pid = field("pid");
    else if (line.rfind("stack ", 0) == 0) frames[field("id")] = field("ips");
    else if (line.rfind("alloc ", 0) == 0) by[field("tid") == pid ? "main" : "other"].push_back(frames[field("stack")]);
  }
  return by;
}
}  // namespace

// Far more stacks at one start than a set has ways (160 a thread at one key): entries are
// evicted, their ways written again with other stacks, and the set rations its fills. Every
// allocation must still get the stack a full walk finds: run twice without address
// randomisation, cache off and on, each thread's allocations have the same frames in turn.
TEST(Phases, StackCacheServesWalkedStacksThroughEvictions) {
  if (run_cmd("setarch -R true 2>&1").status != 0) GTEST_SKIP() << "setarch -R is not permitted here";
  constexpr int kSteps = 8, kPerStep = 2 * 60 + 100;
  std::map<std::string, std::vector<std::string>> by[2];
  std::map<std::string, long> c;
  for (int cache = 0; cache < 2; ++cache) {
    ProgRun r = run("/usr/bin/setarch",
                    {"-R", kProgs + "/prog_stackmix", "same", "2", "60", "100", std::to_string(kSteps)},
                    {std::string("GPUHEAP_STACK_CACHE=") + (cache ? "1" : "0")});
    ASSERT_EQ(r.status, 0) << r.err << r.out;
    by[cache] = stacks_by_thread(r);
    c = counters(r.out);
  }
  for (const char* t : {"main", "other"}) {
    const std::vector<std::string>& walked = by[0][t];
    const std::vector<std::string>& cached = by[1][t];
    ASSERT_EQ(walked.size(), std::size_t{kSteps * kPerStep}) << t;
    ASSERT_EQ(cached.size(), walked.size()) << t;
    EXPECT_EQ(std::set<std::string>(walked.begin(), walked.end()).size(), 160u) << t;
    std::size_t differ = 0, first = 0;
    for (std::size_t i = 0; i < walked.size(); ++i)
      if (cached[i] != walked[i] && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << t << ": allocations given another stack than the walked one, the first #" << first << ": "
                          << cached[first] << " for " << walked[first];
  }
  // Not vacuous: stacks were served, and ways were filled again (32 a set, two threads).
  EXPECT_GT(c["hits"], 0) << c["captures"];
  EXPECT_GT(c["fills"], 2 * 32) << c["fills"];
}

TEST(Phases, ProgramWithoutPreloadFindsNoApi) {
  ProgRun r = run("prog_phases", {"absent"}, {}, false);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.traces.empty());
}

// `gpuheap run` points NVTX_INJECTION64_PATH at the preload, so NVTX ranges need no setup;
// summary's By phase table lists them with their peaks.
TEST(Phases, RunInjectsNvtxAndSummaryListsRanges) {
  std::string dir = make_dir();
  CmdRun r = run_cmd("env -u NVTX_INJECTION64_PATH " + kBuild +
                     "/gpuheap run --simulate --no-symbolize --no-compress -o '" + dir + "/t.trace' -- " + kProgs +
                     "/prog_phases 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  TraceFile t = load_trace(dir + "/t.trace");
  ASSERT_TRUE(t.ok && t.has_end) << r.out;
  EXPECT_EQ(names(t, PhaseSource::nvtx, PhaseOp::push),
            (std::vector<std::string>{"forward", "inner?", "backward", "registered"}));
  CmdRun s = run_cmd(kBuild + "/gpuheap summary " + dir + "/t.trace 2>&1");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("By phase"), std::string::npos) << s.out;
  // forward's peak: the 1000-byte block (1 KiB) and the 4096-byte one allocated inside it.
  EXPECT_NE(s.out.find("  forward "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("    inner?"), std::string::npos) << s.out;  // nested: indented
  EXPECT_NE(s.out.find("  nvtx-mark (mark)"), std::string::npos) << s.out;
}

// A value the user set (another NVTX tool) is left alone: NVTX then never reaches gpuheap.
TEST(Phases, RunKeepsTheUsersNvtxInjection) {
  std::string dir = make_dir();
  CmdRun r = run_cmd("NVTX_INJECTION64_PATH=/nonexistent/libtool.so " + kBuild +
                     "/gpuheap run --simulate --no-symbolize --no-compress -o '" + dir + "/t.trace' -- " + kProgs +
                     "/prog_phases 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  TraceFile t = load_trace(dir + "/t.trace");
  ASSERT_TRUE(t.ok) << r.out;
  EXPECT_TRUE(names(t, PhaseSource::nvtx, PhaseOp::push).empty());
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::push).size(), 403u);
}

// Python finds the API with ctypes.CDLL(None) when preloaded, and not without the preload.
TEST(Phases, CtypesFindsTheApi) {
  const std::string script = std::string(PY_SCRIPT_DIR) + "/phases_ctypes.py";
  ProgRun r = run(PYTHON3_EXE, {script});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r.out;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::push), std::vector<std::string>{"py-load"});
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::mark), std::vector<std::string>{"py-start"});
  EXPECT_EQ(names(t, PhaseSource::api, PhaseOp::pop).size(), 1u);
  ProgRun absent = run(PYTHON3_EXE, {script}, {}, false);
  EXPECT_EQ(absent.status, 0) << absent.err;
  EXPECT_NE(absent.out.find("ABSENT"), std::string::npos) << absent.out;
}
