#include "preload/sink.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "preload/recorder.h"

namespace gpuheap {
namespace detail {
namespace {

constexpr std::size_t kChunkBytes = (1u << 20) + 4096;  // >= any record (kMaxPayload + frame)
static_assert(kChunkBytes >= format::kMaxPayload + format::kFrameHeaderSize);

struct Chunk {
  Chunk* next;
  std::size_t used;
  unsigned char data[kChunkBytes];
};

// Raw pthread objects: they are re-initialised in the fork child (a condvar copied while
// the parent's writer waited on it carries phantom waiters; glibc may block on them).
// Everything here is constant-initialised (constinit): runtime.cpp's constructor may call
// recorder_start() before this file's dynamic initialisers would have run.
struct Sink {
  // Adaptive mutexes spin briefly before sleeping; the critical sections are a memcpy long.
  pthread_mutex_t buf_mu = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;  // lists, state, records
  pthread_mutex_t io_mu = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;   // orders write(2) batches
  // Re-initialised on CLOCK_MONOTONIC by the first sink_open (init_conds).
  pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;   // writer: a chunk filled / exit
  pthread_cond_t space_cv = PTHREAD_COND_INITIALIZER;  // producers: chunks were returned
  Chunk* cur = nullptr;
  Chunk* full_head = nullptr;
  Chunk* full_tail = nullptr;
  Chunk* free_list = nullptr;
  std::size_t nchunks = 0, max_chunks = 256;
  std::uint64_t flush_ns = 20'000'000;
  int fd = -1;
  char path[4096] = {};
  bool writer_running = false, exit_writer = false;
  pthread_t writer{};
  std::uint64_t records = 0, producer_waits = 0;  // under buf_mu
};

constinit Sink g;
constinit std::atomic<int> g_state{static_cast<int>(SinkState::off)};
constinit std::atomic<std::uint64_t> g_bytes{0}, g_dropped{0}, g_writes{0};
constinit std::atomic<bool> g_warned{false};
constinit std::atomic<std::uint64_t> g_last_drain_ns{0};  // when a drain last took the buffers
constinit pthread_once_t g_cond_once = PTHREAD_ONCE_INIT;
// Which sink locks this thread holds: the signal handler must not wait for itself.
thread_local bool t_holds_buf __attribute__((tls_model("initial-exec"))) = false;
thread_local bool t_holds_io __attribute__((tls_model("initial-exec"))) = false;

void init_conds() noexcept {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g.work_cv, &ca);
  pthread_cond_init(&g.space_cv, &ca);
  pthread_condattr_destroy(&ca);
}
void init_sync() noexcept {  // fork child: nothing else runs, fresh objects are safe
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&g.buf_mu, &ma);
  pthread_mutex_init(&g.io_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  init_conds();
}

void lock_buf() noexcept { pthread_mutex_lock(&g.buf_mu), t_holds_buf = true; }
void unlock_buf() noexcept { t_holds_buf = false, pthread_mutex_unlock(&g.buf_mu); }
void lock_io() noexcept { pthread_mutex_lock(&g.io_mu), t_holds_io = true; }
void unlock_io() noexcept { t_holds_io = false, pthread_mutex_unlock(&g.io_mu); }

SinkState state() noexcept { return static_cast<SinkState>(g_state.load(std::memory_order_acquire)); }
void set_state(SinkState s) noexcept { g_state.store(static_cast<int>(s), std::memory_order_release); }

// write(2) all of it; EINTR and short writes are retried. False on error (errno set).
bool write_all(int fd, const unsigned char* p, std::size_t n) noexcept {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = ENOSPC;
      return false;
    }
    p += w, n -= static_cast<std::size_t>(w);
    g_bytes.fetch_add(static_cast<std::uint64_t>(w), std::memory_order_relaxed);
  }
  return true;
}

// Detaches every buffered chunk, oldest first. buf_mu held.
Chunk* take_all_locked() noexcept {
  if (g.cur && g.cur->used) {
    g.cur->next = nullptr;
    if (g.full_tail) g.full_tail->next = g.cur;
    else g.full_head = g.cur;
    g.full_tail = g.cur;
    g.cur = nullptr;
  }
  Chunk* list = g.full_head;
  g.full_head = g.full_tail = nullptr;
  return list;
}

void release_locked(Chunk* list) noexcept {
  while (list) {
    Chunk* next = list->next;
    list->used = 0;
    list->next = g.free_list;
    g.free_list = list;
    list = next;
  }
  pthread_cond_broadcast(&g.space_cv);
}

void fail_locked(int err) noexcept {
  // Give up on this file: drop what is buffered, wake waiting producers, close.
  set_state(SinkState::failed);
  release_locked(take_all_locked());
  char msg[4300];
  snprintf(msg, sizeof msg, "writing trace %s failed (%s); tracing stopped, the program continues",
           g.path, strerror(err));
  sink_warn_once(msg);
}

// Writes everything buffered; io_mu held, takes buf_mu (the lock order everywhere).
void drain_io_held() noexcept {
  g_last_drain_ns.store(now_ns(), std::memory_order_relaxed);
  lock_buf();
  Chunk* list = take_all_locked();
  int fd = g.fd;
  unlock_buf();
  bool ok = true;
  int err = 0;
  for (Chunk* c = list; c && ok && fd >= 0; c = c->next) {
    ok = write_all(fd, c->data, c->used);
    if (!ok) err = errno;
    else g_writes.fetch_add(1, std::memory_order_relaxed);
  }
  lock_buf();
  release_locked(list);
  if (!ok) {
    fail_locked(err);
    if (g.fd >= 0) close(g.fd);
    g.fd = -1;
  }
  unlock_buf();
}

void drain() noexcept {
  lock_io();
  drain_io_held();
  unlock_io();
}

// The flush-interval guarantee must not depend on the writer thread getting a CPU: with
// busy producers on a loaded 2-core machine it was starved for 160 ms (SIGKILL test in
// tests/preload/test_reliability.cpp). Every 256th record, a producer that finds the last
// drain older than 1.5 flush intervals writes the buffers itself, unless a write is running.
void producer_catch_up() noexcept {
  std::uint64_t last = g_last_drain_ns.load(std::memory_order_relaxed);
  if (now_ns() - last < g.flush_ns + g.flush_ns / 2) return;
  if (pthread_mutex_trylock(&g.io_mu) != 0) return;
  t_holds_io = true;
  if (state() == SinkState::active) drain_io_held();
  unlock_io();
}

void* writer_main(void*) {
  lock_buf();
  while (!g.exit_writer) {
    if (!g.full_head) {
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      std::uint64_t ns = static_cast<std::uint64_t>(ts.tv_nsec) + g.flush_ns;
      ts.tv_sec += static_cast<time_t>(ns / 1'000'000'000u);
      ts.tv_nsec = static_cast<long>(ns % 1'000'000'000u);
      t_holds_buf = false;  // the wait releases it
      pthread_cond_timedwait(&g.work_cv, &g.buf_mu, &ts);
      t_holds_buf = true;
      if (g.exit_writer) break;
    }
    bool any = g.full_head || (g.cur && g.cur->used);
    unlock_buf();
    if (any) drain();
    lock_buf();
  }
  unlock_buf();
  return nullptr;
}

// buf_mu held. Asynchronous signals are blocked in the writer, so a process-directed
// SIGTERM lands on a user thread, never on the thread that may hold io_mu mid-write.
void start_writer_locked() noexcept {
  sigset_t all, old;
  sigfillset(&all);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigdelset(&all, s);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  g.exit_writer = false;
  int rc = pthread_create(&g.writer, nullptr, writer_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    fail_locked(rc);
    return;
  }
  g.writer_running = true;
}

bool append_locked(const void* rec, std::size_t n) noexcept {
  for (;;) {
    if (state() != SinkState::active) return false;
    if (!g.cur && g.free_list) {
      g.cur = g.free_list;
      g.free_list = g.cur->next;
      g.cur->used = 0;
    }
    if (g.cur && kChunkBytes - g.cur->used >= n) break;
    if (g.cur) {  // full: queue it for the writer
      g.cur->next = nullptr;
      if (g.full_tail) g.full_tail->next = g.cur;
      else g.full_head = g.cur;
      g.full_tail = g.cur;
      g.cur = nullptr;
      pthread_cond_signal(&g.work_cv);
      continue;
    }
    if (g.nchunks < g.max_chunks) {
      ++g.nchunks;
      unlock_buf();  // malloc outside the lock keeps the critical section short
      auto* c = static_cast<Chunk*>(malloc(sizeof(Chunk)));
      lock_buf();
      if (c) {
        c->used = 0, c->next = g.free_list, g.free_list = c;
        continue;
      }
      --g.nchunks;
    }
    // At the bound (or out of memory): wait for the writer to return chunks.
    ++g.producer_waits;
    if (!g.writer_running) start_writer_locked();
    pthread_cond_signal(&g.work_cv);
    t_holds_buf = false;
    pthread_cond_wait(&g.space_cv, &g.buf_mu);
    t_holds_buf = true;
  }
  std::memcpy(g.cur->data + g.cur->used, rec, n);
  g.cur->used += n;
  ++g.records;
  return true;
}

}  // namespace

SinkState sink_state() noexcept { return state(); }
void sink_set_state(SinkState s) noexcept { set_state(s); }

void sink_open(int fd, const char* path, std::uint64_t flush_ns, std::size_t max_bytes,
               std::size_t header_bytes) noexcept {
  pthread_once(&g_cond_once, init_conds);  // before any thread can wait on them
  lock_io();
  lock_buf();
  release_locked(take_all_locked());
  g.fd = fd;
  snprintf(g.path, sizeof g.path, "%s", path);
  g.flush_ns = flush_ns ? flush_ns : 20'000'000;
  g.max_chunks = max_bytes / kChunkBytes < 2 ? 2 : max_bytes / kChunkBytes;
  g.records = 0, g.producer_waits = 0;
  g_bytes.store(header_bytes), g_dropped.store(0), g_writes.store(0);
  g_last_drain_ns.store(now_ns(), std::memory_order_relaxed);
  set_state(SinkState::active);
  unlock_buf();
  unlock_io();
}

const char* sink_path() noexcept { return g.path; }

bool sink_append(const void* rec, std::size_t n, bool start_writer) noexcept {
  if (state() != SinkState::active || n > kChunkBytes) {
    sink_count_dropped();
    return false;
  }
  lock_buf();
  if (start_writer && !g.writer_running && state() == SinkState::active) start_writer_locked();
  bool ok = append_locked(rec, n);
  // Only appenders that may start the writer take part (metadata at open passes false).
  bool check = ok && start_writer && g.writer_running && (g.records & 255) == 0;
  unlock_buf();
  if (!ok) sink_count_dropped();
  if (check) producer_catch_up();
  return ok;
}

void sink_flush() noexcept {
  if (state() == SinkState::off || state() == SinkState::pending_child) return;
  drain();
}

void sink_close(format::EndReason reason) noexcept {
  lock_buf();
  if (state() == SinkState::active) {
    unsigned char buf[format::kMaxEventRecordSize];
    format::EndRecord end{now_ns(), reason, g.records};
    std::size_t n = format::encode(buf, sizeof buf, end);
    append_locked(buf, n);
    set_state(SinkState::stopped);
  }
  unlock_buf();
  drain();
  lock_buf();
  bool join = g.writer_running && !pthread_equal(g.writer, pthread_self());
  g.exit_writer = true;
  pthread_cond_signal(&g.work_cv);
  pthread_t w = g.writer;
  g.writer_running = false;
  unlock_buf();
  if (join) pthread_join(w, nullptr);
  lock_io();
  if (g.fd >= 0) close(g.fd);
  g.fd = -1;
  unlock_io();
}

void sink_emergency_flush(bool write_end) noexcept {
  if (t_holds_buf || t_holds_io) return;  // interrupted ourselves mid-append/mid-write
  auto try_for = [](pthread_mutex_t* m) {
    for (int i = 0; i < 100; ++i) {  // up to ~100 ms: the holder is mid-write(2)
      if (pthread_mutex_trylock(m) == 0) return true;
      timespec ms{0, 1'000'000};
      nanosleep(&ms, nullptr);
    }
    return false;
  };
  if (!try_for(&g.io_mu)) return;
  if (!try_for(&g.buf_mu)) {
    pthread_mutex_unlock(&g.io_mu);
    return;
  }
  SinkState s = state();
  if (g.fd >= 0 && (s == SinkState::active || s == SinkState::stopped)) {
    bool ok = true;
    for (Chunk* c = g.full_head; c && ok; c = c->next) ok = write_all(g.fd, c->data, c->used);
    if (ok && g.cur && g.cur->used) ok = write_all(g.fd, g.cur->data, g.cur->used);
    // Everything buffered is now in the file (or lost); forget it without freeing.
    for (Chunk* c = g.full_head; c; c = c->next) c->used = 0;
    if (g.cur) g.cur->used = 0;
    // Recycle the written chunks without release_locked(): condvars are not
    // async-signal-safe. Waiting producers are woken by the writer's next drain.
    if (g.full_tail) {
      g.full_tail->next = g.free_list;
      g.free_list = g.full_head;
    }
    g.full_head = g.full_tail = nullptr;
    if (ok && write_end && s == SinkState::active) {
      unsigned char buf[format::kMaxEventRecordSize];
      format::EndRecord end{now_ns(), format::EndReason::signal, g.records};
      std::size_t n = format::encode(buf, sizeof buf, end);
      if (write_all(g.fd, buf, n)) ++g.records;
      set_state(SinkState::stopped);
    }
  }
  pthread_mutex_unlock(&g.buf_mu);
  pthread_mutex_unlock(&g.io_mu);
}

void sink_fork_prepare() noexcept {
  lock_io();
  lock_buf();
}
void sink_fork_parent() noexcept {
  unlock_buf();
  unlock_io();
}
void sink_fork_child() noexcept {
  init_sync();
  t_holds_buf = t_holds_io = false;
  // The parent still owns and writes these records and its file.
  release_locked(take_all_locked());
  if (g.fd >= 0) close(g.fd);
  g.fd = -1;
  g.path[0] = '\0';
  g.writer_running = false, g.exit_writer = false;
  g.records = 0, g.producer_waits = 0;
  g_bytes.store(0), g_dropped.store(0), g_writes.store(0);
}

SinkCounters sink_counters() noexcept {
  SinkCounters c;
  lock_buf();
  c.records = g.records, c.producer_waits = g.producer_waits;
  unlock_buf();
  c.bytes = g_bytes.load(), c.dropped = g_dropped.load(), c.writes = g_writes.load();
  return c;
}

void sink_count_dropped() noexcept {
  SinkState s = state();
  if (s == SinkState::stopped || s == SinkState::failed) g_dropped.fetch_add(1, std::memory_order_relaxed);
}

void sink_warn_once(const char* msg) noexcept {
  if (g_warned.exchange(true)) return;
  char line[4400];
  int n = snprintf(line, sizeof line, "gpuheap: %s\n", msg);
  if (n > static_cast<int>(sizeof line) - 1) n = sizeof line - 1;
  if (n > 0 && write(STDERR_FILENO, line, static_cast<std::size_t>(n)) < 0) { /* nothing to do */ }
}
void sink_reset_warning() noexcept { g_warned.store(false); }

}  // namespace detail
}  // namespace gpuheap
