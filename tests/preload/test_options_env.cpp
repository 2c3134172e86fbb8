// GPUHEAP_* values as the preloaded library reads them at load (preload/core/options.h): the
// spellings every boolean accepts, and one warning for an invalid value.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(PreloadOptions, StacksOffRecordsNoStacks) {
  for (const char* off : {"GPUHEAP_STACKS=off", "GPUHEAP_STACKS=FALSE", "GPUHEAP_STACKS=no"}) {
    ProgRun r = run("prog_api", {}, {off});
    ASSERT_EQ(r.status, 0) << off << r.out;
    ASSERT_EQ(r.traces.size(), 1u) << off;
    TraceFile t = load_trace(r.traces[0]);
    EXPECT_TRUE(t.ok);
    EXPECT_FALSE(t.allocs.empty());
    EXPECT_TRUE(t.stack_ids.empty()) << off;
    for (auto& a : t.allocs) EXPECT_EQ(a.stack, 0u) << off;
    EXPECT_EQ(r.err.find("gpuheap: GPUHEAP_"), std::string::npos) << r.err;
  }
}

TEST(PreloadOptions, InvalidValueWarnsOnceAndUsesTheDefault) {
  ProgRun r = run("prog_api", {}, {"GPUHEAP_STACKS=maybe"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.err, "gpuheap: "), 1u) << r.err;
  EXPECT_EQ(count(r.err, "GPUHEAP_STACKS=\"maybe\""), 1u) << r.err;
  EXPECT_EQ(count(r.err, "using the default 1"), 1u) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_FALSE(t.stack_ids.empty());  // the default: stacks on
}

TEST(PreloadOptions, QuietAcceptsEveryBooleanSpelling) {
  ProgRun loud = run("prog_api", {}, {"GPUHEAP_QUIET=off"});
  ASSERT_EQ(loud.status, 0);
  EXPECT_EQ(count(loud.err, "tracing to"), 1u) << loud.err;
  ProgRun quiet = run("prog_api", {}, {"GPUHEAP_QUIET=yes"});
  ASSERT_EQ(quiet.status, 0);
  EXPECT_EQ(quiet.err.find("tracing to"), std::string::npos) << quiet.err;
}

// ---- issue 18, round 2 ----

namespace {
int max_depth(const TraceFile& t) {
  int m = 0;
  for (auto& [id, d] : t.stack_depths) m = std::max(m, d);
  return m;
}
}  // namespace

// GPUHEAP_STACK_DEPTH=N keeps N of the program's frames: the interposer's own frame used to
// count against it (N - 1 kept, and none at all for 1).
TEST(PreloadOptions, StackDepthKeepsExactlyThatManyFrames) {
  ProgRun full = run("prog_api", {}, {});
  ASSERT_EQ(full.traces.size(), 1u);
  const int deepest = max_depth(load_trace(full.traces[0]));
  ASSERT_GE(deepest, 4) << "prog_api's stacks are too shallow for this test";
  for (int n : {1, 2, 3}) {
    ProgRun r = run("prog_api", {}, {"GPUHEAP_STACK_DEPTH=" + std::to_string(n)});
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(r.traces.size(), 1u);
    TraceFile t = load_trace(r.traces[0]);
    ASSERT_FALSE(t.stack_depths.empty()) << "GPUHEAP_STACK_DEPTH=" << n << " recorded no stack";
    EXPECT_EQ(max_depth(t), n) << "GPUHEAP_STACK_DEPTH=" << n;
    for (auto& a : t.allocs) EXPECT_NE(a.stack, 0u) << "GPUHEAP_STACK_DEPTH=" << n;
  }
}

// GPUHEAP_OUTPUT naming something that is not a regular file (/dev/null, a FIFO, a
// directory) used to get a suffixed sibling created next to it (/dev/null.1). Now: no trace,
// one warning, the program unharmed, nothing created.
TEST(PreloadOptions, OutputThatIsNotARegularFileGetsNoTraceAndNoSibling) {
  std::string dir = make_dir();
  std::string fifo = dir + "/fifo.trace";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(mkdir((dir + "/sub").c_str(), 0700), 0);
  bool devnull_sibling_before = access("/dev/null.1", F_OK) == 0;
  struct Case {
    std::string path, kind;
  };
  for (const Case& c :
       {Case{"/dev/null", "a character device"}, Case{fifo, "a FIFO"}, Case{dir + "/sub", "a directory"}}) {
    ProgRun r = run("prog_api", {}, {"GPUHEAP_OUTPUT=" + c.path});
    EXPECT_EQ(r.status, 0) << c.path << r.err;
    EXPECT_EQ(count(r.err, "gpuheap: "), 1u) << c.path << ": " << r.err;
    EXPECT_EQ(count(r.err, "GPUHEAP_OUTPUT names " + c.path + ", which is " + c.kind), 1u) << r.err;
  }
  if (!devnull_sibling_before) EXPECT_NE(access("/dev/null.1", F_OK), 0) << "/dev/null.1 was created";
  EXPECT_NE(access((dir + "/fifo.1.trace").c_str(), F_OK), 0);
  EXPECT_NE(access((dir + "/sub.1").c_str(), F_OK), 0);
}

// gpuheap's own stderr lines (here "tracing to" and an invalid-option warning) into a pipe
// whose reader has gone raised SIGPIPE: the job was killed (status 141) where it ran fine
// without gpuheap. Now its writes cannot raise SIGPIPE, and the program's own SIGPIPE
// behaviour is unchanged (control: a write of its own still dies of it).
TEST(PreloadOptions, StderrIntoAClosedPipeDoesNotKillTheJob) {
  auto run_broken = [](std::vector<std::string> env, std::vector<std::string> args) {
    std::string dir = make_dir();
    int p[2];
    if (pipe(p) != 0) return -1;
    close(p[0]);                          // nobody reads stderr
    std::vector<std::string> envs = env;  // first: getenv() returns the first match
    envs.push_back("LD_LIBRARY_PATH=" + kBuild + "/simcuda");
    envs.push_back("LD_PRELOAD=" + kBuild + "/libgpuheap.so");
    envs.push_back("GPUHEAP_OUTPUT=" + dir + "/t.%p.trace");
    std::vector<char*> envp, argv;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string path = kProgs + "/prog_crash";
    argv.push_back(path.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      signal(SIGPIPE, SIG_DFL);
      dup2(p[1], 2);
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      execve(path.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(p[1]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  };
  EXPECT_EQ(run_broken({"GPUHEAP_QUIET=0"}, {"nofree"}), 0);
  EXPECT_EQ(run_broken({"GPUHEAP_QUIET=1", "GPUHEAP_STACKS=maybe"}, {"nofree"}), 0);
  EXPECT_EQ(run_broken({"GPUHEAP_QUIET=0", "GPUHEAP_OUTPUT=/nonexistent/t.trace"}, {"nofree"}), 0);
  // The program's own SIGPIPE still reaches it (raise=13: the default action, status 141).
  EXPECT_EQ(run_broken({"GPUHEAP_QUIET=0"}, {"raise=13"}), 128 + SIGPIPE);
}
