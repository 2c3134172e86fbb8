// Ends that are not exit() (issue 33): _exit, _Exit and every exec form after CUDA work leave
// a trace with its `end` record, which `gpuheap check` accepts and `gpuheap run` finishes; a
// failed exec keeps tracing in the same file; a vfork child's _exit or exec leaves the
// parent's trace alone. And signals sent to `gpuheap run` reach the program.
#include <fcntl.h>
#include <gtest/gtest.h>
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

// Failed execs while other threads allocate: their appends wait for the exec and go on in
// the same file (across several 4 MiB windows), none lost, one `end`, at exit.
TEST(Ends, FailedExecsWhileOtherThreadsAllocate) { expect_finished("exec_fail_threads", 0, 3 + 4 * 20000, "exit"); }

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

// ---------------------------------------------------------------- signals sent to `run`

namespace {

// Starts `gpuheap run --simulate -o s.trace prog_lifecycle sleep DIR [EXTRA]` in DIR, its
// output in DIR/run.out; on_tty: in a session of its own on the pty slave `tty` (its
// controlling terminal, run and the program in its foreground process group).
pid_t start_run(const std::string& dir, const std::string& extra, const char* tty = nullptr) {
  std::vector<std::string> args = {kBuild + "/gpuheap", "run", "--simulate", "-o", "s.trace", kLife, "sleep", dir};
  if (!extra.empty()) args.push_back(extra);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "GPUHEAP_", 8) != 0 && std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string out = dir + "/run.out";
  pid_t pid = fork();
  if (pid == 0) {
    if (tty) {
      setsid();
      int t = open(tty, O_RDWR);  // a session leader's first terminal: its controlling one
      if (t < 0 || ioctl(t, TIOCSCTTY, 0) != 0) _exit(120);
      dup2(t, 0);
    }
    rlimit core{0, 0};
    setrlimit(RLIMIT_CORE, &core);  // SIGQUIT's default action: no core file
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || chdir(dir.c_str()) != 0) _exit(121);
    dup2(fd, 1), dup2(fd, 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// The program's pid once it wrote DIR/ready (after its allocations), or 0 after 20 s.
pid_t wait_ready(const std::string& dir) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(dir + "/ready");
    long pid = 0;
    if (in >> pid && pid > 0) return static_cast<pid_t>(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// run's exit status (128+N when a signal killed it), -1 if it has not ended within 30 s.
int wait_status(pid_t pid) {
  for (int i = 0; i < 3000; ++i) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
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

// Whether the process is gone; a leftover (the run that did not forward) is killed.
bool ended(pid_t pid) {
  for (int i = 0; i < 200 && kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (kill(pid, 0) != 0) return true;
  kill(pid, SIGKILL);
  return false;
}

}  // namespace

// SIGTERM to run (Popen.terminate(), a supervisor): the program gets it (its handler writes
// got-TERM and exits 0), run waits, finishes the trace, prints its path and exits 0. Before:
// run died with 143 at once, printed nothing, and left the program running, orphaned.
TEST(Ends, SigtermToRunReachesTheProgram) {
  std::string dir = make_dir();
  pid_t run_pid = start_run(dir, "");
  pid_t prog = wait_ready(dir);
  ASSERT_GT(prog, 0) << read_all(dir + "/run.out");
  ASSERT_EQ(kill(run_pid, SIGTERM), 0);
  int st = wait_status(run_pid);
  std::string out = read_all(dir + "/run.out");
  EXPECT_TRUE(ended(prog)) << "the program outlived gpuheap run";
  EXPECT_EQ(st, 0) << out;
  EXPECT_TRUE(exists(dir + "/got-TERM")) << out;
  EXPECT_NE(out.find("gpuheap: trace written to " + dir + "/s.trace.zst\n"), std::string::npos) << out;
  CmdRun c = run_cmd(kBuild + "/gpuheap check --max-reserved 1G " + dir + "/s.trace.zst 2>&1");
  EXPECT_EQ(c.status, 0) << c.out;
}

// Each forwarded signal, to a program that leaves it at its default action: the program dies
// of it (the preload's handler writes `end` first), run reports 128+N as a shell would, after
// finishing the trace and printing its path.
TEST(Ends, EachForwardedSignalKillsTheProgramAndRunReportsIt) {
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2}) {
    SCOPED_TRACE(strsignal(sig));
    struct sigaction now {};
    sigaction(sig, nullptr, &now);
    if (now.sa_handler == SIG_IGN) continue;  // ignored here, so for run too: nothing to forward
    std::string dir = make_dir();
    pid_t run_pid = start_run(dir, "default");
    pid_t prog = wait_ready(dir);
    ASSERT_GT(prog, 0) << read_all(dir + "/run.out");
    ASSERT_EQ(kill(run_pid, sig), 0);
    int st = wait_status(run_pid);
    std::string out = read_all(dir + "/run.out");
    EXPECT_TRUE(ended(prog));
    EXPECT_EQ(st, 128 + sig) << out;
    EXPECT_NE(out.find("gpuheap: trace written to " + dir + "/s.trace.zst\n"), std::string::npos) << out;
    CmdRun c = run_cmd(kBuild + "/gpuheap check --max-reserved 1G " + dir + "/s.trace.zst 2>&1");
    EXPECT_EQ(c.status, 0) << c.out;
  }
}

// ^C on a terminal goes to its whole foreground process group, the program included: run
// does not send it a second one (the program counts exactly one SIGINT), and reports as usual.
TEST(Ends, TerminalInterruptReachesTheProgramOnce) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  std::string tty = ptsname(master);
  std::string dir = make_dir();
  pid_t run_pid = start_run(dir, "", tty.c_str());
  pid_t prog = wait_ready(dir);
  ASSERT_GT(prog, 0) << read_all(dir + "/run.out");
  ASSERT_EQ(write(master, "\x03", 1), 1);  // VINTR: the line discipline signals the group
  int st = wait_status(run_pid);
  std::string out = read_all(dir + "/run.out");
  close(master);
  EXPECT_TRUE(ended(prog));
  EXPECT_EQ(st, 0) << out;
  EXPECT_TRUE(exists(dir + "/ints=1")) << out;
  EXPECT_FALSE(exists(dir + "/ints=2")) << "the program got ^C twice";
  EXPECT_NE(out.find("gpuheap: trace written to " + dir + "/s.trace.zst\n"), std::string::npos) << out;
}

// ---------------------------------------------------------------- the path list

// The directory the traces go to removed while the program runs: the trace run was told about
// is gone, and run says so and exits 3 (docs/cli.md); before, it exited 0 and said nothing.
TEST(Ends, TraceDirectoryRemovedMidRunIsAFailure) {
  std::string dir = make_dir();
  ASSERT_EQ(::mkdir((dir + "/out").c_str(), 0700), 0);
  CmdRun r = run_in(dir, "-o out/t.trace -- sh -c '" + kProgs + "/prog_files cuda && rm -r out'");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("gpuheap: error: trace " + dir + "/out/t.trace was removed before the command ended\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("trace written to"), std::string::npos) << r.out;
  // The command's own failure keeps its status.
  r = run_in(dir, "-o gone/t.trace -- sh -c 'mkdir gone && " + kProgs + "/prog_files cuda; rm -r gone; exit 7'");
  EXPECT_EQ(r.status, 7) << r.out;
}

// A program whose name holds a newline names its trace so (%n): the preload's messages and
// run's lines keep it escaped (one line each), and run still finds, finishes and names the
// trace. Before, the path list's line broke in two, neither half existed, and run named no
// trace (exit 0, the trace left raw).
TEST(Ends, ProgramNameWithANewline) {
  std::string dir = make_dir();
  std::string prog = dir + "/two\nlines";
  ASSERT_EQ(std::system(("cp " + kProgs + "/prog_files '" + prog + "'").c_str()), 0);
  CmdRun r = run_in(dir, "'" + prog + "' cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  std::vector<std::string> files = traces_in(dir);
  ASSERT_EQ(files.size(), 1u) << r.out;
  EXPECT_EQ(files[0].substr(files[0].size() - 4), ".zst") << files[0];
  std::string shown = dir + "/gpuheap.two\\nlines.";
  EXPECT_NE(r.out.find("gpuheap: tracing to " + shown), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpuheap: trace written to " + shown), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Now run: gpuheap summary $'" + shown), std::string::npos) << r.out;
  EXPECT_EQ(count(r.out, "\n"), count(r.out, "gpuheap:") + count(r.out, "Now run:")) << "a line broke:\n" << r.out;
  CmdRun c = run_cmd(kBuild + "/gpuheap check --max-reserved 1G '" + files[0] + "' 2>&1");
  EXPECT_EQ(c.status, 0) << c.out;
  // The preload's warnings too: one line, the newline written \n.
  ProgRun w = run("prog_files", {"cuda"}, {"GPUHEAP_OUTPUT=" + dir + "/no\nsuch/t.trace"});
  EXPECT_EQ(w.status, 0) << w.err;
  EXPECT_EQ(w.err.rfind("gpuheap: cannot create trace file " + dir + "/no\\nsuch/t.trace: ", 0), 0u) << w.err;
  EXPECT_EQ(count(w.err, "\n"), 1) << w.err;
}
