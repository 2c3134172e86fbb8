// GPUHEAP_LIMIT, cudaMemGetInfo inside the cap, OOM records and reports, cache control,
// context teardown (device reset, cuCtxDestroy).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using gpuheap::format::AllocKind;
using gpuheap::format::EmptyCacheReason;
namespace format = gpuheap::format;
using namespace gpuheap::test;

namespace {
constexpr std::uint64_t MiB = 1u << 20;

}

TEST(Limits, CapEnforcedForPooledAndPassThroughWithExactMemInfo) {
  ProgRun r = run("prog_limit", {"cap"}, {"GPUHEAP_LIMIT=64MiB", "SIMCUDA_TOTAL_MEMORY=1G"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("gpuheap: CUDA out of memory. Tried to allocate 10.00 MiB (cudaMalloc) on device 0"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("cap 64.00 MiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("per-process cap GPUHEAP_LIMIT"), std::string::npos) << r.err;
  // The six live 10 MiB blocks come from one call site in the program.
  EXPECT_NE(r.err.find("top live allocation sites on device 0:\ngpuheap:     #1 60.00 MiB in 6 allocations"),
            std::string::npos)
      << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.ooms.size(), 2u);
  EXPECT_EQ(t.ooms[0].requested, 10 * MiB);
  EXPECT_EQ(t.ooms[0].limit, 64 * MiB);
  EXPECT_EQ(t.ooms[0].kind, AllocKind::device_pooled);
  EXPECT_EQ(t.ooms[0].reserved, 60 * MiB);
  EXPECT_EQ(t.ooms[1].kind, AllocKind::managed);
  EXPECT_GE(t.retries.size(), 1u);  // the pool retried after releasing its cache
  std::size_t api = 0, retry = 0;
  for (auto& e : t.empty_caches) {
    api += e.reason == EmptyCacheReason::api && e.released == 40 * MiB;
    retry += e.reason == EmptyCacheReason::oom_retry;
  }
  EXPECT_EQ(api, 1u);
  EXPECT_GE(retry, 1u);
}

TEST(Limits, FractionAndPerDevice) {
  EXPECT_EQ(run("prog_limit", {"fraction"}, {"GPUHEAP_LIMIT=0.25", "SIMCUDA_TOTAL_MEMORY=256M"}).status, 0);
  ProgRun r = run("prog_limit", {"perdevice"}, {"GPUHEAP_LIMIT=0:32MiB", "SIMCUDA_DEVICE_COUNT=2"});
  EXPECT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.count_allocs(AllocKind::device_pooled), 1u);
  EXPECT_EQ(t.allocs[0].device, 1);
  ASSERT_EQ(t.frees.size(), 1u);
  EXPECT_EQ(t.frees[0].device, 1);  // looked up by pointer, not by the current device
}

TEST(Limits, ReleaseThresholdTrimsTheCache) {
  ProgRun r = run("prog_limit", {"threshold"}, {"GPUHEAP_RELEASE_THRESHOLD=1b"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  std::size_t n = 0;
  for (auto& e : t.empty_caches) n += e.reason == EmptyCacheReason::threshold;
  EXPECT_GE(n, 1u);
  EXPECT_GE(t.segment_frees.size(), 1u);
}

TEST(Limits, InvalidSpecWarnsAndDoesNotCap) {
  ProgRun r = run("prog_limit", {"uncapped"}, {"GPUHEAP_LIMIT=lots", "SIMCUDA_TOTAL_MEMORY=256M"});
  EXPECT_EQ(r.status, 0);
  // The one line every invalid option gets (options.h): variable, value, what is used.
  EXPECT_NE(r.err.find("GPUHEAP_LIMIT=\"lots\" is not valid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("using the default none (no cap)"), std::string::npos) << r.err;
}

// Issue 18: a SIZE_MAX request was charged as -1 byte (size_t cast to a signed charge), so
// the OOM report of a process holding nothing said "held by this process 16777216.00 TiB"
// (2^64 - 1 bytes), and the request passed any cap on its way to the driver. The held
// figure is what the process holds: nothing, then its 1 MiB block (its 2 MiB pool segment
// when pooled).
TEST(Limits, OomReportOfSizeMaxRequestGivesWhatTheProcessHolds) {
  struct Case {
    std::vector<std::string> env;
    const char* held_later;
  };
  for (const Case& c : {Case{{}, "2.00 MiB"}, Case{{"GPUHEAP_LIMIT=64MiB"}, "2.00 MiB"},
                        Case{{"GPUHEAP_LIMIT=64MiB", "GPUHEAP_POOL=0"}, "1.00 MiB"}}) {
    ProgRun r = run("prog_limit", {"sizemax"}, c.env);
    std::string what = c.env.empty() ? "pooled, no cap" : c.env.back();
    EXPECT_EQ(r.status, 0) << what << r.out << r.err;
    std::size_t first = r.err.find("Tried to allocate 16777216.00 TiB");
    ASSERT_NE(first, std::string::npos) << what << r.err;
    std::size_t second = r.err.find("Tried to allocate 16777216.00 TiB", first + 1);
    ASSERT_NE(second, std::string::npos) << what << r.err;
    std::size_t held1 = r.err.find("held by this process ", first);
    std::size_t held2 = r.err.find("held by this process ", second);
    ASSERT_TRUE(held1 < second && held2 != std::string::npos) << what << r.err;
    EXPECT_EQ(r.err.compare(held1, 25, "held by this process 0 B\n"), 0) << what << r.err;
    EXPECT_EQ(r.err.compare(held2, 21 + std::strlen(c.held_later) + 1,
                            std::string("held by this process ") + c.held_later + "\n"),
              0)
        << what << r.err;
    EXPECT_EQ(r.err.find("held by this process 16777216"), std::string::npos) << what << r.err;
  }
}

// Issue 18: without a unit a GPUHEAP_LIMIT value is a fraction with a point in (0, 1]; "1.5"
// (a 1-byte cap before) and "2" (a 2-byte cap) are refused with one warning and no cap, so
// the 100 MiB allocation of "uncapped" succeeds.
TEST(Limits, BareNumbersAreNotByteCaps) {
  for (const char* v : {"1.5", "2"}) {
    ProgRun r = run("prog_limit", {"uncapped"}, {std::string("GPUHEAP_LIMIT=") + v, "SIMCUDA_TOTAL_MEMORY=256M"});
    EXPECT_EQ(r.status, 0) << v << r.err;
    EXPECT_NE(r.err.find(std::string("GPUHEAP_LIMIT=\"") + v + "\" is not valid"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("gpuheap: "), r.err.rfind("gpuheap: ")) << "more than one warning: " << r.err;
  }
}

// Issue 18: "5:1GiB" where the process has 1 device was accepted silently. Now one warning,
// once, naming the entries; a spec naming only devices that exist gets none.
TEST(Limits, CapForAMissingDeviceWarnsOnce) {
  ProgRun r = run("prog_limit", {"uncapped"}, {"GPUHEAP_LIMIT=5:1GiB,7:2GiB", "SIMCUDA_TOTAL_MEMORY=256M"});
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string w = "GPUHEAP_LIMIT names devices 5, 7, but this process has 1 device";
  EXPECT_NE(r.err.find(w), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(w), r.err.rfind(w)) << r.err;
  EXPECT_EQ(r.err.find("gpuheap: "), r.err.rfind("gpuheap: ")) << "more than one warning: " << r.err;
  ProgRun ok = run("prog_limit", {"perdevice"}, {"GPUHEAP_LIMIT=0:32MiB,1:1GiB", "SIMCUDA_DEVICE_COUNT=2"});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err.find("names device"), std::string::npos) << ok.err;
}

// Reserve-then-allocate: threads racing pass-through kinds to the cap never overshoot it
// (exact: 64 pieces of 1 MiB, in each of 5 rounds; prog_limit checks the driver's count).
TEST(Limits, RacingThreadsNeverExceedTheCap) {
  ProgRun r = run("prog_limit", {"race"}, {"GPUHEAP_LIMIT=64MiB", "GPUHEAP_POOL=0", "SIMCUDA_TOTAL_MEMORY=1G"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  EXPECT_EQ(t.count_allocs(AllocKind::managed) + t.count_allocs(AllocKind::device_passthrough), 5u * 64u);
  EXPECT_EQ(t.ooms.size(), 5u * 4u);  // each thread stops at its first refusal
}

// cuMemCreate is charged to prop->location.id, cudaMallocAsync to the stream's device,
// cudaMallocFromPoolAsync to the pool's device, whichever device is current.
TEST(Limits, PassThroughChargedToTheRightDevice) {
  ProgRun r = run("prog_limit", {"devices"}, {"GPUHEAP_LIMIT=1:8MiB", "SIMCUDA_DEVICE_COUNT=2"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.count_allocs(AllocKind::vmm_physical), 1u);
  ASSERT_EQ(t.count_allocs(AllocKind::async), 2u);
  for (auto& a : t.allocs)
    if (a.kind != AllocKind::device_pooled) EXPECT_EQ(a.device, 1) << format::alloc_kind_name(a.kind);
  ASSERT_EQ(t.ooms.size(), 4u);
  for (auto& o : t.ooms) {
    EXPECT_EQ(o.device, 1);
    EXPECT_EQ(o.limit, 8 * MiB);
  }
}

// cuMemRelease while mapped: the memory stays held (trace and cap) until the last unmap.
TEST(Limits, ReleaseBeforeUnmapKeepsTheBytesHeldUntilUnmap) {
  ProgRun r = run("prog_limit", {"vmm"}, {"GPUHEAP_LIMIT=8MiB"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.ooms.size(), 1u);
  EXPECT_EQ(t.ooms[0].kind, AllocKind::managed);
  // free records in order: vmm_map (the unmap), then vmm_physical (freed by that unmap).
  std::vector<AllocKind> kinds;
  for (auto& f : t.frees)
    if (f.kind == AllocKind::vmm_map || f.kind == AllocKind::vmm_physical) {
      kinds.push_back(f.kind);
      EXPECT_EQ(f.flags, 0);
      EXPECT_EQ(f.size, 8 * MiB);
    }
  EXPECT_EQ(kinds, (std::vector<AllocKind>{AllocKind::vmm_map, AllocKind::vmm_physical}));
}

// cudaDeviceReset / cuDevicePrimaryCtxReset destroy the context's memory: the pool forgets
// its segments (no stale reuse: the next allocation takes a fresh one from the driver), the
// cap accounting goes back to 0, and the trace frees what the reset released (no leak).
TEST(Limits, DeviceResetDropsTheContextsMemory) {
  ProgRun r = run("prog_limit", {"reset"}, {"GPUHEAP_LIMIT=64MiB"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 4u);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 4u);  // 2 by the first reset, 1 by the second
  EXPECT_EQ(t.count_allocs(AllocKind::managed), 1u);
  EXPECT_EQ(t.count_frees(AllocKind::managed), 1u);
  EXPECT_EQ(t.segments.size(), 4u);
  EXPECT_EQ(t.segment_frees.size(), 4u);  // the last one, cached, by the third reset
  std::map<std::uint64_t, int> live;
  for (auto& a : t.allocs) ++live[a.ptr];
  for (auto& f : t.frees) --live[f.ptr];
  for (auto& [ptr, n] : live) EXPECT_EQ(n, 0) << std::hex << ptr;
  // Every pooled block is completed too: 3 live ones dropped by the resets, and the
  // program's last free, still pending behind its fence when the third reset came.
  std::map<std::uint64_t, int> active;
  for (auto& a : t.allocs)
    if (a.kind == AllocKind::device_pooled) ++active[a.ptr];
  for (auto& c : t.completed) --active[c.ptr];
  EXPECT_EQ(t.completed.size(), 4u);
  for (auto& [ptr, n] : active) EXPECT_EQ(n, 0) << std::hex << ptr;
}

namespace {
// `gpuheap summary --json` of a trace, checked to replay with nothing leaked and no free
// the analyzer could not match (empty JSON, and a failure, when the CLI fails).
nlohmann::json summary_without_leaks(const std::string& trace) {
  CmdRun js = run_cmd(kBuild + "/gpuheap summary --json " + trace);
  EXPECT_EQ(js.status, 0) << js.out;
  if (js.status != 0) return nlohmann::json::object();
  auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["leaked_count"], 0);
  EXPECT_EQ(j["leaked_bytes"], 0);
  EXPECT_EQ(j["trace"]["unmatched_frees"], 0);
  EXPECT_EQ(j["trace"]["unmatched_free_completed"], 0);
  return j;
}
}  // namespace

// The analyzer replays that trace as memory released: nothing leaked, active or reserved
// at the end, no counter below zero, no unmatched frees.
TEST(Limits, DeviceResetTraceReplaysCleanly) {
  ProgRun r = run("prog_limit", {"reset"}, {"GPUHEAP_LIMIT=64MiB"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string& trace = r.traces.at(0);
  nlohmann::json j = summary_without_leaks(trace);
  ASSERT_EQ(j["devices"].size(), 1u);
  const auto& d = j["devices"][0];
  for (const char* stat : {"active_allocs", "active_bytes", "allocated_bytes", "allocations", "requested_bytes",
                           "reserved_bytes", "segments", "inactive_split", "inactive_split_bytes"}) {
    EXPECT_EQ(d[stat]["current"], 0) << stat;
    EXPECT_EQ(d[stat]["allocated"], d[stat]["freed"]) << stat;
    for (const char* pool : {"large_pool", "small_pool"})
      if (d[stat].contains(pool)) EXPECT_EQ(d[stat][pool]["current"], 0) << stat << pool;
  }
  EXPECT_EQ(d["active_allocs"]["allocated"], 4);
  EXPECT_EQ(d["reserved_bytes"]["peak"], 12 * MiB);
  std::vector<const nlohmann::json*> todo{&j};
  while (!todo.empty()) {  // no counter anywhere went negative
    const nlohmann::json* x = todo.back();
    todo.pop_back();
    if (x->is_number_integer()) EXPECT_GE(x->get<std::int64_t>(), 0) << j.dump();
    if (x->is_structured())
      for (const auto& v : *x) todo.push_back(&v);
  }
  CmdRun text = run_cmd(kBuild + "/gpuheap summary " + trace + " 2>&1");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("Leaks: none"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("unmatched"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("warning"), std::string::npos) << text.out;
  CmdRun check = run_cmd(kBuild + "/gpuheap check --max-leaked 0 --max-reserved 12MiB " + trace + " 2>&1");
  EXPECT_EQ(check.status, 0) << check.out;
}

// cuCtxDestroy (prog_ctx, see its header). The numbers a line of the program's stdout that
// starts with `tag` carries (decimal or 0x-hex).
namespace {
std::vector<std::uint64_t> numbers_after(const std::string& out, const std::string& tag) {
  std::vector<std::uint64_t> v;
  std::size_t at = out.find(tag + " ");
  if (at == std::string::npos) return v;
  std::size_t end = out.find('\n', at);
  const char* p = out.c_str() + at + tag.size();
  const char* e = out.c_str() + (end == std::string::npos ? out.size() : end);
  while (p < e) {
    char* next = nullptr;
    std::uint64_t x = std::strtoull(p, &next, 0);
    if (next == p) break;
    v.push_back(x);
    p = next;
  }
  return v;
}

// The first successful free of `a`'s pointer after it was allocated, or nullptr.
const format::FreeRecord* free_of(const TraceFile& t, const format::AllocRecord& a) {
  for (auto& f : t.frees)
    if (f.ptr == a.ptr && f.ts > a.ts && !(f.flags & format::kFlagFailed)) return &f;
  return nullptr;
}
}  // namespace

// Everything a created context held is freed in the trace by its cuCtxDestroy: pooled blocks
// (live ones as frees, and their segments), pitch, managed and pinned host memory, each on its
// device with its size; the pool's segments of that context go too, and nothing else does.
// The destroyed handle comes back from the next cuCtxCreate on device 1: what is allocated
// there belongs to device 1. cuCtxDestroy of the primary context is refused by the driver and
// must leave the primary pool alone. The analyzer sees no leak and no unmatched free.
TEST(Limits, CtxDestroyFreesWhatTheContextHeld) {
  ASSERT_EQ(run("prog_ctx", {"1"}, {"SIMCUDA_DEVICE_COUNT=2"}, /*preload=*/false).status, 0);
  ProgRun r = run("prog_ctx", {"1"}, {"SIMCUDA_DEVICE_COUNT=2"});
  EXPECT_EQ(r.status, 0) << r.err;  // the trace of the first context is checked even so
  auto c1 = numbers_after(r.out, "ctx1"), c2 = numbers_after(r.out, "ctx2"), live = numbers_after(r.out, "live");
  ASSERT_EQ(c1.size(), 3u) << r.out;    // create, destroy called, destroy returned
  ASSERT_EQ(live.size(), 5u) << r.out;  // a, c, pitched, managed, host: left for the destroy
  const std::uint64_t stale = live[0];
  TraceFile t = load_trace(r.traces.at(0));
  auto in_destroy = [&](std::uint64_t ts) {
    return (ts >= c1[1] && ts <= c1[2]) || (c2.size() == 3 && ts >= c2[1] && ts <= c2[2]);
  };

  // The first context: 6 allocations, each freed once, with its device and size; the 5 left
  // live by the program during cuCtxDestroy, the other one before.
  std::map<AllocKind, int> kinds;
  for (auto& a : t.allocs) {
    if (a.ts < c1[0] || a.ts >= c1[1]) continue;
    ++kinds[a.kind];
    EXPECT_EQ(a.device, a.kind == AllocKind::host_pinned ? -1 : 0) << format::alloc_kind_name(a.kind);
    const format::FreeRecord* f = free_of(t, a);
    if (!f) {
      ADD_FAILURE() << "never freed: " << format::alloc_kind_name(a.kind) << std::hex << " " << a.ptr;
      continue;
    }
    EXPECT_EQ(f->device, a.device) << format::alloc_kind_name(a.kind);
    EXPECT_EQ(f->kind, a.kind);
    EXPECT_EQ(f->size, a.size) << format::alloc_kind_name(a.kind);
    const bool left_live = std::find(live.begin(), live.end(), a.ptr) != live.end();
    EXPECT_EQ(f->ts >= c1[1] && f->ts <= c1[2], left_live)
        << format::alloc_kind_name(a.kind) << std::hex << " " << a.ptr;
  }
  EXPECT_EQ(kinds, (std::map<AllocKind, int>{{AllocKind::device_pooled, 3},
                                             {AllocKind::managed, 1},
                                             {AllocKind::host_pinned, 1},
                                             {AllocKind::pitch, 1}}));
  // Its pool's three segments (30 MiB, 20 MiB, 2 MiB small) go back with it.
  std::size_t segs1 = 0;
  for (auto& s : t.segments) {
    if (s.ts < c1[0] || s.ts >= c1[1]) continue;
    ++segs1;
    EXPECT_EQ(s.device, 0);
    std::size_t n = 0;
    for (auto& sf : t.segment_frees)
      n += sf.ptr == s.ptr && sf.size == s.size && sf.device == 0 && sf.ts >= c1[1] && sf.ts <= c1[2];
    EXPECT_EQ(n, 1u) << std::hex << s.ptr;
  }
  EXPECT_EQ(segs1, 3u);
  // Segments are freed only by the two destroys (the primary pool keeps its cache to the end).
  for (auto& sf : t.segment_frees) EXPECT_TRUE(in_destroy(sf.ts)) << std::hex << sf.ptr << " device " << sf.device;

  // The only failed free is the program's cuMemFree of a dead-context pointer, after the destroy.
  std::size_t failed = 0;
  for (auto& f : t.frees)
    if (f.flags & format::kFlagFailed) {
      ++failed;
      EXPECT_EQ(f.ptr, stale);
      EXPECT_GT(f.ts, c1[2]);
    }
  EXPECT_EQ(failed, 1u);

  // The recycled handle on device 1: its allocations, frees and segments are device 1's.
  ASSERT_EQ(c2.size(), 3u) << r.out;
  std::size_t allocs2 = 0;
  for (auto& a : t.allocs) {
    if (a.ts < c2[0] || a.ts >= c2[1]) continue;
    ++allocs2;
    EXPECT_EQ(a.device, 1);
    const format::FreeRecord* f = free_of(t, a);
    if (!f) {
      ADD_FAILURE() << "never freed: " << std::hex << a.ptr;
      continue;
    }
    EXPECT_EQ(f->device, 1);
    EXPECT_LE(f->ts, c2[2]);
  }
  EXPECT_EQ(allocs2, 2u);
  std::size_t segs2 = 0;
  for (auto& s : t.segments)
    if (s.ts >= c2[0] && s.ts < c2[1]) {
      ++segs2;
      EXPECT_EQ(s.device, 1);
    }
  EXPECT_GE(segs2, 1u);

  nlohmann::json j = summary_without_leaks(r.traces.at(0));
  bool saw_device1 = false;
  for (const auto& d : j["devices"]) {
    if (d["device"] != 1) continue;
    saw_device1 = true;  // all of it went with the second context
    for (const char* stat : {"active_bytes", "allocated_bytes", "requested_bytes", "reserved_bytes", "segments"})
      EXPECT_EQ(d[stat]["current"], 0) << stat;
  }
  EXPECT_TRUE(saw_device1);
}

// 100 contexts created and destroyed in turn (the handle reused each time, more contexts than
// gpuheap's 64 pool states): each is served from its pool — the destroyed context's state
// comes back for the new one — and each destroy frees what it held.
TEST(Limits, CtxCreateDestroyCycleKeepsPooling) {
  ProgRun r = run("prog_ctx", {"cycle"}, {});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("cycle reused=100"), std::string::npos) << r.out;  // simcuda reuses handles
  TraceFile t = load_trace(r.traces.at(0));
  EXPECT_TRUE(t.has_end);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 200u);
  EXPECT_EQ(t.count_allocs(AllocKind::device_passthrough), 0u);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 200u);
  for (auto& f : t.frees) EXPECT_FALSE(f.flags & format::kFlagFailed);
  for (auto& a : t.allocs) EXPECT_EQ(a.device, 0);
  summary_without_leaks(r.traces.at(0));
}

// Under a cap the destroyed context's charge (pool segments and pass-through memory) is given
// back: the primary context then gets 60 of the 64 MiB, and the recycled handle on device 1 is
// charged to device 1, not to device 0's full budget.
TEST(Limits, CtxDestroyGivesTheChargeBack) {
  ProgRun r = run("prog_ctx", {"1"}, {"SIMCUDA_DEVICE_COUNT=2", "GPUHEAP_LIMIT=64MiB"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  EXPECT_TRUE(t.ooms.empty());
  EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << r.err;
}
