// Event blocks (format version 7, format/block.h) end to end: `gpuheap compress` regroups a
// compact trace's event frames into blocks, and every command reads the compressed trace (and
// its `zstd -d` output) exactly as the original; a stored version-6 .zst still reads; a damaged
// block is refused at its offset (exit 2), a trace cut inside one reads as cut before it.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <random>

#include "analyzer/trace/block_stream.h"
#include "format/trace.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

using Bytes = std::vector<unsigned char>;

Result gh(const std::string& args) { return run(std::string(GPUHEAP_CLI) + " " + args); }

Bytes read_bytes(const std::string& path) {
  const std::string s = slurp(path);
  return Bytes(s.begin(), s.end());
}
void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
Bytes unzstd(const Bytes& z) {
  Bytes out;
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ZSTD_inBuffer in{z.data(), z.size(), 0};
  Bytes chunk(ZSTD_DStreamOutSize());
  while (in.pos < in.size) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    if (ZSTD_isError(ZSTD_decompressStream(d, &o, &in))) break;
    out.insert(out.end(), chunk.data(), chunk.data() + o.pos);
  }
  ZSTD_freeDCtx(d);
  return out;
}
Bytes zstd3(const Bytes& b) {
  Bytes z(ZSTD_compressBound(b.size()));
  z.resize(ZSTD_compress(z.data(), z.size(), b.data(), b.size(), 3));
  return z;
}
std::uint16_t version_of(const Bytes& stream) {
  std::uint16_t v = 0;
  if (stream.size() >= format::kFileHeaderSize) std::memcpy(&v, stream.data() + 8, 2);
  return v;
}

// The command's output on `trace`, its path written as TRACE.
std::string output_of(const std::string& cmd, const std::string& trace) {
  Result r = gh(cmd + " " + trace);
  std::string s = r.out;
  for (std::size_t p = s.find(trace); p != std::string::npos; p = s.find(trace, p)) s.replace(p, trace.size(), "TRACE");
  return s + "\nexit " + std::to_string(r.code);
}

// `name`'s compact (version 6) form in the test directory, from a stored trace of any version.
std::string compact_copy(const std::string& stored, const std::string& name) {
  const std::string out = TraceBuilder::dir() + "/" + name;
  std::remove(out.c_str());
  EXPECT_EQ(run(std::string(GPUHEAP_RECODE) + " " + stored + " " + out + " --compact").code, 0) << stored;
  return out;
}

// TRACE compressed with event blocks (gpuheap compress --keep): TRACE.zst.
std::string compress(const std::string& trace) {
  Result r = gh("compress --keep --force " + trace);
  EXPECT_EQ(r.code, 0) << r.out;
  return trace + ".zst";
}

// The offset of the first event_block frame in a version-7 stream.
std::size_t first_block(const Bytes& s) {
  std::size_t off = format::kFileHeaderSize;
  while (off < s.size()) {
    if (s[off] == static_cast<unsigned char>(format::RecordType::event_block)) return off;
    if (s[off] & format::kCompactBit) {
      off += 2 + s[off + 1];
    } else {
      std::uint32_t len;
      std::memcpy(&len, s.data() + off + 1, 4);
      off += 5 + len;
    }
  }
  return 0;
}

}  // namespace

TEST(Blocks, CompressedShippedTracesReadAsTheOriginal) {
  const std::string src = GPUHEAP_SOURCE_DIR;
  const char* stored[] = {"examples/traces/h100-gpt-train.trace.zst", "tests/gpu/traces/h200-gpt-train-v2.trace.zst",
                          "tests/gpu/traces/h100-gpt-train-v3.trace.zst",
                          "tests/gpu/traces/h100-resnet18-nocache.trace.zst"};
  int i = 0;
  for (const char* s : stored) {
    const std::string trace = compact_copy(src + "/" + s, "shipped" + std::to_string(i++) + ".trace");
    const Bytes original = read_bytes(trace);
    ASSERT_EQ(version_of(original), format::kRecordVersion) << s;
    const std::string zst = compress(trace);
    const Bytes z = read_bytes(zst), stream = unzstd(z);
    EXPECT_EQ(version_of(stream), 7) << s;
    EXPECT_NE(first_block(stream), 0u) << s;
    // Smaller than the same trace through zstd alone, at the same level.
    EXPECT_LT(z.size(), zstd3(original).size()) << s;
    // What `zstd -d` gives: a plain version-7 trace.
    const std::string v7 = trace + ".v7";
    write_bytes(v7, stream);
    for (const char* c : {"summary --json", "dump", "check", "replay -q --json"}) {
      const std::string want = output_of(c, trace);
      EXPECT_GT(want.size(), std::string("\nexit 0").size()) << c;
      EXPECT_EQ(output_of(c, zst), want) << c << " on " << s;
      EXPECT_EQ(output_of(c, v7), want) << c << " on " << s << " (zstd -d)";
    }
  }
}

// A .zst written before event blocks (format version 6, kept in tests/unit/data) reads as it
// did, and as its own version-7 recompression.
TEST(Blocks, StoredVersionSixZstStillReads) {
  const std::string stored = std::string(GPUHEAP_SOURCE_DIR) + "/tests/unit/data/compact-v6.trace.zst";
  const Bytes old = unzstd(read_bytes(stored));
  ASSERT_EQ(version_of(old), 6);
  EXPECT_EQ(first_block(old), 0u);
  const std::string plain = TraceBuilder::dir() + "/stored-v6.trace";
  write_bytes(plain, old);
  const std::string zst = compress(plain);
  EXPECT_EQ(version_of(unzstd(read_bytes(zst))), 7);
  for (const char* c : {"summary --json", "dump"}) {
    const std::string want = output_of(c, plain);
    EXPECT_EQ(output_of(c, stored), want) << c;
    EXPECT_EQ(output_of(c, zst), want) << c;
  }
}

TEST(Blocks, DamagedBlockIsRefusedAtItsOffset) {
  const std::string stored = std::string(GPUHEAP_SOURCE_DIR) + "/tests/unit/data/compact-v6.trace.zst";
  const std::string plain = TraceBuilder::dir() + "/damage.trace";
  write_bytes(plain, unzstd(read_bytes(stored)));
  const Bytes good = unzstd(read_bytes(compress(plain)));
  const std::size_t at = first_block(good);
  ASSERT_NE(at, 0u);
  std::uint32_t len;
  std::memcpy(&len, good.data() + at + 1, 4);
  // The count (one or two varint bytes), the first event's type byte (past the timestamps).
  std::size_t count_len = (good[at + 5] & 0x80) ? 2 : 1, count = good[at + 5] & 0x7F;
  if (count_len == 2) count |= static_cast<std::size_t>(good[at + 6]) << 7;
  std::size_t rest = at + 5 + count_len;
  for (std::size_t i = 0; i < count; ++i) {
    while (good[rest] & 0x80) ++rest;
    ++rest;
  }
  struct Damage {
    const char* what;
    std::size_t off;
    unsigned char byte;
  };
  const Damage damages[] = {
      {"count 0", at + 5, 0},
      {"a type no compact event has", rest, static_cast<unsigned char>(format::RecordType::stack)},
      {"a length one byte longer", rest + 1, static_cast<unsigned char>(good[rest + 1] + 1)},
      {"a payload length one byte longer", at + 1, static_cast<unsigned char>(good[at + 1] + 1)},
  };
  const std::string want = "corrupt record (type 22) at byte offset " + std::to_string(at);
  for (const Damage& d : damages) {
    Bytes b = good;
    b[d.off] = d.byte;
    const std::string path = TraceBuilder::dir() + "/damaged.trace";
    write_bytes(path, b);
    Result r = gh("summary " + path);
    EXPECT_EQ(r.code, 2) << d.what << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << d.what << ": " << r.out;
    write_bytes(path + ".zst", zstd3(b));
    r = gh("summary " + path + ".zst");
    EXPECT_EQ(r.code, 2) << d.what << " (zstd): " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << d.what << " (zstd): " << r.out;
  }
  // Cut inside the block: read as cut there, with the records before it.
  for (std::size_t cut : {at + 3, at + 5 + len / 2, at + 5 + len - 1}) {
    const std::string path = TraceBuilder::dir() + "/cut.trace";
    write_bytes(path, Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
    Result r = gh("summary " + path);
    EXPECT_EQ(r.code, 0) << cut << ": " << r.out;
    EXPECT_NE(r.out.find("file cut mid-record at byte " + std::to_string(at)), std::string::npos) << cut << r.out;
  }
}

// The packer and the expander on a stream cut anywhere: fed in pieces of random sizes (frames
// straddling every piece boundary), taken out into windows of random sizes, they give the bytes
// they give on the whole stream, and the expansion is the original.
TEST(Blocks, PiecesStraddlingFramesPackAndExpandAsTheWhole) {
  const std::string stored = std::string(GPUHEAP_SOURCE_DIR) + "/tests/unit/data/compact-v6.trace.zst";
  const Bytes original = unzstd(read_bytes(stored));
  ASSERT_GT(original.size(), 10000u);
  std::string whole;
  {
    BlockPacker p;
    p.write(original.data(), original.size(), whole);
    p.finish(whole);
    EXPECT_TRUE(p.packed());
  }
  ASSERT_EQ(version_of(Bytes(whole.begin(), whole.end())), 7);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::string pieces;
    BlockPacker p;
    for (std::size_t at = 0; at < original.size();) {
      const std::size_t n = std::min<std::size_t>(original.size() - at, 1 + rng() % (round < 10 ? 40 : 4000));
      p.write(original.data() + at, n, pieces);
      at += n;
    }
    p.finish(pieces);
    ASSERT_EQ(pieces, whole) << round;
    // Expanded from a stream that comes in pieces, into windows of random room.
    BlockExpander x(format::kFileHeaderSize, 64);
    Bytes out(whole.begin(), whole.begin() + format::kFileHeaderSize), window(70000);
    std::size_t at = format::kFileHeaderSize;
    for (;;) {
      const std::size_t n = x.take(window.data(), 1 + rng() % window.size());
      out.insert(out.end(), window.data(), window.data() + n);
      if (!x.needs_input()) continue;
      if (at == whole.size()) {
        if (x.finished()) break;
        x.finish();
        continue;
      }
      unsigned char* dst = x.space();
      const std::size_t m = std::min({x.room(), whole.size() - at, static_cast<std::size_t>(1 + rng() % 3000)});
      std::memcpy(dst, whole.data() + at, m);
      x.added(m);
      at += m;
    }
    std::memcpy(out.data() + 8, original.data() + 8, 2);  // the header says 7, the original 6
    ASSERT_EQ(out, original) << round;
    EXPECT_FALSE(x.cut());
  }
}
