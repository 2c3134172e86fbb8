// Hand-built hostile traces: huge length fields, wild stack ids, events for unknown
// pointers, absurd declared counts, maximal records. Each must be answered quickly, with
// memory that does not grow with the numbers the trace *claims* (only, at most, with its
// size), and with a report or a clean InputError.
#include <gtest/gtest.h>

#include "analyzer/base/error.h"
#include "tests/fuzz/hostile.h"
#include "tests/fuzz/pipeline.h"

namespace gpuheap::test {
namespace {

using format::AllocKind;

constexpr std::uint64_t kMiB = 1ull << 20;

struct Outcome {
  bool ok = false;
  std::string error;
  PipelineResult result;
  double seconds = 0;
  std::uint64_t rss_growth = 0;
};

// Runs the pipeline and checks time and memory: growth of the peak RSS above what it was
// before stays under `slack` plus `per_byte` times the file size.
Outcome run_bounded(const RawTrace& t, const std::string& name, double max_s = 10.0, std::uint64_t slack = 64 * kMiB,
                    std::uint64_t per_byte = 4) {
  auto path = t.write(name);
  Outcome o;
  auto rss0 = max_rss();
  auto t0 = std::chrono::steady_clock::now();
  try {
    o.result = run_pipeline(path, nullptr);
    o.ok = true;
  } catch (const InputError& e) {
    o.error = e.what();
    EXPECT_EQ(o.error.find('\n'), std::string::npos);
  }
  o.seconds = seconds_since(t0);
  o.rss_growth = max_rss() - rss0;
  EXPECT_LT(o.seconds, max_s) << name;
  std::uint64_t bound = slack + per_byte * t.bytes.size();
  if (!kSanitized) {
    EXPECT_LT(o.rss_growth, bound) << name << ": RSS grew by " << o.rss_growth / kMiB << " MiB";
  }
  return o;
}

format::AllocRecord alloc_rec(std::uint64_t ts, std::uint64_t ptr, std::uint64_t size, std::uint32_t stack,
                              AllocKind kind = AllocKind::device_passthrough, int device = 0) {
  format::AllocRecord a;
  a.ts = ts, a.tid = 7, a.device = static_cast<std::int16_t>(device), a.kind = kind;
  a.ptr = ptr, a.requested = size, a.size = size, a.stack = stack;
  return a;
}

TEST(Hostile, HugeLengthFieldIsCorruption) {
  for (std::uint32_t len : {format::kMaxPayload + 1, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    RawTrace t;
    t.process().frame(static_cast<std::uint8_t>(format::RecordType::alloc), len, 64);
    auto o = run_bounded(t, "huge-len");
    EXPECT_FALSE(o.ok) << len;
    EXPECT_NE(o.error.find("corrupt record"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("byte offset"), std::string::npos) << o.error;
  }
}

TEST(Hostile, FrameClaimingMaxPayloadAtTheEndIsATruncation) {
  RawTrace t;
  t.process().frame(static_cast<std::uint8_t>(format::RecordType::thread), format::kMaxPayload, 100);
  auto o = run_bounded(t, "maxpayload-cut");
  ASSERT_TRUE(o.ok) << o.error;
  EXPECT_TRUE(o.result.truncated);
  EXPECT_EQ(o.result.records, 1u);
}

TEST(Hostile, MaximalRecordsAreReadWithMemoryBoundedByTheFile) {
  RawTrace t;
  t.process();
  const auto head = t.bytes.size();
  std::string big(format::kMaxPayload - 8, 'x');    // thread: u32 tid | str name
  std::string path(format::kMaxPayload - 32, '/');  // module: 3 x u64 | str path | str build_id ("")
  for (int i = 0; i < 8; ++i) {
    t.put(format::ThreadRecord{static_cast<std::uint32_t>(i), big});
    t.put(
        format::ModuleRecord{0x1000ull << (i + 20), 0x1000ull << (i + 20), (0x1000ull << (i + 20)) + 0x1000, path, ""});
  }
  // A frame of exactly kMaxPayload, then one byte more: the first decodes, the second is corrupt.
  EXPECT_EQ(t.bytes.size(), head + 16 * (format::kFrameHeaderSize + format::kMaxPayload));
  auto o = run_bounded(t, "maximal", 20.0, 64 * kMiB, 8);
  ASSERT_TRUE(o.ok) << o.error;
  EXPECT_EQ(o.result.records, 17u);
  t.frame(static_cast<std::uint8_t>(format::RecordType::thread), format::kMaxPayload + 1, 0);
  EXPECT_FALSE(run_bounded(t, "maximal-plus-one", 20.0, 64 * kMiB, 8).ok);
}

// Ids are dense from 1 in real traces; a wild id referenced by an event (before any stack
// record defines it) must not size anything by the id.
TEST(Hostile, WildStackIdsDoNotSizeMemory) {
  RawTrace t;
  t.process();
  std::uint64_t ts = 2'000'000'000;
  std::uint32_t ids[] = {1u << 26, (1u << 26) - 1, 1u << 25, 0x7FFFFFFFu, 0xFFFFFFFFu, 12345678u};
  std::uint64_t ptr = 0x10000000;
  for (auto id : ids)
    for (int k = 0; k < 4; ++k) t.put(alloc_rec(ts += 10, ptr += 0x1000, 4096, id + static_cast<std::uint32_t>(k)));
  // ... and stacks defined later with those ids, at full depth.
  std::vector<std::uint64_t> ips(format::kMaxStackDepth, 0xdeadbeef);
  for (auto id : ids) t.stack(id, ips);
  t.put(format::EndRecord{ts + 1, format::EndReason::exit, 31});
  auto o = run_bounded(t, "wild-stacks", 10.0, 48 * kMiB);
  ASSERT_TRUE(o.ok) << o.error;
  EXPECT_FALSE(o.result.truncated);
}

TEST(Hostile, DeepStacksRepeatedStayBounded) {
  std::vector<std::uint64_t> ips(format::kMaxStackDepth);
  for (std::size_t i = 0; i < ips.size(); ++i) ips[i] = 0x400000 + 16 * i;
  RawTrace same, distinct;
  same.process(), distinct.process();
  const int n = scale_small() ? 2000 : 8000;  // 2054-byte records: up to 16 MiB
  std::uint64_t ts = 2'000'000'000;
  for (int i = 0; i < n; ++i) {
    same.stack(1, ips);
    ips[0] = 0x500000 + static_cast<std::uint64_t>(i);
    distinct.stack(static_cast<std::uint32_t>(i + 1), ips);
    distinct.put(alloc_rec(ts += 10, 0x10000000 + 0x1000ull * static_cast<std::uint64_t>(i), 512,
                           static_cast<std::uint32_t>(i + 1)));
  }
  auto a = run_bounded(same, "deep-same", 10.0, 32 * kMiB, 1);
  ASSERT_TRUE(a.ok) << a.error;
  // Distinct stacks are all symbolized (site keys) and their frames cached per stack: about
  // 256 Frame objects per 2 KiB record, so memory is ~35x the bytes of such records.
  auto b = run_bounded(distinct, "deep-distinct", 60.0, 64 * kMiB, 48);
  ASSERT_TRUE(b.ok) << b.error;
}

TEST(Hostile, EventsForUnknownPointers) {
  RawTrace t;
  t.process();
  std::uint64_t ts = 2'000'000'000;
  const int n = scale_small() ? 20000 : 100000;
  for (int i = 0; i < n; ++i) {
    std::uint64_t p = 0x7f0000000000ull + 512ull * static_cast<std::uint64_t>(i);
    format::FreeRecord f;
    f.ts = ts += 3, f.tid = 1, f.kind = static_cast<AllocKind>(i % format::kNumAllocKinds), f.ptr = p, f.size = 512;
    t.put(f);
    t.put(format::FreeCompletedRecord{ts += 3, 0, p, 512});
    t.segment(format::SegmentRecord{ts += 3, 0, 0, p, 2 * kMiB}, true);
  }
  auto o = run_bounded(t, "unknown-ptrs", 20.0, 32 * kMiB, 2);
  ASSERT_TRUE(o.ok) << o.error;
  EXPECT_TRUE(o.result.truncated);  // no end record
}

TEST(Hostile, AbsurdDeclaredCountsAndSizes) {
  RawTrace t;
  t.process();
  std::uint64_t ts = 2'000'000'000;
  t.put(format::DeviceRecord{0, ~0ull, "dev"});
  // Sizes at the top of the u64 range, for every kind; frees with sizes that disagree.
  for (int k = 0; k < format::kNumAllocKinds; ++k) {
    auto kind = static_cast<AllocKind>(k);
    t.put(alloc_rec(ts += 10, 0x1000ull * static_cast<std::uint64_t>(k + 1), ~0ull - static_cast<std::uint64_t>(k), 0,
                    kind));
    t.put(alloc_rec(ts += 10, 0x100000ull * static_cast<std::uint64_t>(k + 1), 1ull << 63, 0, kind));
  }
  t.segment(format::SegmentRecord{ts += 10, 0, 0, 0x90000000, ~0ull}, false);
  t.put(alloc_rec(ts += 10, 0x90000000, ~0ull, 0, AllocKind::device_pooled));
  format::OomRecord oom;
  oom.ts = ts += 10, oom.requested = ~0ull, oom.device_free = ~0ull, oom.device_total = 1, oom.reserved = ~0ull;
  oom.allocated = ~0ull, oom.largest_free = ~0ull, oom.stack = 0xFFFFFFFF;
  for (int i = 0; i < 1000; ++i) t.put(oom);
  t.put(format::EmptyCacheRecord{ts += 10, 0, format::EmptyCacheReason::api, ~0ull});
  t.put(format::RetryRecord{~0ull, -32768, ~0ull});
  // Timestamps going backwards and to the end of the clock.
  t.put(alloc_rec(1, 0x5000, 4096, 0));
  t.put(alloc_rec(~0ull, 0x6000, 4096, 0));
  t.put(format::EndRecord{~0ull, format::EndReason::signal, 1'000'000'000'000ull});  // claims 10^12 records
  auto o = run_bounded(t, "absurd");
  ASSERT_TRUE(o.ok) << o.error;
  EXPECT_FALSE(o.result.truncated);
}

// Device ordinals are i32 in device records and i16 in events: a trace may name tens of
// thousands of them. Answer within bounded time and memory (report or clean error).
TEST(Hostile, ManyDistinctDevices) {
  RawTrace t;
  t.process();
  std::uint64_t ts = 2'000'000'000;
  for (int d = -32768; d < 32768; d += 1) t.put(alloc_rec(ts += 1'000'000, 0x1000, 512, 0, AllocKind::async, d));
  for (int i = 0; i < 100000; ++i) t.put(format::DeviceRecord{0x10000 + i, 1, "x"});
  auto o = run_bounded(t, "many-devices", 10.0, 96 * kMiB, 4);
  if (!o.ok) {
    EXPECT_NE(o.error.find("device"), std::string::npos) << o.error;
  }
}

// replay of allocations of sizes near 2^64 (a damaged size field): --policy torch ended in
// "internal error: the torch model does not know a block it handed out" (512-byte rounding
// wrapped to 0), --policy none wrapped its 2 MiB rounding and replayed a 16 EiB allocation
// as 0 bytes (exit 0). Every policy now refuses such a record (exit 2, the size named) and
// runs out of address space, not arithmetic, just below it.
TEST(Hostile, ReplayOfSizesNearTwoToThe64) {
  std::string cli = GPUHEAP_CLI;
  const char* policies[] = {"gpuheap", "torch", "none", "torch:roundup_power2_divisions=4",
                            "torch:max_split_size_mb=64"};
  for (std::uint64_t n : {~0ull, ~0ull - 511, ~0ull - 2 * kMiB + 2, ~0ull - 20 * kMiB, 1ull << 63}) {
    for (auto kind : {AllocKind::device_pooled, AllocKind::device_passthrough}) {
      RawTrace t;
      t.process();
      std::uint64_t ts = 2'000'000'000;
      t.put(alloc_rec(ts += 10, 0x7f0000000000ull, 4096, 0, kind));  // an ordinary one first
      t.put(alloc_rec(ts += 10, 0x7f0000200000ull, n, 0, kind));
      format::FreeRecord f;
      f.ts = ts += 10, f.tid = 7, f.kind = kind, f.ptr = 0x7f0000200000ull, f.size = n;
      t.put(f);
      t.put(format::EndRecord{ts += 10, format::EndReason::exit, 0});
      auto path = t.write("huge-size.trace");
      for (const char* p : policies) {
        for (const char* extra : {"", " --json", " --limit 1GiB", " --find-min-limit"}) {
          auto r = run_cli(cli + " replay -q --policy " + p + extra + " " + path);
          std::string what = std::string(p) + extra + " of " + std::to_string(n);
          EXPECT_EQ(r.status, 2) << what << ": " << r.out << r.err;
          EXPECT_NE(r.err.find("record 3: an allocation of " + std::to_string(n) + " bytes"), std::string::npos)
              << what << ": " << r.err;
          EXPECT_EQ(r.err.find("internal error"), std::string::npos) << what << ": " << r.err;
        }
      }
    }
  }
  // Just below 2^63: a size no device has runs out of memory under every policy (exit 1,
  // the request named); totals never pass 2^63 (none kept adding, and its signed totals
  // turned negative).
  RawTrace t;
  t.process();
  std::uint64_t ts = 2'000'000'000;
  for (std::uint64_t i = 0; i < 4; ++i) t.put(alloc_rec(ts += 10, 0x7f0000000000ull + (i << 40), (1ull << 62) - 1, 0));
  t.put(format::EndRecord{ts += 10, format::EndReason::exit, 0});
  auto path = t.write("near-top.trace");
  for (const char* p : policies) {
    auto r = run_cli(cli + " replay -q --json --policy " + p + " " + path);
    EXPECT_EQ(r.status, 1) << p << ": " << r.out << r.err;
    EXPECT_NE(r.out.find("\"requested\": 4611686018427387903"), std::string::npos) << p << ": " << r.out;
    EXPECT_EQ(r.out.find(": -"), std::string::npos) << p << ": a negative figure: " << r.out;
  }
}

}  // namespace
}  // namespace gpuheap::test
