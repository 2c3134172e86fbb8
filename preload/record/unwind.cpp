#include "preload/record/unwind.h"

#define UNW_LOCAL_ONLY
#include <fcntl.h>
#include <libunwind.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>

#include "format/trace.h"
#include "preload/record/modules.h"
#include "preload/record/pystack.h"
#include "preload/record/scratch.h"
#include "preload/record/sink.h"
#include "preload/record/stackcache.h"
#include "preload/record/stackstats.h"

namespace gpuheap {
namespace preload {
namespace {

// Open-addressing table, lock-free lookups. A slot is published by storing its key
// (hash | 1, never 0) with release order after id/depth/ips are filled in; readers load
// the key with acquire. Inserts are serialised by g_intern_mu.
struct Slot {
  std::atomic<std::uint64_t> key;
  std::uint32_t id;
  std::uint16_t depth;
  const std::uint64_t* ips;
};
constexpr std::size_t kSlots = 1u << 19;          // 12 MiB of address space, touched lazily
constexpr std::size_t kMaxFill = kSlots / 4 * 3;  // beyond: stacks are written uninterned
constexpr std::size_t kArenaBytes = 1u << 20;

struct Arena {  // storage for interned ip arrays; reused (not freed) across resets
  Arena* next;
  std::size_t used;
  unsigned char data[kArenaBytes];
};

constinit Slot* g_table = nullptr;
constinit std::size_t g_fill = 0;
constinit std::uint32_t g_next_id = 1;
constinit Arena* g_arena_head = nullptr;  // first arena; g_arena is the one being filled
constinit Arena* g_arena = nullptr;
constinit pthread_mutex_t g_intern_mu = PTHREAD_MUTEX_INITIALIZER;
constinit std::atomic<std::uint64_t> g_count{0};
constinit std::atomic<bool> g_enabled{true};
constinit std::atomic<int> g_depth{64};
constinit pthread_once_t g_once = PTHREAD_ONCE_INIT;
// Native frames unwound per stack on this thread when it has Python frames: the last cut
// (where the eval loop was found) plus a margin, so that the frames below the interpreter
// (its start-up, and every Python-to-C-to-Python transition) are not unwound only to be
// dropped. 0 = the configured depth. A stack that needs more is unwound again in full.
thread_local int t_py_budget __attribute__((tls_model("initial-exec"))) = 0;
constexpr int kPyBudgetMargin = 12;

// libunwind (1.6 to 1.8) opens a pipe when it initialises and validates the memory it reads
// while stepping through a frame for the first time (Debian builds it with conservative
// checks) by writing the byte into that pipe. Its descriptors would take the lowest free
// numbers: 0 and 1 when the program starts with stdio closed, and two of the program's
// RLIMIT_NOFILE when the program lowers the limit later (its own open() then fails where it
// succeeds natively). Validating another way would need a change inside libunwind, which is
// bundled as the distribution builds it; without validation it cannot step at all. So the
// pipe it makes while this thread is in libunwind for us (pipe2 interposer, hooks/) is moved
// to the top of the descriptor table (below 1024 and the soft limit), close-on-exec: a
// program that lowers its limit keeps every descriptor below it, and only one that holds
// about a thousand descriptors at once comes near ours.
thread_local bool t_unwinding __attribute__((tls_model("initial-exec"))) = false;
struct Unwinding {
  bool was = t_unwinding;
  Unwinding() { t_unwinding = true; }
  ~Unwinding() { t_unwinding = was; }
};

// Address range of libgpuheap.so's own code (PT_LOAD segments), found once.
constinit std::uintptr_t g_self_lo = 0, g_self_hi = 0;

int self_range_cb(dl_phdr_info* info, size_t, void* data) {
  auto self = reinterpret_cast<std::uintptr_t>(data);
  // Linked into an executable (the recorder's unit tests), "our" frames are the program's:
  // keep them. Only a shared object (libgpuheap.so) has frames to drop.
  if (!info->dlpi_name || !*info->dlpi_name) {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const auto& ph = info->dlpi_phdr[i];
      std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
      if (ph.p_type == PT_LOAD && self >= lo && self < lo + ph.p_memsz) return 1;
    }
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
    if (self >= lo && self < hi) {
      g_self_lo = lo;
      g_self_hi = hi;
      return 1;
    }
  }
  return 0;
}

inline bool in_self(const void* ip) {
  auto a = reinterpret_cast<std::uintptr_t>(ip);
  return a >= g_self_lo && a < g_self_hi;
}

void init_once() {
  // Per-thread caches: no global lock inside libunwind on the hot path. This also runs
  // libunwind's initialisation (its validation pipe: see t_unwinding).
  {
    Unwinding in;
    unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
  }
  dl_iterate_phdr(self_range_cb, reinterpret_cast<void*>(&init_once));
  void* p = mmap(nullptr, kSlots * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  g_table = p == MAP_FAILED ? nullptr : static_cast<Slot*>(p);
}

// Every allocation hashes its whole stack (~50 words in a deep Python program): two words a
// step, in two independent lanes (multiplies in flight together), mixed once at the end. Bits
// of a word reach only the higher bits of its lane, so the final mix folds the high half down
// before the low bits pick a slot.
inline std::uint64_t hash_ips(const std::uint64_t* ips, int depth) {
  std::uint64_t a = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(depth), b = 0xC2B2AE3D27D4EB4Full;
  int i = 0;
  for (; i + 1 < depth; i += 2) {
    a = (a ^ ips[i]) * 0xFF51AFD7ED558CCDull;
    b = (b ^ ips[i + 1]) * 0xC4CEB9FE1A85EC53ull;
  }
  if (i < depth) a = (a ^ ips[i]) * 0xFF51AFD7ED558CCDull;
  std::uint64_t h = a ^ (b << 31 | b >> 33);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 29;
  return h | 1;
}

// Copies ips into arena storage (g_intern_mu held).
const std::uint64_t* store_ips(const std::uint64_t* ips, int depth) {
  std::size_t need = 8u * static_cast<std::size_t>(depth);
  if (!g_arena || kArenaBytes - g_arena->used < need) {
    Arena* next = g_arena ? g_arena->next : g_arena_head;
    if (!next) {
      next = static_cast<Arena*>(malloc(sizeof(Arena)));
      if (!next) return nullptr;
      next->next = nullptr;
      if (g_arena) g_arena->next = next;
      else g_arena_head = next;
    }
    next->used = 0;
    g_arena = next;
  }
  auto* dst = reinterpret_cast<std::uint64_t*>(g_arena->data + g_arena->used);
  memcpy(dst, ips, need);
  g_arena->used += need;
  return dst;
}

bool append_stack(std::uint32_t id, const std::uint64_t* ips, int depth) {
  unsigned char buf[format::stack_record_size(format::kMaxStackDepth)];
  std::size_t n = format::encode_stack(buf, sizeof buf, id, ips, static_cast<std::uint16_t>(depth));
  return n && sink_append(buf, n);
}

}  // namespace

void stacks_configure(bool enabled, int max_depth, bool python) noexcept {
  pthread_once(&g_once, init_once);
  pystack_configure(enabled && python);
  if (max_depth < 1) max_depth = 1;
  if (max_depth > format::kMaxStackDepth) max_depth = format::kMaxStackDepth;
  g_enabled.store(enabled), g_depth.store(max_depth);
}
bool stacks_enabled() noexcept { return g_enabled.load(std::memory_order_relaxed); }
bool stacks_unwinding() noexcept { return t_unwinding; }

void stacks_place_pipe(int fds[2]) noexcept {
  rlimit rl{};
  long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 1024 ? static_cast<long>(rl.rlim_cur) : 1024;
  for (int i = 0; i < 2; ++i) {
    int fd = fcntl(fds[i], F_DUPFD_CLOEXEC, top - 2 > 3 ? top - 2 : 3);
    if (fd < 0 && fds[i] < 3) fd = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);  // never 0, 1, 2
    if (fd >= 0) {
      close(fds[i]);
      fds[i] = fd;
    }
  }
}

std::uint32_t stacks_intern(const std::uint64_t* ips, int depth) noexcept {
  if (depth <= 0) return 0;
  if (depth > format::kMaxStackDepth) depth = format::kMaxStackDepth;
  pthread_once(&g_once, init_once);
  std::uint64_t h = hash_ips(ips, depth);
  std::size_t mask = kSlots - 1;
  if (g_table) {
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = g_table[i];
      std::uint64_t k = s.key.load(std::memory_order_acquire);
      if (k == 0) break;
      if (k == h && s.depth == depth && s.ips && memcmp(s.ips, ips, 8u * depth) == 0) return s.id;
    }
  }
  pthread_mutex_lock(&g_intern_mu);
  std::uint32_t id = 0;
  Slot* empty = nullptr;
  if (g_table) {
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {  // again: someone may have won
      Slot& s = g_table[i];
      std::uint64_t k = s.key.load(std::memory_order_relaxed);
      if (k == 0) {
        empty = &s;
        break;
      }
      if (k == h && s.depth == depth && memcmp(s.ips, ips, 8u * depth) == 0) {
        id = s.id;
        break;
      }
    }
  }
  if (id == 0) {
    std::uint32_t new_id = g_next_id;
    modules_sync_if_changed();  // frames of objects dlopen'ed since the trace started
    pystack_reprobe();          // an embedding program may have loaded libpython since
    // The record goes to the sink before the id is visible to anyone else.
    if (append_stack(new_id, ips, depth)) {
      ++g_next_id;
      id = new_id;
      g_count.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t* stored = empty && g_fill < kMaxFill ? store_ips(ips, depth) : nullptr;
      if (stored) {  // full table / no memory: the stack stays written but uninterned
        empty->id = id, empty->depth = static_cast<std::uint16_t>(depth), empty->ips = stored;
        empty->key.store(h, std::memory_order_release);
        ++g_fill;
      }
    }
  }
  pthread_mutex_unlock(&g_intern_mu);
  return id;
}

namespace {
// Index of the first return address in raw[from..n) inside the interpreter's eval loop; -1.
int find_eval(void* const* raw, int from, int n) {
  for (int i = from; i < n; ++i)
    if (pystack_is_eval_ip(reinterpret_cast<std::uint64_t>(raw[i]))) return i;
  return -1;
}
}  // namespace

namespace {
thread_local bool t_in_capture __attribute__((tls_model("initial-exec"))) = false;
struct InCapture {
  bool was = t_in_capture;
  InCapture() { t_in_capture = true; }
  ~InCapture() { t_in_capture = was; }
};

struct Capture {
  int skip;
  std::uint32_t id;
  std::uint64_t ip0, sp0, rbp0;  // the frame of stacks_capture's caller (stackcache.h)
};

// A stack the thread's cache holds (its words re-read and found unchanged): its id without
// a walk, or its native frames joined to this event's Python frames.
std::uint32_t from_cache(const StackHit& hit, const std::uint64_t* py, int npy) {
  if (npy == 0) {
    if (hit.id) return hit.id;
    std::uint32_t id = stacks_intern(hit.ips, hit.nat);
    if (id) stackcache_set_id(hit.entry, id);
    return id;
  }
  std::uint64_t ips[format::kMaxStackDepth];
  int keep_py = npy < format::kMaxStackDepth - hit.nat ? npy : format::kMaxStackDepth - hit.nat;
  memcpy(ips, hit.ips, 8u * static_cast<std::size_t>(hit.nat));
  memcpy(ips + hit.nat, py, 8u * static_cast<std::size_t>(keep_py));
  return stacks_intern(ips, hit.nat + keep_py);
}

// Frames inside libgpuheap.so beyond `skip` (the interposer, inlined or not) are dropped by
// capture_deep; room for up to kSelfFrames of them is unwound on top of GPUHEAP_STACK_DEPTH, so
// the stack keeps exactly that many of the program's frames (before round 2 they came out of
// the depth: N - 1 frames kept, none for 1).
constexpr int kSelfFrames = 8;

struct Walk {
  int n;       // raw[0..n): the frames to keep, up to the eval loop's
  int last;    // the deepest frame the result depends on (stackcache.h)
  bool ended;  // the thread's stack ended before the frames asked for
};

// unw_backtrace into raw, cut at the first frame of the interpreter's eval loop when the
// thread has Python frames. Inlined: raw's first entry stays the return address into
// capture_deep.
__attribute__((always_inline)) inline Walk walk(void** raw, int first, int npy, int depth) {
  int want = npy > 0 && t_py_budget > 0 && t_py_budget < depth ? t_py_budget : depth;
  int asked = want + first + kSelfFrames;
  int n = unw_backtrace(raw, asked);
  stackstats_add(StackCounter::walks);
  int cut = npy > 0 ? find_eval(raw, first, n) : -1;
  if (npy > 0 && cut < 0 && want < depth && n == asked) {  // the budget was too small
    asked = depth + first + kSelfFrames;
    n = unw_backtrace(raw, asked);
    stackstats_add(StackCounter::walks);
    stackstats_add(StackCounter::rewalks);
    cut = find_eval(raw, first, n);
  }
  stackstats_add(StackCounter::native_frames, static_cast<std::uint64_t>(n > 0 ? n : 0));
  // The result depends on the eval frame it was cut at, else on every frame looked at for one.
  Walk w{n, cut >= 0 ? cut : n - 1, cut < 0 && n < asked};
  if (cut >= 0) {
    w.n = cut;  // the interpreter's frames and everything below them: the Python frames say it
    t_py_budget = cut - first + kPyBudgetMargin;
  }
  return w;
}

// The unwinding itself, through run_deep (scratch.h): libunwind's DWARF parsing of a cold
// cache, the buffers below and a new stack's record take several KiB of stack, too much for
// a thread with a 16 KiB one. On the scratch stack one more frame (the switch) lies between
// this function and stacks_capture; libunwind steps through it (its CFI) onto the thread's
// own frames.
__attribute__((noinline)) void capture_deep(void* arg, bool on_scratch) {
  auto* c = static_cast<Capture*>(arg);
  // Native frames (innermost first) then, when the thread runs Python, its Python frames in
  // place of the interpreter's native ones: one array, interned as one stack.
  constexpr int kRaw = 2 * format::kMaxStackDepth + 32 + kSelfFrames + 2;  // room to append the Python frames
  std::uint64_t py[format::kMaxStackDepth];
  void* raw[kRaw];
  int npy = pystack_capture(py, format::kMaxStackDepth);
  stackstats_add(StackCounter::captures);
  if (npy > 0) stackstats_add(StackCounter::python_frames, static_cast<std::uint64_t>(npy));
  // unw_backtrace's first entry is the return address into this function, then come run_deep
  // (and the switch below it, on the scratch stack) and stacks_capture: dropped too.
  const int start = 3 + (on_scratch ? 1 : 0);  // raw[start]: ip0, in stacks_capture's caller
  int first = c->skip + start;
  const int depth = g_depth.load(std::memory_order_relaxed);
  // A capture nested in another on this thread (a signal handler's allocation) leaves the
  // cache alone: the outer one may be reading or filling the very entry it would use.
  InCapture nested;
  const StackKey key = nested.was ? StackKey{} : stackcache_key(c->ip0, c->sp0, c->rbp0, c->skip, depth, npy > 0);
  StackHit hit;
  if (stackcache_find(key, &hit)) {
    stackstats_add(StackCounter::cache_hits);
    c->id = from_cache(hit, py, npy);
    return;
  }
  Unwinding in;
  const Walk w = walk(raw, first, npy, depth);
  int n = w.n;
  if (n <= first && npy == 0) return;
  // Drop every leading frame inside libgpuheap.so itself: how many there are depends on
  // inlining, and keeping them would split one user call site into several stacks.
  while (first < n && in_self(raw[first])) ++first;
  if (n < first) n = first;
  int nat = n - first < depth ? n - first : depth;
  if (nat + npy == 0) return;
  static_assert(sizeof(void*) == sizeof(std::uint64_t));
  auto* ips = reinterpret_cast<std::uint64_t*>(raw + first);  // Python frames go after the native ones
  int last = w.last;
  bool ended = w.ended;
  if (npy == 0 && first + nat - 1 < last) last = first + nat - 1, ended = false;  // frames below: unused
  // With Python frames the id is the joined stack's: the entry keeps the native frames only,
  // and is made before the Python frames are written over raw's tail.
  if (npy > 0) stackcache_fill(key, raw, start, last, ended, ips, nat, 0);
  int keep_py = npy < format::kMaxStackDepth - nat ? npy : format::kMaxStackDepth - nat;
  if (keep_py > 0) memcpy(ips + nat, py, 8u * static_cast<std::size_t>(keep_py));
  c->id = stacks_intern(ips, nat + keep_py);
  if (npy == 0 && c->id) stackcache_fill(key, raw, start, last, ended, ips, nat, c->id);
}
}  // namespace

__attribute__((noinline)) std::uint32_t stacks_capture(int skip) noexcept {
  // rbp as the caller left it (this function does not use it: the cache's fill checks that
  // the unwinder finds the same value, and caches nothing if not).
  std::uint64_t rbp = 0;
#if defined(__x86_64__)
  asm volatile("mov %%rbp, %0" : "=r"(rbp));
#endif
  if (!g_enabled.load(std::memory_order_relaxed)) return 0;
  pthread_once(&g_once, init_once);
  if (skip < 0) skip = 0;
  if (skip > 31) skip = 31;
  Capture c{skip, 0, reinterpret_cast<std::uint64_t>(__builtin_return_address(0)),
            reinterpret_cast<std::uint64_t>(__builtin_dwarf_cfa()), rbp};
  // Too little room and no scratch stack: no stack for this event rather than a crash.
  run_deep(capture_deep, &c);
  asm volatile("" ::: "memory");  // not a tail call: this frame is counted above
  return c.id;
}

int stacks_lookup(std::uint32_t id, const std::uint64_t** ips) noexcept {
  int depth = 0;
  pthread_mutex_lock(&g_intern_mu);
  for (std::size_t i = 0; g_table && id && i < kSlots; ++i) {
    if (g_table[i].key.load(std::memory_order_acquire) != 0 && g_table[i].id == id) {
      *ips = g_table[i].ips;
      depth = g_table[i].depth;
      break;
    }
  }
  pthread_mutex_unlock(&g_intern_mu);
  return depth;
}

void stacks_reset() noexcept {
  pthread_mutex_lock(&g_intern_mu);
  if (g_table && g_fill) {
    // Anonymous private mapping: MADV_DONTNEED gives back zero pages (cheap, lazily).
    madvise(g_table, kSlots * sizeof(Slot), MADV_DONTNEED);
  }
  g_fill = 0;
  g_next_id = 1;
  g_arena = nullptr;  // arenas are reused from the head
  g_count.store(0);
  stackcache_new_generation();  // ids cached by threads are this file's no more
  pthread_mutex_unlock(&g_intern_mu);
  pystack_reset();  // the code records too
}

std::uint64_t stacks_count() noexcept { return g_count.load(std::memory_order_relaxed); }

// The Python code table is part of the stacks: its lock is taken after the intern lock (a
// new stack record may re-probe for the interpreter under it), released before it.
void stacks_fork_prepare() noexcept {
  pthread_mutex_lock(&g_intern_mu);
  pystack_fork_prepare();
}
void stacks_fork_parent() noexcept {
  pystack_fork_parent();
  pthread_mutex_unlock(&g_intern_mu);
}
void stacks_fork_child() noexcept {
  pystack_fork_child();
  pthread_mutex_init(&g_intern_mu, nullptr);
  stacks_reset();
}

}  // namespace preload
}  // namespace gpuheap
