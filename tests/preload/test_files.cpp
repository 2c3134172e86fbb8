// When trace files are created: a process gets one at its first recorded event, so processes
// that never touch CUDA (compiler subprocesses, DataLoader workers, wrappers that only exec)
// leave no file, no "tracing to" line and no "trace written to" line (prog_files.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;
using gpuheap::format::AllocKind;

namespace {

// `gpuheap run --simulate` of prog_files MODE... with its traces in dir.
CmdRun gpuheap_run(const std::string& dir, const std::string& args) {
  return run_cmd(kBuild + "/gpuheap run --simulate -o '" + dir + "/t.%p.trace' -- " + kProgs + "/prog_files " + args +
                 " 2>&1");  // stdout and stderr together
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string value(const std::string& out, const std::string& key) {
  std::size_t p = out.find(key + "=");
  if (p == std::string::npos) return "(missing)";
  p += key.size() + 1;
  return out.substr(p, out.find('\n', p) - p);
}

}  // namespace

TEST(TraceFiles, ProcessWithoutCudaCallsLeavesNoFile) {
  for (const char* mode : {"none", "exec"}) {
    ProgRun r = run("prog_files", {mode}, {"GPUHEAP_QUIET=0"});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    EXPECT_NE(r.out.find("none pid="), std::string::npos) << mode;
    EXPECT_TRUE(r.traces.empty()) << mode << ": " << r.traces.size() << " file(s), first " << r.traces.at(0);
    EXPECT_EQ(count(r.err, "tracing to"), 0) << mode << ": " << r.err;
  }
}

// The preload appends to GPUHEAP_PATH_FILE but never creates it (outpath.h): the lists
// these tests read are created empty first, as `gpuheap run` does.
static std::string empty_list() {
  std::string list = make_dir() + "/paths.txt";
  std::ofstream(list).flush();
  return list;
}

TEST(TraceFiles, ForkExecChildrenWithoutCudaLeaveNoFile) {
  std::string list = empty_list();
  ProgRun r = run("prog_files", {"spawn", "4"}, {"GPUHEAP_QUIET=0", "GPUHEAP_PATH_FILE=" + list});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(r.out, "none pid="), 4) << r.out;
  EXPECT_TRUE(r.traces.empty()) << r.traces.size() << " file(s) left by processes that never touched CUDA";
  EXPECT_EQ(count(r.err, "tracing to"), 0) << r.err;
  EXPECT_EQ(read_all(list), "") << "the path list names files of processes without events";
}

TEST(TraceFiles, GpuheapRunPrintsNoTraceLineForProcessesWithoutCuda) {
  std::string dir = make_dir();
  CmdRun r = gpuheap_run(dir, "spawn 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "none pid="), 3) << r.out;
  EXPECT_EQ(count(r.out, "trace written to"), 0) << r.out;
  EXPECT_EQ(count(r.out, "tracing to"), 0) << r.out;
  EXPECT_TRUE(traces_in(dir).empty());
  // Control: the same run with a parent that allocates names exactly its one file.
  std::string dir2 = make_dir();
  CmdRun c = gpuheap_run(dir2, "parent_cuda");
  ASSERT_EQ(c.status, 0) << c.out;
  auto files = traces_in(dir2);
  ASSERT_EQ(files.size(), 1u) << c.out;
  EXPECT_EQ(count(c.out, "trace written to"), 1) << c.out;
  EXPECT_NE(c.out.find("gpuheap: trace written to " + files[0] + "\n"), std::string::npos) << c.out;
  // run compresses at exit: the preload named the raw file, run prints the final .zst.
  std::string raw = files[0];
  if (raw.size() > 4 && raw.compare(raw.size() - 4, 4, ".zst") == 0) raw.resize(raw.size() - 4);
  EXPECT_EQ(count(c.out, "tracing to " + raw + "\n"), 1) << c.out;
}

// A listed trace that is gone when the command ends was removed while it ran (issue 33): it
// is not named as written but as removed, and run exits 3 (docs/cli.md), as for any trace
// that could not be written; an empty one (a header only) is not named at all.
TEST(TraceFiles, GpuheapRunNamesOnlyListedFilesThatHoldEvents) {
  std::string dir = make_dir();
  CmdRun r = gpuheap_run(dir, "bad_list " + dir);
  ASSERT_EQ(r.status, 3) << r.out;
  std::string mine = dir + "/t.";
  EXPECT_EQ(count(r.out, "trace written to"), 1) << r.out;
  EXPECT_NE(r.out.find("gpuheap: trace written to " + mine), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpuheap: error: trace " + dir + "/gone.trace was removed before the command ended\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(count(r.out, "gone.trace"), 1) << r.out;
  EXPECT_EQ(count(r.out, "empty.trace"), 0) << r.out;
  CmdRun a = run_cmd(kBuild + "/gpuheap run --simulate --allow-no-trace -o '" + dir + "/u.%p.trace' -- " + kProgs +
                     "/prog_files bad_list " + dir + " 2>&1");
  EXPECT_EQ(a.status, 0) << a.out;
  EXPECT_NE(a.out.find("gpuheap: warning: trace " + dir + "/gone.trace was removed"), std::string::npos) << a.out;
}

TEST(TraceFiles, CudaParentWithChildrenWithoutCudaLeavesExactlyOneFile) {
  std::string list = empty_list();
  ProgRun r = run("prog_files", {"parent_cuda"}, {"GPUHEAP_PATH_FILE=" + list});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(r.out, "none pid="), 1) << r.out;
  ASSERT_EQ(r.traces.size(), 1u) << "children that never touched CUDA left files";
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_TRUE(t.ok && t.process_first && t.has_end && !t.truncated && !t.corrupt);
  EXPECT_EQ(t.allocs.size(), 1u);
  EXPECT_EQ(t.frees.size(), 1u);
  EXPECT_NE(value(r.out, "none pid"), std::to_string(t.process.pid)) << "the file is the child's";
  EXPECT_EQ(read_all(list), r.traces[0] + "\n");
}

TEST(TraceFiles, LateFirstEventAfterForkAndThreadsGivesACompleteTrace) {
  std::string dir = make_dir();
  ProgRun r = run("prog_files", {"late", dir}, {"GPUHEAP_OUTPUT=" + dir + "/t.%p.trace"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto files = traces_in(dir);
  ASSERT_EQ(files.size(), 1u) << "only the process that allocated may leave a file";
  EXPECT_EQ(value(r.out, "file_before"), "0") << "the file existed before the first event";
  EXPECT_EQ(value(r.out, "path_before"), "") << "gpuheap_trace_path() named a file before the first event";
  EXPECT_EQ(value(r.out, "path_after"), files[0]);
  TraceFile t = load_trace(files[0]);
  EXPECT_TRUE(t.ok && t.process_first && t.has_end && !t.truncated && !t.corrupt);
  EXPECT_TRUE(t.stack_before_use && t.device_before_use);
  EXPECT_GT(t.modules, 0u);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 4u * 50 + 1);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 4u * 50);
  EXPECT_EQ(files[0], dir + "/t." + std::to_string(t.process.pid) + ".trace");
  // The process record still describes the start of the process, not its first event.
  EXPECT_LE(t.process.mono_ns, std::stoull(value(r.out, "start_ns")));
  EXPECT_NE(t.cmdline.find("late"), std::string::npos);
  CmdRun s = run_cmd(kBuild + "/gpuheap summary " + files[0] + " 2>&1");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("  events:    "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("  truncated: no\n"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("late"), std::string::npos) << s.out;
}

// ---- issue 18, round 2: the run's path list ----

// The list is never created by the preload and never followed through a symlink: a missing
// list stays missing, a symlink there leaves its target alone, a FIFO there does not block.
TEST(TraceFiles, PathListIsNeverCreatedOrFollowed) {
  std::string dir = make_dir();
  std::string victim = dir + "/victim";
  std::ofstream(victim) << "victim\n";
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  for (const char* name : {"/missing", "/link", "/fifo"}) {
    ProgRun r = run("prog_api", {}, {"GPUHEAP_PATH_FILE=" + dir + name});
    EXPECT_EQ(r.status, 0) << name << r.err;
    EXPECT_EQ(r.traces.size(), 1u) << name;
  }
  EXPECT_NE(access((dir + "/missing").c_str(), F_OK), 0) << "the preload created the path list";
  EXPECT_EQ(read_all(victim), "victim\n") << "the preload followed a symlink at GPUHEAP_PATH_FILE";
  // Control: an existing list gets the path.
  std::string list = empty_list();
  ProgRun c = run("prog_api", {}, {"GPUHEAP_PATH_FILE=" + list});
  ASSERT_EQ(c.traces.size(), 1u);
  EXPECT_EQ(read_all(list), c.traces[0] + "\n");
}

// `gpuheap run` keeps its list in a private 0700 directory and removes both when its
// command exits. A traced process that outlives the command (a daemon, a job left in the
// background) makes its first event after that: it must not re-create the list, nor follow
// a symlink another user planted at its name meanwhile (round 1: /tmp/gpuheap-paths-*
// opened O_CREAT without O_NOFOLLOW, re-created after the unlink).
TEST(TraceFiles, GpuheapRunListIsPrivateAndNotRecreatedByLateChildren) {
  std::string dir = make_dir();
  std::string script = "echo \"$GPUHEAP_PATH_FILE\" > " + dir +
                       "/listname; stat -c %a \"$(dirname \"$GPUHEAP_PATH_FILE\")\" > " + dir + "/mode; (sleep 1; " +
                       kProgs + "/prog_api; touch " + dir + "/late_done) >/dev/null 2>&1 &";
  CmdRun r = run_cmd(kBuild + "/gpuheap run --simulate -o '" + dir + "/t.%p.trace' -- sh -c '" + script + "' 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  std::string list = read_all(dir + "/listname");
  ASSERT_FALSE(list.empty());
  list.pop_back();  // the newline
  EXPECT_EQ(read_all(dir + "/mode"), "700\n") << "the list's directory is not private";
  std::string list_dir = list.substr(0, list.rfind('/'));
  // The attacker's move, while the late child sleeps: the list's name (its directory
  // re-created if need be) now a symlink to a file of the attacker's choice.
  std::string victim = dir + "/victim";
  std::ofstream(victim) << "victim\n";
  mkdir(list_dir.c_str(), 0755);
  ASSERT_EQ(symlink(victim.c_str(), list.c_str()), 0) << list;
  for (int i = 0; i < 200 && access((dir + "/late_done").c_str(), F_OK) != 0; ++i) usleep(50 * 1000);
  ASSERT_EQ(access((dir + "/late_done").c_str(), F_OK), 0) << "the late child did not finish";
  EXPECT_EQ(traces_in(dir).size(), 1u) << "the late child was traced";
  EXPECT_EQ(read_all(victim), "victim\n") << "a late child followed the planted symlink";
  unlink(list.c_str());
  rmdir(list_dir.c_str());
  // And without the attacker: nothing re-creates the list after run has removed it.
  std::string dir2 = make_dir();
  script = "echo \"$GPUHEAP_PATH_FILE\" > " + dir2 + "/listname; (sleep 1; " + kProgs + "/prog_api; touch " + dir2 +
           "/late_done) >/dev/null 2>&1 &";
  r = run_cmd(kBuild + "/gpuheap run --simulate -o '" + dir2 + "/t.%p.trace' -- sh -c '" + script + "' 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  list = read_all(dir2 + "/listname");
  ASSERT_FALSE(list.empty());
  list.pop_back();
  EXPECT_NE(access(list.c_str(), F_OK), 0) << "run left its list behind";
  for (int i = 0; i < 200 && access((dir2 + "/late_done").c_str(), F_OK) != 0; ++i) usleep(50 * 1000);
  ASSERT_EQ(access((dir2 + "/late_done").c_str(), F_OK), 0);
  EXPECT_EQ(traces_in(dir2).size(), 1u);
  EXPECT_NE(access(list.c_str(), F_OK), 0) << "a late child re-created the list";
  EXPECT_NE(access(list.substr(0, list.rfind('/')).c_str(), F_OK), 0) << "the list's directory is back";
}

// ---- issue 18, round 2: tracing that failed fails the gate ----

// The preload's "cannot create/write trace file" warning used to scroll by while `run`
// exited 0 (and `check` on no file said nothing). Now every failure is listed last and
// `run` exits 3 when the command itself succeeded, unless --allow-no-trace.
TEST(TraceFiles, GpuheapRunFailsWhenATraceCannotBeWritten) {
  std::string dir = make_dir();
  struct Case {
    std::string output, prefix, why;
  };
  const Case cases[] = {
      {dir + "/no/such/dir/t.%p.trace", "", "No such file or directory"},  // directory missing
      {"/dev/full", "", "a character device"},                             // full disk stand-in
      {dir + "/t.%p.trace", "ulimit -f 1; ", "File too large"},            // 512 bytes (dash), < a page
  };
  for (const Case& c : cases) {
    for (bool allow : {false, true}) {
      std::string cmd = kBuild + "/gpuheap run --simulate " + (allow ? "--allow-no-trace " : "") + "-o '" + c.output +
                        "' -- sh -c '" + c.prefix + "exec " + kProgs + "/prog_api' 2>&1";
      CmdRun r = run_cmd(cmd);
      EXPECT_EQ(r.status, allow ? 0 : 3) << cmd << "\n" << r.out;
      std::string tag = allow ? "gpuheap: warning: tracing failed in process "
                              : "gpuheap: error: tracing failed in process ";
      std::size_t at = r.out.find(tag);
      ASSERT_NE(at, std::string::npos) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find(c.why, at), std::string::npos) << r.out;
      std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
      if (allow) EXPECT_EQ(last.rfind(tag, 0), 0u) << "not the last line: " << r.out;
      else
        EXPECT_EQ(last,
                  "gpuheap: error: 1 process could not write its trace; exit status 3 (--allow-no-trace: the command's "
                  "own status)\n")
            << r.out;
      EXPECT_EQ(r.out.find("trace written to"), std::string::npos) << r.out;
    }
  }
  // The command's own failure status wins over 3; a run that traced fine exits 0.
  CmdRun f = run_cmd(kBuild + "/gpuheap run --simulate -o /dev/full -- sh -c '" + kProgs + "/prog_api; exit 5' 2>&1");
  EXPECT_EQ(f.status, 5) << f.out;
  EXPECT_NE(f.out.find("gpuheap: error: tracing failed in process "), std::string::npos) << f.out;
  CmdRun ok = run_cmd(kBuild + "/gpuheap run --simulate -o '" + dir + "/ok.%p.trace' -- " + kProgs + "/prog_api 2>&1");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_EQ(ok.out.find("tracing failed"), std::string::npos) << ok.out;
}

// Under RLIMIT_FSIZE 0 ("disk full at start" as the kernel sees it) the 16-byte header write
// got the job killed by SIGXFSZ (status 153) and left a 0-byte trace. Now: checked before
// writing, one warning, no file, the job's own status. (stderr is a pipe here: a warning
// written to a regular file under that limit would be a SIGXFSZ of its own.)
TEST(TraceFiles, FileSizeLimitZeroAtStartDoesNotKillTheJob) {
  std::string dir = make_dir();
  CmdRun r = run_cmd("sh -c 'ulimit -f 0; LD_LIBRARY_PATH=" + kBuild + "/simcuda LD_PRELOAD=" + kBuild +
                     "/libgpuheap.so GPUHEAP_QUIET=1 GPUHEAP_OUTPUT=" + dir + "/t.%p.trace exec " + kProgs +
                     "/prog_api' 2>&1 >/dev/null");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "gpuheap: cannot write trace file "), 1) << r.out;
  EXPECT_EQ(count(r.out, "File too large"), 1) << r.out;
  EXPECT_TRUE(traces_in(dir).empty());
}
