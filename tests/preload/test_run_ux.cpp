// `gpuheap run` as memray, heaptrack and nsys behave (issue #17): options stop at the
// program, -o NAME refuses an existing NAME unless --force, the end names the traces and the
// next command, -q prints nothing, GPUHEAP_FOLLOW_FORK=0 traces the started process only,
// and a relative output pattern is resolved once, where the job started.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"

using namespace gpuheap::test;

namespace {

const std::string kFiles = kProgs + "/prog_files";

// Plain LD_PRELOAD on simcuda, from DIR, with extra VAR=VALUE words.
CmdRun preload_in(const std::string& dir, const std::string& env, const std::string& cmd) {
  return run_cmd("cd '" + dir + "' && env -u GPUHEAP_OUTPUT -u GPUHEAP_FOLLOW_FORK_ROOT LD_LIBRARY_PATH=" + kBuild +
                 "/simcuda LD_PRELOAD=" + kBuild + "/libgpuheap.so GPUHEAP_QUIET=1 " + env + " " + cmd + " 2>&1");
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

// Item 1: `gpuheap run --simulate sh -c ... -o x --force` gave -c, -o and --force to run.
TEST(RunUx, OptionsStopAtTheProgram) {
  std::string dir = make_dir();
  CmdRun r = run_in(dir, "sh -c 'echo \"args:$*\"' sh -o x.trace --force -q");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("args:-o x.trace --force -q\n"), std::string::npos) << r.out;
  EXPECT_FALSE(exists(dir + "/x.trace"));
  // After `--` everything is the command, even words that look like run's options.
  r = run_in(dir, "-q -- sh -c 'echo \"args:$*\"' sh --no-pool -o y");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("args:--no-pool -o y\n"), std::string::npos) << r.out;
  // run's own options before the program still apply (-o here names the trace).
  r = run_in(dir, "-q -o mine.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(exists(dir + "/mine.trace.zst")) << r.out;
  // An unknown option before the program is an error, not a program called --bogus.
  r = run_in(dir, "--bogus " + kFiles + " cuda");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("unknown option --bogus"), std::string::npos) << r.out;
  r = run_in(dir, "");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("no program given"), std::string::npos) << r.out;
  // Other subcommands still refuse extra words, also after `--`.
  CmdRun s = run_cmd(kBuild + "/gpuheap dump a.trace -- b 2>&1");
  EXPECT_EQ(s.status, 2) << s.out;
  CmdRun h = run_cmd(kBuild + "/gpuheap run --help 2>&1");
  EXPECT_NE(h.out.find("run [OPTIONS] [--] PROGRAM [ARGS...]"), std::string::npos) << h.out;
}

// Item 2: -o NAME refuses an existing NAME or NAME.zst (the trace's name once compressed)
// with exit 2 unless --force; a %p pattern keeps making unique names.
TEST(RunUx, OutputNameRefusesAnExistingFileUnlessForce) {
  std::string dir = make_dir();
  std::ofstream(dir + "/t.trace") << "precious";
  CmdRun r = run_in(dir, "-o t.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "gpuheap: error: run: " + dir +
                       "/t.trace exists; --force replaces it (or give a pattern: -o "
                       "t.%p.trace)\n");
  EXPECT_EQ(read_all(dir + "/t.trace"), "precious");
  EXPECT_FALSE(exists(dir + "/t.1.trace"));

  // NAME.zst alone counts too (run compresses at exit) ...
  std::ofstream(dir + "/z.trace.zst") << "old";
  r = run_in(dir, "-o z.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(dir + "/z.trace.zst exists; --force replaces it"), std::string::npos) << r.out;
  // ... but not when the trace stays uncompressed.
  r = run_in(dir, "-q --no-compress -o z.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(exists(dir + "/z.trace"));
  EXPECT_EQ(read_all(dir + "/z.trace.zst"), "old");

  // --force: the new trace takes the name, compressed over the old NAME.zst; no NAME.1.
  std::ofstream(dir + "/t.trace.zst") << "old";
  r = run_in(dir, "--force -o t.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(exists(dir + "/t.trace"));
  EXPECT_FALSE(exists(dir + "/t.1.trace"));
  EXPECT_FALSE(exists(dir + "/t.1.trace.zst"));
  ASSERT_TRUE(exists(dir + "/t.trace.zst"));
  EXPECT_NE(read_all(dir + "/t.trace.zst"), "old");
  EXPECT_NE(r.out.find("gpuheap: trace written to " + dir + "/t.trace.zst\n"), std::string::npos) << r.out;
  CmdRun s = run_cmd(kBuild + "/gpuheap summary " + dir + "/t.trace.zst 2>&1");
  EXPECT_EQ(s.status, 0) << s.out;

  // A pattern is never refused: each run makes its own name.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(run_in(dir, "-q -o p.%p.trace " + kFiles + " cuda").status, 0);
}

// Items 3 and 4: the exact absolute paths and the next command at the end; -q and
// GPUHEAP_QUIET=1 print nothing on success, errors still.
TEST(RunUx, PrintsAbsolutePathsAndTheNextCommandOrNothingWhenQuiet) {
  std::string dir = make_dir();
  CmdRun r = run_in(dir, "-o one.trace " + kFiles + " cuda");
  ASSERT_EQ(r.status, 0) << r.out;
  std::string path = dir + "/one.trace.zst";
  EXPECT_NE(r.out.find("gpuheap: trace written to " + path + "\nNow run: gpuheap summary " + path + "\n"),
            std::string::npos)
      << r.out;
  // Two traced processes (the default name, made absolute): one line each, one Now-run line.
  r = run_in(dir, "-- sh -c '" + kFiles + " cuda; " + kFiles + " cuda; true'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "gpuheap: trace written to " + dir + "/gpuheap.prog_files."), 2) << r.out;
  std::size_t now = r.out.find("Now run: gpuheap summary ");
  ASSERT_NE(now, std::string::npos) << r.out;
  std::string line = r.out.substr(now, r.out.find('\n', now) - now);
  EXPECT_EQ(count(line, " " + dir + "/gpuheap.prog_files."), 2) << line;
  EXPECT_EQ(r.out.find("Now run:", now + 1), std::string::npos) << r.out;

  // Quiet: not one line, whether by -q or by GPUHEAP_QUIET=1.
  r = run_in(dir, "-q -o q1.trace " + kFiles + " cuda");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(exists(dir + "/q1.trace.zst"));
  r = run_cmd("cd '" + dir + "' && GPUHEAP_QUIET=1 " + kBuild + "/gpuheap run --simulate -o q2.trace " + kFiles +
              " cuda 2>&1");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(exists(dir + "/q2.trace.zst"));
  // Errors still print.
  r = run_in(dir, "-q -o /dev/full " + kFiles + " cuda");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("gpuheap: error: tracing failed in process "), std::string::npos) << r.out;
}

// Item 5: GPUHEAP_FOLLOW_FORK=0 traces the started process only: its exec'd children (which
// inherit LD_PRELOAD) write nothing, while an exec that keeps the pid (a wrapper's `exec
// prog`) is still the started process.
TEST(RunUx, FollowForkZeroTracesOnlyTheStartedProcess) {
  const std::string two_children = "sh -c '" + kFiles + " cuda; " + kFiles + " cuda; true'";
  const std::string child_then_exec = "sh -c '" + kFiles + " cuda; exec " + kFiles + " cuda'";
  for (bool via_run : {true, false}) {
    SCOPED_TRACE(via_run ? "gpuheap run" : "plain LD_PRELOAD");
    auto go = [&](const std::string& dir, const std::string& follow, const std::string& cmd) {
      return via_run ? run_cmd("cd '" + dir + "' && GPUHEAP_FOLLOW_FORK=" + follow + " " + kBuild +
                               "/gpuheap run --simulate -q -o t.%p.trace -- " + cmd + " 2>&1")
                     : preload_in(dir, "GPUHEAP_FOLLOW_FORK=" + follow + " GPUHEAP_OUTPUT=t.%p.trace", cmd);
    };
    std::string on = make_dir(), off = make_dir(), wrap = make_dir();
    CmdRun r = go(on, "1", two_children);  // control: both children traced
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(traces_in(on).size(), 2u) << r.out;
    r = go(off, "0", two_children);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(traces_in(off).size(), 0u) << r.out;
    r = go(wrap, "0", child_then_exec);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(traces_in(wrap).size(), 1u) << r.out;
  }
}

// Item 6: a relative output is resolved once, where the job started: a wrapper that cd's
// before starting the program, and a forked child that chdir()s before its first CUDA call,
// still write into the starting directory.
TEST(RunUx, RelativeOutputIsResolvedWhereTheJobStarted) {
  std::string dir = make_dir();
  ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0700), 0);
  std::string sub = dir + "/sub";
  // gpuheap run, -o relative and the default name.
  CmdRun r = run_in(dir, "-q -o rel.%p.trace -- sh -c 'cd sub && exec " + kFiles + " cuda'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(traces_in(dir).size(), 1u) << r.out;
  EXPECT_TRUE(traces_in(sub).empty());
  std::string d2 = make_dir();
  ASSERT_EQ(::mkdir((d2 + "/sub").c_str(), 0700), 0);
  r = run_in(d2, "-- sh -c 'cd sub && " + kFiles + " cuda; true'");
  EXPECT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(traces_in(d2).size(), 1u) << r.out;
  EXPECT_EQ(traces_in(d2)[0].rfind(d2 + "/gpuheap.prog_files.", 0), 0u) << traces_in(d2)[0];
  EXPECT_TRUE(traces_in(d2 + "/sub").empty());
  // Plain LD_PRELOAD: resolved where the first traced process loaded gpuheap.
  std::string d3 = make_dir();
  ASSERT_EQ(::mkdir((d3 + "/sub").c_str(), 0700), 0);
  r = preload_in(d3, "GPUHEAP_OUTPUT=t.%p.trace", "sh -c 'cd sub && " + kFiles + " cuda; true'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(traces_in(d3).size(), 1u) << r.out;
  EXPECT_TRUE(traces_in(d3 + "/sub").empty());
  // A forked child that chdir()s before its first CUDA call.
  std::string d4 = make_dir();
  ASSERT_EQ(::mkdir((d4 + "/sub").c_str(), 0700), 0);
  r = preload_in(d4, "", kFiles + " chdir_child " + d4 + "/sub");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(traces_in(d4).size(), 1u) << r.out;
  EXPECT_TRUE(traces_in(d4 + "/sub").empty());
  // A '%' in the starting directory is taken literally, not as a conversion.
  std::string d5 = make_dir() + "/100%p";
  ASSERT_EQ(::mkdir(d5.c_str(), 0700), 0);
  r = preload_in(d5, "GPUHEAP_OUTPUT=t.trace", kFiles + " cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(exists(d5 + "/t.trace")) << r.out;
}
