#include "preload/record/pystack.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>

#include "format/trace.h"
#include "preload/record/modules.h"
#include "preload/record/pystack_layout.h"
#include "preload/record/scratch.h"
#include "preload/record/sink.h"

namespace gpuheap {
namespace preload {
namespace {

using get_ts_fn = void* (*)();
using int_fn = int (*)();

// Everything found at probe time. Written once before g_ready is set (release), read after
// an acquire load of g_ready: never changes while ready.
struct Interp {
  const PyLayout* layout = nullptr;
  int major = 0, minor = 0;
  get_ts_fn this_thread_state = nullptr;       // PyGILState_GetThisThreadState
  get_ts_fn unchecked_get = nullptr;           // 3.12+: the thread's current state (thread-local)
  int_fn is_initialized = nullptr;             // Py_IsInitialized
  std::uintptr_t code_type = 0, str_type = 0;  // &PyCode_Type, &PyUnicode_Type
  std::uintptr_t eval_lo = 0, eval_hi = 0;     // _PyEval_EvalFrameDefault
};
constinit Interp g_py;
constinit std::atomic<bool> g_ready{false};
constinit std::atomic<bool> g_enabled{true};
constinit std::atomic<unsigned long long> g_probed_adds{~0ull};
// The first walk of a thread's frames reads through process_vm_readv (a bad address is an
// error, not a crash); the layout is trusted for direct reads only once that walk found what
// it expects. 0 = not yet, 1 = checked, 2 = failed (Python frames off).
constinit std::atomic<int> g_checked{0};
constinit pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;  // probe + code interning

// Code objects seen in this file: code pointer -> id. Lookups are lock-free; a slot's `check`
// (hash of the fields that identify the object) and id are one atomic word, so a code object
// freed and another one allocated at its address gets a new id, never a torn one.
struct CodeSlot {
  std::atomic<std::uintptr_t> code;
  std::atomic<std::uint64_t> check_id;  // check << 32 | id
};
constexpr std::size_t kCodeSlots = 1u << 16;  // 1 MiB of address space, touched lazily
constexpr std::size_t kCodeMaxFill = kCodeSlots / 4 * 3;
constinit CodeSlot* g_codes = nullptr;
constinit std::size_t g_code_fill = 0;
constinit std::uint32_t g_next_code = 1;

// The one record being built (g_mu held): too large for a user thread's stack.
constexpr std::size_t kMaxName = 4096, kMaxLinetable = 256 * 1024;
constinit unsigned char g_rec[format::kFrameHeaderSize + 32 + 3 * kMaxName + kMaxLinetable];
constinit char g_file_buf[kMaxName], g_name_buf[kMaxName];

template <class T>
inline T at(std::uintptr_t base, int off) {
  T v;
  memcpy(&v, reinterpret_cast<const void*>(base + static_cast<std::uintptr_t>(off)), sizeof v);
  return v;
}

void* sym(const char* name) { return dlsym(RTLD_DEFAULT, name); }

// Parses "3.12.3 (main, ...)" (Py_GetVersion's static string).
bool parse_version(const char* v, int* major, int* minor) {
  char* end = nullptr;
  long a = strtol(v, &end, 10);
  if (!end || *end != '.') return false;
  long b = strtol(end + 1, &end, 10);
  *major = static_cast<int>(a), *minor = static_cast<int>(b);
  return true;
}

void warn_once(const char* what) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  char line[256];
  int n = snprintf(line, sizeof line, "gpuheap: warning: %s; Python frames are not recorded\n", what);
  if (n > 0) (void)!write(2, line, static_cast<std::size_t>(n) < sizeof line ? n : sizeof line - 1);
}

// g_mu held. Fills g_py and sets g_ready when a known interpreter is in the process.
void probe_locked() {
  if (g_ready.load(std::memory_order_relaxed)) return;
  using ver_fn = const char* (*)();
  auto get_version = reinterpret_cast<ver_fn>(sym("Py_GetVersion"));
  if (!get_version) return;
  Interp p;
  const char* v = get_version();
  if (!v || !parse_version(v, &p.major, &p.minor)) return;
  p.layout = py_layout(p.major, p.minor);
  if (!p.layout) return warn_once("this Python version's frame layout is unknown (3.10-3.13 are)");
  // The free-threaded build has a larger object header: none of the offsets hold.
  if (sym("_Py_MergeZeroLocalRefcount")) return warn_once("free-threaded Python is not supported");
  p.this_thread_state = reinterpret_cast<get_ts_fn>(sym("PyGILState_GetThisThreadState"));
  if (p.minor >= 12) {
    p.unchecked_get = reinterpret_cast<get_ts_fn>(sym("PyThreadState_GetUnchecked"));
    if (!p.unchecked_get) p.unchecked_get = reinterpret_cast<get_ts_fn>(sym("_PyThreadState_UncheckedGet"));
  }
  p.is_initialized = reinterpret_cast<int_fn>(sym("Py_IsInitialized"));
  p.code_type = reinterpret_cast<std::uintptr_t>(sym("PyCode_Type"));
  p.str_type = reinterpret_cast<std::uintptr_t>(sym("PyUnicode_Type"));
  void* eval = sym("_PyEval_EvalFrameDefault");
  Dl_info info;
  void* extra = nullptr;
  if (eval && dladdr1(eval, &info, &extra, RTLD_DL_SYMENT) && extra) {
    const auto* esym = static_cast<const ElfW(Sym)*>(extra);
    p.eval_lo = reinterpret_cast<std::uintptr_t>(eval);
    p.eval_hi = p.eval_lo + esym->st_size;
  }
  if (!p.this_thread_state || !p.is_initialized || !p.code_type || !p.str_type)
    return warn_once("the Python interpreter does not export what gpuheap reads");
  if (!g_codes) {
    void* m = mmap(nullptr, kCodeSlots * sizeof(CodeSlot), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return;
    g_codes = static_cast<CodeSlot*>(m);
  }
  g_py = p;
  g_ready.store(true, std::memory_order_release);
}

inline bool is_type(std::uintptr_t obj, std::uintptr_t type) {
  return obj && (obj & 7) == 0 && at<std::uintptr_t>(obj, kObType) == type;
}

// A str object's text as UTF-8 into out[0..cap); "" for what it cannot read (never fails).
std::size_t read_str(std::uintptr_t s, char* out, std::size_t cap) {
  const PyLayout& L = *g_py.layout;
  if (!is_type(s, g_py.str_type)) return 0;
  auto len = at<std::int64_t>(s, kStrLength);
  auto state = at<std::uint32_t>(s, kStrState);
  unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || len < 0 || (L.str_needs_ready && !((state >> 7) & 1))) return 0;
  auto data = s + static_cast<std::uintptr_t>(ascii ? L.str_ascii_data : L.str_compact_data);
  std::size_t n = 0;
  for (std::int64_t i = 0; i < len; ++i) {
    std::uint32_t c;
    if (kind == 1) c = at<std::uint8_t>(data, static_cast<int>(i));
    else if (kind == 2) c = at<std::uint16_t>(data, static_cast<int>(2 * i));
    else if (kind == 4) c = at<std::uint32_t>(data, static_cast<int>(4 * i));
    else return n;
    char u[4];
    std::size_t k;
    if (c < 0x80) u[0] = static_cast<char>(c), k = 1;
    else if (c < 0x800) u[0] = static_cast<char>(0xC0 | (c >> 6)), u[1] = static_cast<char>(0x80 | (c & 63)), k = 2;
    else if (c < 0x10000)
      u[0] = static_cast<char>(0xE0 | (c >> 12)), u[1] = static_cast<char>(0x80 | ((c >> 6) & 63)),
      u[2] = static_cast<char>(0x80 | (c & 63)), k = 3;
    else
      u[0] = static_cast<char>(0xF0 | (c >> 18)), u[1] = static_cast<char>(0x80 | ((c >> 12) & 63)),
      u[2] = static_cast<char>(0x80 | ((c >> 6) & 63)), u[3] = static_cast<char>(0x80 | (c & 63)), k = 4;
    if (n + k > cap) return n;  // cut at a character boundary
    memcpy(out + n, u, k);
    n += k;
  }
  return n;
}

// The fields that identify a code object's content, as far as its record goes: a code object
// freed and another allocated at its address differs in at least one of them unless it names
// the same file, name, first line and line table objects.
struct CodeFields {
  std::uintptr_t filename, name, linetable;
  std::int32_t firstlineno;
};

inline CodeFields code_fields(std::uintptr_t code, const PyLayout& L) {
  return {at<std::uintptr_t>(code, L.co_filename), at<std::uintptr_t>(code, L.co_name),
          at<std::uintptr_t>(code, L.co_linetable), at<std::int32_t>(code, L.co_firstlineno)};
}

inline std::uint32_t code_check(const CodeFields& f) {
  std::uint64_t h = f.filename * 0x9E3779B97F4A7C15ull;
  h ^= f.name + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
  h ^= static_cast<std::uint32_t>(f.firstlineno) * 0xFF51AFD7ED558CCDull;
  h ^= f.linetable;
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

// g_mu held: writes the py_code record of `code` under a new id; 0 if the sink refused it.
std::uint32_t write_code_locked(std::uintptr_t code) {
  const PyLayout& L = *g_py.layout;
  if (g_next_code > format::kMaxPyCodeId) return 0;
  format::PyCodeRecord r;
  r.id = g_next_code;
  r.py_major = static_cast<std::uint8_t>(g_py.major), r.py_minor = static_cast<std::uint8_t>(g_py.minor);
  r.firstlineno = at<std::int32_t>(code, L.co_firstlineno);
  r.filename = {g_file_buf, read_str(at<std::uintptr_t>(code, L.co_filename), g_file_buf, kMaxName)};
  std::uintptr_t name = L.co_qualname >= 0 ? at<std::uintptr_t>(code, L.co_qualname) : 0;
  if (!is_type(name, g_py.str_type)) name = at<std::uintptr_t>(code, L.co_name);
  r.name = {g_name_buf, read_str(name, g_name_buf, kMaxName)};
  std::uintptr_t lt = at<std::uintptr_t>(code, L.co_linetable);
  if (lt && (lt & 7) == 0) {
    auto n = at<std::int64_t>(lt, kVarSize);
    // A table too long to carry is left out: lines then read as the first line.
    if (n > 0 && static_cast<std::uint64_t>(n) <= kMaxLinetable)
      r.linetable = {reinterpret_cast<const char*>(lt + kBytesData), static_cast<std::size_t>(n)};
  }
  std::size_t len = format::encode(g_rec, sizeof g_rec, r);
  modules_sync_if_changed();  // keep the module records ahead, as for stacks
  if (!len || !sink_append(g_rec, len)) return 0;
  return g_next_code++;
}

// The id of a code object in this file, writing its record on first sight.
std::uint32_t code_id(std::uintptr_t code, const CodeFields& fields) {
  std::uint32_t check = code_check(fields);
  std::size_t mask = kCodeSlots - 1;
  std::size_t h = static_cast<std::size_t>((code >> 4) * 0x9E3779B97F4A7C15ull >> 40);
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    CodeSlot& s = g_codes[i];
    std::uintptr_t k = s.code.load(std::memory_order_acquire);
    if (k == 0) break;
    if (k == code) {
      std::uint64_t ci = s.check_id.load(std::memory_order_acquire);
      if (static_cast<std::uint32_t>(ci >> 32) == check) return static_cast<std::uint32_t>(ci);
      break;
    }
  }
  pthread_mutex_lock(&g_mu);
  std::uint32_t id = 0;
  CodeSlot* slot = nullptr;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {  // again, under the lock
    CodeSlot& s = g_codes[i];
    std::uintptr_t k = s.code.load(std::memory_order_relaxed);
    if (k == 0 || k == code) {
      slot = &s;
      if (k == code) {
        std::uint64_t ci = s.check_id.load(std::memory_order_relaxed);
        if (static_cast<std::uint32_t>(ci >> 32) == check) id = static_cast<std::uint32_t>(ci);
      }
      break;
    }
  }
  if (id == 0) {
    id = write_code_locked(code);
    bool fresh = slot->code.load(std::memory_order_relaxed) == 0;
    if (id && (!fresh || g_code_fill < kCodeMaxFill)) {  // full table: written, not interned
      slot->check_id.store(static_cast<std::uint64_t>(check) << 32 | id, std::memory_order_release);
      if (fresh) slot->code.store(code, std::memory_order_release), ++g_code_fill;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return id;
}

// A thread's memo of the code ids it found last (GPUHEAP_STACK_CACHE): the table above costs a
// hash and a probe per frame, and a deep program's stacks name the same few hundred code objects
// at every allocation. An entry serves a frame only when the code object's identifying fields,
// read again now, are exactly those its id was found for: the table's own condition (its check
// is a hash of the same fields), compared in full instead of hashed. Nothing is inferred from a
// frame still holding the address it held before: a frame that returned, a code object freed
// and another allocated at its address, and a new frame at the old frame's address (exec of new
// source in a loop) look the same from the frame chain.
// Two ways a set, 256 sets by a hash of the code address (a training step's stacks name a few
// hundred code objects; pymalloc places them at regular strides, which a plain multiplicative
// hash of the address folded onto few sets), the newest in way 0. 24 KiB a thread, mapped at
// its first Python stack (never through malloc: we may be inside its hook) and unmapped when
// it exits.
struct MemoEntry {
  std::uintptr_t code;  // 0: empty
  std::uintptr_t filename, name, linetable;
  std::int32_t firstlineno;
  std::uint64_t frame;  // format::py_frame(id, 0)
};
constexpr int kMemoSetBits = 8;
struct Memo {
  std::uint32_t gen;  // the g_code_gen its ids were found in
  MemoEntry e[1u << kMemoSetBits][2];
};
constinit std::atomic<std::uint32_t> g_code_gen{1};  // bumped where ids restart (pystack_reset)
constinit std::atomic<bool> g_memo_on{true};
thread_local Memo* t_memo __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local bool t_no_memo __attribute__((tls_model("initial-exec"))) = false;
thread_local bool t_walking __attribute__((tls_model("initial-exec"))) = false;

void release_memo(void* p) {
  t_no_memo = true;
  if (t_memo == p) t_memo = nullptr;
  munmap(p, sizeof(Memo));
}

// The calling thread's memo, holding ids of the current file only; nullptr when off.
Memo* thread_memo() {
  if (!g_memo_on.load(std::memory_order_relaxed)) return nullptr;
  if (!t_memo && !t_no_memo) {
    void* p = mmap(nullptr, sizeof(Memo), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED && !release_at_thread_exit(release_memo, p)) {
      munmap(p, sizeof(Memo));
      p = MAP_FAILED;
    }
    if (p == MAP_FAILED) {
      t_no_memo = true;
      return nullptr;
    }
    t_memo = static_cast<Memo*>(p);
  }
  Memo* m = t_memo;
  std::uint32_t gen = g_code_gen.load(std::memory_order_acquire);
  if (m && m->gen != gen) {
    memset(m->e, 0, sizeof m->e);
    m->gen = gen;
  }
  return m;
}

inline MemoEntry* memo_set(Memo* m, std::uintptr_t code) {
  std::uint64_t x = (code >> 4) * 0x9E3779B97F4A7C15ull;
  return m->e[(x ^ (x >> 29)) & ((1u << kMemoSetBits) - 1)];
}

inline bool memo_serves(const MemoEntry& e, std::uintptr_t code, const CodeFields& f) {
  return e.code == code && e.filename == f.filename && e.name == f.name && e.linetable == f.linetable &&
         e.firstlineno == f.firstlineno;
}

// Not in way 0: way 1, which then swaps with way 0, else the table, whose id goes to way 0 (the
// entry there moves to way 1) when it belongs to the memo's file. format::py_frame(id, 0); 0
// for no id.
__attribute__((noinline)) std::uint64_t memo_miss(Memo* m, MemoEntry* set, std::uintptr_t code, const CodeFields& f) {
  if (memo_serves(set[1], code, f)) {
    const MemoEntry hit = set[1];
    set[1] = set[0], set[0] = hit;
    return hit.frame;
  }
  std::uint32_t id = code_id(code, f);
  if (!id) return 0;
  std::uint64_t frame = format::py_frame(id, 0);
  // A new file may have started during the look-up (its ids restart): such an id is not kept.
  if (g_code_gen.load(std::memory_order_acquire) == m->gen) {
    if (set[0].code != code) set[1] = set[0];
    set[0] = {code, f.filename, f.name, f.linetable, f.firstlineno, frame};
  }
  return frame;
}

// format::py_frame(code's id, 0), 0 when it has none.
template <int V>
inline std::uint64_t memo_frame(Memo* m, std::uintptr_t code) {
  const CodeFields f = code_fields(code, kPyLayouts[V]);  // the layout's offsets as constants
  MemoEntry* set = memo_set(m, code);
  return memo_serves(set[0], code, f) ? set[0].frame : memo_miss(m, set, code, f);
}

bool safe_read(std::uintptr_t addr, void* out, std::size_t n) {
  iovec local{out, n}, remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}
// One word through safe_read; where process_vm_readv itself is refused (seccomp: ENOSYS or
// EPERM, not EFAULT), a direct read: the layout of a known version is then trusted as it is.
bool read_word(std::uintptr_t addr, std::uintptr_t* v) {
  if (safe_read(addr, v, sizeof *v)) return true;
  if (errno == EFAULT || (addr & 7)) return false;
  *v = at<std::uintptr_t>(addr, 0);
  return true;
}

// Walks up to 64 frames from `fr` with checked reads: every pointer followed must be readable
// and the frames must name code objects.
bool check_layout(std::uintptr_t fr) {
  const PyLayout& L = *g_py.layout;
  int codes = 0;
  for (int i = 0; fr && i < 64; ++i) {
    std::uintptr_t prev = 0, code = 0, type = 0;
    if ((fr & 7) || !read_word(fr + L.fr_previous, &prev) || !read_word(fr + L.fr_code, &code)) return false;
    if (code && !(code & 7) && read_word(code + kObType, &type) && type == g_py.code_type) ++codes;
    else if (L.minor < 12) return false;  // only 3.12+ frames (shims, other executables) may lack one
    fr = prev;
  }
  return codes > 0;
}

// The frames from `fr` outwards into out[0..cap), with kPyLayouts[V]'s offsets as constants: a
// deep program pays this per frame at every allocation, and offsets read from the layout
// doubled the instructions of each read.
template <int V, bool kMemo>
int walk_frames(std::uintptr_t fr, std::uint64_t* out, int cap, Memo* memo) {
  static_assert(kPyLayouts[V].minor == 10 + V);
  constexpr const PyLayout& L = kPyLayouts[V];
  const std::uintptr_t code_type = g_py.code_type;
  int n = 0;
  // A chain longer than this is no stack (a cycle would be corruption): stop.
  for (int guard = 0; fr && (fr & 7) == 0 && n < cap && guard < 100000; ++guard) {
    const std::uintptr_t prev = at<std::uintptr_t>(fr, L.fr_previous);
    if (L.fr_owner >= 0 && at<std::int8_t>(fr, L.fr_owner) == kOwnedByCStack) {
      fr = prev;
      continue;
    }
    const std::uintptr_t code = at<std::uintptr_t>(fr, L.fr_code);
    if (!is_type(code, code_type)) {
      if (L.minor >= 13) {  // f_executable may be another object (not a Python function)
        fr = prev;
        continue;
      }
      break;  // not what the layout says: stop rather than follow garbage
    }
    std::uint32_t lasti = format::kPyNoLasti;
    if (L.fr_lasti_is_int) {
      auto li = at<std::int32_t>(fr, L.fr_instr);
      if (li >= 0) lasti = static_cast<std::uint32_t>(li);
    } else {
      std::uintptr_t ip = at<std::uintptr_t>(fr, L.fr_instr), first = code + static_cast<std::uintptr_t>(L.co_code);
      if (ip >= first) lasti = static_cast<std::uint32_t>((ip - first) / 2);
    }
    std::uint64_t frame = 0;
    if (kMemo) {
      frame = memo_frame<V>(memo, code);
    } else if (std::uint32_t id = code_id(code, code_fields(code, L))) {
      frame = format::py_frame(id, 0);
    }
    if (frame == 0) break;  // the sink refused the record: the frames would name nothing
    out[n++] = frame | lasti;
    fr = prev;
  }
  return n;
}

int walk_any(int minor, std::uintptr_t fr, std::uint64_t* out, int cap, Memo* memo) {
  switch (minor * 2 + (memo ? 1 : 0)) {
    case 20: return walk_frames<0, false>(fr, out, cap, memo);
    case 21: return walk_frames<0, true>(fr, out, cap, memo);
    case 22: return walk_frames<1, false>(fr, out, cap, memo);
    case 23: return walk_frames<1, true>(fr, out, cap, memo);
    case 24: return walk_frames<2, false>(fr, out, cap, memo);
    case 25: return walk_frames<2, true>(fr, out, cap, memo);
    case 26: return walk_frames<3, false>(fr, out, cap, memo);
    default: return walk_frames<3, true>(fr, out, cap, memo);
  }
}

}  // namespace

void pystack_configure(bool enabled) noexcept {
  g_enabled.store(enabled);
  if (!enabled) return;
  pthread_mutex_lock(&g_mu);
  probe_locked();
  pthread_mutex_unlock(&g_mu);
}

void pystack_cache_enable(bool on) noexcept { g_memo_on.store(on); }

bool pystack_available() noexcept { return g_ready.load(std::memory_order_acquire); }

void pystack_reprobe() noexcept {
  if (!g_enabled.load(std::memory_order_relaxed) || g_ready.load(std::memory_order_relaxed)) return;
  unsigned long long adds = modules_seen_adds();
  if (g_probed_adds.exchange(adds, std::memory_order_relaxed) == adds) return;
  pthread_mutex_lock(&g_mu);
  probe_locked();
  pthread_mutex_unlock(&g_mu);
}

int pystack_capture(std::uint64_t* out, int cap) noexcept {
  if (!g_enabled.load(std::memory_order_relaxed) || !g_ready.load(std::memory_order_acquire)) return 0;
  const Interp& P = g_py;
  const PyLayout& L = *P.layout;
  if (!P.is_initialized()) return 0;  // not yet, or finalizing: thread states may be gone
  auto ts = reinterpret_cast<std::uintptr_t>(P.this_thread_state());
  if (!ts && P.unchecked_get) ts = reinterpret_cast<std::uintptr_t>(P.unchecked_get());
  if (!ts) return 0;
  int checked = g_checked.load(std::memory_order_acquire);
  if (checked == 2) return 0;
  // Until the layout is checked, even the reads that find the first frame are checked ones.
  auto word = [checked](std::uintptr_t addr, std::uintptr_t* v) {
    if (checked == 1) return *v = at<std::uintptr_t>(addr, 0), true;
    return read_word(addr, v);
  };
  std::uintptr_t fr = 0, cf = 0;
  bool readable = L.ts_frame >= 0 ? word(ts + L.ts_frame, &fr)
                                  : word(ts + L.ts_cframe, &cf) && (!cf || word(cf + L.cframe_current, &fr));
  if (readable && !fr) return 0;  // no Python frames on this thread
  if (checked != 1) {
    bool ok = readable && check_layout(fr);
    g_checked.store(ok ? 1 : 2, std::memory_order_release);
    if (!ok) {
      warn_once("the Python interpreter's frames do not have the expected layout");
      return 0;
    }
  }
  // A capture nested in this one (a signal handler's allocation during the walk) leaves the
  // memo alone: the walk it interrupted may be reading the very entry it would write.
  const bool nested = t_walking;
  Memo* memo = nested ? nullptr : thread_memo();
  t_walking = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  int n = walk_any(L.minor, fr, out, cap, memo);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_walking = nested;
  return n;
}

bool pystack_is_eval_ip(std::uint64_t ip) noexcept {
  // g_py is constant once ready; callers asked pystack_capture first (acquire).
  return ip >= g_py.eval_lo && ip < g_py.eval_hi;
}

void pystack_reset() noexcept {
  pthread_mutex_lock(&g_mu);
  if (g_codes && g_code_fill) madvise(g_codes, kCodeSlots * sizeof(CodeSlot), MADV_DONTNEED);
  g_code_fill = 0;
  g_next_code = 1;
  g_code_gen.fetch_add(1, std::memory_order_release);  // the threads' memos are stale
  pthread_mutex_unlock(&g_mu);
}

void pystack_fork_prepare() noexcept { pthread_mutex_lock(&g_mu); }
void pystack_fork_parent() noexcept { pthread_mutex_unlock(&g_mu); }
void pystack_fork_child() noexcept {
  pthread_mutex_init(&g_mu, nullptr);
  pystack_reset();
}

}  // namespace preload
}  // namespace gpuheap
