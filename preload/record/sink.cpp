#include "preload/record/sink.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "preload/core/fds.h"
#include "preload/core/stderr_line.h"
#include "preload/record/aggregate.h"
#include "preload/record/recorder.h"
#include "preload/record/signals.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL (ignored)
#endif

namespace gpuheap {
namespace preload {
namespace {

// File windows grow with the file: the first is kFirstWindowBytes, each later one as long
// as the file before it, up to kWindowBytes (window_len). Disk space is allocated a window
// at a time, the current one and the next: a process that records a few events holds
// 128 KiB of disk, not 8 MiB (on a small filesystem or under a quota, times the ranks, the
// job's own writes met ENOSPC). A record longer than the next window gets a longer one.
constexpr std::uint64_t kFirstWindowBytes = 64u << 10;
constexpr std::uint64_t kWindowBytes = 4u << 20;
static_assert(kWindowBytes >= format::kMaxPayload + format::kFrameHeaderSize);

// File range [start, end) mapped at base (MAP_SHARED, space reserved first: reserve_space).
struct Window {
  unsigned char* base = nullptr;
  std::uint64_t start = 0, end = 0;
};

// Raw pthread objects: they are re-initialised in the fork child (a condvar copied while
// the parent's thread waited on it carries phantom waiters; glibc may block on them).
// Everything here is constant-initialised (constinit): runtime.cpp's constructor may call
// recorder_start() before this file's dynamic initialisers would have run.
struct Sink {
  // Adaptive mutex: spins briefly before sleeping; the critical section is a memcpy long.
  pthread_mutex_t mu = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;  // windows, offset, state
  pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;           // background thread: window used / exit
  pthread_cond_t started_cv = PTHREAD_COND_INITIALIZER;        // background thread: it is running
  bool thread_started = false;                                 // under mu
  Window cur, next;                                            // next: prepared ahead, starts at cur.end (or unmapped)
  std::uint64_t off = 0;  // file offset where the next record goes (= bytes in file)
  std::uint64_t flush_ns = 20'000'000;
  int fd = -1;
  FileId id;  // the trace file behind fd (fds.h): the program may close fd and reuse its number
  char path[4096] = {};
  bool thread_running = false, exit_thread = false;
  pthread_t thread{};
  std::uint64_t records = 0, inline_maps = 0, windows = 0;  // under mu
  // Only where fallocate(2) is not supported (reserve_space): the file is zero-filled by
  // hand, under alloc_mu, never below zeroed_upto (space that may already hold records).
  pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;
  std::uint64_t zeroed_upto = 0;
  // mmap offsets and fallocate granularity: the kernel's page size, read at open (4 KiB on
  // x86-64, but 16/64 KiB on some aarch64 kernels, where a 4 KiB-aligned window offset is
  // EINVAL). kFirstWindowBytes is a multiple of every page size Linux uses.
  std::uint64_t page = 4096;
  // The process that opened this file (sink_open), by the kernel's pid: a vfork child shares
  // this memory with its parent but has its own pid, and must never end the parent's trace.
  std::atomic<long> owner{0};   // read without the lock by the ending paths
  std::uint64_t exec_mark = 0;  // g.off before the `end` written for an exec (sink_end_before_exec)
  // The background thread is allocating and mapping the next window outside the lock: an
  // fallocate landing after the cut that follows `end` would leave zeros past it.
  std::atomic<bool> preparing{false};
  std::uint64_t cuts = 0;  // files cut for an exec: a window prepared before one is stale
  // What the compact event records written so far leave for the next (format/compact.h):
  // encoded under mu, so the state follows the file order. Fresh with each file.
  format::CompactState compact;
  // Rolling window (GPUHEAP_AGGREGATE, aggregate.h): when the events after the head (the
  // copied tables and the snapshot) reach roll_budget bytes, the file is replaced by a new
  // segment (roll_locked). 0: one whole trace. Set before the file opens (sink_set_aggregate).
  std::uint64_t roll_budget = 0, head_len = 0;
  std::uint32_t segments = 0;  // rolls so far
  bool roll_off = false;       // rolling gave up (warned once): the trace grows as a full one
  // The replaced segment's descriptor, for the background thread to close (retire_fd_locked).
  int retired_fd = -1;
  FileId retired_id;
};

constinit Sink g;

// Copies s into buf from `at` on, leaving room for the terminating NUL (written); returns
// the new end. For messages built where snprintf is not allowed (signal handlers).
std::size_t append_cstr(char* buf, std::size_t cap, std::size_t at, const char* s) noexcept {
  while (*s && at + 1 < cap) buf[at++] = *s++;
  if (at < cap) buf[at] = 0;
  return at;
}
constinit std::atomic<int> g_state{static_cast<int>(SinkState::off)};
constinit std::atomic<std::uint64_t> g_dropped{0};
constinit std::atomic<bool> g_warned{false};
constinit std::atomic<SinkFailureFn> g_failure_fn{nullptr};  // recorder.cpp: the run's path list
constinit pthread_once_t g_cond_once = PTHREAD_ONCE_INIT;
// Whether this thread holds the sink lock: the signal handler must not wait for itself.
thread_local bool t_holds __attribute__((tls_model("initial-exec"))) = false;
// Whether this thread opened the file and is writing its opening records (state `opening`).
thread_local bool t_opener __attribute__((tls_model("initial-exec"))) = false;

void init_cond() noexcept {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g.work_cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&g.started_cv, nullptr);
}

void lock() noexcept { pthread_mutex_lock(&g.mu), t_holds = true; }
// The pid as the kernel has it (no cache can hold the parent's in a vfork child).
long kernel_pid() noexcept { return syscall(SYS_getpid); }
void unlock() noexcept { t_holds = false, pthread_mutex_unlock(&g.mu); }

SinkState state() noexcept { return static_cast<SinkState>(g_state.load(std::memory_order_acquire)); }
void set_state(SinkState s) noexcept { g_state.store(static_cast<int>(s), std::memory_order_release); }
// Whether an append from this thread goes in: anyone's while active, only the opener's while
// the opening records are written.
bool accepting(SinkState s) noexcept { return s == SinkState::active || (s == SinkState::opening && t_opener); }

// The trace file's descriptor, checked before every use (mapping a window, ftruncate, close):
// the program may have closed it (closerange(3, ~0U), a daemon library closing every fd) and
// may have opened its own file at the same number; gpuheap must never write, truncate or
// close that file. Windows already mapped stay valid without the descriptor, so records keep
// going into the trace; for the next window the file is reopened by its path (O_NOFOLLOW,
// and only if it is still the same file). -1: the trace file cannot be reached any more.
// mu held (or the only thread: fork child, signal path with mu try-locked).
int own_fd_locked() noexcept {
  if (g.fd >= 0 && fd_is(g.fd, g.id)) return g.fd;
  g.fd = -1;  // not ours any more: forgotten, never closed
  if (!g.id.known || !g.path[0]) return -1;
  int fd = fd_above_stdio(open(g.path, O_RDWR | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
  if (fd >= 0 && !fd_is(fd, g.id)) {  // renamed, replaced: another file now has the name
    close(fd);
    fd = -1;
  }
  return g.fd = fd;
}

// Gives [start, start+len) disk blocks. fallocate(2) itself, not posix_fallocate: where the
// filesystem lacks it (NFSv3, some FUSE) glibc's posix_fallocate emulates it by writing a
// zero byte into each block, and the appender and the background thread may reserve the same
// window at once, so that emulation could zero bytes of records already copied there. The
// fallback here writes zeros only past zeroed_upto, which is past every window handed out.
// 0 or errno.
int reserve_space(int fd, std::uint64_t start, std::uint64_t len) noexcept {
  int rc;
  do {
    rc = fallocate(fd, 0, static_cast<off_t>(start), static_cast<off_t>(len)) == 0 ? 0 : errno;
  } while (rc == EINTR);
  if (rc != EOPNOTSUPP && rc != ENOSYS) return rc;
  pthread_mutex_lock(&g.alloc_mu);
  std::uint64_t end = start + len, from = start > g.zeroed_upto ? start : g.zeroed_upto;
  rc = 0;
  static const char zero = 0;
  // The last byte of each page-sized block from `from` on; the file grows as it goes, so a
  // failure (ENOSPC) leaves [.., the last block written) allocated and zeroed_upto below it.
  for (std::uint64_t b = from; b < end && rc == 0; b += g.page) {
    std::uint64_t at = (b | (g.page - 1)) < end ? (b | (g.page - 1)) : end - 1;
    ssize_t n;
    do n = pwrite(fd, &zero, 1, static_cast<off_t>(at));
    while (n < 0 && errno == EINTR);
    if (n == 1) g.zeroed_upto = at + 1;
    else rc = n < 0 ? errno : EIO;
  }
  pthread_mutex_unlock(&g.alloc_mu);
  return rc;
}

// The length of the window at `start` (a multiple of the page size): as long as the file
// before it, at least kFirstWindowBytes, at most kWindowBytes, and never shorter than
// `min_len` (a record that does not fit the rest of the current window).
std::uint64_t window_len(std::uint64_t start, std::uint64_t min_len) noexcept {
  std::uint64_t len = start < kFirstWindowBytes ? kFirstWindowBytes : start < kWindowBytes ? start : kWindowBytes;
  // A rolling window's file stays near its budget on disk too: its tail is never preallocated
  // much beyond it.
  if (g.roll_budget && !g.roll_off && len > g.roll_budget / 4)
    len = g.roll_budget / 4 < kFirstWindowBytes ? kFirstWindowBytes : g.roll_budget / 4;
  len = (len + g.page - 1) & ~(g.page - 1);
  std::uint64_t need = (min_len + g.page - 1) & ~(g.page - 1);
  return len < need ? need : len;
}

// Allocates and maps the file range starting at `start`: window_len, less where
// RLIMIT_FSIZE or a full disk leave less (halved down to a page or min_len, so the trace
// uses the space there is). Space is allocated before it is mapped: a store into a mapped
// page that has no disk block behind it would be a SIGBUS in the user's program. 0 or errno
// (EBADF: fd is no longer the trace file).
//
// RLIMIT_FSIZE is read here, for every window: a program may lower it while it runs
// (setrlimit), and an fallocate past the current limit is answered with SIGXFSZ, whose
// default action kills the process.
int map_window(int fd, std::uint64_t start, std::uint64_t min_len, bool populate, Window* w) noexcept {
  std::uint64_t len = window_len(start, min_len);
  std::uint64_t floor = (min_len + g.page - 1) & ~(g.page - 1);  // the record must fit
  if (floor < g.page) floor = g.page;
  rlimit rl{};
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    std::uint64_t limit = rl.rlim_cur;
    // Checked here rather than left to the kernel, which would also send SIGXFSZ.
    if (start + floor > limit) return EFBIG;
    if (limit - start < len) len = (limit - start) & ~(g.page - 1);
  }
  // Checked again right before the descriptor is used: the background thread maps without
  // the lock (own_fd_locked checked it under the lock).
  if (!fd_is(fd, g.id)) return EBADF;
  for (;;) {
    int rc = reserve_space(fd, start, len);
    if (rc == 0) break;
    if ((rc != ENOSPC && rc != EFBIG) || len <= floor) return rc;
    len = (len / 2) & ~(g.page - 1);
    if (len < floor) len = floor;
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) return errno;
  // Forked children never write the parent's file: they do not inherit the mapping.
  madvise(p, len, MADV_DONTFORK);
  // Page-cache pages and page-table entries now, off the append path (which holds the lock).
  if (populate) madvise(p, len, MADV_POPULATE_WRITE);
  w->base = static_cast<unsigned char*>(p), w->start = start, w->end = start + len;
  return 0;
}

// The errors a trace file can meet, as strerror words them in the C locale; others by number.
const char* errno_text(int err, char* buf, std::size_t cap) noexcept {
  switch (err) {
    case ENOSPC: return "No space left on device";
    case EFBIG: return "File too large";
    case EDQUOT: return "Disk quota exceeded";
    case EIO: return "Input/output error";
    case EROFS: return "Read-only file system";
    case ENOMEM: return "Cannot allocate memory";
    case EINVAL: return "Invalid argument";
    case EBADF: return "Bad file descriptor";
    case EACCES: return "Permission denied";
    case ENODEV: return "No such device";
    case EOPNOTSUPP: return "Operation not supported";
    default: break;
  }
  char digits[16];
  int n = 0;
  unsigned v = err < 0 ? 0u - static_cast<unsigned>(err) : static_cast<unsigned>(err);
  do digits[n++] = static_cast<char>('0' + v % 10), v /= 10;
  while (v && n < 16);
  std::size_t at = append_cstr(buf, cap, 0, "errno ");
  while (n && at + 1 < cap) buf[at++] = digits[--n];
  buf[at < cap ? at : cap - 1] = 0;
  return buf;
}

void unmap(Window* w) noexcept {
  if (w->base) munmap(w->base, w->end - w->start);
  *w = Window{};
}

// Gives up on this file: the data written so far stays, the unused allocated tail goes,
// later appends are dropped. The fd stays open until sink_close (the background thread may
// be allocating with it). mu held. `why` replaces the errno's text.
void fail_locked(int err, const char* why = nullptr) noexcept {
  set_state(SinkState::failed);
  unmap(&g.cur), unmap(&g.next);
  int fd = own_fd_locked();
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(g.off)) != 0) { /* the zero tail reads as a cut */
  }
  // May run inside a signal handler (the end record of a crash): no snprintf, no strerror
  // (locale, malloc), and no strerrordesc_np (glibc >= 2.32 only).
  char msg[4300];
  char num[24];
  const char* parts[] = {"writing trace ", g.path, " failed (", why ? why : errno_text(err, num, sizeof num),
                         "); tracing stopped, the program continues"};
  std::size_t at = 0;
  for (const char* part : parts) at = append_cstr(msg, sizeof msg, at, part);
  sink_warn_once(msg);
}

// Closes a retired descriptor if it is still the file it was (the program may have closed the
// number and opened its own there).
void close_retired_locked() noexcept {
  if (g.retired_fd >= 0 && fd_is(g.retired_fd, g.retired_id)) close(g.retired_fd);
  g.retired_fd = -1;
}

// A descriptor of a file the trace no longer writes (a replaced segment): the background
// thread closes it outside the lock; without one it is closed here. mu held.
void retire_fd_locked(int fd, FileId id) noexcept {
  close_retired_locked();  // one left from a roll before (the thread not run since): now
  if (!g.thread_running) {
    close(fd);
    return;
  }
  g.retired_fd = fd, g.retired_id = id;
  pthread_cond_signal(&g.work_cv);
}

// Copies one frame at g.off, which may run from cur into next. The type byte goes last:
// a process killed mid-copy leaves a zero type byte there, which readers take for the end
// of the data (a cut trace), never a half-written record.
void copy_frame(const unsigned char* rec, std::size_t n) noexcept {
  std::uint64_t in_cur = g.cur.end - g.off < n ? g.cur.end - g.off : n;
  unsigned char* dst = g.cur.base + (g.off - g.cur.start);
  if (in_cur < n) std::memcpy(g.next.base, rec + in_cur, n - in_cur);
  std::memcpy(dst + 1, rec + 1, in_cur - 1);
  asm volatile("" ::: "memory");  // keep the type byte's store after the rest
  dst[0] = rec[0];
}

// cur is used up: next (already mapped) takes its place. mu held; nobody else can be
// copying into cur, so it is unmapped here (every 4 MiB, short).
void rotate_locked() noexcept {
  Window old = g.cur;
  g.cur = g.next, g.next = Window{};
  pthread_cond_signal(&g.work_cv);  // prepare the one after
  unmap(&old);
}

bool append_locked(const void* rec, std::size_t n) noexcept {
  if (!accepting(state())) return false;
  if (g.off + n > g.cur.end) {
    std::uint64_t beyond = g.off + n - g.cur.end;                           // what goes into next
    if (g.next.base && g.next.end - g.next.start < beyond) unmap(&g.next);  // a longer one, below
    if (!g.next.base) {
      // The background thread has not prepared it (not yet run, or starved): do it here.
      int fd = own_fd_locked();
      int err = fd < 0 ? EBADF : map_window(fd, g.cur.end, beyond, false, &g.next);
      if (err) {
        fail_locked(err, err == EBADF ? "its descriptor was closed by the program and the file is gone" : nullptr);
        return false;
      }
      ++g.inline_maps, ++g.windows;
    }
    if (g.off + n > g.next.end) {  // a shrunken window near a full disk
      fail_locked(ENOSPC);
      return false;
    }
    if (g.off >= g.cur.end) rotate_locked();
  }
  copy_frame(static_cast<const unsigned char*>(rec), n);
  g.off += n;
  ++g.records;
  if (g.off >= g.cur.end && g.next.base) rotate_locked();  // the frame ran into next
  return true;
}

// Before the file is cut after `end` by a process about to go (_exit, a fatal signal, an
// exec), mu held: the background thread's window in preparation must be allocated first, or
// its fallocate could land after the cut. Bounded (the thread may be starved); nanosleep and
// atomics only, async-signal-safe.
void wait_for_preparation() noexcept {
  for (int i = 0; i < 200 && g.preparing.load(); ++i) {
    timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
  }
}

// Background thread: keeps the next window prepared (so appends rarely make a system
// call) and re-arms the fatal-signal handlers every flush interval (signals.h). It is
// never needed for a record to reach the file: appends copy straight into the file's pages.
void* thread_main(void*) {
  lock();
  g.thread_started = true;
  pthread_cond_signal(&g.started_cv);
  bool backoff = false;  // preparing failed: retry after a tick, not at once
  while (!g.exit_thread) {
    if (!backoff && !g.next.base && g.cur.base && state() == SinkState::active) {
      std::uint64_t start = g.cur.end;
      int fd = own_fd_locked();
      if (fd < 0) {  // the appender that needs the window reports it
        backoff = true;
        continue;
      }
      std::uint64_t cuts = g.cuts;
      g.preparing.store(true);
      unlock();
      Window w;
      int err = map_window(fd, start, 0, false, &w);
      g.preparing.store(false);  // allocated: a cut from now on stays (populating cannot undo it)
      // Populated here, not inside map_window: a process ending meanwhile waits for the
      // allocation only (wait_for_preparation). Past a cut, populating fails with EFAULT
      // instead of a SIGBUS (madvise(2)).
      if (!err) madvise(w.base, w.end - w.start, MADV_POPULATE_WRITE);
      lock();
      if (!err && !g.next.base && g.cur.end == start && g.cuts == cuts && state() == SinkState::active) {
        g.next = w, ++g.windows;
        continue;
      }
      unmap(&w);
      // Allocated after a failure or stop truncated the file: cut the tail again.
      if (!err && state() != SinkState::active && (fd = own_fd_locked()) >= 0 &&
          ftruncate(fd, static_cast<off_t>(g.off)) != 0) {
      }
      // On error the appender that needs the window meets it (and reports it) itself.
      backoff = err != 0;
      continue;
    }
    if (g.retired_fd >= 0) {  // after the next window (appends may wait for that one)
      const int fd = g.retired_fd;
      const FileId id = g.retired_id;
      g.retired_fd = -1;
      unlock();
      if (fd_is(fd, id)) close(fd);
      lock();
      continue;
    }
    backoff = false;
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    std::uint64_t ns = static_cast<std::uint64_t>(ts.tv_nsec) + g.flush_ns;
    ts.tv_sec += static_cast<time_t>(ns / 1'000'000'000u);
    ts.tv_nsec = static_cast<long>(ns % 1'000'000'000u);
    t_holds = false;  // the wait releases it
    pthread_cond_timedwait(&g.work_cv, &g.mu, &ts);
    t_holds = true;
    if (g.exit_thread) break;
    unlock();
    signals_rearm();
    lock();
  }
  unlock();
  return nullptr;
}

// mu held. Asynchronous signals are blocked in the background thread, so a process-directed
// SIGTERM lands on a user thread.
void start_thread_locked() noexcept {
  sigset_t all, old;
  sigfillset(&all);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigdelset(&all, s);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  g.exit_thread = false, g.thread_started = false;
  int rc = pthread_create(&g.thread, nullptr, thread_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  // Without it appends still work (they map windows themselves); only re-arming is lost.
  g.thread_running = rc == 0;
  // Wait until the thread runs our code. The file (and so this thread) now starts at the
  // process's first event, and a program may fork right after it: a thread still inside its
  // start-up (the C library's or a sanitizer's allocations, which take allocator locks) would
  // leave such a lock held in the child forever. Seen with ASan: the forked child of
  // RecorderProcess.ForkedChildWritesItsOwnFile deadlocked in calloc. Once per file.
  t_holds = false;  // the wait releases mu
  while (g.thread_running && !g.thread_started) pthread_cond_wait(&g.started_cv, &g.mu);
  t_holds = true;
}

}  // namespace

SinkState sink_state() noexcept { return state(); }
void sink_set_state(SinkState s) noexcept { set_state(s); }

void sink_open(int fd, const char* path, std::uint64_t flush_ns, std::size_t header_bytes) noexcept {
  pthread_once(&g_cond_once, init_cond);  // before any thread can wait on it
  lock();
  // A previous file that failed (its fd is kept open for the background thread): stop the
  // thread before that fd is closed and its number can be reused.
  bool join = g.thread_running;
  pthread_t t = g.thread;
  g.exit_thread = true, g.thread_running = false;
  pthread_cond_signal(&g.work_cv);
  unlock();
  if (join) pthread_join(t, nullptr);
  lock();
  unmap(&g.cur), unmap(&g.next);
  close_retired_locked();
  if (g.fd >= 0 && fd_is(g.fd, g.id)) close(g.fd);  // the program's file now, if not ours
  g.fd = fd;
  g.owner = kernel_pid();
  g.id = file_id(fd);
  append_cstr(g.path, sizeof g.path, 0, path);
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0 && kWindowBytes % static_cast<std::uint64_t>(page) == 0) g.page = static_cast<std::uint64_t>(page);
  g.flush_ns = flush_ns ? flush_ns : 20'000'000;
  g.off = header_bytes;
  g.records = 0, g.inline_maps = 0, g.windows = 0;
  g.compact = format::CompactState{};
  g.head_len = header_bytes, g.segments = 0, g.roll_off = false;
  agg_reset();
  g.zeroed_upto = header_bytes;  // the header is written (write(2)) before any window
  g_dropped.store(0);
  // The first window covers the header (written with write(2) by the caller).
  int err = map_window(fd, 0, 0, true, &g.cur);
  t_opener = true;
  set_state(SinkState::opening);
  if (err == 0) ++g.windows;
  else fail_locked(err);  // reported like any later failure
  unlock();
}

void sink_publish() noexcept {
  lock();
  if (state() == SinkState::opening) set_state(SinkState::active);
  t_opener = false;
  unlock();
}

const char* sink_path() noexcept { return g.path; }

void sink_set_aggregate(std::uint64_t budget) noexcept {
  lock();
  // A smaller budget would roll every few events: the head alone may be larger.
  g.roll_budget = budget && budget < kFirstWindowBytes ? kFirstWindowBytes : budget;
  unlock();
}

bool sink_append(const void* rec, std::size_t n, bool start_thread) noexcept {
  if (!accepting(state()) || n > format::kMaxPayload + format::kFrameHeaderSize || n == 0) {
    sink_count_dropped();
    return false;
  }
  lock();
  if (start_thread && !g.thread_running && accepting(state())) start_thread_locked();
  bool ok = append_locked(rec, n);
  if (ok && g.roll_budget && !g.roll_off) agg_on_record(static_cast<const unsigned char*>(rec), n, g.off - n);
  unlock();
  if (!ok) sink_count_dropped();
  return ok;
}

namespace {
void aggregate_event(const format::AllocRecord& r) noexcept { agg_on_alloc(r); }
void aggregate_event(const format::FreeRecord& r) noexcept { agg_on_free(r); }
void aggregate_event(const format::FreeCompletedRecord& r) noexcept { agg_on_free_completed(r); }
void aggregate_event(const format::SegmentRecord& r, bool) noexcept { agg_on_segment(r.ts); }

// Rolling stops for good (the file keeps growing as a whole trace): one line on stderr. Not
// a tracing failure (sink_warn_once): the trace stays complete.
void roll_give_up(const char* why) noexcept {
  g.roll_off = true;
  char line[4400];
  std::size_t n = append_cstr(line, sizeof line - 1, 0, "gpuheap: aggregate: ");
  n = append_escaped(line, sizeof line - 1, n, why);
  n = append_escaped(line, sizeof line - 1, n, "; the trace is kept whole from here on, the program continues");
  line[n++] = '\n';
  write_stderr(line, n);
}

// Writes the head of the next segment to a file descriptor (the records are whole frames).
struct HeadOut {
  int fd;
  std::uint64_t len = 0, frames = 0;  // frames: calls, one per record (and one for the file header)
  static bool put(void* ctx, const unsigned char* f, std::size_t n) noexcept {
    auto* h = static_cast<HeadOut*>(ctx);
    ++h->frames;
    while (n) {
      ssize_t k = write(h->fd, f, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      f += k, n -= static_cast<std::size_t>(k), h->len += static_cast<std::uint64_t>(k);
    }
    return true;
  }
};

// Next segment (Sink::roll_budget). mu held, state active. The new file is written whole
// under a temporary name beside the trace (created O_EXCL, ours), the tables copied from the
// current file and the snapshot (aggregate.h) after them, and only then renamed over the
// trace's path: at every moment the path names a whole trace, the old segment until the new
// one is complete. The old file is replaced only while the path still names it (the program
// may have moved it: then nothing is replaced and rolling stops).
void roll_locked() noexcept {
  if (g.preparing.load()) return;  // the background thread holds the old fd: next event
  int old = own_fd_locked();
  if (old < 0) return;  // the next window's mapping reports it
  if (!agg_ok()) return roll_give_up("not enough memory for the window's state");
  char tmp[sizeof g.path + 8];
  std::size_t tl = append_cstr(tmp, sizeof tmp, 0, g.path);
  if (append_cstr(tmp, sizeof tmp, tl, ".roll") != tl + 5) return roll_give_up("the trace's path is too long");
  int fd = fd_above_stdio(open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600));
  if (fd < 0) return roll_give_up("cannot create the next segment beside the trace");
  unsigned char header[format::kFileHeaderSize];
  format::encode_file_header(header);
  HeadOut out{fd};
  std::uint64_t tables = 0;  // table records copied (in pieces: out's frames count the pieces)
  bool ok = HeadOut::put(&out, header, sizeof header) && agg_copy_tables(old, HeadOut::put, &out, &tables);
  const std::uint64_t tables_end = out.len, table_puts = out.frames;
  ok = ok && agg_write_snapshot(now_ns(), g.segments + 1, HeadOut::put, &out);
  struct stat st {};
  ok = ok && lstat(g.path, &st) == 0 && g.id.known && st.st_dev == g.id.dev && st.st_ino == g.id.ino;
  ok = ok && rename(tmp, g.path) == 0;
  if (!ok) {
    FileId mine = file_id(fd);
    struct stat t {};
    if (lstat(tmp, &t) == 0 && mine.known && t.st_dev == mine.dev && t.st_ino == mine.ino) unlink(tmp);
    close(fd);
    return roll_give_up("the next segment could not be written or published");
  }
  // The old segment is gone from the directory; its windows go now, its descriptor in the
  // background thread: the last close of an unlinked file frees its page cache, which takes
  // as long as the copy above for a large segment.
  unmap(&g.cur), unmap(&g.next);
  ++g.cuts;  // a window the background thread prepared for the old file is stale
  retire_fd_locked(old, g.id);
  g.fd = fd, g.id = file_id(fd);
  g.off = g.head_len = out.len, g.zeroed_upto = out.len;
  g.records = tables + (out.frames - table_puts);  // the head's records (one snapshot record a put)
  agg_tables_moved(tables_end, tables);
  ++g.segments;
  g.compact = format::CompactState{};  // compact records start afresh in each file
  if (int err = map_window(fd, 0, out.len, true, &g.cur)) return fail_locked(err);
  ++g.windows;
}

// The record is encoded under the lock: a compact record is relative to the one before it in
// the file. Encoding only once the sink accepts keeps the state in step with the file (a
// failed append fails the file: nothing follows it).
template <class R, class... Extra>
bool append_event(const R& r, Extra... extra) noexcept {
  if (!accepting(state())) {
    sink_count_dropped();
    return false;
  }
  unsigned char buf[format::kCompactMaxEventSize];
  lock();
  if (!g.thread_running && accepting(state())) start_thread_locked();
  bool ok = false;
  if (accepting(state())) {
    std::size_t n = format::encode_compact(buf, sizeof buf, g.compact, r, extra...);
    ok = n != 0 && append_locked(buf, n);
    if (ok && g.roll_budget && !g.roll_off) {
      aggregate_event(r, extra...);
      if (g.off - g.head_len >= g.roll_budget && state() == SinkState::active) roll_locked();
    }
  }
  unlock();
  if (!ok) sink_count_dropped();
  return ok;
}
}  // namespace

bool sink_append_event(const format::AllocRecord& r) noexcept { return append_event(r); }
bool sink_append_event(const format::FreeRecord& r) noexcept { return append_event(r); }
bool sink_append_event(const format::FreeCompletedRecord& r) noexcept { return append_event(r); }
bool sink_append_event(const format::SegmentRecord& r, bool is_free) noexcept { return append_event(r, is_free); }

void sink_flush() noexcept {
  // Appends copy into the file's page-cache pages: what is appended is already in the
  // file for every reader (and survives SIGKILL). Taking the lock waits for an append in
  // progress on another thread.
  lock();
  unlock();
}

void sink_close(format::EndReason reason) noexcept {
  // exit() from a signal handler that interrupted this thread's own append: the lock is ours
  // already and the frame half-copied. Waiting would hang the exit; the file keeps what is
  // whole and its zero tail (read as "no end record").
  if (t_holds) return;
  lock();
  if (state() == SinkState::active) {
    unsigned char buf[format::kMaxEventRecordSize];
    format::EndRecord end{now_ns(), reason, g.records};
    std::size_t n = format::encode(buf, sizeof buf, end);
    append_locked(buf, n);
    if (state() == SinkState::active) set_state(SinkState::stopped);
  }
  bool join = g.thread_running && !pthread_equal(g.thread, pthread_self());
  g.exit_thread = true;
  pthread_cond_signal(&g.work_cv);
  pthread_t t = g.thread;
  g.thread_running = false;
  unlock();
  if (join) pthread_join(t, nullptr);
  lock();
  unmap(&g.cur), unmap(&g.next);
  close_retired_locked();
  // The allocated but unused tail goes: the file ends with the last record. Where the trace
  // cannot be reached any more (own_fd_locked) the zero tail stays, read as the data's end.
  if (int fd = own_fd_locked(); fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(g.off)) != 0) { /* reads as a cut trace */
    }
    close(fd);
  }
  g.fd = -1;
  unlock();
}

void sink_emergency_flush(bool write_end, format::EndReason reason) noexcept {
  // Everything appended is already in the file; what is left is `end` and the file size.
  if (!write_end || t_holds) return;  // interrupted ourselves mid-append
  // A vfork child shares the parent's memory, this sink included: its _exit or crash is not
  // the end of the parent's trace.
  if (g.owner != kernel_pid()) return;
  bool locked = false;
  for (int i = 0; i < 100 && !locked; ++i) {  // up to ~100 ms: the holder may be preempted
    locked = pthread_mutex_trylock(&g.mu) == 0;
    if (!locked) {
      timespec ms{0, 1'000'000};
      nanosleep(&ms, nullptr);
    }
  }
  if (!locked) return;
  if (state() == SinkState::active) {
    unsigned char buf[format::kMaxEventRecordSize];
    format::EndRecord end{now_ns(), reason, g.records};
    std::size_t n = format::encode(buf, sizeof buf, end);
    append_locked(buf, n);
    if (state() == SinkState::active) set_state(SinkState::stopped);
    // Nothing is appended after `stopped`, so the unused tail can go (ftruncate is
    // async-signal-safe; the mappings stay, nobody touches them again).
    wait_for_preparation();
    int fd = own_fd_locked();
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(g.off)) != 0) { /* reads as a cut trace */
    }
  }
  pthread_mutex_unlock(&g.mu);
}

bool sink_end_before_exec() noexcept {
  if (t_holds || state() != SinkState::active || g.owner != kernel_pid()) return false;
  lock();
  std::uint64_t mark = g.off;
  unsigned char buf[format::kMaxEventRecordSize];
  std::size_t n = format::encode(buf, sizeof buf, format::EndRecord{now_ns(), format::EndReason::stopped, g.records});
  if (state() != SinkState::active || !append_locked(buf, n)) {  // a failure was warned about
    unlock();
    return false;
  }
  g.exec_mark = mark;
  // The file ends with `end`, as after a clean close. The state stays `active` and the lock
  // held: other threads' appends wait (the exec ends them; a failed one lets them in, after
  // sink_resume_after_exec), a fatal signal's handler finds the lock taken and `end` written.
  wait_for_preparation();
  ++g.cuts;
  if (int fd = own_fd_locked(); fd >= 0 && ftruncate(fd, static_cast<off_t>(g.off)) != 0) {
    /* readers stop at `end` anyway */
  }
  return true;
}

void sink_resume_after_exec() noexcept {
  // Still holding the lock from sink_end_before_exec. The file is cut right after `end`:
  // map it again from the page holding `end` (allocating space past the cut anew), then
  // erase `end`, type byte first, so appends go on where it was.
  std::uint64_t end_at = g.off, mark = g.exec_mark;
  unmap(&g.cur), unmap(&g.next);
  if (g.zeroed_upto > end_at) g.zeroed_upto = end_at;  // the cut dropped what lay past it
  int fd = own_fd_locked();
  int err = fd < 0 ? EBADF : map_window(fd, mark & ~(g.page - 1), 0, true, &g.cur);
  if (err) {
    fail_locked(err);  // the file keeps `end`: a complete trace of what came before the exec
    unlock();
    return;
  }
  ++g.windows;
  // A window shrunk to a page near a full disk may end inside `end`: its bytes past the
  // window are the next frame's to overwrite (a zero type byte before them reads as the end).
  unsigned char* at = g.cur.base + (mark - g.cur.start);
  std::uint64_t upto = end_at < g.cur.end ? end_at : g.cur.end;
  at[0] = 0;
  asm volatile("" ::: "memory");
  std::memset(at + 1, 0, upto - mark - 1);
  g.off = mark;
  --g.records;
  unlock();
}

void sink_fork_prepare() noexcept { lock(); }
void sink_fork_parent() noexcept { unlock(); }
void sink_fork_child() noexcept {
  // One thread, ours: fresh objects rather than the parent's.
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&g.mu, &ma);
  pthread_mutexattr_destroy(&ma);
  init_cond();
  pthread_mutex_init(&g.alloc_mu, nullptr);
  g.zeroed_upto = 0;
  t_holds = false, t_opener = false;
  // The windows were not inherited (MADV_DONTFORK); munmap covers a kernel that ignored it.
  unmap(&g.cur), unmap(&g.next);
  // Only if still the parent's trace file: the number may be the program's file by now, which
  // the child must keep (its write would fail with EBADF).
  if (g.fd >= 0 && fd_is(g.fd, g.id)) close(g.fd);
  g.fd = -1;
  close_retired_locked();
  g.owner = 0;
  g.id = FileId{};
  g.path[0] = '\0';
  g.off = 0;
  g.thread_running = false, g.exit_thread = false;
  g.records = 0, g.inline_maps = 0, g.windows = 0;
  g.compact = format::CompactState{};
  g.head_len = 0, g.segments = 0, g.roll_off = false;
  agg_reset();
  g_dropped.store(0);
}

SinkCounters sink_counters() noexcept {
  SinkCounters c;
  lock();
  c.records = g.records, c.producer_waits = g.inline_maps, c.writes = g.windows, c.bytes = g.off;
  unlock();
  c.dropped = g_dropped.load();
  return c;
}

void sink_count_dropped() noexcept {
  SinkState s = state();
  if (s == SinkState::stopped || s == SinkState::failed) g_dropped.fetch_add(1, std::memory_order_relaxed);
}

void sink_warn_once(const char* msg) noexcept {
  if (g_warned.exchange(true)) return;
  // Async-signal-safe (a crash handler may get here): plain copies and one write(2).
  char line[4400];
  std::size_t n = append_cstr(line, sizeof line - 1, 0, "gpuheap: ");
  n = append_escaped(line, sizeof line - 1, n, msg);  // the paths in it may hold a newline
  line[n++] = '\n';
  write_stderr(line, n);  // never a SIGPIPE for the program (stderr_line.h)
  if (SinkFailureFn fn = g_failure_fn.load()) fn(msg);
}
void sink_set_failure_listener(SinkFailureFn fn) noexcept { g_failure_fn.store(fn); }
void sink_reset_warning() noexcept { g_warned.store(false); }

}  // namespace preload
}  // namespace gpuheap
