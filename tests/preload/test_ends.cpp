// Ends that are not exit() (issue 33): _exit, _Exit and every exec form after CUDA work leave
// a trace with its `end` record, which `gpuheap check` accepts and `gpuheap run` finishes; a
// failed exec keeps tracing in the same file; a vfork child's _exit or exec leaves the
// parent's trace alone. And signals sent to `gpuheap run` reach the program.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;

namespace {

const std::string kLife = kProgs + "/prog_lifecycle";

// `cd DIR && gpuheap run --simulate ARGS` with stdout and stderr together.
CmdRun run_in(const std::string& dir, const std::string& args) {
  return run_cmd("cd '" + dir + "' && env -u GPUHEAP_OUTPUT -u GPUHEAP_QUIET -u GPUHEAP_FOLLOW_FORK -u "
                 "GPUHEAP_FOLLOW_FORK_ROOT " + kBuild + "/gpuheap run --simulate " + args + " 2>&1");
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The trace's `end` lines as `gpuheap dump` prints them ("end ts=... reason=R records=N").
std::vector<std::string> end_lines(const std::string& trace) {
  CmdRun d = run_cmd(kBuild + "/gpuheap dump " + trace + " 2>&1");
  std::vector<std::string> out;
  for (std::size_t p = d.out.find("end ts="); p != std::string::npos; p = d.out.find("end ts=", p + 1))
    out.push_back(d.out.substr(p, d.out.find('\n', p) - p));
  return out;
}

// One mode of prog_lifecycle under the preload and without: same status and output, one
// trace with `allocs` allocations ending in one `end` of `reason`, which check accepts; then
// the same under `gpuheap run`, which finishes it (symbolized, compressed, its path printed).
void expect_finished(const std::string& mode, int status, std::size_t allocs, const char* reason) {
  SCOPED_TRACE(mode);
  ProgRun base = run("prog_lifecycle", {mode}, {}, false);
  ProgRun r = run("prog_lifecycle", {mode});
  EXPECT_EQ(base.status, status) << base.out << base.err;
  EXPECT_EQ(r.status, base.status) << r.err;
  EXPECT_EQ(r.out, base.out);
  ASSERT_EQ(r.traces.size(), 1u) << r.err;
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_TRUE(t.ok && !t.truncated && !t.corrupt);
  EXPECT_TRUE(t.has_end);
  EXPECT_EQ(t.allocs.size(), allocs);
  std::vector<std::string> ends = end_lines(r.traces[0]);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_NE(ends[0].find(std::string("reason=") + reason), std::string::npos) << ends[0];
  CmdRun c = run_cmd(kBuild + "/gpuheap check --max-reserved 1G " + r.traces[0] + " 2>&1");
  EXPECT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(c.out.find("incomplete"), std::string::npos) << c.out;

  CmdRun g = run_in(r.dir, "-o g.trace " + kLife + " " + mode);
  EXPECT_EQ(g.status, status) << g.out;
  EXPECT_NE(g.out.find("gpuheap: trace written to " + r.dir + "/g.trace.zst\n"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("left as written"), std::string::npos) << g.out;
  CmdRun s = run_cmd(kBuild + "/gpuheap check --max-reserved 1G " + r.dir + "/g.trace.zst 2>&1");
  EXPECT_EQ(s.status, 0) << s.out;
}

}  // namespace

TEST(Ends, UnderscoreExitWritesTheEndRecord) {
  expect_finished("_exit", 3, 3, "exit");
  expect_finished("_Exit", 3, 3, "exit");
  // From a signal handler: the async-signal-safe path.
  expect_finished("signal_exit", 4, 3, "exit");
}

TEST(Ends, EveryExecFormEndsTheTraceFirst) {
  for (const char* form : {"l", "lp", "le", "v", "vp", "ve", "vpe", "f"})
    expect_finished(std::string("exec=") + form, 0, 3, "stopped");
}

// A failed exec returns to the program, which goes on allocating: the `end` written before it
// is erased, the later events land in the same file, which ends once, at exit.
TEST(Ends, FailedExecKeepsTracingInTheSameFile) {
  for (const char* form : {"l", "lp", "le", "v", "vp", "ve", "vpe", "f"}) {
    std::string mode = std::string("exec_fail=") + form;
    expect_finished(mode, 0, 103, "exit");
    ProgRun r = run("prog_lifecycle", {mode});
    EXPECT_NE(r.out.find("exec failed: "), std::string::npos) << r.out;
    if (std::string(form) != "f") EXPECT_NE(r.out.find("exec failed: ENOENT"), std::string::npos) << form << r.out;
  }
}

// vfork children share the parent's memory: their _exit and exec (failed or not) must not
// end the parent's trace, which goes on and ends at the parent's exit.
TEST(Ends, VforkChildrenLeaveTheParentsTraceAlone) { expect_finished("vfork", 0, 103, "exit"); }

// Python's os._exit, the normal end of multiprocessing's forked workers.
TEST(Ends, PythonOsExit) {
  const std::string script = std::string(PY_SCRIPT_DIR) + "/os_exit.py";
  ProgRun r = run(PYTHON3_EXE, {script});
  EXPECT_EQ(r.status, 5) << r.out << r.err;
  ASSERT_EQ(r.traces.size(), 1u) << r.err;
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_TRUE(t.has_end);
  EXPECT_EQ(t.allocs.size(), 1u);
  CmdRun c = run_cmd(kBuild + "/gpuheap check --max-reserved 1G " + r.traces[0] + " 2>&1");
  EXPECT_EQ(c.status, 0) << c.out;
}

