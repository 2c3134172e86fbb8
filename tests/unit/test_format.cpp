// format/trace.h: every record round-trips; a cut trace decodes exactly its whole records;
// corrupted frames and bad headers are reported as such.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "format/trace.h"

namespace f = gpuheap::format;

namespace {

using Bytes = std::vector<unsigned char>;

template <class R, class... Extra>
void append(Bytes& out, const R& r, Extra... extra) {
  unsigned char buf[4096];
  std::size_t n = f::encode(buf, sizeof buf, r, extra...);
  ASSERT_GT(n, 0u);
  out.insert(out.end(), buf, buf + n);
}

const std::uint64_t kIps[3] = {0x401000, 0x7f0000001234, 0xdeadbeef};

// One of every record type, with every field set to something distinctive.
Bytes sample_records(std::vector<f::RecordType>* types) {
  Bytes b;
  f::ProcessRecord p{1234, 1, 1700000000123456789ull, 987654321, "host", std::string_view("a\0b", 3), "0.1", "/bin/x"};
  append(b, p), types->push_back(f::RecordType::process);
  append(b, f::DeviceRecord{3, 80ull << 30, "H200"}), types->push_back(f::RecordType::device);
  append(b, f::ModuleRecord{0x1000, 0x2000, 0x9000, "/lib/libz.so", std::string_view("\x01\x02\0\x04", 4)});
  types->push_back(f::RecordType::module);
  append(b, f::ModuleUnloadRecord{55, 0x1000}), types->push_back(f::RecordType::module_unload);
  unsigned char sb[256];
  std::size_t n = f::encode_stack(sb, sizeof sb, 7, kIps, 3);
  b.insert(b.end(), sb, sb + n), types->push_back(f::RecordType::stack);
  append(b, f::AllocRecord{10, 42, 2, f::AllocKind::managed, f::kFlagSmallPool, 0xabc000, 100, 512, 0x77, 7});
  types->push_back(f::RecordType::alloc);
  append(b, f::FreeRecord{11, 43, 1, f::AllocKind::vmm_map, f::kFlagFailed, 0xabc000, 512, 0x78, 7});
  types->push_back(f::RecordType::free);
  append(b, f::FreeCompletedRecord{12, 1, 0xabc000, 512}), types->push_back(f::RecordType::free_completed);
  append(b, f::SegmentRecord{13, 1, f::kFlagSmallPool, 0xa00000, 2 << 20}, false);
  types->push_back(f::RecordType::segment_alloc);
  append(b, f::SegmentRecord{14, 1, 0, 0xa00000, 2 << 20}, true), types->push_back(f::RecordType::segment_free);
  append(b, f::OomRecord{15, 44, 0, f::AllocKind::async, 1 << 30, 9, 100, 200, 300, 400, 500, 600, 7});
  types->push_back(f::RecordType::oom);
  append(b, f::RetryRecord{16, 0, 4096}), types->push_back(f::RecordType::retry);
  append(b, f::EmptyCacheRecord{17, 0, f::EmptyCacheReason::oom_retry, 1 << 20});
  types->push_back(f::RecordType::empty_cache);
  append(b, f::ThreadRecord{45, "worker-3"}), types->push_back(f::RecordType::thread);
  append(b, f::EndRecord{18, f::EndReason::signal, 14}), types->push_back(f::RecordType::end);
  return b;
}

std::size_t frame_at(const Bytes& b, std::size_t index) {  // offset of the index-th frame
  std::size_t off = 0;
  for (std::size_t i = 0; i < index; ++i) {
    std::uint32_t len;
    std::memcpy(&len, b.data() + off + 1, 4);
    off += f::kFrameHeaderSize + len;
  }
  return off;
}

}  // namespace

TEST(Format, EveryRecordRoundTrips) {
  std::vector<f::RecordType> types;
  Bytes b = sample_records(&types);
  std::size_t off = 0, i = 0;
  f::Record r;
  std::size_t used = 0;
  while (off < b.size()) {
    ASSERT_EQ(f::decode_frame(b.data() + off, b.size() - off, r, &used), f::FrameStatus::ok) << i;
    ASSERT_LT(i, types.size());
    EXPECT_EQ(r.type, types[i]);
    switch (r.type) {
      case f::RecordType::process:
        EXPECT_EQ(r.process.pid, 1234u);
        EXPECT_EQ(r.process.ppid, 1u);
        EXPECT_EQ(r.process.wall_ns, 1700000000123456789ull);
        EXPECT_EQ(r.process.mono_ns, 987654321u);
        EXPECT_EQ(r.process.hostname, "host");
        EXPECT_EQ(r.process.cmdline, std::string_view("a\0b", 3));
        EXPECT_EQ(r.process.version, "0.1");
        EXPECT_EQ(r.process.exe, "/bin/x");
        break;
      case f::RecordType::device:
        EXPECT_EQ(r.device.device, 3);
        EXPECT_EQ(r.device.total_memory, 80ull << 30);
        EXPECT_EQ(r.device.name, "H200");
        break;
      case f::RecordType::module:
        EXPECT_EQ(r.module.base, 0x1000u);
        EXPECT_EQ(r.module.lo, 0x2000u);
        EXPECT_EQ(r.module.hi, 0x9000u);
        EXPECT_EQ(r.module.path, "/lib/libz.so");
        EXPECT_EQ(r.module.build_id, std::string_view("\x01\x02\0\x04", 4));
        break;
      case f::RecordType::module_unload:
        EXPECT_EQ(r.module_unload.ts, 55u);
        EXPECT_EQ(r.module_unload.base, 0x1000u);
        break;
      case f::RecordType::stack:
        EXPECT_EQ(r.stack.id, 7u);
        ASSERT_EQ(r.stack.depth, 3);
        for (int k = 0; k < 3; ++k) EXPECT_EQ(r.stack.ip(k), kIps[k]);
        break;
      case f::RecordType::alloc: {
        auto& a = r.alloc;
        EXPECT_EQ(a.ts, 10u);
        EXPECT_EQ(a.tid, 42u);
        EXPECT_EQ(a.device, 2);
        EXPECT_EQ(a.kind, f::AllocKind::managed);
        EXPECT_EQ(a.flags, f::kFlagSmallPool);
        EXPECT_EQ(a.ptr, 0xabc000u);
        EXPECT_EQ(a.requested, 100u);
        EXPECT_EQ(a.size, 512u);
        EXPECT_EQ(a.stream, 0x77u);
        EXPECT_EQ(a.stack, 7u);
        EXPECT_EQ(used, f::kFrameHeaderSize + 52);
        break;
      }
      case f::RecordType::free: {
        auto& x = r.free;
        EXPECT_EQ(x.ts, 11u);
        EXPECT_EQ(x.tid, 43u);
        EXPECT_EQ(x.device, 1);
        EXPECT_EQ(x.kind, f::AllocKind::vmm_map);
        EXPECT_EQ(x.flags, f::kFlagFailed);
        EXPECT_EQ(x.ptr, 0xabc000u);
        EXPECT_EQ(x.size, 512u);
        EXPECT_EQ(x.stream, 0x78u);
        EXPECT_EQ(x.stack, 7u);
        EXPECT_EQ(used, f::kFrameHeaderSize + 44);
        break;
      }
      case f::RecordType::free_completed:
        EXPECT_EQ(r.free_completed.ts, 12u);
        EXPECT_EQ(r.free_completed.device, 1);
        EXPECT_EQ(r.free_completed.ptr, 0xabc000u);
        EXPECT_EQ(r.free_completed.size, 512u);
        break;
      case f::RecordType::segment_alloc:
      case f::RecordType::segment_free:
        EXPECT_EQ(r.segment.ts, r.type == f::RecordType::segment_alloc ? 13u : 14u);
        EXPECT_EQ(r.segment.flags, r.type == f::RecordType::segment_alloc ? f::kFlagSmallPool : 0);
        EXPECT_EQ(r.segment.device, 1);
        EXPECT_EQ(r.segment.ptr, 0xa00000u);
        EXPECT_EQ(r.segment.size, 2u << 20);
        break;
      case f::RecordType::oom: {
        auto& o = r.oom;
        EXPECT_EQ(o.ts, 15u);
        EXPECT_EQ(o.tid, 44u);
        EXPECT_EQ(o.kind, f::AllocKind::async);
        EXPECT_EQ(o.requested, 1u << 30);
        EXPECT_EQ(o.stream, 9u);
        EXPECT_EQ(o.device_free, 100u);
        EXPECT_EQ(o.device_total, 200u);
        EXPECT_EQ(o.limit, 300u);
        EXPECT_EQ(o.reserved, 400u);
        EXPECT_EQ(o.allocated, 500u);
        EXPECT_EQ(o.largest_free, 600u);
        EXPECT_EQ(o.stack, 7u);
        break;
      }
      case f::RecordType::retry:
        EXPECT_EQ(r.retry.ts, 16u);
        EXPECT_EQ(r.retry.requested, 4096u);
        break;
      case f::RecordType::empty_cache:
        EXPECT_EQ(r.empty_cache.ts, 17u);
        EXPECT_EQ(r.empty_cache.reason, f::EmptyCacheReason::oom_retry);
        EXPECT_EQ(r.empty_cache.released, 1u << 20);
        break;
      case f::RecordType::thread:
        EXPECT_EQ(r.thread.tid, 45u);
        EXPECT_EQ(r.thread.name, "worker-3");
        break;
      case f::RecordType::end:
        EXPECT_EQ(r.end.ts, 18u);
        EXPECT_EQ(r.end.reason, f::EndReason::signal);
        EXPECT_EQ(r.end.records, 14u);
        break;
    }
    off += used, ++i;
  }
  EXPECT_EQ(i, types.size());
  EXPECT_EQ(i, 15u) << "one record of each of the 15 types";
}

TEST(Format, PhaseRecordRoundTripsAndRefusesBadOps) {
  Bytes b;
  append(b, f::PhaseRecord{77, 46, f::PhaseOp::push, f::PhaseSource::nvtx, "backward"});
  append(b, f::PhaseRecord{78, 46, f::PhaseOp::pop, f::PhaseSource::nvtx, ""});
  f::Record r;
  std::size_t used = 0;
  ASSERT_EQ(f::decode_frame(b.data(), b.size(), r, &used), f::FrameStatus::ok);
  EXPECT_EQ(r.type, f::RecordType::phase);
  EXPECT_EQ(r.phase.ts, 77u);
  EXPECT_EQ(r.phase.tid, 46u);
  EXPECT_EQ(r.phase.op, f::PhaseOp::push);
  EXPECT_EQ(r.phase.source, f::PhaseSource::nvtx);
  EXPECT_EQ(r.phase.name, "backward");
  EXPECT_EQ(used, f::kFrameHeaderSize + 8 + 4 + 1 + 1 + 4 + 8);
  ASSERT_EQ(f::decode_frame(b.data() + used, b.size() - used, r, &used), f::FrameStatus::ok);
  EXPECT_EQ(r.phase.op, f::PhaseOp::pop);
  EXPECT_TRUE(r.phase.name.empty());
  Bytes bad = b;
  bad[f::kFrameHeaderSize + 12] = 3;  // op beyond pop
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
  bad = b;
  bad[f::kFrameHeaderSize + 13] = 2;  // unknown source
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
}

// v6's snapshot records (a rolling window's head): every part round-trips with its entries; a
// bad part, a bad kind in a live entry or a count beyond the payload is corrupt.
TEST(Format, SnapshotRecordsRoundTripAndRefuseBadParts) {
  Bytes b;
  f::SnapshotRecord begin;
  begin.part = f::SnapshotPart::begin, begin.ts = 900, begin.segment = 3, begin.events_before = 12345;
  begin.first_ts = 7;
  append(b, begin);
  f::SnapshotRecord dev;
  dev.part = f::SnapshotPart::device, dev.device = 2, dev.peak_requested = 1000, dev.peak_allocated = 1024;
  dev.peak_ts = 55, dev.peak_seq = 9, dev.ooms = 2, dev.retries = 3, dev.empty_cache_calls = 4;
  dev.empty_cache_released = 5;
  append(b, dev);
  unsigned char entries[2 * f::kSnapLiveSize];
  f::SnapLive l1{4, 50, 0x7000, 1024, 1000, 0x11, 46, 3, 2, f::AllocKind::device_pooled, f::kSnapPending};
  f::SnapLive l2{9, 51, 0x9000, 2048, 2000, 0, 47, 5, 2, f::AllocKind::managed, f::kFlagSmallPool};
  f::encode_snap_live(entries, l1), f::encode_snap_live(entries + f::kSnapLiveSize, l2);
  f::SnapshotRecord live;
  live.part = f::SnapshotPart::live, live.count = 2, live.entries = entries;
  append(b, live);
  unsigned char fe[f::kSnapFreedSize], se[f::kSnapSiteSize];
  f::encode_snap_freed(fe, f::SnapFreed{3, 2, 700, 768});
  f::encode_snap_site(se, f::SnapSite{5, 10, 20000, 20480, 4000});
  f::SnapshotRecord freed, site, end;
  freed.part = f::SnapshotPart::peak_freed, freed.count = 1, freed.entries = fe;
  site.part = f::SnapshotPart::site, site.count = 1, site.entries = se;
  end.part = f::SnapshotPart::end, end.n_live = 2, end.n_freed = 1, end.n_sites = 1;
  append(b, freed), append(b, site), append(b, end);

  f::Record r;
  std::size_t at = 0, used = 0;
  auto next = [&] {
    EXPECT_EQ(f::decode_frame(b.data() + at, b.size() - at, r, &used), f::FrameStatus::ok);
    EXPECT_EQ(r.type, f::RecordType::snapshot);
    at += used;
  };
  next();
  EXPECT_EQ(r.snapshot.part, f::SnapshotPart::begin);
  EXPECT_EQ(r.snapshot.ts, 900u);
  EXPECT_EQ(r.snapshot.segment, 3u);
  EXPECT_EQ(r.snapshot.events_before, 12345u);
  EXPECT_EQ(r.snapshot.first_ts, 7u);
  next();
  EXPECT_EQ(r.snapshot.part, f::SnapshotPart::device);
  EXPECT_EQ(r.snapshot.device, 2);
  EXPECT_EQ(r.snapshot.peak_requested, 1000u);
  EXPECT_EQ(r.snapshot.peak_allocated, 1024u);
  EXPECT_EQ(r.snapshot.peak_ts, 55u);
  EXPECT_EQ(r.snapshot.peak_seq, 9u);
  EXPECT_EQ(r.snapshot.ooms, 2u);
  EXPECT_EQ(r.snapshot.retries, 3u);
  EXPECT_EQ(r.snapshot.empty_cache_calls, 4u);
  EXPECT_EQ(r.snapshot.empty_cache_released, 5u);
  const std::size_t live_at = at;
  next();
  ASSERT_EQ(r.snapshot.count, 2u);
  const f::SnapLive d1 = r.snapshot.live(0), d2 = r.snapshot.live(1);
  EXPECT_EQ(d1.seq, 4u);
  EXPECT_EQ(d1.ts, 50u);
  EXPECT_EQ(d1.ptr, 0x7000u);
  EXPECT_EQ(d1.size, 1024u);
  EXPECT_EQ(d1.requested, 1000u);
  EXPECT_EQ(d1.stream, 0x11u);
  EXPECT_EQ(d1.tid, 46u);
  EXPECT_EQ(d1.stack, 3u);
  EXPECT_EQ(d1.device, 2);
  EXPECT_EQ(d1.kind, f::AllocKind::device_pooled);
  EXPECT_EQ(d1.flags, f::kSnapPending);
  EXPECT_EQ(d2.seq, 9u);
  EXPECT_EQ(d2.kind, f::AllocKind::managed);
  EXPECT_EQ(d2.flags, f::kFlagSmallPool);
  next();
  ASSERT_EQ(r.snapshot.count, 1u);
  EXPECT_EQ(r.snapshot.freed(0).stack, 3u);
  EXPECT_EQ(r.snapshot.freed(0).device, 2);
  EXPECT_EQ(r.snapshot.freed(0).requested, 700u);
  EXPECT_EQ(r.snapshot.freed(0).size, 768u);
  next();
  const f::SnapSite s = r.snapshot.site(0);
  EXPECT_EQ(s.stack, 5u);
  EXPECT_EQ(s.allocs, 10u);
  EXPECT_EQ(s.alloc_bytes, 20000u);
  EXPECT_EQ(s.alloc_allocated, 20480u);
  EXPECT_EQ(s.max_live_bytes, 4000u);
  next();
  EXPECT_EQ(r.snapshot.n_live, 2u);
  EXPECT_EQ(r.snapshot.n_freed, 1u);
  EXPECT_EQ(r.snapshot.n_sites, 1u);
  EXPECT_EQ(at, b.size());

  Bytes bad = b;
  bad[f::kFrameHeaderSize] = f::kMaxSnapshotPart + 1;  // unknown part
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
  bad = b;
  bad[live_at + f::kFrameHeaderSize + 1 + 4 + 58] = f::kNumAllocKinds;  // the first live entry's kind
  EXPECT_EQ(f::decode_frame(bad.data() + live_at, bad.size() - live_at, r, &used), f::FrameStatus::corrupt);
  bad = b;
  bad[live_at + f::kFrameHeaderSize + 1] = 3;  // three entries in a payload of two
  EXPECT_EQ(f::decode_frame(bad.data() + live_at, bad.size() - live_at, r, &used), f::FrameStatus::corrupt);
}

// v3's symbol records (written by `gpuheap symbolize`): strings by id, then an ip's frames
// naming them; a zero count, too many frames, an id 0 or a payload of another length is corrupt.
TEST(Format, SymbolRecordsRoundTripAndRefuseBadCounts) {
  Bytes b;
  unsigned char buf[512];
  b.insert(b.end(), buf, buf + f::encode(buf, sizeof buf, f::SymbolStringRecord{1, "alloc_weights(int)"}));
  b.insert(b.end(), buf, buf + f::encode(buf, sizeof buf, f::SymbolStringRecord{2, "/src/model.cpp"}));
  const f::SymbolFrameEntry e[2] = {{1, 2, 17, f::kSymbolInlined}, {1, 0, 0, 0}};
  std::size_t n = f::encode_symbol_frames(buf, sizeof buf, 0x401234, e, 2);
  EXPECT_EQ(n, f::symbol_frames_record_size(2));
  EXPECT_EQ(n, f::kFrameHeaderSize + 8 + 2 + 2 * 13);
  std::size_t frames_at = b.size();
  b.insert(b.end(), buf, buf + n);
  f::Record r;
  std::size_t used = 0, off = 0;
  ASSERT_EQ(f::decode_frame(b.data(), b.size(), r, &used), f::FrameStatus::ok);
  EXPECT_EQ(r.type, f::RecordType::symbol_string);
  EXPECT_EQ(r.symbol_string.id, 1u);
  EXPECT_EQ(r.symbol_string.text, "alloc_weights(int)");
  off += used;
  ASSERT_EQ(f::decode_frame(b.data() + off, b.size() - off, r, &used), f::FrameStatus::ok);
  EXPECT_EQ(r.symbol_string.id, 2u);
  EXPECT_EQ(r.symbol_string.text, "/src/model.cpp");
  off += used;
  ASSERT_EQ(f::decode_frame(b.data() + off, b.size() - off, r, &used), f::FrameStatus::ok);
  EXPECT_EQ(r.type, f::RecordType::symbol_frames);
  EXPECT_EQ(r.symbol_frames.ip, 0x401234u);
  ASSERT_EQ(r.symbol_frames.count, 2);
  auto e0 = r.symbol_frames.entry(0), e1 = r.symbol_frames.entry(1);
  EXPECT_EQ(e0.function, 1u);
  EXPECT_EQ(e0.file, 2u);
  EXPECT_EQ(e0.line, 17u);
  EXPECT_EQ(e0.flags, f::kSymbolInlined);
  EXPECT_EQ(e1.function, 1u);
  EXPECT_EQ(e1.file, 0u);
  EXPECT_EQ(e1.line, 0u);
  EXPECT_EQ(e1.flags, 0);
  EXPECT_EQ(off + used, b.size());

  Bytes bad(b.begin() + static_cast<std::ptrdiff_t>(frames_at), b.end());
  bad[f::kFrameHeaderSize + 8] = 0, bad[f::kFrameHeaderSize + 9] = 0;  // count 0
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
  bad.assign(b.begin() + static_cast<std::ptrdiff_t>(frames_at), b.end());
  bad[f::kFrameHeaderSize + 8] = 3;  // three frames declared, two present
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
  bad.assign(b.begin() + static_cast<std::ptrdiff_t>(frames_at), b.end());
  std::uint16_t many = f::kMaxSymbolFrames + 1;
  std::memcpy(bad.data() + f::kFrameHeaderSize + 8, &many, 2);
  EXPECT_EQ(f::decode_frame(bad.data(), bad.size(), r, &used), f::FrameStatus::corrupt);
  n = f::encode(buf, sizeof buf, f::SymbolStringRecord{0, "x"});  // id 0 is "unknown", never defined
  EXPECT_EQ(f::decode_frame(buf, n, r, &used), f::FrameStatus::corrupt);
  std::string long_name(f::kMaxSymbolString + 1, 'a');
  std::vector<unsigned char> big(long_name.size() + 64);
  n = f::encode(big.data(), big.size(), f::SymbolStringRecord{3, long_name});
  EXPECT_EQ(f::decode_frame(big.data(), n, r, &used), f::FrameStatus::corrupt);
}

TEST(Format, CutAtEveryOffsetDecodesWholeRecordsThenNeedMore) {
  std::vector<f::RecordType> types;
  Bytes b = sample_records(&types);
  std::vector<std::size_t> ends;  // end offset of each frame
  for (std::size_t i = 1; i <= types.size(); ++i) ends.push_back(frame_at(b, i));
  for (std::size_t cut = 0; cut <= b.size(); ++cut) {
    std::size_t off = 0, count = 0, used = 0;
    f::Record r;
    f::FrameStatus st;
    while ((st = f::decode_frame(b.data() + off, cut - off, r, &used)) == f::FrameStatus::ok) off += used, ++count;
    std::size_t expect = 0;
    while (expect < ends.size() && ends[expect] <= cut) ++expect;
    ASSERT_EQ(count, expect) << "cut at " << cut;
    ASSERT_EQ(st, f::FrameStatus::need_more) << "cut at " << cut;
    ASSERT_EQ(off, expect ? ends[expect - 1] : 0u);
  }
}

TEST(Format, CorruptFramesAreReported) {
  std::vector<f::RecordType> types;
  Bytes b = sample_records(&types);
  f::Record r;
  std::size_t used = 0;
  auto status = [&](const Bytes& x, std::size_t at) { return f::decode_frame(x.data() + at, x.size() - at, r, &used); };
  for (unsigned char bad : {16, 200, 255}) {  // bad type
    Bytes x = b;
    x[0] = bad;
    EXPECT_EQ(status(x, 0), f::FrameStatus::corrupt) << int(bad);
  }
  {  // type 0: the unused, zeroed tail of a preallocated file ends the data (a cut trace)
    Bytes x = b;
    x[0] = 0;
    EXPECT_EQ(status(x, 0), f::FrameStatus::need_more);
    Bytes zeros(64, 0);
    EXPECT_EQ(status(zeros, 0), f::FrameStatus::need_more);
  }
  {  // absurd length
    Bytes x = b;
    std::uint32_t len = f::kMaxPayload + 1;
    std::memcpy(x.data() + 1, &len, 4);
    EXPECT_EQ(status(x, 0), f::FrameStatus::corrupt);
  }
  std::size_t alloc_at = frame_at(b, 5), free_at = frame_at(b, 6), oom_at = frame_at(b, 10);
  ASSERT_EQ(b[alloc_at], static_cast<unsigned char>(f::RecordType::alloc));
  for (int delta : {-1, 1, -8, 4}) {  // length disagreeing with the alloc layout
    Bytes x = b;
    std::uint32_t len = 52 + delta;
    std::memcpy(x.data() + alloc_at + 1, &len, 4);
    EXPECT_EQ(status(x, alloc_at), f::FrameStatus::corrupt) << delta;
  }
  {  // a free frame relabelled as alloc: 44 bytes cannot be an alloc
    Bytes x = b;
    x[free_at] = static_cast<unsigned char>(f::RecordType::alloc);
    EXPECT_EQ(status(x, free_at), f::FrameStatus::corrupt);
  }
  for (std::size_t at : {alloc_at, free_at, oom_at}) {  // kind byte out of range
    Bytes x = b;
    x[at + f::kFrameHeaderSize + 14] = f::kNumAllocKinds;
    EXPECT_EQ(status(x, at), f::FrameStatus::corrupt) << at;
    x[at + f::kFrameHeaderSize + 14] = f::kNumAllocKinds - 1;
    EXPECT_EQ(status(x, at), f::FrameStatus::ok) << at;
  }
  {  // stack depth beyond the maximum
    std::size_t at = frame_at(b, 4);
    Bytes x = b;
    std::uint16_t depth = f::kMaxStackDepth + 1;
    std::memcpy(x.data() + at + f::kFrameHeaderSize + 4, &depth, 2);
    EXPECT_EQ(status(x, at), f::FrameStatus::corrupt);
  }
  {  // string length running past the payload
    Bytes x = b;
    std::uint32_t huge = 1000;
    std::memcpy(x.data() + f::kFrameHeaderSize + 24, &huge, 4);  // process: hostname length
    EXPECT_EQ(status(x, 0), f::FrameStatus::corrupt);
  }
  {  // bad end reason / empty-cache reason
    std::size_t end_at = frame_at(b, 14), ec_at = frame_at(b, 12);
    Bytes x = b;
    x[end_at + f::kFrameHeaderSize + 8] = 3;
    EXPECT_EQ(status(x, end_at), f::FrameStatus::corrupt);
    x[ec_at + f::kFrameHeaderSize + 10] = 4;
    EXPECT_EQ(status(x, ec_at), f::FrameStatus::corrupt);
  }
}

TEST(Format, FileHeader) {
  unsigned char h[f::kFileHeaderSize];
  f::encode_file_header(h);
  std::uint16_t v = 0;
  EXPECT_EQ(f::decode_file_header(h, sizeof h, &v), f::HeaderStatus::ok);
  EXPECT_EQ(v, f::kRecordVersion);
  for (std::size_t n = 0; n < sizeof h; ++n)
    EXPECT_EQ(f::decode_file_header(h, n, nullptr), f::HeaderStatus::short_file) << n;
  unsigned char elf[f::kFileHeaderSize] = {0x7f, 'E', 'L', 'F'};
  EXPECT_EQ(f::decode_file_header(elf, sizeof elf, nullptr), f::HeaderStatus::not_a_trace);
  EXPECT_EQ(f::decode_file_header(elf, 3, nullptr), f::HeaderStatus::not_a_trace);
  unsigned char newer[f::kFileHeaderSize];
  std::memcpy(newer, h, sizeof h);
  std::uint16_t nv = f::kFormatVersion + 1;
  std::memcpy(newer + 8, &nv, 2);
  EXPECT_EQ(f::decode_file_header(newer, sizeof newer, &v), f::HeaderStatus::newer_version);
  EXPECT_EQ(v, nv);
  std::uint16_t zero = 0;
  std::memcpy(newer + 8, &zero, 2);
  EXPECT_EQ(f::decode_file_header(newer, sizeof newer, nullptr), f::HeaderStatus::not_a_trace);
}

TEST(Format, EncodersRefuseSmallBuffers) {
  unsigned char buf[64];
  f::AllocRecord a;
  EXPECT_EQ(f::encode(buf, f::kFrameHeaderSize + 51, a), 0u);
  EXPECT_EQ(f::encode(buf, f::kFrameHeaderSize + 52, a), f::kFrameHeaderSize + 52);
  EXPECT_EQ(f::encode(buf, 3, a), 0u);
}

// The in-place event decoder must agree with decode_frame on every frame: same fields for
// good ones, "corrupt" (false) exactly where decode_frame says corrupt. Random payloads of
// random lengths around the real ones, with valid and invalid kinds.
namespace {
bool same_event(const f::Record& r, const f::EventRecord& e) {
  if (r.type != e.type) return false;
  switch (r.type) {
    case f::RecordType::alloc: {
      const auto &a = r.alloc, &b = e.alloc;
      return a.ts == b.ts && a.tid == b.tid && a.device == b.device && a.kind == b.kind && a.flags == b.flags &&
             a.ptr == b.ptr && a.requested == b.requested && a.size == b.size && a.stream == b.stream &&
             a.stack == b.stack;
    }
    case f::RecordType::free: {
      const auto &a = r.free, &b = e.free;
      return a.ts == b.ts && a.tid == b.tid && a.device == b.device && a.kind == b.kind && a.flags == b.flags &&
             a.ptr == b.ptr && a.size == b.size && a.stream == b.stream && a.stack == b.stack;
    }
    case f::RecordType::free_completed: {
      const auto &a = r.free_completed, &b = e.free_completed;
      return a.ts == b.ts && a.device == b.device && a.ptr == b.ptr && a.size == b.size;
    }
    default: {
      const auto &a = r.segment, &b = e.segment;
      return a.ts == b.ts && a.device == b.device && a.flags == b.flags && a.ptr == b.ptr && a.size == b.size;
    }
  }
}
}  // namespace

TEST(Format, InPlaceEventDecodeMatchesDecodeFrame) {
  std::vector<f::RecordType> types;
  Bytes b = sample_records(&types);
  // The sample's event records, decoded both ways.
  std::size_t checked = 0;
  for (std::size_t i = 0; i < types.size(); ++i) {
    std::size_t off = frame_at(b, i);
    if (!f::is_event_type(b[off])) continue;
    f::Record r;
    std::size_t used = 0;
    ASSERT_EQ(f::decode_frame(b.data() + off, b.size() - off, r, &used), f::FrameStatus::ok);
    std::uint32_t len;
    std::memcpy(&len, b.data() + off + 1, 4);
    f::EventRecord e;
    ASSERT_TRUE(f::decode_event(b[off], b.data() + off + f::kFrameHeaderSize, len, e));
    EXPECT_TRUE(same_event(r, e)) << i;
    ++checked;
  }
  EXPECT_EQ(checked, 5u);
  EXPECT_FALSE(f::is_event_type(0));
  EXPECT_FALSE(f::is_event_type(static_cast<std::uint8_t>(f::RecordType::stack)));
  EXPECT_FALSE(f::is_event_type(static_cast<std::uint8_t>(f::RecordType::oom)));

  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  auto rnd = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  const std::uint32_t lens[] = {f::kAllocPayload, f::kFreePayload, f::kFreeCompletedPayload, f::kSegmentPayload};
  int ok = 0, bad = 0, batched = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto t = static_cast<std::uint8_t>(6 + rnd() % 5);  // alloc .. segment_free
    std::uint32_t len = lens[rnd() % 4];
    if (rnd() % 4 == 0) len += static_cast<std::uint32_t>(rnd() % 5) - 2;  // off by up to 2
    Bytes fr(f::kFrameHeaderSize + len);
    fr[0] = t;
    std::memcpy(fr.data() + 1, &len, 4);
    for (std::size_t k = f::kFrameHeaderSize; k < fr.size(); ++k) fr[k] = static_cast<unsigned char>(rnd());
    if (len > 14 && rnd() % 2) fr[f::kFrameHeaderSize + 14] %= f::kNumAllocKinds;  // mostly valid kinds
    f::Record r;
    std::size_t used = 0;
    auto st = f::decode_frame(fr.data(), fr.size(), r, &used);
    ASSERT_NE(st, f::FrameStatus::need_more);
    f::EventRecord e;
    bool fast = f::decode_event(t, fr.data() + f::kFrameHeaderSize, len, e);
    ASSERT_EQ(fast, st == f::FrameStatus::ok) << "type " << int(t) << " len " << len;
    // The batches' branch-free decoding: the same verdict and fields for the three types it
    // takes (it reads kBatchRead bytes of payload and beyond: random bytes follow the frame),
    // refusal for the others; the same address and kind through EventRecord::ptr/kind.
    Bytes padded = fr;
    for (std::size_t k = 0; k < f::kBatchRead; ++k) padded.push_back(static_cast<unsigned char>(rnd()));
    f::EventRecord eb;
    std::memset(static_cast<void*>(&eb), 0xA5, sizeof eb);  // stale bytes of an earlier batch
    const bool batch = f::decode_batch_event(t, padded.data() + f::kFrameHeaderSize, len, eb);
    const bool batch_type = t == 6 || t == 7 || t == 8;
    ASSERT_EQ(batch, fast && batch_type) << "type " << int(t) << " len " << len;
    if (batch) {
      ASSERT_TRUE(same_event(r, eb)) << "type " << int(t);
      EXPECT_EQ(eb.ptr(), e.ptr());
      EXPECT_EQ(eb.kind(), e.kind());
      EXPECT_EQ(eb.kind(), t == 8 ? f::AllocKind::device_pooled : t == 7 ? r.free.kind : r.alloc.kind);
      EXPECT_EQ(eb.ptr(), t == 8 ? r.free_completed.ptr : t == 7 ? r.free.ptr : r.alloc.ptr);
      if (t == 6) EXPECT_EQ(eb.alloc_stack(), r.alloc.stack);
      ++batched;
    }
    if (fast) {
      ASSERT_TRUE(same_event(r, e)) << "type " << int(t);
      ++ok;
    } else {
      ++bad;
    }
  }
  EXPECT_GT(ok, 1000);
  EXPECT_GT(bad, 1000);
  EXPECT_GT(batched, 500);

  // Length fields no frame of the type has, the largest included, are refused whatever the
  // type (the fuzzers found a batch that stepped 4 GiB on a 0xFFFFFFFF length).
  Bytes pad(f::kBatchRead + 16, 0);
  for (int t = 0; t < 256; ++t) {
    for (std::uint32_t len : {0u, 1u, 25u, 27u, 43u, 45u, 51u, 53u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
      f::EventRecord eb;
      EXPECT_FALSE(f::decode_batch_event(static_cast<std::uint8_t>(t), pad.data(), len, eb)) << t << " " << len;
    }
  }
}

// format/rules.h: the rules both halves share. The address spaces' numbers are what the
// analyzer's live keys are made of (Model::key), so they are part of the contract.
TEST(FormatRules, AddressSpaces) {
  EXPECT_EQ(f::address_space(f::AllocKind::device_pooled), f::AddressSpace::pointer);
  EXPECT_EQ(f::address_space(f::AllocKind::managed), f::AddressSpace::pointer);
  EXPECT_EQ(static_cast<int>(f::address_space(f::AllocKind::vmm_physical)), 1);
  EXPECT_EQ(static_cast<int>(f::address_space(f::AllocKind::vmm_map)), 2);
  EXPECT_EQ(static_cast<int>(f::address_space(f::AllocKind::va_reserve)), 3);
  static_assert(f::address_space(f::AllocKind::va_reserve) == f::AddressSpace::va, "usable in constant expressions");
  // space_key: one key per (address, space), the same for every pointer kind (a free of an
  // address finds its allocation whatever pointer kind each record names), distinct across
  // spaces (a VMM handle equal to an address, a mapping at its reservation's start).
  const std::uint64_t p = 0x7f0000200000;
  EXPECT_EQ(f::space_key(p, f::AllocKind::device_pooled), p);
  EXPECT_EQ(f::space_key(p, f::AllocKind::async), f::space_key(p, f::AllocKind::managed));
  std::set<std::uint64_t> keys;
  for (auto k :
       {f::AllocKind::device_pooled, f::AllocKind::vmm_physical, f::AllocKind::vmm_map, f::AllocKind::va_reserve})
    keys.insert(f::space_key(p, k));
  EXPECT_EQ(keys.size(), 4u);
}

TEST(FormatRules, Bytes) {
  char b[f::kBytesTextSize];
  EXPECT_STREQ(f::format_bytes(0, b, sizeof b), "0 B");
  EXPECT_STREQ(f::format_bytes(1023, b, sizeof b), "1023 B");
  EXPECT_STREQ(f::format_bytes(2u << 20, b, sizeof b), "2.00 MiB");
  EXPECT_STREQ(f::format_bytes(40u << 20, b, sizeof b), "40.0 MiB");
  EXPECT_STREQ(f::format_bytes(964ull << 20, b, sizeof b), "964 MiB");
  EXPECT_STREQ(f::format_bytes(~0ull, b, sizeof b), "16384 PiB");
}

// One case per cause, in the rule's order: fragmentation wins over the cap.
TEST(FormatRules, OomDiagnosis) {
  constexpr std::uint64_t M = 1u << 20;
  f::OomFacts frag;
  frag.requested = 4 * M, frag.largest_free = 2 * M, frag.cached_unused = 20 * M;
  frag.limit = 40 * M, frag.held = 40 * M, frag.device_free = 900 * M;
  f::OomDiagnosis d = f::diagnose_oom(frag);
  EXPECT_EQ(d.cause, f::OomCause::fragmentation);
  EXPECT_TRUE(d.fits_without_fragmentation);
  f::OomText t;
  f::oom_text(frag, d, &t);
  EXPECT_STREQ(t.fit,
               "fragmentation cost 20.0 MiB here (free in the pool, largest free block 2.00 MiB): with it gone "
               "the request would have fit");
  EXPECT_EQ(std::string(t.suggestion).rfind("the pool's free memory is split", 0), 0u) << t.suggestion;

  f::OomFacts cap = frag;
  cap.requested = 30 * M;
  d = f::diagnose_oom(cap);
  EXPECT_EQ(d.cause, f::OomCause::limit);
  f::oom_text(cap, d, &t);
  EXPECT_STREQ(t.suggestion,
               "the per-process cap GPUHEAP_LIMIT=40.0 MiB is what failed; the device itself has 900 MiB "
               "free");
  EXPECT_STREQ(f::oom_cause_name(d.cause), "limit");

  f::OomFacts real;
  real.requested = 24 * M, real.held = 16 * M, real.device_free = 16 * M;
  d = f::diagnose_oom(real);
  EXPECT_EQ(d.cause, f::OomCause::live_allocations);
  EXPECT_FALSE(d.fits_without_fragmentation);
  EXPECT_STREQ(f::oom_cause_name(d.cause), "live_allocations");
}
