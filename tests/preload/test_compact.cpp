// Compact event records (format version 5, format/compact.h): what the preload writes reads
// back to the same events as the fixed-layout records of version 4 and before. The traces of a
// few programs, recorded here, and the same traces rewritten with plain records
// (gpuheap_recode_trace --plain) give the same output in every analyzer command, byte for byte.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <string>
#include <vector>

#include "tests/preload/run_prog.h"

namespace gpuheap::test {
namespace {

std::string replace_all(std::string s, const std::string& what, const std::string& with) {
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size()))
    s.replace(p, what.size(), with);
  return s;
}

long long file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

// The command's stdout, stderr and exit status on `trace`, its path written as TRACE.
std::string output_of(const std::string& cmd, const std::string& trace) {
  CmdRun r = run_cmd(kBuild + "/gpuheap " + cmd + " " + trace + " 2>&1");
  return replace_all(r.out, trace, "TRACE") + "\nexit " + std::to_string(r.status);
}

void expect_same_outputs(const std::string& compact) {
  const std::string plain = compact + ".plain";
  ASSERT_EQ(run_cmd(kBuild + "/gpuheap_recode_trace " + compact + " " + plain + " --plain").status, 0);
  // The preload wrote compact records: the plain rewrite is larger.
  EXPECT_GT(file_size(plain), file_size(compact)) << compact;
  const char* cmds[] = {"summary",
                        "summary --json",
                        "check --max-leaked 0",
                        "dump",
                        "replay -q --json",
                        "replay -q --policy torch --json",
                        "export --format csv -o -",
                        "export --format folded --metric allocated -o -",
                        "export --format torch-snapshot -o -"};
  for (const char* c : cmds) {
    const std::string want = output_of(c, plain);
    EXPECT_GT(want.size(), std::string("\nexit 0").size()) << c << ": some output";
    EXPECT_EQ(output_of(c, compact), want) << c << " on " << compact;
  }
}

TEST(CompactTrace, AnalyzerOutputsMatchThePlainEncoding) {
  struct Prog {
    std::string prog;
    std::vector<std::string> args;
  };
  const Prog progs[] = {
      {"prog_threads", {"4", "300"}},  // threads racing: times out of order between records
      {"prog_reuse", {}},              // reuse, frees of blocks long allocated
      {"prog_api", {}},                // every API family
      {kBuild + "/examples/mini_train", {"40"}},
  };
  for (const Prog& p : progs) {
    ProgRun r = run(p.prog, p.args);
    ASSERT_EQ(r.status, 0) << p.prog << ": " << r.err;
    ASSERT_EQ(r.traces.size(), 1u) << p.prog;
    expect_same_outputs(r.traces[0]);
  }
}

// The header's version of a .zst trace (its decompressed bytes 8-9).
std::string zst_version(const std::string& zst) {
  return run_cmd("zstd -dc '" + zst + "' 2>/dev/null | head -c 10 | od -An -tu2 -j8 | tr -d ' \n'").out;
}

// Event blocks (format version 7): what the preload wrote, compressed by `gpuheap compress`,
// reads as the original in every command; `gpuheap symbolize` of the compressed trace rewrites
// it with blocks still, and it reads as the original symbolized.
TEST(CompactTrace, EventBlocksReadAsTheOriginalAndSymbolizeKeepsThem) {
  ProgRun r = run(kBuild + "/examples/mini_train", {"40"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  const std::string t = r.traces[0], copy = t + ".copy";
  ASSERT_EQ(run_cmd("cp '" + t + "' '" + copy + "'").status, 0);
  CmdRun c = run_cmd(kBuild + "/gpuheap compress --keep " + t + " 2>&1");
  ASSERT_EQ(c.status, 0) << c.out;
  const std::string z = t + ".zst";
  EXPECT_EQ(zst_version(z), "7");
  const char* cmds[] = {"summary",          "summary --json",          "dump", "check --max-leaked 0",
                        "replay -q --json", "export --format csv -o -"};
  for (const char* cmd : cmds) EXPECT_EQ(output_of(cmd, z), output_of(cmd, copy)) << cmd;
  c = run_cmd(kBuild + "/gpuheap symbolize " + z + " 2>&1");
  ASSERT_EQ(c.status, 0) << c.out;
  c = run_cmd(kBuild + "/gpuheap symbolize " + copy + " 2>&1");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(zst_version(z), "7");
  const std::string dump = output_of("dump", copy);
  EXPECT_NE(dump.find("symbol_frames"), std::string::npos) << "symbolize stored nothing: the test shows nothing";
  EXPECT_EQ(output_of("dump", z), dump);
  EXPECT_EQ(output_of("summary --json", z), output_of("summary --json", copy));
}

}  // namespace
}  // namespace gpuheap::test
