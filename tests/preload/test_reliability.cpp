// "Never lose the trace, never break the job": programs run under LD_PRELOAD=libgpuheap.so on
// the simulated CUDA runtime through load, SIGKILL, crashes, odd exits, API misuse, disk
// trouble, fork, dlopen and several devices. Whatever the job does must end exactly as it
// ends without gpuheap (compared by running both), and the trace must always decode.
// Figures are printed as "[figure] ..." lines; docs/reliability.md quotes the current ones.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "format/trace.h"
#include "tests/preload/progress.h"
#include "tests/preload/run_prog.h"
#include "tests/trace_walk.h"

namespace fmt_ = gpuheap::format;
using fmt_::AllocKind;
using fmt_::RecordType;
using gpuheap::test::FileWalk;
using gpuheap::test::walk_file;

extern char** environ;

namespace {

const std::string kBuild = GPUHEAP_BUILD_DIR;
const std::string kProgs = PRELOAD_PROG_DIR;

bool small_scale() {
  const char* s = std::getenv("GPUHEAP_TEST_SCALE");
  return s && std::strcmp(s, "small") == 0;
}
bool full_scale() {
  const char* s = std::getenv("GPUHEAP_TEST_SCALE");
  return s && std::strcmp(s, "full") == 0;
}

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

using gpuheap::test::make_dir;
using gpuheap::test::traces_in;

std::string read_file(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
  }
  return s;
}

void remove_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) unlink((dir + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(dir.c_str());
}

struct Opts {
  std::vector<std::string> args;
  std::vector<std::string> env;
  bool preload = true;
  std::string out_dir;                       // "" = a fresh temp dir; traces go to OUT/t.%p.trace
  std::string output;                        // GPUHEAP_OUTPUT override (full pattern)
  int timeout_s = 120;                       // killed after this: a hang fails the test
  std::function<void()> in_child;            // runs in the child before execve
  std::function<void(pid_t, int)> on_start;  // (pid, stdout fd) in the parent
};

struct ProgResult {
  int status = -1;  // exit code, or 128 + signal
  bool timed_out = false;
  double wall_s = 0;
  std::string dir, out, err;
  std::vector<std::string> traces;
};

ProgResult run(const std::string& prog, Opts o) {
  ProgResult r;
  r.dir = o.out_dir.empty() ? make_dir() : o.out_dir;
  std::string err_path = make_dir() + "/stderr";
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) && std::strncmp(*e, "LD_LIBRARY_PATH=", 16) &&
        std::strncmp(*e, "GPUHEAP_", 8) && std::strncmp(*e, "SIMCUDA_", 8))
      envs.push_back(*e);
  for (auto& e : o.env) envs.push_back(e);  // first: getenv() returns the first match
  envs.push_back("LD_LIBRARY_PATH=" + kBuild + "/simcuda");
  if (o.preload) envs.push_back("LD_PRELOAD=" + kBuild + "/libgpuheap.so");
  envs.push_back("GPUHEAP_OUTPUT=" + (o.output.empty() ? r.dir + "/t.%p.trace" : o.output));
  envs.push_back("GPUHEAP_QUIET=1");
  std::vector<char*> envp, argv;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string path = kProgs + "/" + prog;
  argv.push_back(path.data());
  for (auto& a : o.args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int pipefd[2];
  if (pipe(pipefd) != 0) return r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    int efd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (efd >= 0) dup2(efd, 2);
    close(pipefd[0]);
    close(pipefd[1]);
    if (o.in_child) o.in_child();
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(pipefd[1]);
  // Watchdog: a hang (deadlock at exit, in a signal handler ...) becomes a failure.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread dog([&] {
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, std::chrono::seconds(o.timeout_s), [&] { return done; })) {
      r.timed_out = true;
      kill(pid, SIGKILL);
    }
  });
  if (o.on_start) o.on_start(pid, pipefd[0]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<std::size_t>(n));
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
  }
  cv.notify_all();
  dog.join();
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.err = read_file(err_path);
  unlink(err_path.c_str());
  rmdir(err_path.substr(0, err_path.size() - 7).c_str());
  r.traces = traces_in(r.dir);
  return r;
}

ProgResult run(const std::string& prog, std::vector<std::string> args, std::vector<std::string> env = {},
               bool preload = true) {
  Opts o;
  o.args = std::move(args), o.env = std::move(env), o.preload = preload;
  return run(prog, std::move(o));
}

// Streaming decode (traces of the load test are gigabytes): counts, never holds the file.
struct Scan {
  bool opened = false, header_ok = false, truncated = false, corrupt = false, has_end = false;
  bool process_first = false;
  fmt_::EndReason end_reason{};
  std::uint64_t records = 0, bytes = 0, end_records = 0;
  std::uint64_t allocs[fmt_::kNumAllocKinds] = {}, frees[fmt_::kNumAllocKinds] = {};
  std::uint64_t failed_frees = 0, ooms = 0;
  std::map<std::uint32_t, std::uint64_t> frees_by_tid;  // pooled frees that succeeded
  std::map<int, std::uint64_t> allocs_by_device, frees_by_device;
  std::vector<fmt_::AllocRecord> first_allocs;  // up to 1000
  std::vector<fmt_::FreeRecord> first_frees;
  std::uint64_t all_allocs() const {
    std::uint64_t n = 0;
    for (auto a : allocs) n += a;
    return n;
  }
  std::uint64_t all_frees() const {
    std::uint64_t n = 0;
    for (auto a : frees) n += a;
    return n;
  }
};

Scan scan(const std::string& path) {
  Scan s;
  const FileWalk w = walk_file(path, [&](const fmt_::Record& r) {
    if (s.records++ == 0) s.process_first = r.type == RecordType::process;
    if (s.has_end) s.corrupt = true;  // nothing may follow `end`
    switch (r.type) {
      case RecordType::alloc:
        s.allocs[static_cast<int>(r.alloc.kind)]++;
        s.allocs_by_device[r.alloc.device]++;
        if (s.first_allocs.size() < 1000) s.first_allocs.push_back(r.alloc);
        break;
      case RecordType::free:
        s.frees[static_cast<int>(r.free.kind)]++;
        if (r.free.flags & fmt_::kFlagFailed) s.failed_frees++;
        else if (r.free.kind == AllocKind::device_pooled) s.frees_by_tid[r.free.tid]++;
        s.frees_by_device[r.free.device]++;
        if (s.first_frees.size() < 1000) s.first_frees.push_back(r.free);
        break;
      case RecordType::oom: s.ooms++; break;
      case RecordType::end: s.has_end = true, s.end_reason = r.end.reason, s.end_records = r.end.records; break;
      default: break;
    }
  });
  s.opened = w.opened, s.header_ok = w.header_ok, s.corrupt |= w.corrupt, s.bytes = w.bytes;
  s.truncated = w.tail_bytes > 0;
  return s;
}

void expect_readable(const Scan& s, const std::string& what) {
  EXPECT_TRUE(s.opened) << what;
  EXPECT_TRUE(s.header_ok) << what;
  EXPECT_FALSE(s.corrupt) << what;
  EXPECT_TRUE(s.process_first) << what;
}

// The lines of `out` that start with `key`, e.g. value(out, "allocs=").
long value(const std::string& out, const std::string& key) {
  auto p = out.find(key);
  return p == std::string::npos ? -1 : std::atol(out.c_str() + p + key.size());
}

int count_warnings(const std::string& err) {
  int n = 0;
  for (std::size_t p = err.find("gpuheap:"); p != std::string::npos; p = err.find("gpuheap:", p + 1)) ++n;
  return n;
}

std::size_t idx(AllocKind k) { return static_cast<std::size_t>(k); }

}  // namespace

// ---------------------------------------------------------------- load

// THREADS x EVENTS: exact event counts, no deadlock (watchdog), bounded preload memory.
void load_case(int threads, long events_per_thread, std::function<void()> in_child = {}) {
  Opts o;
  o.args = {std::to_string(threads), std::to_string(events_per_thread)};
  o.in_child = in_child;
  o.timeout_s = 1200;
  // The baseline only provides VmHWM without gpuheap (simcuda's memory is never touched,
  // so it does not grow with the event count); a tenth of the events keeps CI time down.
  ProgResult base = run("prog_load", Opts{{o.args[0], std::to_string(events_per_thread / 10)}, {}, false});
  ProgResult r = run("prog_load", o);
  ASSERT_FALSE(r.timed_out) << "deadlock or livelock: killed after " << o.timeout_s << " s";
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  ASSERT_EQ(base.status, 0) << base.out << base.err;
  const long pairs = static_cast<long>(threads) * (events_per_thread / 2);
  EXPECT_EQ(value(r.out, "allocs="), pairs);
  EXPECT_EQ(value(r.out, "frees="), pairs);
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "load trace");
  EXPECT_TRUE(s.has_end);
  EXPECT_FALSE(s.truncated);
  // Zero events lost: the trace holds exactly the events the program made.
  EXPECT_EQ(s.allocs[idx(AllocKind::device_pooled)], static_cast<std::uint64_t>(pairs));
  EXPECT_EQ(s.frees[idx(AllocKind::device_pooled)], static_cast<std::uint64_t>(pairs));
  EXPECT_EQ(s.all_allocs(), static_cast<std::uint64_t>(pairs));
  EXPECT_EQ(s.failed_frees, 0u);
  EXPECT_EQ(s.end_records + 1, s.records) << "end record's count disagrees with the file";
  long hwm = value(r.out, "hwm_kb="), base_hwm = value(base.out, "hwm_kb=");
  long extra_mb = (hwm - base_hwm) / 1024;
  // Bounded: the sink maps at most two 4 MiB file windows and buffers nothing; stacks and
  // pool bookkeeping add little. 320 MiB is the documented ceiling.
  EXPECT_LT(extra_mb, 320) << "preload memory grew with the run";
  std::printf(
      "[figure] load threads=%d events/thread=%ld events=%ld wall=%.1fs (no preload ~%.0fs, extrapolated) "
      "trace=%.1f MiB VmHWM=%ld MiB (no preload, 1/10 of the events: %ld MiB; +%ld MiB)\n",
      threads, events_per_thread, 2 * pairs, r.wall_s, base.wall_s * 10, static_cast<double>(s.bytes) / (1 << 20),
      hwm / 1024, base_hwm / 1024, extra_mb);
  remove_tree(r.dir);
  remove_tree(base.dir);
}

TEST(Reliability, Load64Threads) {
  // Default (CI main build): 64 x 100 k events; GPUHEAP_TEST_SCALE=small: 64 x 10 k;
  // the contract size 64 x 1 M runs in Reliability.Load64ThreadsFull.
  load_case(64, small_scale() ? 10000 : 100000);
}

TEST(Reliability, Load64ThreadsFull) {
  if (!full_scale()) GTEST_SKIP() << "64 threads x 1 M events: set GPUHEAP_TEST_SCALE=full";
  load_case(64, 1000000);
}

// A filesystem without fallocate(2) (NFSv3, some FUSE): a seccomp filter in the child answers
// fallocate with EOPNOTSUPP. The sink falls back to zero-filling new blocks itself, only past
// the space it has handed out, while 64 threads cross many 4 MiB windows (the appender and
// the background thread both prepare windows): every event must still be in the file.
void deny_fallocate() {
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EOPNOTSUPP & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) _exit(126);
}

TEST(Reliability, LoadWithoutFallocate) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the seccomp filter is written for x86-64";
#endif
  // The probe: fallocate really fails under the filter (else the test would prove nothing).
  pid_t pid = fork();
  if (pid == 0) {
    deny_fallocate();
    int fd = open("/tmp", O_TMPFILE | O_RDWR, 0600);
    if (fd < 0) _exit(125);
    _exit(fallocate(fd, 0, 0, 4096) != 0 && errno == EOPNOTSUPP ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << "seccomp probe died: status " << st;
  if (WEXITSTATUS(st) == 126 || WEXITSTATUS(st) == 125)
    GTEST_SKIP() << "no seccomp filters (or no O_TMPFILE) in this environment";
  ASSERT_EQ(WEXITSTATUS(st), 0) << "the seccomp filter did not make fallocate fail";
  load_case(64, small_scale() ? 10000 : 40000, deny_fallocate);
}

// ---------------------------------------------------------------- kill

// SIGKILL at random moments of a 4-thread busy run. The program publishes, per thread,
// (time, pooled frees returned) into shared memory; every free that returned more than
// 100 ms (the contract) of the process's own progress before
// the kill must be in the trace.
TEST(Reliability, SigkillAtRandomMoments) {
  const int reps = small_scale() ? 8 : 30, threads = 4;
  const std::uint64_t contract_ns = 100'000'000;
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_ms(5, 400);
  double worst_missing_age_ms = 0, worst_covered_lag_ms = 0, worst_stall_ms = 0;
  int truncated = 0;
  std::uint64_t total_frees = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::string pdir = make_dir();
    std::string ppath = pdir + "/progress";
    int fd = open(ppath.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, sizeof(gpuheap::test::Progress)), 0);
    void* m = mmap(nullptr, sizeof(gpuheap::test::Progress), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(m, MAP_FAILED);
    auto* prog = static_cast<const gpuheap::test::Progress*>(m);
    std::uint64_t kill_ns = 0;
    int wait_ms = delay_ms(rng);
    Opts o;
    o.args = {std::to_string(threads), "0", ppath};
    o.on_start = [&](pid_t pid, int out) {
      char c;
      std::string line;
      while (read(out, &c, 1) == 1 && c != '\n') line += c;
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      kill_ns = mono_ns();
      kill(pid, SIGKILL);
    };
    ProgResult r = run("prog_load", o);
    ASSERT_EQ(r.status, 128 + SIGKILL) << "rep " << rep << ": " << r.out << r.err;
    ASSERT_EQ(r.traces.size(), 1u);
    Scan s = scan(r.traces[0]);
    expect_readable(s, "rep " + std::to_string(rep));
    EXPECT_FALSE(s.has_end);
    truncated += s.truncated;
    for (int t = 0; t < threads; ++t) {
      const auto& tp = prog->threads[t];
      std::uint64_t n = tp.count.load(std::memory_order_acquire);
      ASSERT_GT(n, 0u);
      std::uint64_t in_trace = s.frees_by_tid.count(tp.tid) ? s.frees_by_tid.at(tp.tid) : 0;
      total_frees += in_trace;
      std::uint64_t first = n > gpuheap::test::kProgressRing ? n - gpuheap::test::kProgressRing : 0;
      // The ring must reach back past the contract horizon, or the check proves nothing.
      const auto& oldest = tp.ring[first % gpuheap::test::kProgressRing];
      if (first > 0) ASSERT_LT(oldest.ns + contract_ns, kill_ns) << "progress ring too short for this rate";
      // The newest snapshot of any thread: when the process last made progress. On a
      // loaded machine a process can get no CPU for 100+ ms; an event only counts as "older
      // than the contract" if the process kept running for 100 ms after it.
      std::uint64_t newest = 0;
      for (int u = 0; u < threads; ++u) {
        std::uint64_t m = prog->threads[u].count.load();
        if (m) newest = std::max(newest, prog->threads[u].ring[(m - 1) % gpuheap::test::kProgressRing].ns);
      }
      newest = std::min(newest, kill_ns);
      worst_stall_ms = std::max(worst_stall_ms, static_cast<double>(kill_ns - newest) / 1e6);
      for (std::uint64_t k = first; k < n; ++k) {
        const auto& e = tp.ring[k % gpuheap::test::kProgressRing];
        if (e.ns > kill_ns) continue;
        double age_ms = static_cast<double>(newest - std::min(e.ns, newest)) / 1e6;
        if (e.frees > in_trace) {
          // Missing: only allowed for frees younger than the contract. Records are copied
          // into the file's pages by the append itself, so in practice nothing published is
          // missing (0 ms measured under load, docs/reliability.md); the contract is asserted.
          worst_missing_age_ms = std::max(worst_missing_age_ms, age_ms);
          EXPECT_LT(age_ms, contract_ns / 1e6)
              << "rep " << rep << " thread " << t << ": " << e.frees << " frees had returned " << age_ms
              << " ms before the kill, the trace holds " << in_trace;
          break;  // the oldest missing snapshot is the one that matters
        }
      }
      // Newest snapshot the trace fully covers: how far behind the file was at the kill.
      for (std::uint64_t k = n; k-- > first;) {
        const auto& e = tp.ring[k % gpuheap::test::kProgressRing];
        if (e.ns <= kill_ns && e.frees <= in_trace) {
          worst_covered_lag_ms = std::max(worst_covered_lag_ms, static_cast<double>(kill_ns - e.ns) / 1e6);
          break;
        }
      }
    }
    munmap(m, sizeof(gpuheap::test::Progress));
    remove_tree(pdir);
    remove_tree(r.dir);
  }
  std::printf(
      "[figure] sigkill reps=%d threads=%d readable=%d/%d truncated_last_frame=%d "
      "frees_checked=%llu oldest_missing_free=%.1fms (contract 100ms) "
      "worst_lag_of_file_behind_kill=%.1fms longest_no_progress_before_kill=%.1fms\n",
      reps, threads, reps, reps, truncated, static_cast<unsigned long long>(total_frees), worst_missing_age_ms,
      worst_covered_lag_ms, worst_stall_ms);
}

// ---------------------------------------------------------------- crash and exit paths

struct EndCase {
  const char* mode;
  int sleep_ms;
  int status;        // expected exit code or 128+signal
  int end_expected;  // `end` record written: 1 yes, 0 no, -1 either (a race the test allows)
  int min_frees;     // pooled frees that must be in the trace
  const char* stdout_has;
};

void end_case(const EndCase& c) {
  Opts o;
  o.args = {c.mode, std::to_string(c.sleep_ms)};
  // No core files from the core-dumping signals (the status is the same either way).
  o.in_child = [] {
    rlimit rl{0, 0};
    setrlimit(RLIMIT_CORE, &rl);
  };
  Opts ob = o;
  ob.preload = false;
  ProgResult base = run("prog_crash", ob);
  ProgResult r = run("prog_crash", o);
  ASSERT_FALSE(r.timed_out) << c.mode << " hung";
  if (c.status >= 0) EXPECT_EQ(base.status, c.status) << c.mode << " (test expectation wrong without the preload)";
  EXPECT_EQ(r.status, base.status) << c.mode << ": exit status changed by the preload";
  EXPECT_EQ(r.out, base.out) << c.mode << ": program output changed by the preload";
  if (c.stdout_has) EXPECT_NE(r.out.find(c.stdout_has), std::string::npos) << c.mode;
  EXPECT_EQ(count_warnings(r.err), 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u) << c.mode;
  Scan s = scan(r.traces[0]);
  expect_readable(s, c.mode);
  if (c.end_expected >= 0) EXPECT_EQ(s.has_end, c.end_expected == 1) << c.mode;
  EXPECT_GE(s.frees[idx(AllocKind::device_pooled)], static_cast<std::uint64_t>(c.min_frees)) << c.mode;
  EXPECT_GE(s.allocs[idx(AllocKind::device_pooled)], 101u) << c.mode;
  std::printf(
      "[figure] end mode=%s sleep=%dms status=%d (same without preload) end_record=%d "
      "allocs=%llu frees=%llu\n",
      c.mode, c.sleep_ms, r.status, s.has_end, static_cast<unsigned long long>(s.all_allocs()),
      static_cast<unsigned long long>(s.all_frees()));
  remove_tree(r.dir);
  remove_tree(base.dir);
}

// Default dispositions: gpuheap's handler flushes, writes `end` and re-raises.
TEST(Reliability, CrashSegv) { end_case({"segv", 0, 128 + SIGSEGV, 1, 100, nullptr}); }
TEST(Reliability, CrashAbort) { end_case({"abort", 0, 128 + SIGABRT, 1, 100, nullptr}); }
TEST(Reliability, CrashUncaughtException) { end_case({"throw", 0, 128 + SIGABRT, 1, 100, nullptr}); }
// The program's own handlers, installed after gpuheap's, replace it; they must still run and
// the status stay theirs. The crash comes right after the handler is installed (no sleep),
// before gpuheap's background thread can re-arm, and still no event may be missing: records
// are in the file when appended. `end` depends on whether a re-arm tick fell in between,
// except where the handler ends in _exit, which writes `end` itself (issue 33).
TEST(Reliability, CrashWithProgramsHandler) {
  end_case({"segv_handler", 0, 128 + SIGSEGV, -1, 100, "handler ran"});
  end_case({"abort_handler", 0, 128 + SIGABRT, -1, 100, "handler ran"});
  end_case({"segv_exit_handler", 0, 42, 1, 100, "handler ran"});
}
// The program installs its handler after its first CUDA call; gpuheap's background thread
// puts its own back in front (the program waits for that, silently); then 100 pairs and a
// crash within a millisecond. gpuheap's handler runs first and chains: the program's handler
// runs with the same arguments (the fault address is printed, same output as without
// gpuheap), re-raises with SIG_DFL, the status is unchanged, and the `end` record (reason
// signal) proves gpuheap's handler was in front: without the re-arm there is none.
TEST(Reliability, CrashWithProgramsHandlerReArmed) {
  end_case({"segv_handler_rearm", 0, 128 + SIGSEGV, 1, 100, "handler ran"});
  end_case({"segv_siginfo_resethand_rearm", 0, 128 + SIGSEGV, 1, 100, "handler ran sig=11 si_signo=11 si_addr=0x10"});
}
// Round 2: every signal whose default action terminates the process (signal(7) "Term" and
// "Core", SIGKILL aside) closes the trace when the program left it at SIG_DFL: `end`
// (reason signal) written, then the default action, so the status is the signal's. Before
// round 2 only SIGSEGV, SIGABRT, SIGBUS and SIGTERM did; the others left no `end`.
TEST(Reliability, EveryTerminatingSignalClosesTheTrace) {
  const int sigs[] = {SIGHUP,    SIGINT,  SIGQUIT, SIGILL,  SIGTRAP,   SIGABRT, SIGBUS,  SIGFPE,
                      SIGUSR1,   SIGSEGV, SIGUSR2, SIGPIPE, SIGALRM,   SIGTERM, SIGXCPU, SIGXFSZ,
                      SIGVTALRM, SIGPROF, SIGIO,   SIGSYS,  SIGSTKFLT, SIGPWR};
  for (int sig : sigs) {
    std::string mode = "raise=" + std::to_string(sig);
    end_case({mode.c_str(), 0, 128 + sig, 1, 100, nullptr});
  }
}
// Real-time signals are the program's own (docs/reliability.md, "Signals"): gpuheap does not
// touch them; a stray one still kills with its own status, the trace then has no `end`.
TEST(Reliability, RealTimeSignalsAreLeftAlone) {
  std::string mode = "raise=" + std::to_string(SIGRTMIN + 1);
  end_case({mode.c_str(), 0, 128 + SIGRTMIN + 1, 0, 100, nullptr});
}
// A handler the program installs for a default-only signal (SIGUSR1) is left alone: not
// replaced by a re-arm (the program checks after ~6 ticks), it runs, the program goes on and
// exits normally (`end` at exit). SIG_IGN (nohup's SIGHUP) stays ignored. SIGINT is still
// SIG_DFL when the program starts (CPython installs its KeyboardInterrupt handler only then):
// gpuheap takes it over at the first event, not at load.
TEST(Reliability, ProgramsOwnSignalChoicesWin) {
  end_case({"usr1_handler", 0, 0, 1, 100, "handler kept\nhandler ran\n"});
  end_case({"hup_ignored", 0, 0, 1, 100, nullptr});
  end_case({"sigint_seen_at_start", 0, 128 + SIGINT, 1, 100, "sigint at start: default"});
}
TEST(Reliability, ExitFromOtherThreadWhileAllocating) { end_case({"thread_exit", 0, 7, 1, 100, nullptr}); }
TEST(Reliability, QuickExit) { end_case({"quick_exit", 0, 5, 1, 100, nullptr}); }
TEST(Reliability, UnderscoreExit) {
  // _exit runs no exit handler; gpuheap's _exit interposer writes `end` (issue 33: before,
  // every record was in the file but no `end`, and run/check took the trace for a killed one).
  end_case({"underscore_exit", 0, 6, 1, 100, nullptr});
}
TEST(Reliability, StaticDestructorFreesAfterMain) { end_case({"static_dtor", 0, 0, 1, 101, "static dtor freed"}); }
TEST(Reliability, StaticDestructorAfterRuntimeTeardown) {
  // Whatever the runtime does with this (simcuda: crashes, see docs/reliability.md), gpuheap
  // changes nothing.
  end_case({"static_dtor_global", 0, -1, 1, 100, nullptr});
}
TEST(Reliability, NeverFrees) { end_case({"nofree", 0, 0, 1, 0, nullptr}); }

// ---------------------------------------------------------------- misuse

// Same program with and without the preload: every return code and cudaGetLastError() must
// match, later allocations must still hold their data, and bad frees appear as failed.
Scan misuse_case(const std::string& c, std::vector<std::string> env, std::uint64_t failed_frees) {
  ProgResult base = run("prog_misuse", {c}, env, false);
  ProgResult r = run("prog_misuse", {c}, env);
  EXPECT_FALSE(r.timed_out) << c;
  EXPECT_EQ(base.status, 0) << c << ": " << base.out << base.err;
  EXPECT_EQ(r.status, base.status) << c;
  EXPECT_EQ(r.out, base.out) << c << ": gpuheap answered differently from the runtime";
  EXPECT_NE(r.out.find("integrity ok"), std::string::npos) << c << ": " << r.out;
  Scan s;
  if (r.traces.size() == 1) s = scan(r.traces[0]);
  EXPECT_EQ(r.traces.size(), 1u) << c;
  expect_readable(s, c);
  EXPECT_TRUE(s.has_end) << c;
  EXPECT_EQ(s.failed_frees, failed_frees) << c << ": failed frees in the trace";
  std::string first = r.out.substr(0, r.out.find("integrity"));
  for (auto& ch : first)
    if (ch == '\n') ch = ';';
  std::printf("[figure] misuse %s: same answers with and without preload: %s | %s\n", c.c_str(),
              r.out == base.out ? "yes" : "NO", first.c_str());
  remove_tree(r.dir);
  remove_tree(base.dir);
  return s;
}

TEST(Reliability, MisuseDoubleFree) { misuse_case("double_free", {}, 1); }
TEST(Reliability, MisuseForeignPointer) { misuse_case("foreign", {}, 3); }
TEST(Reliability, MisuseInteriorPointer) { misuse_case("interior", {}, 1); }
TEST(Reliability, MisuseSizeZero) { misuse_case("size0", {}, 0); }
TEST(Reliability, MisuseLargerThanDevice) {
  Scan s = misuse_case("too_large", {"SIMCUDA_TOTAL_MEMORY=1G"}, 0);
  EXPECT_EQ(s.ooms, 2u) << "each failed cudaMalloc leaves an oom record";
}
TEST(Reliability, MisuseFreeFromThreadWithoutContext) { misuse_case("no_context", {}, 0); }
TEST(Reliability, MisuseDriverFreeWithoutContext) { misuse_case("drv_no_context", {}, 1); }
TEST(Reliability, MisuseConcurrentFreeOfOnePointer) {
  Scan s = misuse_case("concurrent", {}, 200);
  EXPECT_EQ(s.frees[idx(AllocKind::device_pooled)], 400u + 16u);  // + integrity()'s 16
}

// ---------------------------------------------------------------- every free entry point

// The first lines where `out` differs from `base`, for the failure message.
std::string first_differences(const std::string& base, const std::string& out) {
  std::string msg;
  std::size_t i = 0, j = 0;
  for (int shown = 0; shown < 8 && (i < base.size() || j < out.size());) {
    std::size_t ie = base.find('\n', i), je = out.find('\n', j);
    std::string a = base.substr(i, ie == std::string::npos ? std::string::npos : ie - i);
    std::string b = out.substr(j, je == std::string::npos ? std::string::npos : je - j);
    if (a != b) msg += "\n  runtime: " + a + "\n  gpuheap: " + b, ++shown;
    if (ie == std::string::npos || je == std::string::npos) break;
    i = ie + 1, j = je + 1;
  }
  return msg;
}

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Issue 33: every allocation API x every free API (cudaFree, cudaFreeAsync, cuMemFree,
// cuMemFreeAsync, their _ptsz variants, through symbols, cudaGetDriverEntryPoint and
// cuGetProcAddress), with valid, interior, doubly freed, null and foreign pointers: each
// return code and cudaPeekAtLastError/cudaGetLastError after it equals the runtime's
// without gpuheap, and the blocks beside a freed one keep their data.
void free_matrix(const std::string& pool) {
  const char* frees[] = {"cudaFree",           "cudaFreeAsync",       "cudaFreeAsync_legacy",
                         "cudaFreeAsync_ptsz", "cuMemFree",           "cuMemFree_entry",
                         "cuMemFreeAsync",     "cuMemFreeAsync_ptsz", "cuMemFreeAsync_ptds0",
                         "cudaFreeHost"};
  int calls = 0, differing = 0;
  for (const char* f : frees) {
    ProgResult base = run("prog_freematrix", {f}, {}, false);
    ProgResult r = run("prog_freematrix", {f}, {"GPUHEAP_POOL=" + pool});
    EXPECT_EQ(base.status, 0) << f << ": " << base.out << base.err;
    EXPECT_EQ(count_of(base.out, "BROKEN"), 0) << f << ": " << base.out;
    EXPECT_EQ(r.status, base.status) << f << " (GPUHEAP_POOL=" << pool << "): " << r.err.substr(0, 2000);
    EXPECT_TRUE(r.out == base.out) << f << " (GPUHEAP_POOL=" << pool
                                   << ") answered differently from the runtime:" << first_differences(base.out, r.out);
    calls += count_of(base.out, " rc=");
    differing += r.out != base.out;
    Scan s;
    if (r.traces.size() == 1) s = scan(r.traces[0]);
    EXPECT_EQ(r.traces.size(), 1u) << f;
    expect_readable(s, f);
    EXPECT_TRUE(s.has_end) << f;
    EXPECT_EQ(s.ooms, 0u) << f;
    // The trace agrees with the answers: one free record per free the runtime accepted.
    int ok_frees = 0, ok_allocs = 0;
    std::size_t at = 0;
    for (std::size_t e; (e = base.out.find('\n', at)) != std::string::npos; at = e + 1) {
      std::string line = base.out.substr(at, e - at);
      bool ok = line.find(" rc=0 ") != std::string::npos;
      bool is_free = line.find(" free_") != std::string::npos || line.find(" cleanup_") != std::string::npos;
      if (ok && is_free && line.find("free_null") == std::string::npos) ++ok_frees;
      if (ok && line.find(" alloc_") != std::string::npos) ++ok_allocs;
    }
    EXPECT_EQ(s.all_allocs(), static_cast<std::uint64_t>(ok_allocs)) << f << " (GPUHEAP_POOL=" << pool << ")";
    EXPECT_EQ(s.all_frees() - s.failed_frees, static_cast<std::uint64_t>(ok_frees))
        << f << " (GPUHEAP_POOL=" << pool << "): free records that succeeded";
    remove_tree(r.dir);
    remove_tree(base.dir);
  }
  EXPECT_GE(calls, 31 * 10);
  std::printf(
      "[figure] free matrix (GPUHEAP_POOL=%s): %d calls in %zu free APIs x 8 allocation APIs + "
      "foreign pointers, %d APIs answered differently from the runtime\n",
      pool.c_str(), calls, sizeof frees / sizeof *frees, differing);
}

TEST(Reliability, FreeMatrixMatchesRuntimePoolOn) { free_matrix("1"); }
TEST(Reliability, FreeMatrixMatchesRuntimePoolOff) { free_matrix("0"); }

// A stream-ordered free of pool memory with work still pending on its stream: the block is
// reused only after that work (a created non-blocking stream; another thread's per-thread
// default stream in a program that creates no stream).
TEST(Reliability, StreamOrderedFreeOfPoolMemoryWaitsForItsStream) {
  for (const char* c : {"order", "order_ptsz"}) {
    ProgResult base = run("prog_freematrix", {c}, {}, false);
    ProgResult r = run("prog_freematrix", {c});
    EXPECT_EQ(base.status, 0) << c << ": " << base.out << base.err;
    EXPECT_NE(base.out.find("order q ok"), std::string::npos) << c << ": " << base.out;
    EXPECT_EQ(r.status, 0) << c << ": " << r.err;
    EXPECT_TRUE(r.out == base.out) << c << first_differences(base.out, r.out);
    remove_tree(r.dir);
    remove_tree(base.dir);
  }
}

// Issue 39: CUDA graph capture as PyTorch does it (tests/preload/prog_capture.cpp). Every
// return code, the last error and the captures invalidated (simcuda_capture_violations) equal
// the runtime's without gpuheap: the pool makes no call that is illegal during a capture
// (no legacy-stream event, no event query or synchronisation where the driver forbids them),
// and where the program's own call is illegal it fails as natively instead of being served
// from the pool. Graph allocations (cudaMallocAsync into a capture) are the driver's.
TEST(Reliability, GraphCaptureAnswersAsTheRuntime) {
  struct Case {
    const char* name;
    std::vector<std::string> must;  // lines the native run must print (the case is not vacuous)
    AllocKind kind;                 // allocations made during the captures
    std::uint64_t during;           // how many of `kind`
  } cases[] = {
      {"relaxed",
       {"capturing thread malloc 12582912 rc=0", "other thread free 512 rc=0", "global thread malloc 512 rc=900",
        "end global rc=0", "end global again rc=901", "global thread to graph malloc 512 rc=900", "end to graph rc=901",
        "violations=2"},
       AllocKind::device_passthrough,
       12},
      {"async",
       {"malloc async rc=0", "free async pooled rc=1", "end global rc=0",
        "driver cuMemAllocAsync calls +3, cuMemFreeAsync +4", "violations=0"},
       AllocKind::async,
       3},
      {"free",
       {"free rc=0", "free rc=900", "malloc rc=900", "end capture rc=901", "violations=1"},
       AllocKind::device_passthrough,
       12},
      {"order", {"free rc=0", "end relaxed rc=0", "block after the capture intact"}, AllocKind::device_passthrough, 0},
  };
  for (const Case& c : cases) {
    ProgResult base = run("prog_capture", {c.name}, {}, false);
    // Every free seals its batch: each records its fence during the capture (deterministic).
    ProgResult r = run("prog_capture", {c.name}, {"GPUHEAP_SEAL_US=0"});
    EXPECT_EQ(base.status, 0) << c.name << ": " << base.out << base.err;
    for (const std::string& line : c.must)
      EXPECT_NE(base.out.find(line + "\n"), std::string::npos) << c.name << " lacks '" << line << "':\n" << base.out;
    EXPECT_EQ(r.status, base.status) << c.name << ": " << r.err.substr(0, 2000);
    EXPECT_TRUE(r.out == base.out) << c.name
                                   << " answered differently from the runtime:" << first_differences(base.out, r.out);
    Scan s;
    if (r.traces.size() == 1) s = scan(r.traces[0]);
    EXPECT_EQ(r.traces.size(), 1u) << c.name;
    expect_readable(s, c.name);
    EXPECT_EQ(s.allocs[idx(c.kind)], c.during) << c.name;
    EXPECT_EQ(s.ooms, 0u) << c.name;
    remove_tree(r.dir);
    remove_tree(base.dir);
  }
}

// Issue 33: an allocation that fails for another reason than memory (no device, a driver
// older than the runtime) is passed through as it is: same answers, no OOM report ("CUDA out
// of memory ... on device -1"), no OOM record, at most one line naming the error.
TEST(Reliability, NonOomErrorsAreNotReportedAsOutOfMemory) {
  struct Case {
    const char* env;
    const char* name;  // the error's name, as the line must say it
  } cases[] = {{"SIMCUDA_DEVICE_COUNT=0", "cudaErrorNoDevice"},
               {"SIMCUDA_DRIVER_VERSION=12000", "cudaErrorInsufficientDriver"}};
  for (const Case& c : cases)
    for (const char* pool : {"GPUHEAP_POOL=1", "GPUHEAP_POOL=0"}) {
      ProgResult base = run("prog_freematrix", {"no_gpu"}, {c.env}, false);
      ProgResult r = run("prog_freematrix", {"no_gpu"}, {c.env, pool});
      EXPECT_EQ(base.status, 0) << c.env;
      EXPECT_NE(base.out.find("rc=" + std::string(std::strstr(c.name, "NoDevice") ? "100" : "35")), std::string::npos)
          << c.env << ": " << base.out;
      EXPECT_EQ(r.status, base.status) << c.env << " " << pool;
      EXPECT_TRUE(r.out == base.out) << c.env << " " << pool << first_differences(base.out, r.out);
      EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << c.env << " " << pool << ": " << r.err;
      EXPECT_LE(count_of(r.err, "gpuheap:"), 1) << c.env << " " << pool << ": " << r.err;
      if (count_of(r.err, "gpuheap:") == 1)
        EXPECT_NE(r.err.find(c.name), std::string::npos) << c.env << " " << pool << ": " << r.err;
      std::uint64_t ooms = 0;
      for (const std::string& t : r.traces) ooms += scan(t).ooms;
      EXPECT_EQ(ooms, 0u) << c.env << " " << pool;
      std::printf("[figure] %s %s: answers %s the runtime's, %llu OOM records, stderr: %s\n", c.env, pool,
                  r.out == base.out ? "equal" : "DIFFER FROM", static_cast<unsigned long long>(ooms),
                  r.err.empty() ? "(nothing)" : r.err.substr(0, r.err.find('\n')).c_str());
      remove_tree(r.dir);
      remove_tree(base.dir);
    }
}

// ---------------------------------------------------------------- multi-device

TEST(Reliability, TwoDevicesPerDevicePoolsAndCrossDeviceFree) {
  Scan s = misuse_case("other_device", {"SIMCUDA_DEVICE_COUNT=2"}, 1);
  EXPECT_GE(s.allocs_by_device[0], 1u);
  EXPECT_GE(s.allocs_by_device[1], 1u);
  // The block of device 1, freed while device 0 is current, is recorded as device 1's.
  bool saw = false;
  for (auto& f : s.first_frees)
    if (!(f.flags & fmt_::kFlagFailed) && f.kind == AllocKind::device_pooled) {
      for (auto& a : s.first_allocs)
        if (a.ptr == f.ptr && a.device == 1) saw = saw || f.device == 1;
    }
  EXPECT_TRUE(saw);
}

TEST(Reliability, TwoDevicesSetDeviceBetweenCalls) {
  Scan s = misuse_case("set_device", {"SIMCUDA_DEVICE_COUNT=2"}, 1);
  // Every allocation's device matches the device its pointer's segment belongs to, and the
  // frees (always made while the other device was current) carry the allocation's device.
  std::map<std::uint64_t, int> dev_of;
  for (auto& a : s.first_allocs) dev_of[a.ptr] = a.device;
  int mismatched = 0, checked = 0;
  for (auto& f : s.first_frees)
    if (!(f.flags & fmt_::kFlagFailed) && dev_of.count(f.ptr)) {
      ++checked;
      mismatched += dev_of[f.ptr] != f.device;
    }
  EXPECT_GE(checked, 64);
  EXPECT_EQ(mismatched, 0);
  EXPECT_GE(s.allocs_by_device[0], 32u);
  EXPECT_GE(s.allocs_by_device[1], 32u);
}

// ---------------------------------------------------------------- disk trouble

void expect_job_unharmed(const ProgResult& r, const ProgResult& base, const char* what) {
  EXPECT_FALSE(r.timed_out) << what;
  EXPECT_EQ(r.status, 0) << what << ": " << r.err;
  EXPECT_EQ(value(r.out, "allocs="), value(base.out, "allocs=")) << what;
  EXPECT_EQ(value(r.out, "frees="), value(base.out, "frees=")) << what;
  EXPECT_EQ(value(r.out, "failures="), 0) << what;
  EXPECT_EQ(count_warnings(r.err), 1) << what << ": expected exactly one warning, got: " << r.err;
  std::string line = r.err.substr(0, r.err.find('\n'));
  std::printf("[figure] disk %s: status=%d, warnings=%d: %s\n", what, r.status, count_warnings(r.err), line.c_str());
}

TEST(Reliability, OutputDirectoryMissing) {
  ProgResult base = run("prog_load", {"4", "2000"}, {}, false);
  Opts o;
  o.args = {"4", "2000"};
  o.output = "/nonexistent-gpuheap-dir/sub/t.%p.trace";
  ProgResult r = run("prog_load", o);
  expect_job_unharmed(r, base, "missing directory");
  remove_tree(r.dir);
  remove_tree(base.dir);
}

TEST(Reliability, OutputDirectoryNotWritable) {
  // Root ignores permission bits, so the job runs as nobody (setresuid before exec) and
  // writes into a root-owned 0755 directory.
  ProgResult base = run("prog_load", {"4", "2000"}, {}, false);
  std::string dir = make_dir();
  chmod(dir.c_str(), 0755);
  Opts o;
  o.args = {"4", "2000"};
  o.out_dir = dir;
  bool root = geteuid() == 0;
  if (root) o.in_child = [] { (void)!setresgid(65534, 65534, 65534), (void)!setresuid(65534, 65534, 65534); };
  else chmod(dir.c_str(), 0555);
  ProgResult r = run("prog_load", o);
  expect_job_unharmed(r, base, "directory not writable");
  EXPECT_TRUE(r.traces.empty());
  remove_tree(dir);
  remove_tree(base.dir);
}

TEST(Reliability, DiskFullMidRun) {
  // RLIMIT_FSIZE of 64 KiB (SIGXFSZ ignored): once the file reaches it, write(2) fails with
  // EFBIG mid-run, as on a full disk. The job must not notice.
  const long events = small_scale() ? 20000 : 100000;
  ProgResult base = run("prog_load", {"4", std::to_string(events)}, {}, false);
  Opts o;
  o.args = {"4", std::to_string(events)};
  o.in_child = [] {
    signal(SIGXFSZ, SIG_IGN);
    rlimit rl{64 << 10, 64 << 10};
    setrlimit(RLIMIT_FSIZE, &rl);
  };
  ProgResult r = run("prog_load", o);
  expect_job_unharmed(r, base, "disk full (RLIMIT_FSIZE 64 KiB)");
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "disk full");
  EXPECT_LE(s.bytes, 64u << 10);
  EXPECT_GT(s.all_allocs(), 0u);
  std::printf(
      "[figure] disk full: trace %llu bytes, %llu of %ld allocs kept, truncated_last_frame=%d, "
      "wall %.2fs (no preload %.2fs)\n",
      static_cast<unsigned long long>(s.bytes), static_cast<unsigned long long>(s.all_allocs()), 4 * events / 2,
      s.truncated, r.wall_s, base.wall_s);
  remove_tree(r.dir);
  remove_tree(base.dir);
}

TEST(Reliability, FileSizeLimitLoweredWhileRunning) {
  // The program lowers RLIMIT_FSIZE to 1 MiB after tracing started, SIGXFSZ at its default
  // (terminate). The first 4 MiB window was allocated before; allocating the next one past
  // the new limit would make the kernel send SIGXFSZ, killing the job. The sink must see
  // the limit as it is now, warn once and stop.
  const long events = small_scale() ? 60000 : 100000;  // per thread: > 4 MiB of records in all
  ProgResult base = run("prog_load", {"4", std::to_string(events)}, {"PROG_LOAD_FSIZE_KB=1024"}, false);
  ProgResult r = run("prog_load", {"4", std::to_string(events)}, {"PROG_LOAD_FSIZE_KB=1024"});
  expect_job_unharmed(r, base, "RLIMIT_FSIZE lowered while running");
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "RLIMIT_FSIZE lowered");
  EXPECT_GT(s.all_allocs(), 0u);
  remove_tree(r.dir);
  remove_tree(base.dir);
}

TEST(Reliability, DiskFullOnTmpfs) {
  // A real ENOSPC where mounting is allowed (root in a privileged container).
  std::string mnt = make_dir();
  if (system(("mount -t tmpfs -o size=64k tmpfs " + mnt + " 2>/dev/null").c_str()) != 0) {
    rmdir(mnt.c_str());
    GTEST_SKIP() << "cannot mount a tmpfs here; RLIMIT_FSIZE variant covers the write failure";
  }
  const long events = small_scale() ? 20000 : 100000;
  ProgResult base = run("prog_load", {"4", std::to_string(events)}, {}, false);
  Opts o;
  o.args = {"4", std::to_string(events)};
  o.out_dir = mnt;
  ProgResult r = run("prog_load", o);
  expect_job_unharmed(r, base, "disk full (64 KiB tmpfs)");
  EXPECT_NE(r.err.find("No space left"), std::string::npos) << r.err;
  if (r.traces.size() == 1) expect_readable(scan(r.traces[0]), "tmpfs");
  EXPECT_EQ(system(("umount " + mnt).c_str()), 0);
  rmdir(mnt.c_str());
  remove_tree(base.dir);
}

// ---------------------------------------------------------------- fork

TEST(Reliability, ChildUsingCudaAfterForkGetsTheRuntimesAnswer) {
  for (const char* mode : {"child_cuda", "child_cuda_fresh"}) {
    ProgResult base = run("prog_fork", {mode}, {}, false);
    ProgResult r = run("prog_fork", {mode});
    EXPECT_FALSE(r.timed_out) << mode;
    EXPECT_EQ(r.status, base.status) << mode;
    EXPECT_EQ(r.out, base.out) << mode;
    for (auto& t : r.traces) expect_readable(scan(t), t);
    std::string o = r.out;
    std::replace(o.begin(), o.end(), '\n', ';');
    std::printf("[figure] fork %s: same answers: %s | %s traces=%zu\n", mode, r.out == base.out ? "yes" : "NO",
                o.c_str(), r.traces.size());
    remove_tree(r.dir);
    remove_tree(base.dir);
  }
}

TEST(Reliability, DataLoaderChildrenLeaveNoTraceAndCostLittle) {
  const int n = small_scale() ? 50 : 300;
  for (const char* how : {"_exit", "exit"}) {
    // Medians of n forks each; a burst of load on a shared 2-core machine can still move one
    // run by milliseconds (seen: 3.6 ms vs 0.8 ms, and the baseline 3.2 ms vs 0.9), so up to
    // 3 interleaved pairs are measured and the bound must hold for one of them. A real
    // slowdown holds in all three.
    bool within = false;
    std::string runs;
    for (int attempt = 0; attempt < 3 && !within; ++attempt) {
      ProgResult base = run("prog_fork", {"loader", std::to_string(n), how}, {}, false);
      ProgResult r = run("prog_fork", {"loader", std::to_string(n), how});
      ASSERT_EQ(base.status, 0);
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.traces.size(), 1u) << "children that never touch CUDA must not leave traces";
      double us = std::atof(r.out.c_str() + r.out.find('=') + 1);
      double base_us = std::atof(base.out.c_str() + base.out.find('=') + 1);
      // No slowdown beyond noise: the child only re-initialises a few locks.
      within = us < 2.0 * base_us + 500.0;
      runs += " " + std::to_string(static_cast<long>(us)) + "/" + std::to_string(static_cast<long>(base_us));
      std::printf("[figure] dataloader fork+%s+wait x%d: %.0f us with preload, %.0f us without; traces=%zu\n", how, n,
                  us, base_us, r.traces.size());
      remove_tree(r.dir);
      remove_tree(base.dir);
    }
    EXPECT_TRUE(within) << "fork+" << how << " median us with/without gpuheap, 3 tries:" << runs;
  }
}

// ---------------------------------------------------------------- dlopen

const std::string kCudart = kBuild + "/simcuda/libcudart.so.13";

TEST(Reliability, LibcudartDlopenedLaterAndDlclosed) {
  ProgResult base = run("prog_dlopen", {"late", kCudart}, {}, false);
  ProgResult r = run("prog_dlopen", {"late", kCudart});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, base.out);
  EXPECT_NE(r.out.find("first failures=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("second failures=0"), std::string::npos) << r.out;
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "dlopen late");
  EXPECT_EQ(s.failed_frees, 0u);
  // Both rounds are seen (the second through the driver hooks if the runtime moved).
  EXPECT_EQ(s.all_allocs(), 20u);
  EXPECT_EQ(s.all_frees(), 20u);
  std::printf("[figure] dlopen late+dlclose+reopen: status=%d allocs=%llu frees=%llu\n", r.status,
              static_cast<unsigned long long>(s.all_allocs()), static_cast<unsigned long long>(s.all_frees()));
  remove_tree(r.dir);
  remove_tree(base.dir);
}

TEST(Reliability, TwoLibcudartCopiesInOneProcess) {
  std::string dir = make_dir();
  std::string copy = dir + "/libcudart-copy.so.13";
  ASSERT_EQ(system(("cp " + kCudart + " " + copy).c_str()), 0);
  ProgResult base = run("prog_dlopen", {"two", kCudart, copy}, {}, false);
  ProgResult r = run("prog_dlopen", {"two", kCudart, copy});
  EXPECT_EQ(base.status, 0) << base.out;
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, base.out);
  EXPECT_NE(r.out.find("distinct copies=1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rc=0"), r.out.find("rc=")) << r.out;
  for (const char* k : {"malloc_a rc=0", "malloc_b rc=0", "free_a rc=0", "free_b rc=0", "free_a2_by_b rc=0",
                        "free_b2_by_a rc=0", "pairs_a failures=0", "pairs_b failures=0"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k << "\n" << r.out;
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "two copies");
  EXPECT_EQ(s.failed_frees, 0u);
  EXPECT_EQ(s.all_allocs(), 24u) << "every allocation of both copies is seen";
  EXPECT_EQ(s.all_frees(), 24u);
  std::printf("[figure] two libcudart copies: status=%d allocs=%llu frees=%llu failed=%llu\n", r.status,
              static_cast<unsigned long long>(s.all_allocs()), static_cast<unsigned long long>(s.all_frees()),
              static_cast<unsigned long long>(s.failed_frees));
  remove_tree(dir);
  remove_tree(r.dir);
  remove_tree(base.dir);
}

// ---------------------------------------------------------------- security

TEST(Reliability, SymlinkAtOutputPathIsNeverFollowed) {
  std::string dir = make_dir(), vdir = make_dir();
  std::string victim = vdir + "/victim", dangling = vdir + "/not-created";
  {
    FILE* f = std::fopen(victim.c_str(), "w");
    std::fputs("precious", f);
    std::fclose(f);
  }
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/out.trace").c_str()), 0);
  ASSERT_EQ(symlink(dangling.c_str(), (dir + "/out.1.trace").c_str()), 0);
  {
    FILE* f = std::fopen((dir + "/out.2.trace").c_str(), "w");  // an existing regular file
    std::fputs("older trace", f);
    std::fclose(f);
  }
  Opts o;
  o.args = {"nofree"};
  o.out_dir = dir;
  o.output = dir + "/out.trace";
  ProgResult r = run("prog_crash", o);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(read_file(victim), "precious") << "the symlink's target was written";
  EXPECT_NE(access(dangling.c_str(), F_OK), 0) << "a dangling symlink's target was created";
  EXPECT_EQ(read_file(dir + "/out.2.trace"), "older trace") << "an existing file was clobbered";
  struct stat st {};
  ASSERT_EQ(lstat((dir + "/out.3.trace").c_str(), &st), 0) << "trace not at the next free suffix";
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  Scan s = scan(dir + "/out.3.trace");
  expect_readable(s, "suffixed trace");
  EXPECT_EQ(s.all_allocs(), 101u);
  std::printf(
      "[figure] symlink planted: victim unchanged, dangling target not created, existing file "
      "kept, trace at out.3.trace mode %o\n",
      st.st_mode & 07777);
  remove_tree(dir);
  remove_tree(vdir);
}

TEST(Reliability, SetuidProcessesAreLeftAlone) {
  // glibc ignores LD_PRELOAD paths with '/' in secure-execution mode, so the only way
  // libgpuheap.so reaches such a process is a dlopen by path (or a preload from a trusted
  // directory): the program dlopens it itself. Secure mode (AT_SECURE) is entered here by
  // exec'ing with real uid nobody and effective uid root (what a setuid-root binary sees).
  // The control run without the uid change must trace, or the test could not fail.
  const std::string lib = kBuild + "/libgpuheap.so";
  for (bool secure : {false, true}) {
    Opts o;
    o.args = {"secure", lib, kCudart};
    o.preload = false;
    if (secure) {
      if (geteuid() != 0) GTEST_SKIP() << "needs root to exec with ruid != euid";
      o.in_child = [] { (void)!setresuid(65534, 0, 0); };
    }
    ProgResult r = run("prog_dlopen", o);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("pairs failures=0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(secure ? "gpuheap_active=0" : "gpuheap_active=1"), std::string::npos) << r.out;
    EXPECT_EQ(r.traces.size(), secure ? 0u : 1u) << (secure ? "secure" : "control");
    std::printf("[figure] %s: %s traces=%zu\n", secure ? "AT_SECURE (ruid nobody, euid root)" : "control",
                r.out.substr(r.out.find("gpuheap_active")).c_str(), r.traces.size());
    remove_tree(r.dir);
  }
}

// ---------------------------------------------------------------- the job's descriptors and disk

namespace {

// prog_harm.cpp's content of user file k at byte `at`.
unsigned char harm_pattern(int k, std::size_t at) {
  return static_cast<unsigned char>((at * 7 + at / 4096 + k * 31) & 0xff);
}

// The eight files prog_harm closefds wrote: exactly `bytes` long, every byte the program's.
void expect_user_files_intact(const std::string& dir, std::size_t bytes, const char* what) {
  for (int k = 0; k < 8; ++k) {
    std::string data = read_file(dir + "/user." + std::to_string(k));
    EXPECT_EQ(data.size(), bytes) << what << ": user." << k;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < data.size(); ++i) bad += static_cast<unsigned char>(data[i]) != harm_pattern(k, i);
    EXPECT_EQ(bad, 0u) << what << ": user." << k << " has bytes that are not the program's";
  }
}

}  // namespace

TEST(Reliability, ProgramClosesTheTraceDescriptor) {
  // closerange(3, ...) after the first event, then the program's own files take the numbers:
  // the one at the trace's old number must get none of the trace's records, keep its size
  // (no ftruncate at exit) and stay open in a forked child. The trace is reopened by path
  // and goes on. The program wrote 32 MiB per file; 1 MiB crosses the same windows.
  const long kib = 1024, n = small_scale() ? 50000 : 100000;
  std::string files = make_dir();
  Opts o;
  o.args = {"closefds", files, std::to_string(kib), std::to_string(n)};
  ProgResult r = run("prog_harm", o);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("child=ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done"), std::string::npos) << r.out;
  EXPECT_EQ(count_warnings(r.err), 0) << r.err;
  expect_user_files_intact(files, static_cast<std::size_t>(kib) << 10, "trace reopened");
  ASSERT_EQ(r.traces.size(), 1u);
  Scan s = scan(r.traces[0]);
  expect_readable(s, "closed descriptor");
  EXPECT_TRUE(s.has_end);
  EXPECT_EQ(s.all_allocs(), static_cast<std::uint64_t>(1 + n + 100));
  std::printf(
      "[figure] program closed fds 3..1023 (%s): user files %ld KiB each intact, child's writes ok, "
      "trace %llu bytes with %llu allocs and its end record\n",
      r.out.substr(0, r.out.find('\n')).c_str(), kib, static_cast<unsigned long long>(s.bytes),
      static_cast<unsigned long long>(s.all_allocs()));
  remove_tree(files);
  remove_tree(r.dir);
}

TEST(Reliability, ProgramClosesTheTraceDescriptorOfAnUnlinkedTrace) {
  // The same with the trace file unlinked first: it cannot be reopened, so tracing stops with
  // one warning, and the program's files are still never touched.
  const long kib = 1024, n = small_scale() ? 50000 : 100000;
  std::string files = make_dir();
  Opts o;
  o.args = {"closefds", files, std::to_string(kib), std::to_string(n), "unlink"};
  ProgResult r = run("prog_harm", o);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("child=ok"), std::string::npos) << r.out;
  EXPECT_EQ(count_warnings(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("closed by the program"), std::string::npos) << r.err;
  expect_user_files_intact(files, static_cast<std::size_t>(kib) << 10, "trace gone");
  std::printf("[figure] program closed fds of an unlinked trace: %s", r.err.c_str());
  remove_tree(files);
  remove_tree(r.dir);
}

TEST(Reliability, JobStartedWithStdioClosed) {
  // `prog 0<&- 1>&- 2>&-`: the program's files take 0..2 as without gpuheap, a write to fd 2
  // after it closed it fails as without gpuheap, and nothing of gpuheap (its "tracing to"
  // line: GPUHEAP_QUIET=0) lands in the program's files or the trace.
  std::string result[2];
  for (bool preload : {false, true}) {
    std::string files = make_dir();
    Opts o;
    o.args = {"stdio", files};
    o.preload = preload;
    o.env = {"GPUHEAP_QUIET=0"};
    o.in_child = [] { close(0), close(1), close(2); };
    ProgResult r = run("prog_harm", o);
    EXPECT_EQ(r.status, 0) << preload;
    result[preload] = read_file(files + "/result");
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(read_file(files + "/user." + std::to_string(k)), "user " + std::to_string(k) + "\n") << preload;
    if (preload) {
      ASSERT_EQ(r.traces.size(), 1u);
      Scan s = scan(r.traces[0]);
      expect_readable(s, "stdio closed");
      EXPECT_TRUE(s.has_end);
      EXPECT_EQ(s.all_allocs(), 11u);
      std::string raw = read_file(r.traces[0]);
      EXPECT_EQ(raw.find("gpuheap:"), std::string::npos);
      EXPECT_EQ(raw.find("program stderr"), std::string::npos);
      gpuheap::test::CmdRun check = gpuheap::test::run_cmd(kBuild + "/gpuheap check --max-leaked 1G " + r.traces[0] +
                                                           " 2>&1");
      EXPECT_EQ(check.status, 0) << check.out;
      std::printf("[figure] stdio closed: %s", result[1].c_str());
    }
    remove_tree(files);
    remove_tree(r.dir);
  }
  EXPECT_EQ(result[1], result[0]);
  EXPECT_NE(result[0].find("fds=0,1,2 stderr_write=-1/9"), std::string::npos) << result[0];
}

TEST(Reliability, FewEventsHoldLittleDisk) {
  // A process that records one allocation holds the disk its trace needs while it runs
  // (two small windows), not the 8 MiB of two full windows.
  std::string files = make_dir();
  ProgResult r = run("prog_harm", {"disk", files, "1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  long held = value(r.out, "trace_alloc=");
  EXPECT_GT(held, 0) << r.out;
  EXPECT_LE(held, 256 << 10) << r.out;
  ASSERT_EQ(r.traces.size(), 1u);
  expect_readable(scan(r.traces[0]), "one allocation");
  std::printf("[figure] disk held by the trace of a 1-allocation process while it runs: %ld bytes (%s)\n", held,
              r.out.substr(0, r.out.find('\n')).c_str());
  remove_tree(files);
  remove_tree(r.dir);
}

TEST(Reliability, SmallFilesystemKeepsRoomForTheJob) {
  // The case on a real 10 MiB tmpfs: one allocation, then a 6 MiB checkpoint on the
  // same filesystem as the trace. Needs mount(2) (root); skipped where it is not allowed.
  std::string mnt = make_dir();
  if (system(("mount -t tmpfs -o size=10m tmpfs " + mnt + " 2>/dev/null").c_str()) != 0) {
    rmdir(mnt.c_str());
    GTEST_SKIP() << "cannot mount a tmpfs here; FewEventsHoldLittleDisk measures the same";
  }
  Opts base;
  base.args = {"disk", mnt, "6"};
  base.preload = false;
  base.out_dir = mnt;
  ProgResult b = run("prog_harm", base);
  EXPECT_EQ(b.status, 0) << b.out;
  unlink((mnt + "/ckpt").c_str());
  Opts o = base;
  o.preload = true;
  ProgResult r = run("prog_harm", o);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ckpt=ok"), std::string::npos) << r.out;
  EXPECT_EQ(count_warnings(r.err), 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  expect_readable(scan(r.traces[0]), "10 MiB tmpfs");
  std::printf("[figure] 10 MiB tmpfs, 1 allocation + 6 MiB checkpoint: %s", r.out.c_str());
  EXPECT_EQ(system(("umount " + mnt).c_str()), 0);
  rmdir(mnt.c_str());
}
