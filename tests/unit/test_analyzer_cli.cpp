// The gpuheap binary end to end: exit codes, messages, truncated/corrupt input, zstd, run.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "analyzer/base/error.h"
#include "analyzer/trace/reader.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr std::uint64_t MiB = 1u << 20;

Result sh(const std::string& args) { return run(std::string(GPUHEAP_CLI) + " " + args); }

TraceBuilder sample() {
  TraceBuilder b;
  b.stack(1, {0x401000, 0x402000});
  b.put(format::ThreadRecord{1, "main"});
  b.segment(0x7f0000000000ull, 2 * MiB, true);
  b.alloc(0x7f0000000000ull, 1000, 1024, 1, AllocKind::device_pooled, format::kFlagSmallPool);
  b.alloc(0x7f0000000000ull + 1024, 1000, 1024, 1, AllocKind::device_pooled, format::kFlagSmallPool);
  b.free(0x7f0000000000ull);
  b.completed(0x7f0000000000ull);
  b.alloc(0x9000000, 4096, 4096, 1, AllocKind::async);
  b.end();
  return b;
}

}  // namespace

TEST(Cli, SummaryAndDumpOnAGoodTrace) {
  auto path = sample().write("cli_good.gh");
  auto s = sh("summary " + path);
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("gpuheap memory summary, device ID 0 (Test GPU)"), std::string::npos) << s.out;
  auto j = sh("summary --json " + path);
  EXPECT_EQ(j.code, 0);
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["devices"][0]["allocated_bytes"]["peak"], 2048);
  auto d = sh("dump " + path);
  EXPECT_EQ(d.code, 0);
  EXPECT_NE(d.out.find("alloc ts="), std::string::npos);
  EXPECT_NE(d.out.find("kind=pooled ptr=0x7f0000000000 requested=1000 size=1024"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("stack id=1 depth=2 ips=0x401000,0x402000"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("process pid=100"), std::string::npos);
  EXPECT_NE(d.out.find("end ts="), std::string::npos);
  EXPECT_EQ(d.out.find("# truncated"), std::string::npos);
}

TEST(Cli, BadInputExitsTwoWithOneLine) {
  std::string dir = TraceBuilder::dir();
  std::ofstream(dir + "/text.txt") << "hello, this is not a trace at all\n";
  auto r = sh("summary " + dir + "/text.txt");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("not a gpuheap trace"), std::string::npos) << r.out;

  auto b = sample();
  b.data[8] = static_cast<unsigned char>(format::kFormatVersion + 1);
  r = sh("summary " + b.write("newer.gh"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("newer"), std::string::npos) << r.out;

  r = sh("summary " + dir + "/does-not-exist.gh");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot open"), std::string::npos) << r.out;

  // Corrupt: an unknown record type after the process record; the message names its offset.
  auto c = sample();
  TraceBuilder probe;  // same prefix: header + process + device
  std::size_t off = probe.data.size();
  c.data[off] = 0xEE;
  r = sh("summary " + c.write("corrupt.gh"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("byte offset " + std::to_string(off)), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  auto read_all = [](const std::string& p) {
    TraceReader rd(p);
    format::Record rec;
    while (rd.next(rec)) {
    }
  };
  EXPECT_THROW(read_all(c.write("corrupt2.gh")), CorruptTraceError);
  EXPECT_NO_THROW(read_all(sample().write("clean.gh")));
  r = sh("dump " + c.write("corrupt3.gh"));
  EXPECT_EQ(r.code, 2);
}

// Every cut after the process record is a truncated trace; every cut before its end is not
// a trace at all (nothing says what process it was), which every command refuses.
TEST(Cli, EveryCutOffsetIsReadableAsTruncated) {
  auto b = sample();
  AnalyzeOptions o;
  o.progress = false;
  o.warn_truncated = false;
  std::size_t full = b.data.size();
  format::Record first;
  std::size_t process_len = 0;
  ASSERT_EQ(format::decode_frame(b.data.data() + format::kFileHeaderSize, full - format::kFileHeaderSize, first,
                                 &process_len),
            format::FrameStatus::ok);
  ASSERT_EQ(first.type, format::RecordType::process);
  const std::size_t process_end = format::kFileHeaderSize + process_len;
  for (std::size_t cut = 0; cut < full; ++cut) {
    TraceBuilder t = b;
    t.data.resize(cut);
    Analysis a;
    if (cut < process_end) {
      EXPECT_THROW(a = analyze({t.write("cut.gh")}, o), NotATraceError) << cut;
      continue;
    }
    ASSERT_NO_THROW(a = analyze({t.write("cut.gh")}, o)) << cut;
    EXPECT_TRUE(a.traces[0]->info.truncated) << cut;
  }
  // Through the binary at a few offsets: exit 0 with a warning; cut mid-record vs no end.
  TraceBuilder mid = b;
  mid.data.resize(full - 3);  // inside the end record
  auto r = sh("summary " + mid.write("cut_mid.gh"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cut mid-record"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("truncated: yes"), std::string::npos) << r.out;
  TraceBuilder whole = b;
  whole.data.resize(full - (format::kFrameHeaderSize + 17));  // whole records, no end
  r = sh("summary --json " + whole.write("cut_noend.gh"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no end record"), std::string::npos) << r.out;
  auto js = r.out.substr(r.out.find('{'));
  auto doc = nlohmann::json::parse(js);
  EXPECT_EQ(doc["trace"]["truncated"], true);
  EXPECT_EQ(doc["trace"]["cut_mid_record"], false);
  EXPECT_EQ(doc["trace"]["has_end"], false);
  auto d = sh("dump " + mid.write("cut_mid2.gh"));
  EXPECT_EQ(d.code, 0);
  EXPECT_NE(d.out.find("# truncated: file cut mid-record at byte offset"), std::string::npos) << d.out;
}

// A killed (or still running) process's trace: whole records, then the preload's
// preallocated space it never wrote, zeros except perhaps one record copied but for its type
// byte (stored last). That is "no end record", not a cut, and every whole record is used.
TEST(Cli, UnwrittenZeroTailIsNotACut) {
  auto b = sample();
  const std::size_t full = b.data.size();
  const std::size_t whole = full - (format::kFrameHeaderSize + 17);  // without the end record
  for (bool in_flight : {false, true}) {
    TraceBuilder t = b;
    t.data.resize(whole);
    std::vector<unsigned char> tail(b.data.begin() + static_cast<long>(whole), b.data.end());
    if (!in_flight) std::fill(tail.begin(), tail.end(), 0);
    tail[0] = 0;  // the end record copied but its type byte not yet stored
    t.data.insert(t.data.end(), tail.begin(), tail.end());
    t.data.resize(t.data.size() + 8192, 0);
    std::string name = in_flight ? "tail_inflight.gh" : "tail_zero.gh";
    TraceReader rd(t.write(name));
    format::Record rec;
    std::uint64_t n = 0;
    while (rd.next(rec)) ++n;
    EXPECT_TRUE(rd.unwritten_tail());
    EXPECT_FALSE(rd.cut_mid_record());
    EXPECT_FALSE(rd.has_end());
    EXPECT_EQ(rd.offset(), whole);
    auto r = sh("summary --json " + t.write(name));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("the rest is space it never wrote"), std::string::npos) << r.out;
    auto doc = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(doc["trace"]["cut_mid_record"], false);
    EXPECT_EQ(doc["trace"]["has_end"], false);
    EXPECT_EQ(doc["trace"]["records"].get<std::uint64_t>(), n);
    auto d = sh("dump " + t.write(name));
    EXPECT_NE(d.out.find("# data ends at byte offset " + std::to_string(whole)), std::string::npos) << d.out;
  }
}

TEST(Cli, ZstdCompressedTraceReadsTheSame) {
  auto b = sample();
  std::vector<unsigned char> z(ZSTD_compressBound(b.data.size()));
  z.resize(ZSTD_compress(z.data(), z.size(), b.data.data(), b.data.size(), 3));
  std::string path = TraceBuilder::dir() + "/sample.gh.zst";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(z.data()), static_cast<std::streamsize>(z.size()));
  auto plain = sh("summary --json " + b.write("sample_plain.gh"));
  auto comp = sh("summary --json " + path);
  ASSERT_EQ(comp.code, 0) << comp.out;
  auto a = nlohmann::json::parse(plain.out), c = nlohmann::json::parse(comp.out);
  EXPECT_EQ(a["devices"], c["devices"]);
  EXPECT_EQ(a["leaks"], c["leaks"]);
  // A compressed stream cut short is a truncated trace, not an error, when what it still
  // holds is a trace: two frames (as a streaming writer flushes them), the second cut.
  const std::size_t half = b.data.size() / 2;
  std::vector<unsigned char> z2(ZSTD_compressBound(b.data.size()) + 64);
  std::size_t n1 = ZSTD_compress(z2.data(), z2.size(), b.data.data(), half, 3);
  std::size_t n2 = ZSTD_compress(z2.data() + n1, z2.size() - n1, b.data.data() + half, b.data.size() - half, 3);
  std::ofstream(path + ".cut", std::ios::binary)
      .write(reinterpret_cast<const char*>(z2.data()), static_cast<std::streamsize>(n1 + n2 - 7));
  auto cut = sh("summary " + path + ".cut");
  EXPECT_EQ(cut.code, 0) << cut.out;
  EXPECT_NE(cut.out.find("truncated: yes"), std::string::npos);
  // Cut inside its first block: nothing decompresses, so it is not a trace (exit 2, one line).
  std::ofstream(path + ".cut1", std::ios::binary)
      .write(reinterpret_cast<const char*>(z.data()), static_cast<std::streamsize>(z.size() - 7));
  auto cut1 = sh("summary " + path + ".cut1");
  EXPECT_EQ(cut1.code, 2) << cut1.out;
  EXPECT_NE(cut1.out.find("not a gpuheap trace (its zstd stream"), std::string::npos) << cut1.out;
}

TEST(Cli, CheckExitCodes) {
  auto path = sample().write("cli_check.gh");
  EXPECT_EQ(sh("check " + path + " --max-allocated 2KiB").code, 0);
  auto r = sh("check " + path + " --max-allocated 2047B");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("FAIL: peak allocated bytes"), std::string::npos) << r.out;
  EXPECT_EQ(sh("check " + path + " --max-leaked 5KiB --max-reserved 2MiB --max-requested 2000B").code, 0);
  // Leaks gate on requested bytes (1000 + 4096), not the blocks (1024 + 4096).
  EXPECT_EQ(sh("check " + path + " --max-leaked 5096B").code, 0);
  EXPECT_EQ(sh("check " + path + " --max-leaked 5095B").code, 1);
  EXPECT_EQ(sh("check " + path + " --max-reserved 2MB").code, 1);  // 2,000,000 < 2 MiB
  EXPECT_EQ(sh("check " + path + " --max-requested 1999B").code, 1);
  EXPECT_EQ(sh("check " + path + " --max-allocated 12QB").code, 2);
  EXPECT_EQ(sh("check " + path).code, 2);  // no limit given
  EXPECT_EQ(sh("check /nonexistent.gh --max-allocated 1B").code, 2);
  auto base = TraceBuilder::dir() + "/cli_base.json";
  ASSERT_EQ(std::system((std::string(GPUHEAP_CLI) + " summary --json " + path + " > " + base).c_str()), 0);
  EXPECT_EQ(sh("check " + path + " --baseline " + base).code, 0);
  EXPECT_EQ(sh("check " + path + " --baseline " + base + " --tolerance 0").code, 0);
  EXPECT_EQ(sh("check " + path + " --baseline /nonexistent.json").code, 2);
}

// A job that crashed before writing anything (or a wrong path) must not turn CI green.
// One size rule for the CLI and GPUHEAP_LIMIT (issue 35): a bare number is refused with a
// message saying how to write it, --help says the rule, and a count of 0 reads as one.
TEST(Cli, SizesNeedAUnitAndCountsSayTheirRange) {
  auto path = sample().write("cli_sizes.gh");
  auto r = sh("check --max-reserved 8 " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("size '8' has no unit: write 8B for bytes"), std::string::npos) << r.out;
  for (const char* cmd :
       {"replay --limit 300 ", "replay --sweep all --limits 1GiB,300 ", "diff --tolerance-bytes 5 "}) {
    r = sh(cmd + path + (std::string(cmd).starts_with("diff") ? " " + path : ""));
    EXPECT_EQ(r.code, 2) << cmd << r.out;
    EXPECT_NE(r.out.find("has no unit"), std::string::npos) << cmd << r.out;
  }
  for (const char* cmd : {"check --help", "replay --help", "diff --help"})
    EXPECT_NE(sh(cmd).out.find("SIZE: a number with a unit, as in GPUHEAP_LIMIT"), std::string::npos) << cmd;
  for (const char* opt : {"--top", "--depth"}) {
    r = sh(std::string("summary ") + opt + " 0 " + path);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(std::string(opt) + ": needs a whole number from 1 to 1000000, not '0'"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("not in range"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sh("check --max-reserved 0 --max-leaked 8B " + path).code, 1);  // bare 0 is 0
}

TEST(Cli, WhatIsNotATraceIsRefusedByEveryCommand) {
  const std::string dir = TraceBuilder::dir();
  auto write_bytes = [&](const std::string& name, const std::vector<unsigned char>& bytes) {
    std::string p = dir + "/" + name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  };
  TraceBuilder b;  // header, process, device records
  std::vector<unsigned char> header(b.data.begin(), b.data.begin() + format::kFileHeaderSize);
  std::vector<unsigned char> no_process = header;
  {
    unsigned char buf[256];
    auto n = format::encode(buf, sizeof buf, format::DeviceRecord{0, 1ull << 30, "GPU"});
    no_process.insert(no_process.end(), buf, buf + n);
  }
  std::vector<unsigned char> cut_process(b.data.begin(), b.data.begin() + format::kFileHeaderSize + 5);
  const std::pair<const char*, std::vector<unsigned char>> cases[] = {
      {"empty.gh", {}},
      {"four.gh", {'G', 'P', 'U', 'H'}},
      {"header_only.gh", header},
      {"header_zero_tail.gh",
       [&] {
         auto v = header;
         v.resize(v.size() + 4096, 0);
         return v;
       }()},
      {"no_process.gh", no_process},
      {"cut_process.gh", cut_process},
  };
  for (const auto& [name, bytes] : cases) {
    auto p = write_bytes(name, bytes);
    for (const std::string& cmd :
         std::vector<std::string>{"check --max-leaked 0 --max-reserved 1B ", "check --allow-truncated --max-leaked 0 ",
                                  "summary ", "summary --json ", "dump ", "diff " + p + " "}) {
      auto r = sh(cmd + p);
      EXPECT_EQ(r.code, 2) << cmd << name << "\n" << r.out;
      EXPECT_NE(r.out.find(p + ": not a gpuheap trace"), std::string::npos) << cmd << name << "\n" << r.out;
      EXPECT_EQ(r.out.find("ok"), std::string::npos) << cmd << name << "\n" << r.out;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << cmd << name << "\n" << r.out;
    }
  }
}

// A trace without an end record (killed, or still running): summary reads it, check fails it
// unless --allow-truncated, and then says what it accepted.
TEST(Cli, CheckFailsAnIncompleteTraceUnlessAllowed) {
  auto b = sample();
  TraceBuilder noend = b;
  noend.data.resize(b.data.size() - (format::kFrameHeaderSize + 17));
  auto path = noend.write("check_noend.gh");
  auto s = sh("summary " + path);
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("truncated: yes"), std::string::npos) << s.out;
  auto r = sh("check --max-leaked 1GiB --max-reserved 1GiB " + path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL: " + path + " is incomplete (no end record"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ok:"), std::string::npos) << r.out;
  r = sh("check --allow-truncated --max-leaked 1GiB --max-reserved 1GiB " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: " + path + " is incomplete"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok: "), std::string::npos) << r.out;
  // A limit that does not hold still fails with --allow-truncated.
  EXPECT_EQ(sh("check --allow-truncated --max-leaked 1B " + path).code, 1);
  // The whole trace passes without the flag.
  EXPECT_EQ(sh("check --max-leaked 1GiB " + b.write("check_whole.gh")).code, 0);
}

TEST(Cli, Diff) {
  auto a = sample().write("cli_da.gh");
  TraceBuilder b2;
  b2.stack(1, {0x401000, 0x402000});
  b2.alloc(0x1000000, 8 * MiB, 8 * MiB, 1, AllocKind::device_passthrough);
  b2.end();
  auto r = sh("diff " + a + " " + b2.write("cli_db.gh"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("#1  peak +"), std::string::npos) << r.out;
}

TEST(Cli, RunPassesExitStatusThrough) {
  std::string cli = GPUHEAP_CLI;
  std::string dir = cli.substr(0, cli.rfind('/'));
  struct stat st {};
  if (::stat((dir + "/libgpuheap.so").c_str(), &st) != 0) GTEST_SKIP() << "libgpuheap.so not built (sanitized build)";
  auto r = sh("run -- sh -c 'exit 3'");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("--framework-pools=keep"), std::string::npos) << r.out;
  r = sh("run --framework-pools=keep -- sh -c 'echo \"$PYTORCH_NO_CUDA_MEMORY_CACHING|$LD_PRELOAD\"'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("|" + dir + "/libgpuheap.so"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--framework-pools=keep"), std::string::npos) << r.out;
  r = sh(
      "run --no-pool --no-stacks --limit 1GiB -o /tmp/x.gh -- sh -c "
      "'echo \"$GPUHEAP_POOL $GPUHEAP_STACKS $GPUHEAP_LIMIT $GPUHEAP_OUTPUT $PYTORCH_NO_CUDA_MEMORY_CACHING\"'");
  EXPECT_NE(r.out.find("0 0 1GiB /tmp/x.gh 1"), std::string::npos) << r.out;
  r = sh("run -- sh -c 'kill -TERM $$'");
  EXPECT_EQ(r.code, 128 + 15) << r.out;
  EXPECT_EQ(sh("run").code, 2);
}

// Issue #17, item 7: every --help line is a whole description at CLI11's default width (30
// columns of names): none is empty or a placeholder, none stops mid-phrase ("...; keep"),
// no parenthesis is left open.
TEST(Cli, HelpTextsAreWholeSentences) {
  const std::set<std::string> dangling = {"and", "or", "of", "the", "to", "with", "a", "an", "for", "by", "in"};
  int checked = 0;
  for (const char* sub :
       {"", "run", "dump", "summary", "check", "diff", "export", "report", "symbolize", "compress", "replay"}) {
    auto r = sh(std::string(sub) + " --help");
    ASSERT_EQ(r.code, 0) << sub << ": " << r.out;
    std::istringstream in(r.out);
    std::string line, name;
    bool in_list = false;
    while (std::getline(in, line)) {
      if (line == "Options:" || line == "Positionals:" || line == "Subcommands:") {
        in_list = true;
        continue;
      }
      if (!in_list || line.size() < 3 || line.compare(0, 2, "  ") != 0) continue;
      if (line[2] == ' ') continue;  // a continuation: read with its name below
      // A name, its description from column 30, or on the next line after a long name.
      // CLI11 pads the name to 30 columns, or breaks the line after a name that fills them.
      bool same_line = line.size() > 30 && line[29] == ' ';
      name = line.substr(2, same_line ? 27 : std::string::npos);
      std::string desc = same_line ? line.substr(30) : "";
      if (desc.empty() && in.peek() == ' ') {
        std::string next;
        std::getline(in, next);
        if (next.size() > 30 && next.compare(0, 30, std::string(30, ' ')) == 0) desc = next.substr(30);
      }
      SCOPED_TRACE(std::string(sub) + " " + name);
      ++checked;
      while (!desc.empty() && desc.back() == ' ') desc.pop_back();
      ASSERT_FALSE(desc.empty()) << line;
      EXPECT_NE(desc, "TRACE...") << "a placeholder, not a description";
      EXPECT_EQ(std::string(",;:-/").find(desc.back()), std::string::npos) << desc;
      EXPECT_EQ(std::count(desc.begin(), desc.end(), '('), std::count(desc.begin(), desc.end(), ')')) << desc;
      std::string last = desc.substr(desc.find_last_of(' ') == std::string::npos ? 0 : desc.find_last_of(' ') + 1);
      EXPECT_EQ(dangling.count(last), 0u) << desc;
      // The last clause after a ';' is more than one word ("off (default): ...; keep" was).
      std::size_t semi = desc.rfind("; ");
      if (semi != std::string::npos) EXPECT_NE(desc.find(' ', semi + 2), std::string::npos) << desc;
    }
  }
  EXPECT_GT(checked, 80);
  // The texts the issue named, in full.
  auto run_help = sh("run --help").out;
  EXPECT_NE(run_help.find("off (default): turn the PyTorch and JAX caching allocators off; keep: leave them on"),
            std::string::npos)
      << run_help;
  EXPECT_NE(run_help.find("Usage: "), std::string::npos);
  EXPECT_NE(run_help.find(" run [OPTIONS] [--] PROGRAM [ARGS...]"), std::string::npos) << run_help;
}

// summary's selection options on a synthetic trace (no symbols: sites by module+offset).
TEST(Cli, SummaryLibraryPidAndDeviceFilters) {
  TraceBuilder b;
  b.module(0x400000, 0x410000, "/opt/x/libnccl.so.2");
  b.module(0x500000, 0x510000, "/opt/x/train");
  b.stack(1, {0x400100, 0x500100});  // NCCL's own buffer, called from the program
  b.stack(2, {0x500200});            // the program's
  b.alloc(0x9000000, 4 * MiB, 4 * MiB, 1, AllocKind::async);
  b.alloc(0xa000000, 1 * MiB, 1 * MiB, 2, AllocKind::async);
  b.end();
  auto path = b.write("cli_filters.gh");
  auto all = sh("summary -q " + path);
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_NE(all.out.find("[NCCL] libnccl.so.2+0xff"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("[train] train+0x1ff"), std::string::npos) << all.out;
  auto nccl = sh("summary -q --library nccl " + path);
  EXPECT_NE(nccl.out.find("[NCCL]"), std::string::npos) << nccl.out;
  EXPECT_EQ(nccl.out.find("[train]"), std::string::npos) << nccl.out;
  auto j = nlohmann::json::parse(
      run("(" + std::string(GPUHEAP_CLI) + " summary -q --json --library TRAIN " + path + " 2>/dev/null)").out);
  ASSERT_EQ(j["leaks"].size(), 1u);
  EXPECT_EQ(j["leaks"][0]["library"], "train");
  EXPECT_EQ(j["leaks"][0]["label"], "train+0x1ff");  // the call: return address - 1
  EXPECT_EQ(j["leaked_bytes"], 5 * MiB);
  EXPECT_EQ(sh("summary -q --pid 100 " + path).code, 0);
  auto pid = sh("summary -q --pid 5 " + path);
  EXPECT_EQ(pid.code, 2);
  EXPECT_NE(pid.out.find("--pid 5: no trace matches (the traces are of pid 100 on testhost (no rank))"),
            std::string::npos)
      << pid.out;
  auto dev = sh("summary -q --device 7 " + path);
  EXPECT_EQ(dev.code, 2);
  EXPECT_NE(dev.out.find("--device 7: no such device in the trace (devices: 0)"), std::string::npos) << dev.out;
  EXPECT_EQ(sh("summary -q --device 0 " + path).code, 0);
}
