// format/compact.h: the version-5 compact event records decode back to exactly the records
// encoded, in any order and with any values; a compact frame that does not decode, or one in a
// file of an older version, is corrupt; a cut one needs more bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "format/trace.h"

namespace f = gpuheap::format;

namespace {

using Bytes = std::vector<unsigned char>;

struct Stream {
  Bytes bytes;
  std::vector<f::Record> want;  // in order
  f::CompactState st;
};

template <class R, class... Extra>
void add(Stream& s, f::RecordType t, const R& r, Extra... extra) {
  unsigned char buf[f::kCompactMaxEventSize];
  const std::size_t n = f::encode_compact(buf, sizeof buf, s.st, r, extra...);
  ASSERT_GT(n, 0u);
  s.bytes.insert(s.bytes.end(), buf, buf + n);
  f::Record rec;
  rec.type = t;
  if constexpr (std::is_same_v<R, f::AllocRecord>) rec.alloc = r;
  if constexpr (std::is_same_v<R, f::FreeRecord>) rec.free = r;
  if constexpr (std::is_same_v<R, f::FreeCompletedRecord>) rec.free_completed = r;
  if constexpr (std::is_same_v<R, f::SegmentRecord>) rec.segment = r;
  s.want.push_back(rec);
}

// A plain (fixed-layout) encoding of an event record: two records are the same event when these
// bytes are.
Bytes plain(const f::Record& r) {
  unsigned char buf[256];
  std::size_t n = 0;
  switch (r.type) {
    case f::RecordType::alloc: n = f::encode(buf, sizeof buf, r.alloc); break;
    case f::RecordType::free: n = f::encode(buf, sizeof buf, r.free); break;
    case f::RecordType::free_completed: n = f::encode(buf, sizeof buf, r.free_completed); break;
    case f::RecordType::segment_alloc: n = f::encode(buf, sizeof buf, r.segment, false); break;
    case f::RecordType::segment_free: n = f::encode(buf, sizeof buf, r.segment, true); break;
    default: break;
  }
  return Bytes(buf, buf + n);
}

std::uint64_t g_x = 0x9e3779b97f4a7c15ull;
std::uint64_t rnd() {
  g_x ^= g_x << 13, g_x ^= g_x >> 7, g_x ^= g_x << 17;
  return g_x;
}

// A random workload: times that go back (threads' clocks race to the lock), blocks freed in and
// out of the recent list, frees completed in and out of order, extreme values.
Stream random_stream(int events) {
  Stream s;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live, freed;  // ptr, size
  std::vector<std::int16_t> freed_dev;
  std::uint64_t ts = 1'000'000'000;
  for (int i = 0; i < events; ++i) {
    ts += rnd() % 5000;
    const std::uint64_t t = rnd() % 16 == 0 ? ts - rnd() % 100000 : ts;  // now and then earlier
    const auto dev = static_cast<std::int16_t>(rnd() % 8 == 0 ? -1 : rnd() % 3);
    const std::uint64_t pick = rnd() % 10;
    if (pick < 4 || live.empty()) {
      std::uint64_t ptr = rnd() % 4 == 0 ? rnd() : 0x7f0000000000ull + (rnd() % (1u << 30)) * 512;
      std::uint64_t req = rnd() % 8 == 0 ? rnd() : rnd() % (64u << 20);
      std::uint64_t size = rnd() % 8 == 0 ? req - rnd() % 3 : req + rnd() % 512;
      add(s, f::RecordType::alloc,
          f::AllocRecord{t, static_cast<std::uint32_t>(rnd()), dev,
                         static_cast<f::AllocKind>(rnd() % f::kNumAllocKinds), static_cast<std::uint8_t>(rnd()), ptr,
                         req, size, rnd() % 4 == 0 ? rnd() : rnd() % 3,
                         static_cast<std::uint32_t>(rnd() % 4 == 0 ? rnd() : rnd() % 100)});
      live.push_back({ptr, size});
    } else if (pick < 7) {
      std::size_t k = rnd() % 3 == 0 ? rnd() % live.size()
                                     : live.size() - 1 - rnd() % std::min<std::size_t>(live.size(), 4);
      auto [ptr, size] = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      if (rnd() % 8 == 0) ptr ^= 64;  // a free of a block never seen (a misuse, recorded as is)
      add(s, f::RecordType::free,
          f::FreeRecord{t, static_cast<std::uint32_t>(rnd() % 100000), dev,
                        static_cast<f::AllocKind>(rnd() % f::kNumAllocKinds), static_cast<std::uint8_t>(rnd()), ptr,
                        size, rnd() % 3, static_cast<std::uint32_t>(rnd() % 3)});
      freed.push_back({ptr, size}), freed_dev.push_back(dev);
    } else if (pick < 9 && !freed.empty()) {
      std::size_t k = rnd() % 4 == 0 ? rnd() % freed.size() : 0;
      auto [ptr, size] = freed[k];
      std::int16_t d = freed_dev[k];
      freed.erase(freed.begin() + static_cast<std::ptrdiff_t>(k));
      freed_dev.erase(freed_dev.begin() + static_cast<std::ptrdiff_t>(k));
      if (rnd() % 8 == 0) size += 1;  // not a recent free's: written in full
      add(s, f::RecordType::free_completed, f::FreeCompletedRecord{t, d, ptr, size});
    } else {
      const bool is_free = rnd() % 2;
      add(s, is_free ? f::RecordType::segment_free : f::RecordType::segment_alloc,
          f::SegmentRecord{t, dev, static_cast<std::uint8_t>(rnd()), rnd(), rnd() % (1ull << 40)}, is_free);
    }
  }
  return s;
}

// Decodes every frame of b; the records and the status that stopped it.
f::FrameStatus decode_all(const Bytes& b, std::vector<f::Record>* got, bool enabled = true,
                          std::size_t* off_out = nullptr) {
  f::CompactState st;
  st.enabled = enabled;
  std::size_t off = 0;
  f::FrameStatus s = f::FrameStatus::ok;
  while (off < b.size()) {
    f::Record r;
    std::size_t used = 0;
    s = f::decode_frame(b.data() + off, b.size() - off, r, &used, &st);
    if (s != f::FrameStatus::ok) break;
    got->push_back(r);
    off += used;
  }
  if (off_out) *off_out = off;
  return s;
}

}  // namespace

TEST(FormatCompact, RandomEventsRoundTrip) {
  for (int seed = 0; seed < 20; ++seed) {
    g_x = 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(seed) * 7919;
    Stream s = random_stream(2000);
    std::vector<f::Record> got;
    ASSERT_EQ(decode_all(s.bytes, &got), f::FrameStatus::ok) << seed;
    ASSERT_EQ(got.size(), s.want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].type, s.want[i].type) << seed << " " << i;
      ASSERT_EQ(plain(got[i]), plain(s.want[i])) << "seed " << seed << ", record " << i;
    }
  }
}

// Plain records between compact ones (stacks, threads, plain events of an older writer) neither
// use nor change the state.
TEST(FormatCompact, PlainRecordsBetweenLeaveTheStateAlone) {
  Stream s;
  add(s, f::RecordType::alloc,
      f::AllocRecord{100, 7, 0, f::AllocKind::device_pooled, 0, 0x7f0000001000, 512, 512, 0, 1});
  unsigned char buf[256];
  const std::uint64_t ips[2] = {0x401000, 0x402000};
  std::size_t n = f::encode_stack(buf, sizeof buf, 2, ips, 2);
  s.bytes.insert(s.bytes.end(), buf, buf + n);
  n = f::encode(buf, sizeof buf, f::AllocRecord{150, 8, 0, f::AllocKind::device_pooled, 0, 0x900000, 8, 8, 0, 2});
  s.bytes.insert(s.bytes.end(), buf, buf + n);
  add(s, f::RecordType::free, f::FreeRecord{200, 7, 0, f::AllocKind::device_pooled, 0, 0x7f0000001000, 512, 0, 0});
  std::vector<f::Record> got;
  ASSERT_EQ(decode_all(s.bytes, &got), f::FrameStatus::ok);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[1].type, f::RecordType::stack);
  EXPECT_EQ(got[2].alloc.ptr, 0x900000u);
  EXPECT_EQ(plain(got[3]), plain(s.want[1]));
}

TEST(FormatCompact, EventsAreSmall) {
  Stream s;
  std::uint64_t ts = 5'000'000'000'000ull;
  for (int i = 0; i < 100; ++i) {
    std::uint64_t p = 0x7f3a00000000ull + static_cast<std::uint64_t>(i % 7) * (2u << 20);
    add(s, f::RecordType::alloc,
        f::AllocRecord{ts += 3000, 4242, 0, f::AllocKind::device_pooled, 1, p, 1 << 20, 1 << 20, 0, 17});
    add(s, f::RecordType::free, f::FreeRecord{ts += 2000, 4242, 0, f::AllocKind::device_pooled, 1, p, 1 << 20, 0, 0});
    add(s, f::RecordType::free_completed, f::FreeCompletedRecord{ts += 100, 0, p, 1 << 20});
  }
  // Fixed layout: 57 + 49 + 31 bytes for the three.
  EXPECT_LE(s.bytes.size(), 100u * 40) << "bytes for 300 events";
}

TEST(FormatCompact, BadFramesAreCorruptCutOnesNeedMore) {
  Stream s;
  add(s, f::RecordType::alloc,
      f::AllocRecord{100, 7, 0, f::AllocKind::device_pooled, 0, 0x7f0000001000, 512, 512, 0, 1});
  const Bytes good = s.bytes;
  std::vector<f::Record> got;
  // A file of an older version (or a decoder without the state) has no compact records.
  EXPECT_EQ(decode_all(good, &got, false), f::FrameStatus::corrupt);
  f::Record r;
  std::size_t used = 0;
  EXPECT_EQ(f::decode_frame(good.data(), good.size(), r, &used), f::FrameStatus::corrupt);
  // Cut anywhere: more bytes are needed.
  for (std::size_t cut = 1; cut < good.size(); ++cut) {
    Bytes b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
    got.clear();
    EXPECT_EQ(decode_all(b, &got), f::FrameStatus::need_more) << cut;
  }
  Bytes b = good;
  b[1] -= 1;  // the payload ends inside a field
  got.clear();
  EXPECT_EQ(decode_all(b, &got), f::FrameStatus::corrupt);
  b = good;
  b[1] += 1, b.push_back(0);  // a byte left over after the fields
  got.clear();
  EXPECT_EQ(decode_all(b, &got), f::FrameStatus::corrupt);
  b = good;
  b[0] = f::kCompactBit | static_cast<std::uint8_t>(f::RecordType::stack);  // not an event type
  got.clear();
  EXPECT_EQ(decode_all(b, &got), f::FrameStatus::corrupt);
  // A free naming a recent allocation that is not there.
  Stream t;
  add(t, f::RecordType::free, f::FreeRecord{1, 1, 0, f::AllocKind::device_pooled, 0, 0x1000, 8, 0, 0});
  b = t.bytes;
  ASSERT_EQ(b[2 + 3], f::kCompactLiteral);  // ts tid flags, then the reference
  b[2 + 3] = 3;
  got.clear();
  EXPECT_EQ(decode_all(b, &got), f::FrameStatus::corrupt);
  // A varint longer than 64 bits.
  b = {static_cast<unsigned char>(f::kCompactBit | static_cast<std::uint8_t>(f::RecordType::segment_alloc)), 11};
  for (int i = 0; i < 10; ++i) b.push_back(0xFF);
  b.push_back(0x01);
  got.clear();
  EXPECT_EQ(decode_all(b, &got), f::FrameStatus::corrupt);
}

// The recent-allocation and recent-free lists are rings; they must hold exactly what the format
// says (docs/trace-format.md): most recent first, a push dropping the oldest when full, a drop
// closing the gap. Checked against a plain list on random pushes and drops from anywhere, so
// a ring that the encoder and the decoder would get wrong the same way (which the round trips
// above cannot see) fails here.
TEST(FormatCompact, RecentListsAreTheDocumentedLists) {
  g_x = 0x1234567u;
  f::CompactState st;
  std::vector<std::uint64_t> allocs, frees;  // ptr, most recent first
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t p = rnd();
    switch (rnd() % 4) {
      case 0:
        st.push_alloc(f::AllocRecord{0, 0, 0, f::AllocKind::device_pooled, 0, p, 0, 0, 0, 0});
        allocs.insert(allocs.begin(), p);
        if (allocs.size() > f::kCompactAllocs) allocs.pop_back();
        break;
      case 1:
        if (!allocs.empty()) {
          const std::size_t k = rnd() % allocs.size();
          ASSERT_EQ(st.find_alloc(allocs[k]), static_cast<int>(k));
          st.drop_alloc(k), allocs.erase(allocs.begin() + static_cast<std::ptrdiff_t>(k));
        }
        break;
      case 2:
        st.push_free(p, p >> 3, 1);
        frees.insert(frees.begin(), p);
        if (frees.size() > f::kCompactFrees) frees.pop_back();
        break;
      default:
        if (!frees.empty()) {
          const std::size_t k = rnd() % frees.size();
          ASSERT_EQ(st.find_free(frees[k], frees[k] >> 3, 1), static_cast<int>(k));
          st.drop_free(k), frees.erase(frees.begin() + static_cast<std::ptrdiff_t>(k));
        }
        break;
    }
    ASSERT_EQ(st.n_allocs, allocs.size()) << i;
    ASSERT_EQ(st.n_frees, frees.size()) << i;
    for (std::size_t k = 0; k < allocs.size(); ++k) ASSERT_EQ(st.alloc_at(k).ptr, allocs[k]) << i << " " << k;
    for (std::size_t k = 0; k < frees.size(); ++k) ASSERT_EQ(st.free_at(k).ptr, frees[k]) << i << " " << k;
  }
}

namespace {
f::Record as_record(const f::EventRecord& e) {
  f::Record r;
  r.type = e.type;
  switch (e.type) {
    case f::RecordType::alloc: r.alloc = e.alloc; break;
    case f::RecordType::free: r.free = e.free; break;
    case f::RecordType::free_completed: r.free_completed = e.free_completed; break;
    default: r.segment = e.segment; break;
  }
  return r;
}
}  // namespace

// The analyzer's replay decodes compact frames without a bound check per byte
// (VarReaderUnchecked, where the window holds kCompactMaxRead bytes past the header). On damaged
// streams (bytes changed, payload lengths changed) it must accept and reject exactly the frames
// VarReader does, with the same records and state, frame after frame.
TEST(FormatCompact, UncheckedReaderDecidesAsTheCheckedOne) {
  int rejected = 0;
  for (int seed = 0; seed < 40; ++seed) {
    g_x = 0xabcdef12345ull + static_cast<std::uint64_t>(seed) * 104729;
    Bytes b = random_stream(300).bytes;
    const int damage = 1 + static_cast<int>(rnd() % 4);
    for (int d = 0; d < damage; ++d) b[rnd() % b.size()] = static_cast<unsigned char>(rnd());
    b.resize(b.size() + f::detail::kCompactMaxRead);  // what the reader's window has past a frame
    f::CompactState checked, unchecked;
    std::size_t off = 0;
    for (;;) {
      if (b.size() - off < f::kCompactHeaderSize + f::detail::kCompactMaxRead) break;
      const unsigned char* p = b.data() + off;
      if (!f::is_compact_type(p[0])) break;
      const unsigned char* q = p + f::kCompactHeaderSize;
      f::detail::VarReader rc{q, q + p[1]};
      f::detail::VarReaderUnchecked ru{q, q + p[1]};
      f::EventRecord ec, eu;
      const bool okc = f::detail::decode_compact_body(p[0], rc, checked, ec);
      const bool oku = f::detail::decode_compact_body(p[0], ru, unchecked, eu);
      ASSERT_EQ(okc, oku) << "seed " << seed << " at " << off;
      if (!okc) {
        ++rejected;
        break;
      }
      ASSERT_EQ(ec.type, eu.type);
      ASSERT_EQ(plain(as_record(ec)), plain(as_record(eu))) << "seed " << seed << " at " << off;
      off += f::kCompactHeaderSize + p[1];
    }
  }
  EXPECT_GT(rejected, 10) << "the damage should make most streams corrupt somewhere";
}

// Every varint length (1 to 10 bytes), and the 10-byte ones that overflow 64 bits: the
// unchecked reader's value, length and verdict are the checked one's.
TEST(FormatCompact, UncheckedVarintsOfEveryLength) {
  std::vector<std::uint64_t> values = {0, ~std::uint64_t{0}};
  for (int k = 1; k < 64; ++k) {
    const std::uint64_t b = std::uint64_t{1} << k;
    values.insert(values.end(), {b - 1, b, b + 1, b | (b >> 1) | 1});
  }
  for (const std::uint64_t v : values) {
    unsigned char buf[32] = {};
    f::detail::VarWriter w{buf};
    w.var(v);
    const auto n = static_cast<std::size_t>(w.p - buf);
    f::detail::VarReader c{buf, buf + n};
    f::detail::VarReaderUnchecked u{buf, buf + n};
    EXPECT_EQ(u.var(), v);
    EXPECT_EQ(c.var(), v);
    EXPECT_TRUE(u.ok && c.ok && u.p == buf + n && c.p == buf + n) << v;
  }
  for (int last = 2; last < 256; last += 37) {  // a 10th byte above 1 does not fit 64 bits
    unsigned char buf[32] = {};
    std::memset(buf, 0xFF, 9);
    buf[9] = static_cast<unsigned char>(last);
    f::detail::VarReader c{buf, buf + 10};
    f::detail::VarReaderUnchecked u{buf, buf + 10};
    c.var(), u.var();
    EXPECT_FALSE(c.ok);
    EXPECT_FALSE(u.ok) << last;
  }
}
