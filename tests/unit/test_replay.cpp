// gpuheap replay (analyzer/replay/) on synthetic traces: fences follow free_completed,
// the none policy's figures, the limit and the pool's retry path, the minimal limit, policy
// parsing and the CLI's exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <tuple>

#include "analyzer/base/error.h"
#include "analyzer/base/flat_map.h"
#include "analyzer/replay/replay.h"
#include "tests/unit/test_analyzer_util.h"

using namespace gpuheap;
using gpuheap::test::TraceBuilder;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr std::uint64_t kA = 0x7f0000000000, kB = 0x7f0010000000;

ReplayResult replay(const TraceBuilder& b, const std::string& name, const std::string& policy = "gpuheap",
                    std::uint64_t limit = 0) {
  ReplayOptions o;
  o.policy = parse_policy(policy);
  o.limit = limit;
  return replay_trace(b.write(name), o);
}

// 10 MiB (own segment), freed, then 10 MiB again; `complete` records the first block's
// free_completed before the second request.
TraceBuilder reuse_trace(bool complete, format::AllocKind kind = format::AllocKind::device_pooled) {
  TraceBuilder b;
  b.alloc(kA, 10 * MiB, 10 * MiB, 0, kind);
  b.free(kA, kind);
  if (complete && kind == format::AllocKind::device_pooled) b.completed(kA);
  b.alloc(kB, 10 * MiB, 10 * MiB, 0, kind);
  b.free(kB, kind);
  b.end();
  return b;
}

// A 20 MiB large-pool segment: Z [0, 8), X [8, 16), free [16, 20). X is freed, then 9 MiB is
// asked for: only X coalesced with the free tail can hold it, and only once X completed.
TraceBuilder coalesce_trace(bool complete) {
  TraceBuilder b;
  b.alloc(kA, 8 * MiB, 8 * MiB);
  b.alloc(kB, 8 * MiB, 8 * MiB);
  b.free(kB);
  if (complete) b.completed(kB);
  b.alloc(kB + MiB, 9 * MiB, 9 * MiB);
  b.end();
  return b;
}

// 12 MiB in its own segment, freed and completed, then 14 MiB: it cannot reuse the 12 MiB
// segment, so unlimited it reserves 26 MiB; under a 16 MiB limit only the pool's OOM path
// (release the free segment, retry) makes it fit.
TraceBuilder retry_trace() {
  TraceBuilder b;
  b.alloc(kA, 12 * MiB, 12 * MiB);
  b.free(kA);
  b.completed(kA);
  b.alloc(kB, 14 * MiB, 14 * MiB);
  b.free(kB);
  b.completed(kB);
  b.end();
  return b;
}

struct Cmd {
  int status = -1;
  std::string out;
};
Cmd cli(const std::string& args) {
  Cmd c;
  FILE* p = ::popen((std::string(GPUHEAP_CLI) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return c;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) c.out.append(buf, n);
  int st = ::pclose(p);
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return c;
}
}  // namespace

TEST(ReplayPolicy, Parses) {
  ReplayPolicy d = parse_policy("gpuheap");
  EXPECT_EQ(d.kind, ReplayPolicy::Kind::gpuheap);
  EXPECT_EQ(d.pool.round, pool::PoolConfig{}.round);
  EXPECT_EQ(d.pool.max_split_size, pool::PoolConfig{}.max_split_size);
  ReplayPolicy p = parse_policy("gpuheap:max_split=64MiB, round=1KiB,large_segment=40MiB");
  EXPECT_EQ(p.pool.max_split_size, 64 * MiB);
  EXPECT_EQ(p.pool.round, KiB);
  EXPECT_EQ(p.pool.large_segment, 40 * MiB);
  EXPECT_EQ(p.pool.small_segment, pool::PoolConfig{}.small_segment);
  EXPECT_EQ(parse_policy("none").kind, ReplayPolicy::Kind::none);
  for (const char* bad : {"pytorch", "gpuheap:bogus=1", "gpuheap:round=pow2:4", "gpuheap:round=0", "gpuheap:max_split",
                          "gpuheap:round=12parsecs", "gpuheapx"})
    EXPECT_THROW(parse_policy(bad), UsageError) << bad;
}

TEST(Replay, FreedBlockIsReusableOnlyAfterItsFreeCompleted) {
  ReplayResult pending = replay(coalesce_trace(false), "pending.trace");
  ASSERT_EQ(pending.devices.size(), 1u);
  EXPECT_EQ(pending.devices[0].reserved.peak, static_cast<std::int64_t>(40 * MiB));  // could not reuse: grew
  EXPECT_EQ(pending.devices[0].segments_at_peak, 2u);
  ReplayResult done = replay(coalesce_trace(true), "done.trace");
  EXPECT_EQ(done.devices[0].reserved.peak, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(done.devices[0].segments_at_peak, 1u);
  EXPECT_EQ(done.devices[0].allocated.allocated, static_cast<std::int64_t>(25 * MiB));
  EXPECT_EQ(done.devices[0].requested.peak, static_cast<std::int64_t>(17 * MiB));
  EXPECT_EQ(done.events, 5u);
  EXPECT_FALSE(done.oom.hit);
}

// gpuheap's pool waits for pending frees rather than grow when they could serve the request
// (pool_impl.h miss()): the replay does the same, so the trace's missing free_completed
// does not make it grow.
TEST(Replay, PendingBytesThatCouldServeAreWaitedFor) {
  EXPECT_EQ(replay(reuse_trace(false), "wait.trace").devices.at(0).reserved.peak, static_cast<std::int64_t>(10 * MiB));
}

// A cudaFree with the pool off synchronized the device: no free_completed is needed.
TEST(Replay, PassThroughFreeCompletesAtOnce) {
  ReplayResult r = replay(reuse_trace(false, format::AllocKind::device_passthrough), "pt.trace");
  EXPECT_EQ(r.devices.at(0).reserved.peak, static_cast<std::int64_t>(10 * MiB));
}

TEST(Replay, PeakLayout) {
  TraceBuilder b;
  b.alloc(kA, 1000, 1024);          // small pool: 2 MiB segment, 1 KiB block
  b.alloc(kB, MiB + 1, MiB + 512);  // large: a 20 MiB segment, split
  b.end();
  ReplayResult r = replay(b, "layout.trace");
  const ReplayDevice& d = r.devices.at(0);
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(22 * MiB));
  EXPECT_EQ(d.allocated.peak, static_cast<std::int64_t>(KiB + MiB + 512));
  EXPECT_EQ(d.non_releasable_at_peak, (2 * MiB - KiB) + (20 * MiB - MiB - 512));
  EXPECT_EQ(d.largest_free_at_peak, 19 * MiB - 512);
  EXPECT_EQ(d.segments_at_peak, 2u);
}

// `none`: every request its own driver allocation, rounded up to 2 MiB, released at free.
TEST(Replay, NonePolicyFiguresMatchAnIndependentCount) {
  TraceBuilder b;
  const std::uint64_t sizes[] = {1, 2 * MiB, 2 * MiB + 1, 5 * MiB, 100, 7 * MiB + 3, 64 * MiB};
  std::map<std::uint64_t, std::uint64_t> live;
  std::uint64_t cur = 0, peak = 0, peak_count = 0, total = 0;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    std::uint64_t ptr = kA + i * 256 * MiB;
    b.alloc(ptr, sizes[i], sizes[i]);
    std::uint64_t r = (sizes[i] + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
    live[ptr] = r, cur += r, total += r;
    if (cur > peak) peak = cur, peak_count = live.size();
    if (i % 3 == 1) {  // free every third, right away
      b.free(ptr);
      b.completed(ptr);
      cur -= live[ptr];
      live.erase(ptr);
    }
  }
  b.end();
  ReplayResult r = replay(b, "none.trace", "none");
  const ReplayDevice& d = r.devices.at(0);
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(peak));
  EXPECT_EQ(d.reserved.current, static_cast<std::int64_t>(cur));
  EXPECT_EQ(d.reserved.allocated, static_cast<std::int64_t>(total));
  EXPECT_EQ(d.segments_at_peak, peak_count);
  EXPECT_EQ(d.largest_free_at_peak, 0u);
  // Under a limit one 2 MiB granule below the peak, `none` fails at the request that made it.
  ReplayResult lim = replay(b, "none.trace", "none", peak - 2 * MiB);
  EXPECT_TRUE(lim.oom.hit);
  EXPECT_EQ(lim.oom.requested, 64 * MiB);
}

// The recorded driver gave the second 20 MiB segment a lower address than the first. Both
// then hold a 6 MiB live head and a 14 MiB free tail, so a 14 MiB request is a tie that the
// pool's best fit breaks by address: the recorded pool took the low segment's tail, and once
// the high segment's head is freed, that whole segment serves 20 MiB (40 MiB reserved). A
// replay that numbers segments upwards in the order it takes them picks the high one, and
// the 20 MiB request must grow a third segment (60 MiB).
TEST(Replay, SegmentsKeepTheRecordedAddressOrder) {
  constexpr std::uint64_t hi = 0x7f0010000000, lo = 0x7f0000000000;
  TraceBuilder b;
  b.segment(hi, 20 * MiB, false);
  b.alloc(hi, 6 * MiB, 6 * MiB);
  b.alloc(hi + 6 * MiB, 14 * MiB, 14 * MiB);
  b.segment(lo, 20 * MiB, false);
  b.alloc(lo, 6 * MiB, 6 * MiB);
  b.free(hi + 6 * MiB);
  b.completed(hi + 6 * MiB);
  b.alloc(lo + 6 * MiB, 14 * MiB, 14 * MiB);  // the tie, taken low
  b.free(hi);
  b.completed(hi);
  b.alloc(hi, 20 * MiB, 20 * MiB);  // the whole high segment again
  b.end();
  ReplayResult r = replay(b, "order.trace");
  const ReplayDevice& d = r.devices.at(0);
  EXPECT_EQ(d.recorded_reserved_peak, 40 * MiB);
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(d.segments_at_peak, 2u);
  // Another policy takes segments of other sizes: those get fresh addresses above every
  // recorded one, and the run still completes.
  ReplayResult other = replay(b, "order.trace", "gpuheap:large_segment=40MiB");
  EXPECT_FALSE(other.oom.hit);
  EXPECT_EQ(other.devices.at(0).allocated.current, static_cast<std::int64_t>(40 * MiB));  // 6 + 14 + 20 live
}

// Segment records the replay must not trust: a range that wraps the address space is never
// offered, and an address offered again while this replay holds it gives way to a fresh one.
TEST(Replay, SegmentAddressesNeverOverlap) {
  TraceBuilder b;
  b.segment(~std::uint64_t{0} - MiB, 16 * MiB, false);
  for (int i = 0; i < 3; ++i) b.segment(kA, 16 * MiB, false);
  b.alloc(kA, 15 * MiB, 15 * MiB);  // a segment of its own, rounded to 16 MiB: kA's
  b.alloc(kB, 15 * MiB, 15 * MiB);  // another: kA is held, so a fresh address
  b.end();
  ReplayResult r = replay(b, "hostile-seg.trace");
  EXPECT_FALSE(r.oom.hit);
  EXPECT_EQ(r.devices.at(0).reserved.peak, static_cast<std::int64_t>(32 * MiB));
  EXPECT_EQ(r.devices.at(0).segments_at_peak, 2u);
}

// The ResNet-18 job kept in tests/gpu/traces (an H100, gpuheap's pool serving every tensor
// from the main and the autograd thread): its replay reproduces the recorded peak, byte for
// byte.
TEST(Replay, KeptH100ResNetTraceReproducesRecordedPeakReserved) {
  ReplayOptions o;
  ReplayResult r = replay_trace(std::string(GPUHEAP_SOURCE_DIR) + "/tests/gpu/traces/h100-resnet18-nocache.trace.zst",
                                o);
  ASSERT_EQ(r.devices.size(), 1u);  // the host allocations make no device of their own
  const ReplayDevice& d = r.devices[0];
  EXPECT_EQ(d.recorded_reserved_peak, 373293056u);
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(d.recorded_reserved_peak));
  EXPECT_EQ(r.unmatched_frees, 0u);
  EXPECT_FALSE(r.truncated);
}

// Under a limit the pool's own OOM path runs: wait for the fences, give fully free segments
// back, retry once.
TEST(Replay, LimitUsesThePoolsReleaseAndRetry) {
  TraceBuilder b = retry_trace();
  EXPECT_EQ(replay(b, "retry.trace").devices.at(0).reserved.peak, static_cast<std::int64_t>(26 * MiB));
  ReplayResult fits = replay(b, "retry.trace", "gpuheap", 16 * MiB);
  EXPECT_FALSE(fits.oom.hit);
  EXPECT_EQ(fits.devices.at(0).retries, 1u);
  EXPECT_EQ(fits.devices.at(0).reserved.peak, static_cast<std::int64_t>(14 * MiB));
  ReplayResult oom = replay(b, "retry.trace", "gpuheap", 13 * MiB);
  ASSERT_TRUE(oom.oom.hit);
  EXPECT_EQ(oom.oom.requested, 14 * MiB);
  EXPECT_EQ(oom.oom.event_index, 6u);   // 1-based: process, device, alloc, free, completed, alloc
  EXPECT_EQ(oom.oom.reserved, 0u);      // the retry gave the 12 MiB segment back first
  EXPECT_EQ(oom.oom.ts_ns, 4 * 1000u);  // the 4th event; TraceBuilder ticks 1 us per event
}

TEST(Replay, FindMinLimitBisects) {
  std::string path = retry_trace().write("min.trace");
  ReplayOptions o;
  MinLimit m = find_min_limit(path, o, 2 * MiB);
  EXPECT_EQ(m.limit, 14 * MiB);  // 12 MiB cannot hold the 14 MiB request; 14 can, by the retry
  EXPECT_FALSE(m.at_limit.oom.hit);
  EXPECT_GT(m.replays, 1);
}

TEST(ReplayCli, ExitCodes) {
  std::string path = retry_trace().write("cli.trace");
  EXPECT_EQ(cli("replay -q " + path).status, 0);
  Cmd oom = cli("replay -q --limit 13MiB " + path);
  EXPECT_EQ(oom.status, 1) << oom.out;
  EXPECT_NE(oom.out.find("OUT OF MEMORY on device 0"), std::string::npos) << oom.out;
  EXPECT_EQ(cli("replay -q --limit 16MiB " + path).status, 0);
  for (const char* bad : {"--policy pytorchish", "--policy gpuheap:nope=1", "--policy gpuheap:round=pow2:4",
                          "--limit lots", "--find-min-limit --limit 1GiB"}) {
    Cmd c = cli(std::string("replay -q ") + bad + " " + path);
    EXPECT_EQ(c.status, 2) << bad << ": " << c.out;
  }
  Cmd js = cli("replay -q --json " + path);
  ASSERT_EQ(js.status, 0) << js.out;
  auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["schema"], "gpuheap.replay/1");
  EXPECT_EQ(j["devices"][0]["reserved_bytes"]["peak"], 26 * MiB);
  EXPECT_EQ(j["devices"][0]["reserved_bytes"]["freed"], 0);
  EXPECT_EQ(j["devices"][0]["allocated_bytes"]["freed"], 26 * MiB);
  EXPECT_EQ(j["oom"]["would_oom"], false);
  Cmd sweep = cli("replay -q --sweep 'gpuheap;none' --limits 13MiB,16MiB " + path);
  EXPECT_EQ(sweep.status, 0) << sweep.out;
  EXPECT_NE(sweep.out.find("NO"), std::string::npos) << sweep.out;
  Cmd sj = cli("replay -q --json --sweep 'gpuheap;none' --limits 13MiB,16MiB " + path);
  ASSERT_EQ(sj.status, 0) << sj.out;
  auto rows = nlohmann::json::parse(sj.out)["rows"];
  ASSERT_EQ(rows.size(), 4u);
  // 13 MiB cannot hold the 14 MiB request under either policy; 16 MiB can: gpuheap by its
  // retry path, none because it caches nothing.
  EXPECT_EQ(rows[0]["fits"], false);
  EXPECT_EQ(rows[1]["fits"], true);
  EXPECT_EQ(rows[1]["peak_reserved"], 14 * MiB);
  EXPECT_EQ(rows[2]["fits"], false);
  EXPECT_EQ(rows[3]["fits"], true);
  EXPECT_EQ(rows[3]["peak_reserved"], 14 * MiB);
  Cmd min = cli("replay -q --find-min-limit " + path);
  EXPECT_EQ(min.status, 0) << min.out;
  EXPECT_NE(min.out.find("(14680064 B)"), std::string::npos) << min.out;
}

// A replay stops at its OOM, the recording did not (issue 35): the rest of the trace still
// says whether it is complete, what the recording reserved at its peak, and the symbols
// `run` stored after the events, which name the failing allocation's frames.
TEST(ReplayCli, AnOomStopsTheReplayNotTheReadingOfTheTrace) {
  TraceBuilder b;
  constexpr std::uint64_t kC = 0x7f0020000000;
  b.segment(kA, 12 * MiB, false);
  b.alloc(kA, 12 * MiB, 12 * MiB);
  b.free(kA);
  b.completed(kA);
  b.stack(1, {0x401000, 0x403000});
  b.segment(kB, 14 * MiB, false);
  b.alloc(kB, 14 * MiB, 14 * MiB, 1);  // over a 13 MiB limit: the replay stops here
  b.segment(kC, 20 * MiB, false);      // the recording's peak: 12 + 14 + 20 MiB
  b.alloc(kC, 20 * MiB, 20 * MiB);
  const char* names[] = {"", "user_model_forward(int)", "model.cpp", "main"};
  for (std::uint32_t id = 1; id < 4; ++id) b.put(format::SymbolStringRecord{id, names[id]});
  for (auto [ip, fn, line] : {std::tuple{0x401000u, 1u, 12u}, std::tuple{0x403000u, 3u, 40u}}) {
    format::SymbolFrameEntry e{fn, 2, line, 0};
    unsigned char buf[256];
    auto n = format::encode_symbol_frames(buf, sizeof buf, ip, &e, 1);
    b.data.insert(b.data.end(), buf, buf + n);
  }
  b.end();
  std::string path = b.write("oom_rest.trace");
  Cmd whole = cli("replay -q " + path);
  Cmd oom = cli("replay -q --limit 13MiB " + path);
  ASSERT_EQ(oom.status, 1) << oom.out;
  EXPECT_EQ(oom.out.find("truncated"), std::string::npos) << oom.out;
  EXPECT_NE(oom.out.find("user_model_forward"), std::string::npos) << oom.out;
  EXPECT_NE(oom.out.find("model.cpp:12"), std::string::npos) << oom.out;
  // The OOM's fragmentation verdict, in the summary's words (format/rules.h).
  EXPECT_NE(oom.out.find("  fragmentation cost 0 B here (free in the pool, largest free block 0 B): with it gone the "
                         "request would not have fit\n"),
            std::string::npos)
      << oom.out;
  auto row = [](const std::string& out) {
    auto at = out.find("recorded peak reserved");
    return at == std::string::npos ? std::string("(none)") : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_NE(row(whole.out).find("46.0 MiB"), std::string::npos) << whole.out;
  EXPECT_EQ(row(oom.out), row(whole.out)) << oom.out;
  auto j = nlohmann::json::parse(cli("replay -q --json --limit 13MiB " + path).out);
  EXPECT_EQ(j["truncated"], false);
  EXPECT_EQ(j["devices"][0]["recorded_reserved_peak"], 46 * MiB);
  // -v is accepted, as the unresolved-modules warning suggests.
  EXPECT_NE(cli("replay -q -v " + path).status, 2);
  Cmd min = cli("replay -q --find-min-limit " + path);
  EXPECT_NE(min.out.find("not counted: the CUDA context"), std::string::npos) << min.out;
  auto mj = nlohmann::json::parse(cli("replay -q --json --find-min-limit " + path).out);
  EXPECT_TRUE(mj.contains("excludes")) << mj.dump();
}

// One fragmentation figure (issue 35): summary, replay and the sweep give the same bytes
// (free bytes in segments holding a live block, at the first moment of peak reserved) and
// summary and replay the same verdict line.
TEST(ReplayCli, SummaryReplayAndSweepGiveOneFragmentationFigure) {
  const std::string path = std::string(GPUHEAP_SOURCE_DIR) + "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
  auto sj = nlohmann::json::parse(cli("summary --json -q " + path + " 2>/dev/null | cat").out);
  auto rj = nlohmann::json::parse(cli("replay -q --json " + path + " 2>/dev/null | cat").out);
  auto wj = nlohmann::json::parse(cli("replay -q --json --sweep gpuheap " + path + " 2>/dev/null | cat").out);
  const auto bytes = sj["devices"][0]["fragmentation"]["bytes"];
  ASSERT_TRUE(bytes.is_number()) << sj["devices"][0].dump();
  EXPECT_GT(bytes.get<std::uint64_t>(), 0u);
  EXPECT_EQ(bytes, rj["devices"][0]["non_releasable_bytes_at_peak"]);
  EXPECT_EQ(bytes, wj["rows"][0]["non_releasable_at_peak"]);
  EXPECT_EQ(sj["devices"][0]["fragmentation"]["reserved"], rj["devices"][0]["reserved_bytes"]["peak"]);
  auto verdict = [](const std::string& out) {
    auto at = out.find("fragmentation cost ");
    return at == std::string::npos ? std::string("(none)") : out.substr(at, out.find('\n', at) - at);
  };
  const std::string text = cli("summary -q " + path + " 2>/dev/null | cat").out;
  EXPECT_NE(verdict(text).find("with it gone the peak reserved would have been"), std::string::npos) << text;
  EXPECT_EQ(verdict(text), verdict(cli("replay -q " + path + " 2>/dev/null | cat").out));
}

// FlatMap::take (the replay's one-probe lookup-and-erase on its live and pending maps): the
// value comes out, the entry is gone, entries sharing its probe run stay findable, and the
// all-ones key (stored beside the table, not in it) works like any other.
TEST(ReplayFlatMap, TakeMovesTheValueOutAndErasesIncludingTheSentinelKey) {
  gpuheap::base::FlatMap<std::uint64_t> m;
  for (std::uint64_t k = 1; k <= 1000; ++k) m.get(k << 21) = k;
  m.get(~std::uint64_t{0}) = 77;
  std::uint64_t v = 0;
  EXPECT_FALSE(m.take(12345, &v));
  for (std::uint64_t k = 1; k <= 1000; k += 2) {
    ASSERT_TRUE(m.take(k << 21, &v));
    EXPECT_EQ(v, k);
    EXPECT_FALSE(m.take(k << 21, &v));
  }
  for (std::uint64_t k = 2; k <= 1000; k += 2) {
    const std::uint64_t* p = m.find(k << 21);
    ASSERT_NE(p, nullptr) << k;
    EXPECT_EQ(*p, k);
  }
  ASSERT_TRUE(m.take(~std::uint64_t{0}, &v));
  EXPECT_EQ(v, 77u);
  EXPECT_FALSE(m.take(~std::uint64_t{0}, &v));
  EXPECT_EQ(m.size(), 500u);
}

// FlatMap::erase_found (the model's erase of a completed block from the slot its lookup
// found), key_at (whether an index survived another erase) and reserve_more/get_reserved
// (both edges of a block inserted after one capacity check): entries erased through them
// are gone, every other entry stays findable, and the all-ones key works like any other.
TEST(ReplayFlatMap, EraseFoundKeyAtAndReservedInsertsKeepTheOtherEntries) {
  gpuheap::base::FlatMap<std::uint64_t> m;
  for (std::uint64_t k = 1; k <= 1000; ++k) {
    m.reserve_more(2);
    std::uint64_t* a = &m.get_reserved(k << 21);
    *a = k;
    m.get_reserved((k << 21) + 512) = k + 5000;
    EXPECT_EQ(*a, k);  // the second insert moved nothing
  }
  m.get(~std::uint64_t{0}) = 77;
  for (std::uint64_t k = 1; k <= 1000; k += 2) {
    std::uint64_t* p = m.find(k << 21);
    ASSERT_NE(p, nullptr);
    m.erase_found(k << 21, p);
    std::size_t ia = m.find_index((k << 21) + 512), ib = m.find_index((k + 1) << 21);
    ASSERT_NE(ia, m.npos);
    ASSERT_NE(ib, m.npos);
    m.erase_at(ib);
    if (m.key_at(ia) == (k << 21) + 512) m.erase_at(ia);
    else ASSERT_TRUE(m.erase((k << 21) + 512));
  }
  m.erase_found(~std::uint64_t{0}, m.find(~std::uint64_t{0}));
  EXPECT_EQ(m.find(~std::uint64_t{0}), nullptr);
  for (std::uint64_t k = 1; k <= 1000; ++k) {
    EXPECT_EQ(m.find(k << 21), nullptr) << k;  // odd k: erase_found; even k: erase_at(ib)
    const std::uint64_t* e = m.find((k << 21) + 512);
    ASSERT_EQ(e != nullptr, k % 2 == 0) << k;
    if (e) EXPECT_EQ(*e, k + 5000);
  }
  EXPECT_EQ(m.size(), 500u);
}

// FlatMap against std::map on random operations (get, find, erase, erase_found, take) over
// keys like the replay's (512-byte multiples at power-of-two strides, the all-ones key):
// growth rehashes only the keys' slots and moves each entry whole; the hash folds the high
// bits in. Every entry must stay findable with its value through all of it.
TEST(ReplayFlatMap, RandomOperationsMatchAnOrderedMap) {
  std::mt19937_64 rng(7);
  gpuheap::base::FlatMap<std::uint64_t> m;
  std::map<std::uint64_t, std::uint64_t> ref;
  auto random_key = [&]() -> std::uint64_t {
    switch (rng() % 4) {
      case 0: return ~std::uint64_t{0};
      case 1: return rng();
      default: return 0x7f0000000000ull + (rng() % 512) * (2u << 20) + (rng() % 64) * 512;
    }
  };
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t k = random_key();
    switch (rng() % 5) {
      case 0:
      case 1: {
        bool inserted = false;
        std::uint64_t& v = m.get(k, &inserted);
        EXPECT_EQ(inserted, ref.count(k) == 0) << k;
        v = ref[k] = rng();
        break;
      }
      case 2: EXPECT_EQ(m.erase(k), ref.erase(k) == 1) << k; break;
      case 3: {
        std::uint64_t* v = m.find(k);
        ASSERT_EQ(v != nullptr, ref.count(k) == 1) << k;
        if (v) {
          EXPECT_EQ(*v, ref[k]);
          m.erase_found(k, v);
          ref.erase(k);
        }
        break;
      }
      default: {
        std::uint64_t v = 0;
        const bool had = ref.count(k) == 1;
        ASSERT_EQ(m.take(k, &v), had) << k;
        if (had) {
          EXPECT_EQ(v, ref[k]);
          ref.erase(k);
        }
      }
    }
    ASSERT_EQ(m.size(), ref.size());
  }
  std::size_t seen = 0;
  m.for_each([&](std::uint64_t k, std::uint64_t v) {
    ++seen;
    auto it = ref.find(k);
    ASSERT_NE(it, ref.end()) << k;
    EXPECT_EQ(v, it->second);
  });
  EXPECT_EQ(seen, ref.size());
}
