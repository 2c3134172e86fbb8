// format/block.h: an event block (format version 7) expands back into exactly the compact
// frames it was made of, byte for byte, for any run of them; a block whose count or lengths
// do not add up, or that holds a type no compact event has, does not expand; decode_frame
// never takes a block for a record.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "format/block.h"
#include "format/trace.h"

namespace f = gpuheap::format;

namespace {

using Bytes = std::vector<unsigned char>;

// n compact event frames of every kind, with random fields (times going back as well as
// forward, addresses far apart), as the preload encodes them.
Bytes compact_frames(std::size_t n, unsigned seed, std::vector<std::size_t>* ends = nullptr) {
  std::mt19937_64 rng(seed);
  f::CompactState st;
  Bytes out;
  std::uint64_t ts = 1'000'000'000;
  std::vector<std::uint64_t> live;
  unsigned char buf[f::kCompactMaxEventSize];
  for (std::size_t i = 0; i < n; ++i) {
    ts += (rng() % 4 == 0) ? rng() : rng() % 5000;
    std::size_t k = 0;
    const unsigned what = rng() % 4;
    if (what == 0 || live.empty()) {
      f::AllocRecord a{};
      a.ts = ts, a.tid = static_cast<std::uint32_t>(rng() % 3), a.ptr = 0x7f0000000000ull + (rng() % 4096) * 512;
      a.requested = rng() % 100000, a.size = a.requested + rng() % 512,
      a.stack = static_cast<std::uint32_t>(rng() % 50);
      k = f::encode_compact(buf, sizeof buf, st, a);
      live.push_back(a.ptr);
    } else if (what == 1) {
      f::FreeRecord r{};
      r.ts = ts, r.ptr = live.back(), r.size = rng() % 1000;
      live.pop_back();
      k = f::encode_compact(buf, sizeof buf, st, r);
    } else if (what == 2) {
      f::FreeCompletedRecord r{};
      r.ts = ts, r.ptr = rng(), r.size = rng() % 1000;
      k = f::encode_compact(buf, sizeof buf, st, r);
    } else {
      f::SegmentRecord r{};
      r.ts = ts, r.ptr = rng(), r.size = rng(), r.device = static_cast<std::int16_t>(rng() % 8);
      k = f::encode_compact(buf, sizeof buf, st, r, rng() % 2 == 0);
    }
    EXPECT_GT(k, 0u);
    out.insert(out.end(), buf, buf + k);
    if (ends) ends->push_back(out.size());
  }
  return out;
}

Bytes block_of(const Bytes& frames, std::size_t count) {
  Bytes b(frames.size() + 32);
  b.resize(f::encode_event_block(b.data(), b.size(), frames.data(), frames.size(), count));
  return b;
}

// The payload's expansion, or empty where it does not expand.
Bytes expand(const Bytes& block) {
  const std::size_t len = block.size() - f::kFrameHeaderSize;
  Bytes out(len);
  out.resize(f::expand_event_block(block.data() + f::kFrameHeaderSize, len, out.data(), out.size()));
  return out;
}

}  // namespace

TEST(FormatBlock, ExpandsToTheFramesItWasMadeOf) {
  for (std::size_t n : {1u, 2u, 7u, 100u, 4096u}) {
    const Bytes frames = compact_frames(n, static_cast<unsigned>(n));
    const Bytes b = block_of(frames, n);
    ASSERT_FALSE(b.empty()) << n;
    EXPECT_EQ(b[0], static_cast<unsigned char>(f::RecordType::event_block));
    std::uint32_t len;
    std::memcpy(&len, b.data() + 1, 4);
    EXPECT_EQ(len, b.size() - f::kFrameHeaderSize);
    EXPECT_EQ(b.size(), f::kFrameHeaderSize + f::detail::varint_size(n) + frames.size());
    EXPECT_EQ(expand(b), frames) << n;
  }
}

TEST(FormatBlock, EncoderTakesOnlyWholeCompactEventFrames) {
  const Bytes frames = compact_frames(10, 1);
  Bytes out(frames.size() + 32);
  // A count that does not match the bytes, a frame cut short, too many events.
  EXPECT_EQ(f::encode_event_block(out.data(), out.size(), frames.data(), frames.size(), 9), 0u);
  EXPECT_EQ(f::encode_event_block(out.data(), out.size(), frames.data(), frames.size(), 11), 0u);
  EXPECT_EQ(f::encode_event_block(out.data(), out.size(), frames.data(), frames.size() - 1, 10), 0u);
  EXPECT_EQ(f::encode_event_block(out.data(), out.size(), frames.data(), frames.size(), 0), 0u);
  EXPECT_EQ(f::encode_event_block(out.data(), 10, frames.data(), frames.size(), 10), 0u);  // no room
  // A compact frame without a whole first varint, one of a type no compact event has.
  const unsigned char no_ts[] = {f::compact_type(f::RecordType::alloc), 1, 0x80};
  EXPECT_EQ(f::block_ts_len(no_ts), 0u);
  const unsigned char empty[] = {f::compact_type(f::RecordType::free), 0};
  EXPECT_EQ(f::block_ts_len(empty), 0u);
  const unsigned char stack[] = {f::kCompactBit | static_cast<unsigned char>(f::RecordType::stack), 1, 0};
  EXPECT_EQ(f::block_ts_len(stack), 0u);
  EXPECT_EQ(f::encode_event_block(out.data(), out.size(), stack, sizeof stack, 1), 0u);
  Bytes big = compact_frames(f::kMaxBlockEvents + 1, 2);
  Bytes out2(big.size() + 32);
  EXPECT_EQ(f::encode_event_block(out2.data(), out2.size(), big.data(), big.size(), f::kMaxBlockEvents + 1), 0u);
}

TEST(FormatBlock, DamagedBlocksDoNotExpand) {
  std::vector<std::size_t> ends;
  const Bytes frames = compact_frames(50, 3, &ends);
  const Bytes good = block_of(frames, 50);
  ASSERT_EQ(expand(good), frames);
  auto refused = [&](Bytes b, const char* what) {
    std::uint32_t len = static_cast<std::uint32_t>(b.size() - f::kFrameHeaderSize);
    std::memcpy(b.data() + 1, &len, 4);
    EXPECT_TRUE(expand(b).empty()) << what;
  };
  Bytes b = good;
  b[5] = 0;  // count 0
  refused(b, "count 0");
  b = good;
  b[5] = 49;  // fewer events than the bytes hold
  refused(b, "count short");
  b[5] = 51;
  refused(b, "count long");
  b = good;
  b.push_back(0);
  refused(b, "a byte after the last event");
  // Every payload cut short.
  for (std::size_t cut = f::kFrameHeaderSize; cut < good.size(); ++cut)
    refused(Bytes(good.begin(), good.begin() + cut), "cut");
  // The first event's type byte: where the rest starts, past the count and the timestamps.
  std::size_t rest = 6;
  for (std::size_t i = 0; i < 50; ++i) rest += f::detail::varint_len(good.data() + rest, good.data() + good.size());
  b = good;
  b[rest] = static_cast<unsigned char>(f::RecordType::stack);  // not compact
  refused(b, "not a compact type");
  b[rest] = f::kCompactBit | static_cast<unsigned char>(f::RecordType::process);
  refused(b, "a compact bit on a record no compact event is");
  b = good;
  b[rest + 1] = static_cast<unsigned char>(b[rest + 1] + 1);  // its rest one byte longer
  refused(b, "lengths off by one");
  b[rest + 1] = 255;  // with its timestamp, longer than a compact frame
  refused(b, "longer than a compact frame");
  // A count of more events than a block may hold.
  Bytes huge = {f::kEventBlockType, 0, 0, 0, 0, 0x81, 0x40};  // var 8193
  refused(huge, "count above the maximum");
  // A timestamp without its last byte: every byte has bit 7.
  Bytes unterminated = {f::kEventBlockType, 0, 0, 0, 0, 1};
  unterminated.insert(unterminated.end(), 11, 0x80);
  refused(unterminated, "no varint");
}

TEST(FormatBlock, DecodeFrameNeverTakesABlockForARecord) {
  const Bytes frames = compact_frames(20, 4);
  const Bytes b = block_of(frames, 20);
  f::Record r;
  std::size_t used = 0;
  f::CompactState cs;
  cs.enabled = true;
  EXPECT_EQ(f::decode_frame(b.data(), b.size(), r, &used, &cs), f::FrameStatus::corrupt);
  EXPECT_EQ(f::decode_frame(b.data(), b.size(), r, &used, nullptr), f::FrameStatus::corrupt);
}

TEST(FormatBlock, FrameExtentIsTheSameWalkForWriterAndReader) {
  const Bytes frames = compact_frames(3, 5);
  f::FrameExtent e = f::frame_extent(frames.data(), frames.size());
  EXPECT_EQ(e.kind, f::FrameKind::compact);
  EXPECT_EQ(e.size, 2u + frames[1]);
  EXPECT_EQ(f::frame_extent(frames.data(), 1).kind, f::FrameKind::need_more);
  EXPECT_EQ(f::frame_extent(frames.data(), e.size - 1).kind, f::FrameKind::need_more);
  const Bytes b = block_of(frames, 3);
  e = f::frame_extent(b.data(), b.size());
  EXPECT_EQ(e.kind, f::FrameKind::record);
  EXPECT_EQ(e.size, b.size());
  EXPECT_EQ(f::frame_extent(b.data(), b.size() - 1).kind, f::FrameKind::need_more);
  const unsigned char zero[] = {0, 1, 2};
  EXPECT_EQ(f::frame_extent(zero, sizeof zero).kind, f::FrameKind::stop);
  const unsigned char huge[] = {5, 0xFF, 0xFF, 0xFF, 0x7F};  // a length no record has
  EXPECT_EQ(f::frame_extent(huge, sizeof huge).kind, f::FrameKind::stop);
}

TEST(FormatBlock, VersionSevenIsReadAndRecordsAloneSayVersionSix) {
  unsigned char h[f::kFileHeaderSize];
  f::encode_file_header(h);
  std::uint16_t v = 0;
  ASSERT_EQ(f::decode_file_header(h, sizeof h, &v), f::HeaderStatus::ok);
  EXPECT_EQ(v, 6);
  f::encode_file_header(h, f::kFirstBlockVersion);
  ASSERT_EQ(f::decode_file_header(h, sizeof h, &v), f::HeaderStatus::ok);
  EXPECT_EQ(v, 7);
}
