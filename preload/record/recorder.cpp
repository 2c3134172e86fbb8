// Recorder glue: configuration, the trace file's lifecycle (start, stop, fork, exit,
// fatal signals) and the record entry points. Buffering/writing lives in sink.cpp,
// stacks in unwind.cpp, loaded objects in modules.cpp, the path rules in outpath.cpp.
#include "preload/record/recorder.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string_view>

#include "preload/core/fds.h"
#include "preload/core/fork.h"
#include "preload/core/stderr_line.h"
#include "preload/record/modules.h"
#include "preload/record/outpath.h"
#include "preload/record/pystack.h"
#include "preload/record/scratch.h"
#include "preload/record/signals.h"
#include "preload/record/sink.h"
#include "preload/record/stackcache.h"
#include "preload/record/unwind.h"

#ifndef GPUHEAP_VERSION
#define GPUHEAP_VERSION "dev"
#endif

namespace gpuheap {
namespace preload {
namespace {

constexpr int kMaxTrackedDevices = 1024;

constinit RecorderConfig g_cfg;
constinit pthread_mutex_t g_ctl_mu = PTHREAD_MUTEX_INITIALIZER;  // start/stop/child activation
constinit pthread_mutex_t g_dev_mu = PTHREAD_MUTEX_INITIALIZER;
constinit std::atomic<std::uint64_t> g_dev_bits[kMaxTrackedDevices / 64];  // announced in this file
constinit std::atomic<DeviceInfoFn> g_devinfo{nullptr};
constinit std::atomic<std::uint32_t> g_file_gen{1};  // bumps per file: threads re-announce themselves
constinit bool g_hooks_registered = false;           // atexit/atfork, once per process (g_ctl_mu)
thread_local std::uint32_t t_tid __attribute__((tls_model("initial-exec"))) = 0;
thread_local std::uint32_t t_thread_gen __attribute__((tls_model("initial-exec"))) = 0;

// Copies what the recorder needs from the settings read at load (options.h): the
// environment is not read again, neither for a later file nor at fork (getenv is not safe
// against another thread's setenv).
void configure(const Settings& s) {
  g_cfg.stacks = s.stacks;
  g_cfg.max_depth = s.stack_depth;
  g_cfg.flush_ns = s.flush_ns;
  g_cfg.output = s.output;
  g_cfg.quiet = s.quiet;
  g_cfg.follow_fork = s.follow_fork;
  snprintf(g_cfg.path_file, sizeof g_cfg.path_file, "%s", s.path_file);
  g_cfg.have_identity = s.have_identity, g_cfg.identity = s.identity;
  sink_set_aggregate(s.aggregate);
  stacks_configure(g_cfg.stacks, g_cfg.max_depth, s.python_stacks);
  stackcache_enable(s.stack_cache);
  pystack_cache_enable(s.stack_cache);
}

void warn_errno(const char* what, const char* path, int err) {
  char msg[4400];
  snprintf(msg, sizeof msg, "%s %s: %s; tracing disabled, the program continues", what, path, strerror(err));
  sink_warn_once(msg);
}

// Reads a whole small /proc file into buf; returns its length.
std::size_t read_proc(const char* path, char* buf, std::size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  close(fd);
  return n;
}

// The encoded `process` record of the calling process as it is now (malloc'd; nullptr when
// out of memory: the file then starts with its modules, as a cut trace would).
unsigned char* encode_process_record(const char* host, std::size_t* len) {
  constexpr std::size_t kCmdCap = 64 << 10;
  char* cmd = static_cast<char*>(malloc(kCmdCap));
  char exe[4096];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[k > 0 ? k : 0] = '\0';
  std::size_t cmd_len = cmd ? read_proc("/proc/self/cmdline", cmd, kCmdCap) : 0;
  while (cmd_len > 0 && cmd[cmd_len - 1] == '\0') --cmd_len;  // '\0' separates, not ends
  timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  format::ProcessRecord r;
  r.pid = static_cast<std::uint32_t>(getpid()), r.ppid = static_cast<std::uint32_t>(getppid());
  r.wall_ns = static_cast<std::uint64_t>(wall.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(wall.tv_nsec);
  r.mono_ns = now_ns();
  r.hostname = host, r.cmdline = std::string_view(cmd ? cmd : "", cmd_len);
  r.version = GPUHEAP_VERSION, r.exe = exe;
  std::size_t cap = 64 + strlen(host) + cmd_len + strlen(GPUHEAP_VERSION) + strlen(exe);
  auto* buf = static_cast<unsigned char*>(malloc(cap));
  *len = buf ? format::encode(buf, cap, r) : 0;
  free(cmd);
  if (*len == 0) free(buf);
  return *len ? buf : nullptr;
}

// The file is created at the process's first event (open_file_locked), not when tracing
// starts: processes that never record one (compiler subprocesses, DataLoader workers,
// wrappers that only exec) must leave no file behind. What an eager open would have
// written is worked out at start, so the trace is the same: the path resolved against the
// working directory of that moment, and the `process` record with the start time and the
// command line as they were then. A forked child prepares its own at its first event, as
// before. Under g_ctl_mu.
struct Opening {
  long pid = 0;                      // the process this was prepared for
  bool path_ok = false;              // false: GPUHEAP_OUTPUT expands to a path that is too long
  char path[4096] = {};              // absolute unless getcwd failed
  unsigned char* process = nullptr;  // encoded `process` record (malloc'd) or nullptr
  std::size_t process_len = 0;
  unsigned char identity[32] = {};  // encoded `identity` record, written right after `process`
  std::size_t identity_len = 0;     // 0: the launcher named no rank
};
constinit Opening g_open;
constinit std::atomic<bool> g_have_file{false};  // this tracing session created its file

void prepare_open_locked() {
  free(g_open.process);
  g_open.process = nullptr, g_open.process_len = 0;
  g_open.pid = getpid();
  char host[256], prog[256], rel[4096];
  common::OutpathVars vars;
  current_outpath_vars(&vars, host, sizeof host, prog, sizeof prog);
  g_open.path_ok = common::expand_output_pattern(g_cfg.output, vars, rel, sizeof rel) >= 0;
  if (g_open.path_ok) {
    snprintf(g_open.path, sizeof g_open.path, "%s", rel);
    // Absolute path, so `gpuheap run` (another cwd) can find the file.
    char cwd[2048];
    const char* r = strncmp(rel, "./", 2) == 0 ? rel + 2 : rel;
    if (rel[0] != '/' && getcwd(cwd, sizeof cwd) &&
        snprintf(g_open.path, sizeof g_open.path, "%s/%s", cwd, r) >= static_cast<int>(sizeof g_open.path)) {
      snprintf(g_open.path, sizeof g_open.path, "%s", rel);
    }
  }
  g_open.process = encode_process_record(host, &g_open.process_len);
  g_open.identity_len = g_cfg.have_identity ? format::encode(g_open.identity, sizeof g_open.identity, g_cfg.identity)
                                            : 0;
}

void announce_path(const char* path) {
  char line[4200];  // a path with many escapes is cut: hooks run on the user's (small) stacks
  if (!g_cfg.quiet) {
    std::size_t n = append_escaped(line, sizeof line - 1, 0, "gpuheap: tracing to ");
    n = append_escaped(line, sizeof line - 1, n, path);  // one line, whatever the path holds
    line[n++] = '\n';
    write_stderr(line, n);
  }
  // `gpuheap run` learns every traced process's file from this list (one line each, a
  // newline in the path written `\n`; never created or followed here: outpath.h).
  append_to_path_file(g_cfg.path_file, "", path);
}

// Tracing failed (the warning sink_warn_once printed): `gpuheap run` reports it last and
// fails unless --allow-no-trace, so a trace that could not be written cannot pass as a
// job without GPU work. The line is "!PID MESSAGE". May run in a signal handler (the sink
// fails on the `end` record of a crash): no snprintf.
void on_tracing_failed(const char* msg) noexcept {
  char head[32] = "!";
  char digits[24];
  int nd = 0;
  for (unsigned long v = static_cast<unsigned long>(getpid()); nd == 0 || v; v /= 10)
    digits[nd++] = static_cast<char>('0' + v % 10);
  int n = 1;
  while (nd) head[n++] = digits[--nd];
  head[n++] = ' ';
  head[n] = '\0';
  append_to_path_file(g_cfg.path_file, head, msg);
}

// Creates the file for this process and writes the opening records; called at the first
// event (ensure_active). g_ctl_mu held.
bool open_file_locked() {
  if (g_open.pid != getpid()) prepare_open_locked();  // a forked child: its own pid, clocks, path
  if (!g_open.path_ok) {
    sink_set_state(SinkState::failed);
    sink_warn_once("GPUHEAP_OUTPUT expands to a path that is too long; tracing disabled");
    return false;
  }
  if (const char* kind = special_file_kind(g_open.path)) {
    sink_set_state(SinkState::failed);
    char msg[4400];
    snprintf(msg, sizeof msg,
             "GPUHEAP_OUTPUT names %s, which is %s, not a regular file: no trace is written "
             "(tracing disabled), the program continues",
             g_open.path, kind);
    sink_warn_once(msg);
    return false;
  }
  char path[4096];
  int fd = create_trace_file(g_open.path, path, sizeof path);
  if (fd < 0) {
    sink_set_state(SinkState::failed);
    warn_errno("cannot create trace file", path, -fd);
    return false;
  }
  unsigned char header[format::kFileHeaderSize];
  format::encode_file_header(header);
  // Under an RLIMIT_FSIZE below a page the write would get the process SIGXFSZ (default:
  // killed, by us); the sink checks each window the same way (sink.cpp, map_window).
  rlimit rl{};
  bool too_big = getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                 rl.rlim_cur < static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
  errno = 0;
  if (too_big || write(fd, header, sizeof header) != static_cast<ssize_t>(sizeof header)) {
    int err = too_big ? EFBIG : errno ? errno : ENOSPC;
    close(fd);
    unlink(path);  // holds nothing (at most part of the header)
    sink_set_state(SinkState::failed);
    warn_errno("cannot write trace file", path, err);
    return false;
  }
  stacks_reset();
  modules_reset();
  for (auto& b : g_dev_bits) b.store(0);
  g_file_gen.fetch_add(1);
  // State `opening` until sink_publish: the records below come first in the file.
  sink_open(fd, path, g_cfg.flush_ns, sizeof header);
  if (sink_state() != SinkState::opening) {  // no space even for the first window: warned
    sink_publish();
    unlink(path);  // holds nothing but the header
    return false;
  }
  g_have_file.store(true);
  if (g_open.process) sink_append(g_open.process, g_open.process_len, /*start_thread=*/false);
  // Only after a `process` record: readers take the file's first record to be one.
  if (g_open.process && g_open.identity_len) sink_append(g_open.identity, g_open.identity_len, /*start_thread=*/false);
  free(g_open.process);
  g_open.process = nullptr, g_open.process_len = 0;
  // The modules loaded now, also those dlopen'ed since the start (frames of the first
  // event's stack need them; later ones are added before each new stack, unwind.cpp).
  modules_sync();
  // Already in the file: a process that ends in _exit(2) (a forked worker, Python's
  // os._exit) runs no exit handler, and its file must still start with `process`.
  sink_publish();
  // Now there is a trace to close on SIGINT, SIGHUP, SIGUSR1, ... (signals.h).
  signals_install_default_only();
  announce_path(path);
  return sink_state() == SinkState::active;
}

void activate_deep(void*, bool) {
  pthread_mutex_lock(&g_ctl_mu);
  if (sink_state() == SinkState::pending) open_file_locked();
  pthread_mutex_unlock(&g_ctl_mu);
}

// Creating the trace (its path, the `process` record, the modules) takes several KiB of
// stack: through run_deep (scratch.h). Refused (no room, no scratch stack): this event is
// dropped and a later one creates the file.
bool activate() {
  run_deep(activate_deep, nullptr);
  return sink_state() == SinkState::active;
}

// Fast path: one atomic load. The first event of a process (or of a forked child) creates
// its file; a thread that arrives while another is creating it waits for it (g_ctl_mu).
inline bool ensure_active(bool count_drop) {
  SinkState s = sink_state();
  if (s == SinkState::active) [[likely]]
    return true;
  if ((s == SinkState::pending || s == SinkState::opening) && activate()) return true;
  if (count_drop) sink_count_dropped();
  return false;
}

void announce_thread() {
  std::uint32_t gen = g_file_gen.load(std::memory_order_relaxed);
  if (t_thread_gen == gen) return;
  t_thread_gen = gen;
  char name[64] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  unsigned char buf[format::kMaxEventRecordSize + 64];
  std::size_t n = format::encode(buf, sizeof buf, format::ThreadRecord{current_tid(), name});
  if (n) sink_append(buf, n);
}

template <class R, class... Extra>
void emit(const R& r, Extra... extra) {
  unsigned char buf[format::kMaxEventRecordSize];
  std::size_t n = format::encode(buf, sizeof buf, r, extra...);
  if (n) sink_append(buf, n);
}

void on_fatal_signal(int, bool terminating) noexcept { sink_emergency_flush(terminating); }

void at_exit() { recorder_stop(format::EndReason::exit); }

// The recorder's own locks; stacks, modules and the sink have their own ranks (fork.h).
void fork_prepare() noexcept {
  pthread_mutex_lock(&g_ctl_mu);
  pthread_mutex_lock(&g_dev_mu);
}
void fork_parent() noexcept {
  pthread_mutex_unlock(&g_dev_mu);
  pthread_mutex_unlock(&g_ctl_mu);
}
// Runs after the sink's, stacks' and modules' child handlers (fork.h); those leave the
// sink's state alone, so it still says whether the parent was tracing.
void fork_child() noexcept {
  // One thread, ours: locks are re-initialised rather than trusted.
  pthread_mutex_init(&g_ctl_mu, nullptr);
  pthread_mutex_init(&g_dev_mu, nullptr);
  t_tid = 0;  // the TLS copy holds the parent's tid
  SinkState s = sink_state();
  for (auto& b : g_dev_bits) b.store(0);
  g_file_gen.fetch_add(1);
  g_have_file.store(false);
  bool follow = g_cfg.follow_fork;
  bool tracing = s == SinkState::active || s == SinkState::pending;
  // Like the parent at its start: the child's file is created at its first event.
  sink_set_state(tracing && follow ? SinkState::pending : SinkState::off);
}

}  // namespace

std::uint64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint32_t current_tid() noexcept {
  if (t_tid == 0) [[unlikely]]
    t_tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  return t_tid;
}

bool recorder_start(const Settings& settings) noexcept {
  pthread_mutex_lock(&g_ctl_mu);
  SinkState s = sink_state();
  bool ok = s == SinkState::active || s == SinkState::pending;
  if (!ok) {
    if (getauxval(AT_SECURE) != 0) {  // setuid/setgid: never write files on its behalf
      sink_set_state(SinkState::off);
    } else {
      {
        // libunwind opens its validation pipe when stacks_configure first initialises it:
        // in a job started with stdio closed it would take fds 0 and 1 (core/fds.h).
        StdioPlaceholders hold;
        configure(settings);
      }
      if (!g_hooks_registered) {
        g_hooks_registered = true;
        fork_set(ForkRank::recorder, {fork_prepare, fork_parent, fork_child});
        fork_set(ForkRank::stacks, {stacks_fork_prepare, stacks_fork_parent, stacks_fork_child});
        fork_set(ForkRank::modules, {modules_fork_prepare, modules_fork_parent, modules_fork_child});
        fork_set(ForkRank::sink, {sink_fork_prepare, sink_fork_parent, sink_fork_child});
        atexit(at_exit);
        // quick_exit(3) skips atexit handlers but runs these: flush there too.
        at_quick_exit(at_exit);
      }
      signals_install(on_fatal_signal);
      sink_set_failure_listener(on_tracing_failed);
      sink_reset_warning();
      prepare_open_locked();
      g_have_file.store(false);
      sink_set_state(SinkState::pending);  // the file comes with the first event
      ok = true;
    }
  }
  pthread_mutex_unlock(&g_ctl_mu);
  return ok;
}

bool recorder_active() noexcept {
  SinkState s = sink_state();
  return s == SinkState::active || s == SinkState::pending || s == SinkState::opening;
}

void recorder_stop(format::EndReason reason) noexcept {
  pthread_mutex_lock(&g_ctl_mu);
  SinkState s = sink_state();
  if (s == SinkState::pending) sink_set_state(SinkState::stopped);  // no event: no file
  else if (s == SinkState::active || s == SinkState::failed) sink_close(reason);
  pthread_mutex_unlock(&g_ctl_mu);
}

void recorder_end_at_exit() noexcept { sink_emergency_flush(true, format::EndReason::exit); }
bool recorder_end_before_exec() noexcept { return sink_end_before_exec(); }
void recorder_resume_after_exec() noexcept { sink_resume_after_exec(); }

void recorder_flush() noexcept { sink_flush(); }

const char* recorder_path() noexcept { return g_have_file.load() ? sink_path() : ""; }

__attribute__((noinline)) std::uint32_t capture_stack(int skip) noexcept {
  if (!stacks_enabled() || !ensure_active(false)) return 0;
  std::uint32_t id = stacks_capture(skip + 1);  // + this frame
  asm volatile("" ::: "memory");                // not a tail call: keep this frame counted
  return id;
}

namespace {
// Out of line: its buffers (~700 bytes) stay off the stack of every later event.
__attribute__((noinline)) void announce_device(int device, bool tracked, std::atomic<std::uint64_t>& word,
                                               std::uint64_t bit) {
  pthread_mutex_lock(&g_dev_mu);
  if (!tracked || !(word.load(std::memory_order_relaxed) & bit)) {
    char name[256] = {};
    std::uint64_t total = 0;
    DeviceInfoFn fn = g_devinfo.load();
    if (!fn || !fn(device, name, sizeof name, &total)) {
      snprintf(name, sizeof name, "unknown");
      total = 0;
    }
    name[sizeof name - 1] = '\0';
    unsigned char buf[format::kMaxEventRecordSize + sizeof name];
    std::size_t n = format::encode(buf, sizeof buf, format::DeviceRecord{device, total, name});
    // Published only after the record is in the buffer: whoever sees the bit appends later.
    if (n && sink_append(buf, n) && tracked) word.fetch_or(bit, std::memory_order_release);
  }
  pthread_mutex_unlock(&g_dev_mu);
}
}  // namespace

void ensure_device(int device) noexcept {
  if (!ensure_active(false)) return;
  bool tracked = device >= 0 && device < kMaxTrackedDevices;
  auto bit = tracked ? 1ull << (device % 64) : 0;
  auto& word = g_dev_bits[tracked ? device / 64 : 0];
  if (tracked && (word.load(std::memory_order_acquire) & bit)) return;
  announce_device(device, tracked, word, bit);
}

// Loading a library is not an event: before the first one there is no file, and its
// opening records list every module loaded by then.
void note_modules_changed() noexcept {
  if (sink_state() == SinkState::active) modules_sync();
}

void record(const format::AllocRecord& r) noexcept {
  if (!ensure_active(true)) return;
  announce_thread();
  sink_append_event(r);
}
void record(const format::FreeRecord& r) noexcept {
  if (!ensure_active(true)) return;
  announce_thread();
  sink_append_event(r);
}
void record(const format::OomRecord& r) noexcept {
  if (!ensure_active(true)) return;
  announce_thread();
  emit(r);
}
void record(const format::FreeCompletedRecord& r) noexcept {
  if (ensure_active(true)) sink_append_event(r);
}
void record(const format::SegmentRecord& r, bool is_free) noexcept {
  if (ensure_active(true)) sink_append_event(r, is_free);
}
void record(const format::RetryRecord& r) noexcept {
  if (ensure_active(true)) emit(r);
}
void record(const format::EmptyCacheRecord& r) noexcept {
  if (ensure_active(true)) emit(r);
}

void record_phase(format::PhaseOp op, format::PhaseSource source, const char* name, std::size_t max_len) noexcept {
  if (!ensure_active(true)) return;
  announce_thread();
  std::size_t n = 0;
  if (name) {
    n = strnlen(name, std::min<std::size_t>(max_len, format::kMaxPhaseName));
  }
  unsigned char buf[format::kMaxEventRecordSize + format::kMaxPhaseName];
  std::size_t size = format::encode(buf, sizeof buf,
                                    format::PhaseRecord{now_ns(), current_tid(), op, source,
                                                        std::string_view(name ? name : "", n)});
  if (size) sink_append(buf, size);
}

void set_device_info_fn(DeviceInfoFn fn) noexcept { g_devinfo.store(fn); }

RecorderCounters recorder_counters() noexcept {
  SinkCounters s = sink_counters();
  RecorderCounters c;
  c.records = s.records, c.bytes = s.bytes, c.dropped = s.dropped, c.stacks = stacks_count();
  c.producer_waits = s.producer_waits, c.writes = s.writes;
  return c;
}

}  // namespace preload
}  // namespace gpuheap
