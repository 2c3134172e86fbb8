// Post-mortem analysis on another machine (issue 17): `gpuheap symbolize` stores a trace's
// frames where its modules are, `gpuheap compress` makes TRACE.zst, `gpuheap run` does both
// once the program has exited. The program's binary (and with it its debug info) is removed
// before the trace is read again, as on a machine where it never was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/preload/run_prog.h"

namespace {

using gpuheap::test::kBuild;
using gpuheap::test::kProgs;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
void copy_file(const std::string& from, const std::string& to, mode_t mode) {
  std::ofstream(to, std::ios::binary) << slurp(from);
  ::chmod(to.c_str(), mode);
}
struct Cli {
  int status = -1;
  std::string out, err;
};
// gpuheap ARGS with stdout and stderr apart.
Cli cli(const std::string& args, const std::string& dir) {
  std::string err = dir + "/cli.err";
  auto r = gpuheap::test::run_cmd("env -u LD_PRELOAD " + kBuild + "/gpuheap " + args + " 2>" + err);
  return {r.status, r.out, slurp(err)};
}
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The program copied into a directory of its own, run under the preload from there.
struct Recorded {
  std::string bin_dir, bin, trace, dir;
};
Recorded record() {
  Recorded r;
  r.bin_dir = gpuheap::test::make_dir();
  r.bin = r.bin_dir + "/prog_symbols";
  copy_file(kProgs + "/prog_symbols", r.bin, 0755);
  auto run = gpuheap::test::run(r.bin);
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.traces.size(), 1u);
  r.dir = run.dir;
  r.trace = run.traces.empty() ? "" : run.traces[0];
  return r;
}

void expect_names(const std::string& summary) {
  EXPECT_NE(summary.find("alloc_weights"), std::string::npos) << summary;
  EXPECT_NE(summary.find("[inlined] grab"), std::string::npos) << summary;
  EXPECT_NE(summary.find("prog_symbols.cpp:12)"), std::string::npos) << summary;  // SYMBOLS_GRAB_LINE
  EXPECT_EQ(summary.find("prog_symbols+0x"), std::string::npos) << summary;
}

}  // namespace

TEST(PostMortem, SymbolizedTraceKeepsNamesWhereTheBinaryIsGone) {
  auto rec = record();
  ASSERT_FALSE(rec.trace.empty());
  auto s = cli("symbolize " + rec.trace, rec.dir);
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_NE(s.out.find("stored the frames of"), std::string::npos) << s.out;
  auto dump = cli("dump " + rec.trace, rec.dir);
  EXPECT_NE(dump.out.find("symbol_string id=1 text="), std::string::npos);
  EXPECT_NE(dump.out.find("symbol_frames ip="), std::string::npos);
  EXPECT_NE(dump.out.find("text=\"alloc_weights"), std::string::npos);
  // The symbol records come before the end record, which counts them.
  EXPECT_LT(dump.out.rfind("symbol_frames"), dump.out.find("\nend ")) << dump.out;

  // Idempotent: a second run changes no byte.
  std::string before = slurp(rec.trace);
  auto again = cli("symbolize " + rec.trace, rec.dir);
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.out.find("unchanged"), std::string::npos) << again.out;
  EXPECT_EQ(slurp(rec.trace), before);

  // Another machine: the trace moved away, the binary and its debug info gone.
  std::string moved_dir = gpuheap::test::make_dir(), moved = moved_dir + "/moved.trace";
  ASSERT_EQ(::rename(rec.trace.c_str(), moved.c_str()), 0);
  ASSERT_EQ(::unlink(rec.bin.c_str()), 0);
  auto sum = cli("summary " + moved, moved_dir);
  EXPECT_EQ(sum.status, 0) << sum.err;
  expect_names(sum.out);
  EXPECT_EQ(sum.err.find("not on this machine"), std::string::npos) << sum.err;
  auto chk = cli("check --max-leaked 1MiB " + moved, moved_dir);
  EXPECT_EQ(chk.status, 1) << chk.out;
  EXPECT_NE(chk.out.find("grab ("), std::string::npos) << chk.out;
  EXPECT_NE(chk.out.find("prog_symbols.cpp:12)"), std::string::npos) << chk.out;
}

TEST(PostMortem, UnsymbolizedTraceSaysOnceWhichModulesAreMissing) {
  auto rec = record();
  ASSERT_EQ(::unlink(rec.bin.c_str()), 0);
  auto sum = cli("summary " + rec.trace, rec.dir);
  EXPECT_EQ(sum.status, 0) << sum.err;
  EXPECT_NE(sum.out.find("prog_symbols+0x"), std::string::npos) << sum.out;
  EXPECT_EQ(count(sum.err, "\n"), 1u) << sum.err;
  EXPECT_NE(sum.err.find("1 module of the trace is not on this machine: its frames show as module+offset; "
                         "--verbose lists it"),
            std::string::npos)
      << sum.err;
  EXPECT_EQ(sum.err.find(rec.bin), std::string::npos) << sum.err;  // no paths without --verbose
  auto verbose = cli("summary --verbose " + rec.trace, rec.dir);
  EXPECT_NE(verbose.err.find(rec.bin), std::string::npos) << verbose.err;
  // symbolize finds nothing to store for the missing module: nothing changes.
  std::string before = slurp(rec.trace);
  auto s = cli("symbolize " + rec.trace, rec.dir);
  EXPECT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(count(s.err, "not on this machine"), 1u) << s.err;
}

TEST(PostMortem, CompressRoundTripsAndRefuses) {
  auto rec = record();
  ASSERT_EQ(cli("symbolize " + rec.trace, rec.dir).status, 0);
  auto plain = cli("summary --json " + rec.trace, rec.dir);
  std::string bytes = slurp(rec.trace);
  auto c = cli("compress " + rec.trace, rec.dir);
  ASSERT_EQ(c.status, 0) << c.err;
  std::string zst = rec.trace + ".zst";
  EXPECT_FALSE(exists(rec.trace));
  ASSERT_TRUE(exists(zst));
  EXPECT_EQ(slurp(zst).substr(0, 4), std::string("\x28\xB5\x2F\xFD", 4));
  EXPECT_LT(slurp(zst).size(), bytes.size());
  auto z = cli("summary --json " + zst, rec.dir);
  // The same report (but for the trace's name).
  auto strip = [](std::string s, const std::string& name) {
    for (auto at = s.find(name); at != std::string::npos; at = s.find(name)) s.erase(at, name.size());
    return s;
  };
  EXPECT_EQ(strip(strip(z.out, zst), rec.trace), strip(plain.out, rec.trace));
  auto dec = gpuheap::test::run_cmd("zstd -dc " + zst + " 2>/dev/null");
  if (dec.status == 0) {
    // The zstd tool, where installed, gives the trace with its events in event blocks (format
    // version 7), which reads as the original.
    EXPECT_EQ(dec.out.substr(8, 2), std::string("\x07\x00", 2));
    const std::string v7 = rec.dir + "/decompressed.trace";
    std::ofstream(v7, std::ios::binary) << dec.out;
    EXPECT_EQ(strip(cli("summary --json " + v7, rec.dir).out, v7), strip(plain.out, rec.trace));
  }

  // Refusals (exit 2), nothing touched: already compressed; TRACE.zst exists; not a trace.
  EXPECT_EQ(cli("compress " + zst, rec.dir).status, 2);
  std::ofstream(rec.trace, std::ios::binary) << bytes;
  auto exists_refused = cli("compress " + rec.trace, rec.dir);
  EXPECT_EQ(exists_refused.status, 2);
  EXPECT_NE(exists_refused.err.find("--force"), std::string::npos) << exists_refused.err;
  EXPECT_TRUE(exists(rec.trace));
  auto kept = cli("compress -k -f " + rec.trace, rec.dir);
  EXPECT_EQ(kept.status, 0) << kept.err;
  EXPECT_TRUE(exists(rec.trace));  // --keep
  std::string junk = rec.dir + "/junk.trace";
  std::ofstream(junk) << "not a trace at all";
  EXPECT_EQ(cli("compress " + junk, rec.dir).status, 2);
  EXPECT_TRUE(exists(junk));
  EXPECT_FALSE(exists(junk + ".zst"));
  EXPECT_EQ(cli("compress " + rec.dir + "/nonexistent.trace", rec.dir).status, 2);
}

TEST(PostMortem, SymbolizeKeepsZstdAndRefusesTruncated) {
  auto rec = record();
  // A compressed, not yet symbolized trace stays compressed when symbolized.
  ASSERT_EQ(cli("compress -k " + rec.trace, rec.dir).status, 0);
  std::string zst = rec.trace + ".zst";
  auto s = cli("symbolize " + zst, rec.dir);
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(slurp(zst).substr(0, 4), std::string("\x28\xB5\x2F\xFD", 4));
  EXPECT_NE(cli("dump " + zst, rec.dir).out.find("symbol_frames"), std::string::npos);
  std::string z1 = slurp(zst);
  EXPECT_NE(cli("symbolize " + zst, rec.dir).out.find("unchanged"), std::string::npos);
  EXPECT_EQ(slurp(zst), z1);

  // Cut mid-record: refused (exit 2, unchanged) unless --allow-truncated.
  std::string bytes = slurp(rec.trace);
  std::string cut = rec.dir + "/cut.trace";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 30);
  std::string cut_bytes = slurp(cut);
  auto refused = cli("symbolize " + cut, rec.dir);
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.err.find("--allow-truncated"), std::string::npos) << refused.err;
  EXPECT_EQ(slurp(cut), cut_bytes);
  EXPECT_EQ(cli("symbolize " + rec.dir + "/nonexistent.trace", rec.dir).status, 2);
  auto allowed = cli("symbolize --allow-truncated " + cut, rec.dir);
  EXPECT_EQ(allowed.status, 0) << allowed.err;
  ASSERT_EQ(::unlink(rec.bin.c_str()), 0);
  auto sum = cli("summary " + cut, rec.dir);
  EXPECT_NE(sum.out.find("alloc_weights"), std::string::npos) << sum.out;
  // No temporary file is left beside the traces.
  for (const auto& f : gpuheap::test::traces_in(rec.dir)) EXPECT_EQ(f.find("gpuheap-tmp"), std::string::npos) << f;
}

TEST(PostMortem, RunSymbolizesAndCompressesAtExit) {
  std::string bin_dir = gpuheap::test::make_dir(), bin = bin_dir + "/prog_symbols";
  copy_file(kProgs + "/prog_symbols", bin, 0755);
  std::string dir = gpuheap::test::make_dir();
  auto r = cli("run --simulate -o " + dir + "/r.%p.trace -- " + bin, dir);
  ASSERT_EQ(r.status, 0) << r.err;
  auto traces = gpuheap::test::traces_in(dir);
  ASSERT_EQ(traces.size(), 1u);
  const std::string& zst = traces[0];
  EXPECT_EQ(zst.substr(zst.size() - 10), ".trace.zst") << zst;
  EXPECT_NE(r.err.find("trace written to " + zst), std::string::npos) << r.err;
  EXPECT_EQ(slurp(zst).substr(0, 4), std::string("\x28\xB5\x2F\xFD", 4));

  std::string nc = gpuheap::test::make_dir();
  ASSERT_EQ(cli("run --simulate --no-compress -o " + nc + "/r.%p.trace -- " + bin, nc).status, 0);
  auto nct = gpuheap::test::traces_in(nc);
  ASSERT_EQ(nct.size(), 1u);
  EXPECT_EQ(nct[0].substr(nct[0].size() - 6), ".trace");
  EXPECT_NE(cli("dump " + nct[0], nc).out.find("symbol_frames"), std::string::npos);

  std::string raw = gpuheap::test::make_dir();
  ASSERT_EQ(cli("run --simulate --no-compress --no-symbolize -o " + raw + "/r.%p.trace -- " + bin, raw).status, 0);
  auto rawt = gpuheap::test::traces_in(raw);
  ASSERT_EQ(rawt.size(), 1u);
  EXPECT_EQ(cli("dump " + rawt[0], raw).out.find("symbol_"), std::string::npos);

  ASSERT_EQ(::unlink(bin.c_str()), 0);
  auto sum = cli("summary " + zst, dir);
  EXPECT_EQ(sum.status, 0) << sum.err;
  expect_names(sum.out);
}
