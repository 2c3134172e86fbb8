// Damaged traces through the analyzer: every truncation offset of real traces and random
// byte flips (fixed seed). The analyzer must answer each with a report (truncation noted)
// or a clean InputError with a one-line message: no crash, no hang, no other exception.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "analyzer/base/error.h"
#include "analyzer/replay/replay.h"
#include "format/decode.h"
#include "format/trace.h"
#include "tests/fuzz/hostile.h"
#include "tests/fuzz/pipeline.h"

namespace gpuheap::test {
namespace {

const std::string kCorpus = GPUHEAP_FUZZ_CORPUS;

struct Sink {
  std::FILE* f = std::fopen("/dev/null", "w");
  ~Sink() { std::fclose(f); }
};

// Every prefix of a real trace that holds its process record is readable: a report of the
// whole records before the cut. A shorter prefix (no header, or a header without a whole
// process record) is not a trace, and is refused as such (NotATraceError).
void check_all_prefixes(const std::string& name) {
  auto data = read_file(kCorpus + "/" + name);
  ASSERT_GT(data.size(), 100u);
  auto full = run_pipeline(kCorpus + "/" + name, nullptr);
  EXPECT_FALSE(full.truncated) << name << " is a complete trace";
  Sink sink;
  bool compressed = name.ends_with(".zst");
  std::string path = RawTrace::dir() + "/prefix-" + name;
  std::uint64_t last_records = 0;
  std::size_t process_end = 0;  // plain traces: where the process record ends
  if (!compressed) {
    format::Record first;
    std::size_t len = 0;
    ASSERT_EQ(format::decode_frame(data.data() + format::kFileHeaderSize, data.size() - format::kFileHeaderSize, first,
                                   &len),
              format::FrameStatus::ok);
    ASSERT_EQ(first.type, format::RecordType::process);
    process_end = format::kFileHeaderSize + len;
  }
  bool readable_seen = false;
  double worst = 0;
  for (std::size_t n = 0; n < data.size(); ++n) {
    write_file(path, data.data(), n);
    auto t0 = std::chrono::steady_clock::now();
    PipelineResult r;
    try {
      r = run_pipeline(path, sink.f);
    } catch (const NotATraceError& e) {
      // Refused: only while the prefix holds no whole process record (for zstd: until its
      // first block with the process record decompresses), never after a readable prefix.
      EXPECT_FALSE(readable_seen) << name << " cut at " << n << ": " << e.what();
      if (!compressed) {
        EXPECT_LT(n, process_end) << name << " cut at " << n << ": " << e.what();
      }
      continue;
    } catch (const std::exception& e) {
      FAIL() << name << " cut at " << n << ": " << e.what();
    }
    if (!compressed) {
      EXPECT_GE(n, process_end) << name << " cut at " << n << " is read though it has no process";
    }
    readable_seen = true;
    worst = std::max(worst, seconds_since(t0));
    // (A zstd file cut in its trailing checksum still yields every record: not truncated.)
    if (n > 0 && !(compressed && r.records == full.records)) {
      EXPECT_TRUE(r.truncated) << name << " cut at " << n;
    }
    EXPECT_GE(r.records, last_records) << "records lost when cutting later, at " << n;
    EXPECT_LE(r.records, full.records);
    EXPECT_GT(r.json_bytes, 0u);
    last_records = r.records;
  }
  EXPECT_TRUE(readable_seen) << name;
  EXPECT_LT(worst, 2.0) << "slowest prefix took " << worst << " s";
}

TEST(BadInput, EveryTruncationOfAPlainTrace) { check_all_prefixes("mini_train.trace"); }
TEST(BadInput, EveryTruncationOfAPoolOomTrace) { check_all_prefixes("prog_limit.trace"); }
TEST(BadInput, EveryTruncationOfACompressedTrace) { check_all_prefixes("prog_api.trace.zst"); }
// mini_train.trace with its events in compact records (format version 5, what the preload writes).
TEST(BadInput, EveryTruncationOfACompactTrace) { check_all_prefixes("mini_train_compact.trace"); }
// The same with its events in event blocks (format version 7: `zstd -d` of what `gpuheap
// compress` writes): a cut inside a block reads as cut before it.
TEST(BadInput, EveryTruncationOfABlockTrace) { check_all_prefixes("mini_train_blocks.trace"); }

// Random damage: flipped bits, random bytes, small and large clusters, plus cuts.
TEST(BadInput, RandomByteFlipsFixedSeed) {
  const char* seeds[] = {"mini_train.trace",   "prog_misuse.trace",        "prog_driver.trace",
                         "prog_api.trace.zst", "mini_train_compact.trace", "mini_train_blocks.trace"};
  const int iterations = scale_small() ? 3000 : 20000;
  std::mt19937_64 rng(0x6770756865617021ull);
  Sink sink;
  std::string path = RawTrace::dir() + "/flipped.trace";
  int reports = 0, errors = 0;
  double worst = 0;
  for (int it = 0; it < iterations; ++it) {
    auto data = read_file(kCorpus + "/" + seeds[it % 6]);
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      auto at = rng() % data.size();
      if (rng() % 2) data[at] ^= static_cast<unsigned char>(1u << (rng() % 8));
      else data[at] = static_cast<unsigned char>(rng());
    }
    if (rng() % 8 == 0) data.resize(rng() % data.size());
    write_file(path, data.data(), data.size());
    auto t0 = std::chrono::steady_clock::now();
    try {
      run_pipeline(path, sink.f);
      ++reports;
    } catch (const InputError& e) {
      ++errors;
      std::string msg = e.what();
      EXPECT_FALSE(msg.empty());
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "iteration " << it << ": " << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << it << ": not an InputError: " << e.what();
      write_file(RawTrace::dir() + "/failing-" + std::to_string(it), data.data(), data.size());
    }
    worst = std::max(worst, seconds_since(t0));
  }
  EXPECT_LT(worst, 2.0);
  // Both outcomes must occur, or the damage is not reaching the decoder.
  EXPECT_GT(reports, iterations / 20);
  EXPECT_GT(errors, iterations / 20);
  std::printf("%d iterations: %d reports, %d clean errors, slowest %.3f s\n", iterations, reports, errors, worst);
}

// Damaged size fields in the corpus's real traces, through `replay` under every policy: each
// pooled or pass-through allocation record in turn gets a requested size near 2^64 (the
// policies' roundings wrapped: torch threw "the torch model does not know a block it handed
// out", a logic_error) or at 2^63. The answer is an InputError naming the record and the size.
TEST(BadInput, ReplayOfDamagedSizesInTheCorpus) {
  const char* seeds[] = {"mini_train.trace", "prog_api.trace", "prog_reuse.trace", "prog_misuse.trace",
                         "prog_driver.trace"};
  const std::uint64_t sizes[] = {~0ull, ~0ull - 511, ~0ull - (2ull << 20) + 2, 1ull << 63};
  std::string path = RawTrace::dir() + "/huge-size.trace";
  int refused = 0;
  for (const char* name : seeds) {
    auto data = read_file(kCorpus + "/" + name);
    // The offsets of the requested fields of the first 12 pooled/pass-through allocations
    // (in frames of their own; the ones inside batch frames are left alone).
    std::vector<std::size_t> at;
    for (std::size_t off = format::kFileHeaderSize; off < data.size() && at.size() < 12;) {
      format::Record r;
      std::size_t len = 0;
      if (format::decode_frame(data.data() + off, data.size() - off, r, &len) != format::FrameStatus::ok) break;
      if (r.type == format::RecordType::alloc &&
          (r.alloc.kind == format::AllocKind::device_pooled || r.alloc.kind == format::AllocKind::device_passthrough))
        at.push_back(off + format::kFrameHeaderSize + 24);  // after ts, tid, device, kind, flags, ptr
      off += len;
    }
    for (std::size_t i = 0; i < at.size(); ++i) {
      auto bad = data;
      std::uint64_t n = sizes[i % 4];
      std::memcpy(bad.data() + at[i], &n, 8);
      write_file(path, bad.data(), bad.size());
      for (const char* policy : {"gpuheap", "torch", "none"}) {
        ReplayOptions o;
        o.policy = parse_policy(policy);
        try {
          replay_trace(path, o);
          ADD_FAILURE() << name << " alloc " << i << " of " << n << " under " << policy << ": replayed";
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("an allocation of " + std::to_string(n) + " bytes"), std::string::npos)
              << name << " under " << policy << ": " << e.what();
          ++refused;
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << " alloc " << i << " of " << n << " under " << policy << ": " << e.what();
        }
      }
    }
  }
  EXPECT_GE(refused, 3 * 12 * 3) << "too few allocation records reached";
}

// The same answers through the CLI binary: exit 0 + a warning for a cut file, exit 2 and
// one line on stderr for garbage and for a file cut before its process record.
TEST(BadInputCli, TruncatedTraceIsReportedWithAWarning) {
  auto data = read_file(kCorpus + "/mini_train.trace");
  for (std::size_t cut :
       {std::size_t{0}, std::size_t{5}, std::size_t{16}, std::size_t{21}, data.size() / 2, data.size() - 1}) {
    std::string path = RawTrace::dir() + "/cli-cut-" + std::to_string(cut) + ".trace";
    write_file(path, data.data(), cut);
    const bool whole_process = cut > 100;  // mini_train's process record ends well before
    for (const char* cmd : {"summary", "summary --json", "dump", "check --max-leaked 0 --max-reserved 1B"}) {
      auto r = run_cli(std::string(GPUHEAP_CLI) + " " + cmd + " " + path);
      const bool check = std::string(cmd).starts_with("check");
      if (!whole_process) {
        EXPECT_EQ(r.status, 2) << cmd << " cut " << cut << ": " << r.err;
        EXPECT_NE(r.err.find(path + ": not a gpuheap trace"), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_EQ(r.out.find("ok"), std::string::npos) << r.out;
        continue;
      }
      EXPECT_EQ(r.status, check ? 1 : 0) << cmd << " cut " << cut << ": " << r.err;
      if (check) {
        EXPECT_NE(r.out.find("is incomplete"), std::string::npos) << r.out;
      }
      if (std::string(cmd) != "dump") {
        EXPECT_NE(r.err.find("no end record"), std::string::npos) << r.err;
      }
    }
  }
}

TEST(BadInputCli, GarbageIsACleanOneLineError) {
  auto data = read_file(kCorpus + "/mini_train.trace");
  struct Case {
    std::string name;
    std::vector<unsigned char> bytes;
    std::string expect;
  };
  std::vector<Case> cases;
  auto bad_type = data;
  bad_type[16] = 0xEE;  // first frame's type
  cases.push_back({"bad-type", bad_type, "corrupt record"});
  auto bad_len = data;
  bad_len[17] = bad_len[18] = bad_len[19] = bad_len[20] = 0xFF;  // first frame's length
  cases.push_back({"bad-len", bad_len, "corrupt record"});
  auto bad_magic = data;
  bad_magic[0] = 'X';
  cases.push_back({"bad-magic", bad_magic, "not a gpuheap trace"});
  auto newer = data;
  newer[8] = 0x7F;
  cases.push_back({"newer", newer, "newer than this gpuheap"});
  for (const auto& c : cases) {
    std::string path = RawTrace::dir() + "/cli-" + c.name + ".trace";
    write_file(path, c.bytes.data(), c.bytes.size());
    for (const char* cmd : {"summary", "summary --json", "check --max-leaked 0", "dump"}) {
      auto r = run_cli(std::string(GPUHEAP_CLI) + " " + cmd + " " + path);
      EXPECT_EQ(r.status, 2) << c.name << " " << cmd;
      EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.name << " " << cmd << ": " << r.err;
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    }
  }
  auto r = run_cli(std::string(GPUHEAP_CLI) + " summary /dev/null/nope");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
  r = run_cli(std::string(GPUHEAP_CLI) + " summary " + RawTrace::dir());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace gpuheap::test
