// Recorder across process boundaries: fork (own file / not followed), fatal signals
// (end record, unchanged death), program handlers chained, disk full mid-run, SIGKILL.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <thread>

#include "test_recorder_util.h"

using namespace rec_test;
namespace d = gpuheap::preload;

namespace {

std::string trace_of(const TempDir& dir, pid_t pid) { return dir.path + "/t." + std::to_string(pid) + ".trace"; }

int wait_status(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

std::set<std::uint64_t> alloc_ptrs(const Trace& t) {
  std::set<std::uint64_t> s;
  for (auto& r : t.records)
    if (r.type == f::RecordType::alloc) s.insert(r.alloc.ptr);
  return s;
}

void quiet_child() {  // no core files from the deliberate crashes below
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
}

}  // namespace

TEST(RecorderProcess, ForkedChildWritesItsOwnFile) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  std::uint32_t parent_stack = capture_here();
  for (int i = 0; i < 100; ++i) d::record(alloc_rec(i, parent_stack));  // buffered at fork
  pid_t child = fork();
  if (child == 0) {
    std::uint32_t st = capture_here();  // same stack: must be written again in the new file
    for (int i = 0; i < 50; ++i) d::record(alloc_rec(0xC000 + i, st));
    exit(0);  // atexit: end record (EndReason::exit)
  }
  ASSERT_GT(child, 0);
  int st = wait_status(child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (int i = 0; i < 10; ++i) d::record(alloc_rec(200 + i));
  d::recorder_stop(f::EndReason::stopped);

  Trace p = read_trace(trace_of(dir, getpid()));
  auto pp = alloc_ptrs(p);
  EXPECT_EQ(pp.size(), 110u);
  EXPECT_FALSE(pp.count(0xC000)) << "child record in the parent's file";
  EXPECT_EQ(p.records.back().type, f::RecordType::end);

  Trace c = read_trace(trace_of(dir, child));
  ASSERT_EQ(c.header, f::HeaderStatus::ok);
  ASSERT_FALSE(c.records.empty());
  ASSERT_EQ(c.records[0].type, f::RecordType::process);
  EXPECT_EQ(c.records[0].process.pid, static_cast<std::uint32_t>(child));
  EXPECT_EQ(c.records[0].process.ppid, static_cast<std::uint32_t>(getpid()));
  EXPECT_GT(c.count(f::RecordType::module), 2u);
  auto cp = alloc_ptrs(c);
  EXPECT_EQ(cp.size(), 50u);
  EXPECT_FALSE(cp.count(0)) << "parent's unwritten records leaked into the child's file";
  std::set<std::uint32_t> defined;
  for (auto& r : c.records) {
    if (r.type == f::RecordType::stack) defined.insert(r.stack.id);
    if (r.type == f::RecordType::alloc) {
      ASSERT_TRUE(defined.count(r.alloc.stack)) << "stack not re-emitted in the child's file";
      EXPECT_EQ(r.alloc.tid, static_cast<std::uint32_t>(child)) << "tid cache not reset after fork";
    }
  }
  ASSERT_EQ(c.records.back().type, f::RecordType::end);
  EXPECT_EQ(c.records.back().end.reason, f::EndReason::exit);
}

TEST(RecorderProcess, ForkNotFollowedWhenDisabled) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_FOLLOW_FORK", "0", 1);  // read at start (options.h), not at the fork
  ASSERT_TRUE(start_recorder());
  unsetenv("GPUHEAP_FOLLOW_FORK");
  d::record(alloc_rec(7));  // the parent's file exists
  pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < 50; ++i) d::record(alloc_rec(0xC000 + i));
    bool ok = !d::recorder_active() && capture_here() == 0;
    d::recorder_flush();
    exit(ok ? 0 : 1);
  }
  int st = wait_status(child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  d::recorder_stop(f::EndReason::stopped);
  EXPECT_EQ(dir.files().size(), 1u);
  EXPECT_EQ(alloc_ptrs(read_trace(trace_of(dir, getpid()))), std::set<std::uint64_t>{7});
}

class FatalSignal : public ::testing::TestWithParam<int> {};

TEST_P(FatalSignal, EndRecordWrittenAndDeathUnchanged) {
  TempDir dir;
  use_dir(dir);
  int sig = GetParam();
#ifdef __SANITIZE_ADDRESS__
  // ASan's own SIGSEGV/SIGBUS handler is the "previous handler" we chain to; it reports
  // and exits with status 1 instead of dying by the signal.
  if (sig == SIGSEGV || sig == SIGBUS) GTEST_SKIP() << "ASan handles this signal";
#endif
  pid_t child = fork();
  if (child == 0) {
    quiet_child();
    if (!start_recorder()) _exit(3);
    for (int i = 0; i < 100; ++i) d::record(alloc_rec(i));  // still buffered
    if (sig == SIGSEGV) {  // a real fault, on a page that exists but may not be touched
      void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      *static_cast<volatile int*>(page) = 1;
    } else if (sig == SIGABRT) abort();
    else kill(getpid(), sig);
    for (;;) pause();
  }
  int st = wait_status(child);
  ASSERT_TRUE(WIFSIGNALED(st)) << "status " << st;
  EXPECT_EQ(WTERMSIG(st), sig);
  Trace t = read_trace(trace_of(dir, child));
  EXPECT_EQ(t.count(f::RecordType::alloc), 100u);
  ASSERT_FALSE(t.records.empty());
  auto& end = t.records.back();
  ASSERT_EQ(end.type, f::RecordType::end);
  EXPECT_EQ(end.end.reason, f::EndReason::signal);
  EXPECT_EQ(end.end.records, t.records.size() - 1);
}
INSTANTIATE_TEST_SUITE_P(Signals, FatalSignal, ::testing::Values(SIGTERM, SIGSEGV, SIGABRT, SIGBUS));

namespace {
volatile sig_atomic_t g_handled = 0;
void program_handler(int) { g_handled = g_handled + 1; }
}  // namespace

TEST(RecorderProcess, ProgramHandlerIsChainedAndTracingContinues) {
  TempDir dir;
  use_dir(dir);
  pid_t child = fork();
  if (child == 0) {
    signal(SIGTERM, program_handler);  // installed before gpuheap: ours chains to it
    if (!start_recorder()) _exit(3);
    for (int i = 0; i < 10; ++i) d::record(alloc_rec(i));
    kill(getpid(), SIGTERM);
    for (int i = 10; i < 20; ++i) d::record(alloc_rec(i));
    d::recorder_stop(f::EndReason::stopped);
    _exit(g_handled == 1 ? 0 : 1);
  }
  int st = wait_status(child);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  Trace t = read_trace(trace_of(dir, child));
  EXPECT_EQ(t.count(f::RecordType::alloc), 20u);
  EXPECT_EQ(t.records.back().end.reason, f::EndReason::stopped);
}

TEST(RecorderProcess, IgnoredSignalStaysIgnored) {
  TempDir dir;
  use_dir(dir);
  pid_t child = fork();
  if (child == 0) {
    signal(SIGTERM, SIG_IGN);
    if (!start_recorder()) _exit(3);
    kill(getpid(), SIGTERM);
    d::record(alloc_rec(1));
    d::recorder_stop(f::EndReason::stopped);
    _exit(0);
  }
  int st = wait_status(child);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_EQ(read_trace(trace_of(dir, child)).count(f::RecordType::alloc), 1u);
}

TEST(RecorderProcess, DiskFullMidRunWarnsOnceAndStopsTracing) {
  TempDir dir;
  use_dir(dir);
  std::string err = dir.path + "/stderr.txt";
  pid_t child = fork();
  if (child == 0) {
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    signal(SIGXFSZ, SIG_IGN);  // beyond RLIMIT_FSIZE, write(2) then fails with EFBIG
    rlimit lim{256 << 10, 256 << 10};
    setrlimit(RLIMIT_FSIZE, &lim);
    if (!start_recorder()) _exit(3);
    // Well past the limit in any encoding: compact records (format version 5) take ~10 bytes.
    for (int i = 0; i < 200000; ++i) {
      d::record(alloc_rec(i));
      if (i % 1000 == 0) d::recorder_flush();
    }
    bool ok = !d::recorder_active() && d::recorder_counters().dropped > 0;
    d::recorder_stop(f::EndReason::stopped);
    _exit(ok ? 0 : 1);
  }
  int st = wait_status(child);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  Trace t = read_trace(trace_of(dir, child));
  EXPECT_EQ(t.header, f::HeaderStatus::ok);
  EXPECT_NE(t.last, f::FrameStatus::corrupt);
  EXPECT_LE(t.data.size(), 256u << 10);
  EXPECT_GT(t.count(f::RecordType::alloc), 1000u);
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  EXPECT_EQ(text.find("gpuheap: "), 0u) << text;
  EXPECT_EQ(text.find("gpuheap: ", 1), std::string::npos) << "warned more than once: " << text;
  EXPECT_NE(text.find("File too large"), std::string::npos) << text;
}

TEST(RecorderProcess, SigkillLosesAtMostTheLastFlushInterval) {
  TempDir dir;
  use_dir(dir);
  pid_t child = fork();
  if (child == 0) {
    if (!start_recorder()) _exit(3);
    for (std::uint64_t seq = 0;; ++seq) {
      d::record(alloc_rec(seq));
      usleep(20);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::uint64_t kill_ns = d::now_ns();
  kill(child, SIGKILL);
  int st = wait_status(child);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  Trace t = read_trace(trace_of(dir, child));
  ASSERT_EQ(t.header, f::HeaderStatus::ok);
  EXPECT_NE(t.last, f::FrameStatus::corrupt);  // possibly a cut last frame: need_more
  std::uint64_t seq = 0, last_ts = 0;
  for (auto& r : t.records) {
    if (r.type != f::RecordType::alloc) continue;
    ASSERT_EQ(r.alloc.ptr, seq++) << "records missing in the middle";
    last_ts = r.alloc.ts;
  }
  ASSERT_GT(seq, 0u);
  EXPECT_GE(last_ts + 100'000'000u, kill_ns) << "records older than 100 ms were not on disk";
}
