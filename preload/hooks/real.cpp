// Finding the real CUDA functions. See real.h for the three routes a call can take.
#include "preload/hooks/real.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace gpuheap {
namespace preload {

std::atomic<void*> g_real[kNumFns];

namespace {

constexpr const char* kNames[kNumFns] = {
#define GPUHEAP_NAME(name, decl) #name,
    GPUHEAP_RUNTIME_HOOKS(GPUHEAP_NAME) "", GPUHEAP_DRIVER_HOOKS(GPUHEAP_NAME) "", GPUHEAP_DRIVER_USED(GPUHEAP_NAME)
#undef GPUHEAP_NAME
};

dlsym_fn find_real_dlsym() noexcept {
  // dlsym moved into libc proper in glibc 2.34 (GLIBC_2.34); older and other architectures
  // carry GLIBC_2.2.5 / GLIBC_2.17. dlvsym is not interposed by us, so this is safe.
  for (const char* ver : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"}) {
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", ver)) return reinterpret_cast<dlsym_fn>(p);
  }
  return nullptr;
}

// The CUDA runtime's names: libcudart.so[.N], and libcudart-<hash>.so[.N], the renamed copy
// a Python wheel bundles (auditwheel-style repairs rename the file and its DT_SONAME; the
// extension that needs it loads it RTLD_LOCAL, so neither RTLD_NEXT nor a dlopen of
// "libcudart.so.13" finds it). Not libcudart_static / libcudart.a (no DT_SONAME, not loaded).
bool is_cudart_name(const char* base) noexcept {
  static constexpr char kStem[] = "libcudart";
  if (!base || strncmp(base, kStem, sizeof kStem - 1) != 0) return false;
  const char* p = base + sizeof kStem - 1;
  if (*p == '-') {
    const char* hash = ++p;
    while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_') ++p;
    if (p == hash) return false;
  }
  return strncmp(p, ".so", 3) == 0 && (p[3] == '\0' || p[3] == '.');
}

bool is_driver_name(const char* base) noexcept { return base && strncmp(base, "libcuda.so", 10) == 0; }

// DT_SONAME of a loaded object, read from its dynamic section in memory (nullptr if none).
// Called under dl_iterate_phdr's lock: the object stays mapped while we read.
const char* soname_of(const dl_phdr_info* info) noexcept {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_DYNAMIC) continue;
    ElfW(Addr) strtab = 0, soname = 0;
    bool has_soname = false;
    for (auto* d = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + ph.p_vaddr); d->d_tag != DT_NULL; ++d) {
      if (d->d_tag == DT_STRTAB) strtab = d->d_un.d_ptr;
      if (d->d_tag == DT_SONAME) soname = d->d_un.d_val, has_soname = true;
    }
    if (!strtab || !has_soname) return nullptr;
    // glibc relocates DT_STRTAB in place, except where the dynamic section is read-only
    // (the vDSO; MIPS, RISC-V): there it is still the link-time address.
    if (strtab < info->dlpi_addr) strtab += info->dlpi_addr;
    return reinterpret_cast<const char*>(strtab + soname);
  }
  return nullptr;
}

// Finds an already-loaded library by its file name or, failing that, its DT_SONAME.
struct FindLib {
  bool (*match)(const char* base);
  char path[4096];
  bool found;
};

int find_lib_cb(dl_phdr_info* info, size_t, void* data) {
  auto* f = static_cast<FindLib*>(data);
  const char* name = info->dlpi_name;
  if (!name || !*name) return 0;
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (!f->match(base) && !f->match(soname_of(info))) return 0;
  strncpy(f->path, name, sizeof f->path - 1);
  f->path[sizeof f->path - 1] = '\0';
  f->found = true;
  return 1;
}

// RTLD_NOLOAD: we never load CUDA ourselves for a lookup. The path is copied under the
// loader lock and reopened outside it (dlopen must not run inside dl_iterate_phdr's callback).
// Out of line: its 4 KiB path stays off the stack of the common case (the soname is loaded).
__attribute__((noinline)) void* loaded_by_file_name(bool (*match)(const char*)) noexcept {
  FindLib f{match, {}, false};
  dl_iterate_phdr(find_lib_cb, &f);
  if (!f.found) return nullptr;
  return dlopen(f.path, RTLD_NOLOAD | RTLD_LAZY);
}

void* loaded_library(bool (*match)(const char*), const char* soname) noexcept {
  if (void* h = dlopen(soname, RTLD_NOLOAD | RTLD_LAZY)) return h;
  return loaded_by_file_name(match);
}

}  // namespace

const char* fn_name(Fn f) noexcept { return kNames[static_cast<int>(f)]; }
bool fn_is_runtime(Fn f) noexcept { return f < Fn::runtime_end_; }
bool fn_is_hooked(Fn f) noexcept { return f != Fn::runtime_end_ && f < Fn::hooks_end_; }

int hooked_fn_by_name(const char* name) noexcept {
  if (!name || name[0] != 'c' || name[1] != 'u') return -1;
  for (int i = 0; i < static_cast<int>(Fn::hooks_end_); ++i) {
    if (i == static_cast<int>(Fn::runtime_end_)) continue;
    if (strcmp(kNames[i], name) == 0) return i;
  }
  return -1;
}

dlsym_fn real_dlsym() noexcept {
  static dlsym_fn fn = find_real_dlsym();
  return fn;
}

int next_pipe2(int fds[2], int flags) noexcept {
  // No function-local static (its guard could be re-entered from a signal handler's pipe2):
  // two threads racing here resolve the same pointer.
  using pipe2_fn = int (*)(int*, int);
  static std::atomic<pipe2_fn> next{nullptr};
  pipe2_fn fn = next.load(std::memory_order_relaxed);
  if (!fn) {
    dlsym_fn dl = real_dlsym();
    fn = dl ? reinterpret_cast<pipe2_fn>(dl(RTLD_NEXT, "pipe2")) : nullptr;
    if (fn) next.store(fn, std::memory_order_relaxed);
  }
  return fn ? fn(fds, flags) : static_cast<int>(syscall(SYS_pipe2, fds, flags));
}

void note_real(Fn f, void* real) noexcept {
  if (!real || real == our_wrapper(f)) return;
  void* expected = nullptr;
  g_real[static_cast<int>(f)].compare_exchange_strong(expected, real, std::memory_order_acq_rel);
}

namespace {
// A lookup that found nothing (a function the loaded driver lacks, a library not loaded
// yet) is retried at most every 50 ms, not on every call: dlopen+dlsym cost microseconds.
std::atomic<std::uint64_t> g_missed_at[kNumFns];

std::uint64_t mono_ms() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000000u + 1;
}
}  // namespace

void* resolve(Fn f) noexcept {
  int i = static_cast<int>(f);
  if (void* p = g_real[i].load(std::memory_order_acquire)) return p;
  std::uint64_t missed = g_missed_at[i].load(std::memory_order_relaxed);
  std::uint64_t now = mono_ms();
  if (missed && now - missed < 50) return nullptr;
  auto dl = real_dlsym();
  if (!dl) return nullptr;
  void* p = nullptr;
  bool lib_loaded = false;  // only a function missing from a loaded library is cached as missing
  if (fn_is_runtime(f)) {
    // The program's libcudart: next in the global scope after us, or (torch loads it with
    // RTLD_LOCAL through its own DT_RPATH; a wheel bundles a renamed copy) an already-loaded
    // libcudart found by file name or soname.
    p = dl(RTLD_NEXT, kNames[i]);
    if (!p) {
      if (void* h = loaded_library(is_cudart_name, "libcudart.so.13")) {
        lib_loaded = true;
        p = dl(h, kNames[i]);
      }
    }
  } else {
    // The driver. It is loaded by whichever runtime the program uses; if nobody loaded it
    // yet, nobody can have a context and the callers handle nullptr.
    void* h = loaded_library(is_driver_name, "libcuda.so.1");
    lib_loaded = h != nullptr;
    if (h) p = dl(h, kNames[i]);
  }
  if (p == our_wrapper(f)) p = nullptr;  // never hand back ourselves as "real"
  if (p) note_real(f, p);
  else if (lib_loaded) g_missed_at[i].store(now, std::memory_order_relaxed);
  return g_real[i].load(std::memory_order_acquire);
}

namespace {
// RTLD_NEXT emulation: the objects after the caller's, in load order. The link_map chain is
// only read under the loader lock, which dl_iterate_phdr holds (a concurrent dlclose frees
// link_maps; following l_next without the lock could read freed memory). The callback copies
// the names out and nothing more: dlopen/dlsym take dl_load_lock, and a concurrent dlopen
// holds that while it waits for the lock dl_iterate_phdr holds (deadlock). Outside the
// callback each name is reopened with RTLD_NOLOAD, which fails harmlessly for an object
// unloaded meanwhile. Names are copied in chunks of kNextBytes (no malloc: dlsym runs inside
// malloc interposers' initialisation), each chunk resuming after the last object copied.
constexpr std::size_t kNextBytes = 8192;

struct NextObjects {
  ElfW(Addr) caller_addr;
  const char* caller_name;   // the caller's l_name (dl_iterate_phdr passes that same pointer)
  const void* resume_after;  // dlpi_phdr of the last object copied; nullptr: after the caller
  bool started;
  bool more;  // stopped early: the buffer is full
  const void* last;
  std::size_t used;
  char names[kNextBytes];
};

int next_objects_cb(dl_phdr_info* info, size_t, void* data) {
  auto* n = static_cast<NextObjects*>(data);
  if (!n->started) {
    n->started = n->resume_after ? info->dlpi_phdr == n->resume_after
                                 : info->dlpi_addr == n->caller_addr && info->dlpi_name == n->caller_name;
    return 0;
  }
  const char* name = info->dlpi_name;
  if (!name || !*name) return 0;  // the main program comes first, never "next"
  std::size_t len = strlen(name) + 1;
  if (len > kNextBytes) return 0;  // longer than any path: cannot be reopened anyway
  if (n->used + len > kNextBytes) {
    n->more = true;
    return 1;
  }
  memcpy(n->names + n->used, name, len);
  n->used += len;
  n->last = info->dlpi_phdr;
  return 0;
}
}  // namespace

namespace {
void* lookup_after(dlsym_fn dl, link_map* lm, const char* name) noexcept;
}  // namespace

void* lookup_for_caller(void* handle, const char* name, const void* caller) noexcept {
  auto dl = real_dlsym();
  if (!dl) return nullptr;
  if (handle != RTLD_NEXT) return dl(handle, name);
  // RTLD_NEXT means "after the caller's object", but glibc would now compute it relative
  // to libgpuheap.so. Search from the caller's successor instead. (Like glibc's own
  // RTLD_NEXT this covers the objects loaded after the caller, RTLD_LOCAL ones included;
  // names are reopened from our namespace, as they always were.)
  Dl_info info;
  link_map* lm = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm) return dl(RTLD_NEXT, name);
  return lookup_after(dl, lm, name);
}

namespace {
// The objects after `lm`, in chunks (kNextBytes on the stack: out of line, so a plain
// dlsym(handle, name) does not carry it).
__attribute__((noinline)) void* lookup_after(dlsym_fn dl, link_map* lm, const char* name) noexcept {
  // The caller's own link_map cannot go away while the caller is running: reading its
  // l_addr/l_name here is safe.
  NextObjects n;
  n.caller_addr = lm->l_addr, n.caller_name = lm->l_name, n.resume_after = nullptr;
  do {
    n.started = n.more = false, n.used = 0, n.last = nullptr;
    dl_iterate_phdr(next_objects_cb, &n);
    for (std::size_t at = 0; at < n.used; at += strlen(n.names + at) + 1) {
      void* h = dlopen(n.names + at, RTLD_NOLOAD | RTLD_LAZY);
      if (!h) continue;
      void* p = dl(h, name);
      dlclose(h);
      if (p) return p;
    }
    n.resume_after = n.last;
  } while (n.more && n.last);
  return nullptr;
}
}  // namespace

}  // namespace preload
}  // namespace gpuheap
