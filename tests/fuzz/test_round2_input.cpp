// Hostile and broken input, round 2 (issue #18), the reader and the CLI's own files: a zstd
// bomb, a FIFO as the trace or the baseline, a trace truncated while it is read, a zero byte
// in the middle of a trace, a zstd stream cut short, an empty file, a full disk under
// stdout, non-finite numbers. Every hostile file is made here.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analyzer/base/error.h"
#include "analyzer/trace/reader.h"
#include "tests/fuzz/hostile.h"
#include "tests/fuzz/pipeline.h"

namespace gpuheap::test {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
const std::string kCli = GPUHEAP_CLI;
const std::string kCorpus = GPUHEAP_FUZZ_CORPUS;

// A whole trace: process, `n` allocations (freed but for the last), end.
RawTrace sample_trace(std::size_t n, bool end = true) {
  RawTrace t;
  t.process();
  for (std::size_t i = 0; i < n; ++i) {
    format::AllocRecord a;
    a.ts = 2'000'000'000 + i, a.tid = 1, a.kind = format::AllocKind::device_passthrough;
    a.ptr = 0x10000 + i * 0x1000, a.requested = a.size = 4096;
    t.put(a);
    if (i + 1 == n) continue;
    format::FreeRecord f;
    f.ts = a.ts, f.tid = 1, f.kind = a.kind, f.ptr = a.ptr, f.size = a.size;
    t.put(f);
  }
  if (end) t.put(format::EndRecord{3'000'000'000, format::EndReason::exit, 0});
  return t;
}

// Streams `data` then `zeros` zero bytes through one zstd frame (the bomb is never held in
// memory: zeros go in 1 MiB pieces).
std::string write_zstd(const std::string& name, const std::vector<unsigned char>& data, std::uint64_t zeros) {
  std::string path = RawTrace::dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ZSTD_CCtx* c = ZSTD_createCCtx();
  std::vector<unsigned char> out(ZSTD_CStreamOutSize());
  std::vector<unsigned char> zero(kMiB, 0);
  auto push = [&](const unsigned char* p, std::size_t n, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{p, n, 0};
    for (;;) {
      ZSTD_outBuffer ob{out.data(), out.size(), 0};
      std::size_t left = ZSTD_compressStream2(c, &ob, &in, mode);
      std::fwrite(out.data(), 1, ob.pos, f);
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) break;
    }
  };
  push(data.data(), data.size(), ZSTD_e_continue);
  for (std::uint64_t done = 0; done < zeros; done += zero.size())
    push(zero.data(), static_cast<std::size_t>(std::min<std::uint64_t>(zero.size(), zeros - done)), ZSTD_e_continue);
  push(nullptr, 0, ZSTD_e_end);
  ZSTD_freeCCtx(c);
  std::fclose(f);
  return path;
}

std::size_t count_lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(Round2, ZstdBombEndsAtTheZeroRun) {
  // 200 MB of zeros after a whole process record, and after a bare header: the reader stops
  // kZeroRun bytes into the zeros instead of decompressing (and keeping) all of them.
  const std::uint64_t zeros = scale_small() ? 50 * kMiB : 200'000'000;
  auto t = sample_trace(100, false);
  std::string bomb = write_zstd("bomb.trace", t.bytes, zeros);
  std::vector<unsigned char> header(t.bytes.begin(), t.bytes.begin() + format::kFileHeaderSize);
  std::string bare = write_zstd("bomb-bare.trace", header, zeros);
  auto rss0 = max_rss();
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_pipeline(bomb, nullptr);
  double s = seconds_since(t0);
  EXPECT_EQ(r.records, 1u + 100 + 99);
  EXPECT_TRUE(r.truncated);
  EXPECT_LT(s, kSanitized ? 20.0 : 2.0) << "the bomb was decompressed to its end";
  if (!kSanitized) {
    EXPECT_LT(max_rss() - rss0, 64 * kMiB);
  }
  TraceReader rd(bomb);
  format::Record rec;
  while (rd.next(rec)) {
  }
  EXPECT_TRUE(rd.unwritten_tail());
  EXPECT_FALSE(rd.cut_mid_record());
  EXPECT_LT(rd.offset(), t.bytes.size() + TraceReader::kZeroRun);
  // Through the CLI: a report of the 200 records; the bare header is refused at once.
  auto cli = run_cli(kCli + " summary --json " + bomb, 60);
  EXPECT_EQ(cli.status, 0) << cli.err;
  auto bare_r = run_cli(kCli + " summary " + bare, 60);
  EXPECT_EQ(bare_r.status, 2) << bare_r.err;
  EXPECT_NE(bare_r.err.find("no process record"), std::string::npos) << bare_r.err;
}

TEST(Round2, FifoAsTraceOrBaselineIsRefusedAtOnce) {
  std::string fifo = RawTrace::dir() + "/fifo.trace";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string good = sample_trace(3).write("fifo-good.trace");
  for (const std::string& cmd :
       {"summary " + fifo, "summary --json " + fifo, "dump " + fifo, "check --max-leaked 0 " + fifo,
        "diff " + good + " " + fifo, "check --baseline " + fifo + " " + good}) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = run_cli(kCli + " " + cmd, 20);
    EXPECT_NE(r.status, -1) << cmd << " hung on the FIFO";
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_LT(seconds_since(t0), 10.0) << cmd;
    EXPECT_EQ(count_lines(r.err), 1u) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(fifo + ": "), std::string::npos) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("a FIFO, not a regular file"), std::string::npos) << cmd << ": " << r.err;
  }
  ::unlink(fifo.c_str());
}

TEST(Round2, TraceTruncatedWhileReadIsACutNotSigbus) {
  // Larger than what the reader takes at its first read: the file is cut to half between
  // open and read, as by the still-running program (a mapped file would raise SIGBUS).
  auto t = sample_trace(scale_small() ? 60'000 : 200'000);
  ASSERT_GT(t.bytes.size(), 4 * kMiB);
  std::string path = t.write("shrinking.trace");
  const auto full = t.bytes.size();
  TraceReader rd(path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(full / 2)), 0);
  format::Record rec;
  std::uint64_t n = 0;
  while (rd.next(rec)) ++n;
  EXPECT_GT(n, 1000u);
  EXPECT_TRUE(rd.shrank());
  EXPECT_TRUE(rd.cut_mid_record());
  EXPECT_TRUE(rd.truncated());
  EXPECT_LE(rd.offset(), full / 2);
  EXPECT_EQ(rd.file_size(), full);
}

// Byte offsets of the frames of a plain trace.
std::vector<std::size_t> frame_offsets(const std::vector<unsigned char>& d) {
  std::vector<std::size_t> out;
  std::size_t at = format::kFileHeaderSize;
  format::Record r;
  std::size_t len = 0;
  while (format::decode_frame(d.data() + at, d.size() - at, r, &len) == format::FrameStatus::ok) {
    out.push_back(at);
    at += len;
  }
  return out;
}

TEST(Round2, ZeroByteMidFileIsDamageNotAnUnwrittenTail) {
  auto data = read_file(kCorpus + "/mini_train.trace");
  auto frames = frame_offsets(data);
  ASSERT_GT(frames.size(), 20u);
  auto hit = data;
  hit[frames[frames.size() / 2]] = 0;  // one type byte in the middle
  std::string path = RawTrace::dir() + "/zero-mid.trace";
  write_file(path, hit.data(), hit.size());
  EXPECT_THROW(run_pipeline(path, nullptr), CorruptTraceError);
  for (const char* cmd :
       {"check --max-leaked 1TiB", "check --max-leaked 1TiB --allow-truncated", "summary", "summary --json"}) {
    auto r = run_cli(kCli + " " + cmd + " " + path);
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("damaged trace: a zero type byte at byte offset " + std::to_string(frames[frames.size() / 2])),
              std::string::npos)
        << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.out.find("ok"), std::string::npos) << r.out;
  }
  // The same byte zeroed with only zeros after it (the preload's unwritten space, its frame
  // copied but for the type byte) stays a trace without an end record, exit 1 for check.
  auto tail = std::vector<unsigned char>(data.begin(),
                                         data.begin() + static_cast<long>(frames[frames.size() / 2] + 30));
  tail[frames[frames.size() / 2]] = 0;
  tail.resize(tail.size() + 3 * kMiB, 0);
  write_file(path, tail.data(), tail.size());
  auto r = run_cli(kCli + " check --max-leaked 1TiB " + path);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("the rest is space it never wrote"), std::string::npos) << r.err;
  // Zeros for longer than any record end the data: what follows them is not looked at.
  std::vector<unsigned char> far(data.begin(), data.begin() + static_cast<long>(frames[5]));
  far.resize(far.size() + TraceReader::kZeroRun + 8, 0);
  far.insert(far.end(), data.begin() + static_cast<long>(frames[5]), data.end());
  write_file(path, far.data(), far.size());
  auto fr = run_pipeline(path, nullptr);
  EXPECT_EQ(fr.records, 5u);
  EXPECT_TRUE(fr.truncated);
}

TEST(Round2, ZstdStreamCutShortIsReportedAsCut) {
  // Two frames, the first ending at a record boundary (as a streaming writer flushes), the
  // second cut inside its only block: what decompresses ends exactly after a whole record,
  // so only the stream itself tells that the file is cut.
  auto t = sample_trace(2000);
  auto frames = frame_offsets(t.bytes);
  const std::size_t split = frames[frames.size() / 2];
  std::vector<unsigned char> z(ZSTD_compressBound(t.bytes.size()) + 64);
  std::size_t n1 = ZSTD_compress(z.data(), z.size(), t.bytes.data(), split, 3);
  std::size_t n2 = ZSTD_compress(z.data() + n1, z.size() - n1, t.bytes.data() + split, t.bytes.size() - split, 3);
  ASSERT_FALSE(ZSTD_isError(n1) || ZSTD_isError(n2));
  std::string path = RawTrace::dir() + "/zcut.trace";
  write_file(path, z.data(), n1 + n2 / 2);
  TraceReader rd(path);
  format::Record rec;
  std::uint64_t n = 0;
  while (rd.next(rec)) ++n;
  EXPECT_EQ(n, frames.size() / 2);
  EXPECT_TRUE(rd.cut_mid_record());
  auto r = run_cli(kCli + " summary --json " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["trace"]["cut_mid_record"], true);
  EXPECT_NE(r.err.find("cut mid-record"), std::string::npos) << r.err;
  // Cut inside the first frame's only block: nothing decompresses, and the message says why.
  write_file(path, z.data(), n1 / 2);
  r = run_cli(kCli + " summary " + path);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("is cut short"), std::string::npos) << r.err;
}

// A reader whose constructor throws (empty file, bad magic, newer version) closes its file:
// found by fuzz_model running out of descriptors after ~250,000 refused inputs.
TEST(Round2, RefusedTraceLeavesNoDescriptorOpen) {
  auto open_fds = [] {
    int n = 0;
    for (int fd = 0; fd < 65536; ++fd) n += ::fcntl(fd, F_GETFD) != -1;
    return n;
  };
  std::string empty = RawTrace::dir() + "/fd-empty.trace", junk = RawTrace::dir() + "/fd-junk.trace";
  write_file(empty, nullptr, 0);
  const unsigned char bad[20] = {'N', 'O', 'T', 'A', 'T', 'R', 'A', 'C', 'E'};
  write_file(junk, bad, sizeof bad);
  int before = open_fds();
  for (int i = 0; i < 200; ++i) {
    EXPECT_THROW(TraceReader{empty}, EmptyTraceError);
    EXPECT_THROW(TraceReader{junk}, NotATraceError);
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(Round2, EmptyFileIsRefusedByEveryCommand) {
  std::string empty = RawTrace::dir() + "/empty.trace";
  write_file(empty, nullptr, 0);
  std::string good = sample_trace(3).write("empty-good.trace");
  for (const std::string& cmd : {"summary " + empty, "summary --json " + empty, "dump " + empty,
                                 "check --max-leaked 1TiB " + empty, "diff " + good + " " + empty}) {
    auto r = run_cli(kCli + " " + cmd);
    EXPECT_EQ(r.status, 2) << cmd;
    EXPECT_NE(r.err.find(empty + ": not a gpuheap trace (empty file)"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("ok"), std::string::npos) << r.out;
  }
}

TEST(Round2, WriteErrorsOnStdoutExit2) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  std::string good = sample_trace(3).write("full-good.trace");
  for (const std::string& cmd : {"summary --json " + good, "summary " + good, "dump " + good,
                                 "check --max-leaked 0 " + good, "diff " + good + " " + good}) {
    auto r = run_cli("sh -c '" + kCli + " " + cmd + " >/dev/full'", 60);
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("cannot write the output"), std::string::npos) << cmd << ": " << r.err;
  }
  auto ok = run_cli(kCli + " summary --json " + good + " >/dev/null");
  EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST(Round2, NonFiniteNumbersAreRefused) {
  std::string good = sample_trace(3).write("nan-good.trace");
  auto base = run_cli(kCli + " summary --json " + good);
  ASSERT_EQ(base.status, 0);
  std::string bpath = RawTrace::dir() + "/nan-base.json";
  write_file(bpath, reinterpret_cast<const unsigned char*>(base.out.data()), base.out.size());
  for (const char* v : {"nan", "NaN", "inf", "-inf", "infinity", "1e999", "-1", "5x", ""}) {
    auto r = run_cli(kCli + " check --baseline " + bpath + " --tolerance '" + v + "' " + good);
    EXPECT_EQ(r.status, 2) << v << ": " << r.out << r.err;
    EXPECT_EQ(r.out.find("ok"), std::string::npos) << v << ": " << r.out;
    auto d = run_cli(kCli + " summary --debuginfod-timeout '" + v + "' " + good);
    EXPECT_EQ(d.status, 2) << v;
  }
  // The other number options: sizes, counts, the device.
  for (std::string opt :
       {"check --max-leaked", "check --max-requested", "summary --top", "summary --device", "diff --top"}) {
    for (const char* v : {"nan", "inf", "1e999"}) {
      std::string args = opt.starts_with("diff") ? good + " " + good : good;
      auto r = run_cli(kCli + " " + opt + " " + v + " " + args);
      EXPECT_EQ(r.status, 2) << opt << " " << v << ": " << r.out << r.err;
    }
  }
  for (const char* v : {"0", "5", "12.5"}) {
    EXPECT_EQ(run_cli(kCli + " check --baseline " + bpath + " --tolerance " + v + " " + good).status, 0) << v;
  }
}

}  // namespace
}  // namespace gpuheap::test
