// Finding the real CUDA functions. See real.h for the three routes a call can take.
#include "preload/real.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <time.h>

#include <mutex>

namespace gpuheap {
namespace detail {

std::atomic<void*> g_real[kNumFns];

namespace {

constexpr const char* kNames[kNumFns] = {
#define GPUHEAP_NAME(name, decl) #name,
    GPUHEAP_RUNTIME_HOOKS(GPUHEAP_NAME) "",
    GPUHEAP_DRIVER_HOOKS(GPUHEAP_NAME) "",
    GPUHEAP_DRIVER_USED(GPUHEAP_NAME)
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

// Handle of an already-loaded library whose file name starts with `prefix` (libcudart.so,
// libcuda.so). RTLD_NOLOAD: we never load CUDA ourselves for a lookup.
struct FindLib {
  const char* prefix;
  char path[4096];
  bool found;
};

int find_lib_cb(dl_phdr_info* info, size_t, void* data) {
  auto* f = static_cast<FindLib*>(data);
  const char* name = info->dlpi_name;
  if (!name || !*name) return 0;
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (strncmp(base, f->prefix, strlen(f->prefix)) != 0) return 0;
  strncpy(f->path, name, sizeof f->path - 1);
  f->path[sizeof f->path - 1] = '\0';
  f->found = true;
  return 1;
}

void* loaded_library(const char* prefix, const char* soname) noexcept {
  if (void* h = dlopen(soname, RTLD_NOLOAD | RTLD_LAZY)) return h;
  FindLib f{prefix, {}, false};
  dl_iterate_phdr(find_lib_cb, &f);
  if (!f.found) return nullptr;
  return dlopen(f.path, RTLD_NOLOAD | RTLD_LAZY);
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
    // RTLD_LOCAL through its own DT_RPATH) an already-loaded libcudart found by name.
    p = dl(RTLD_NEXT, kNames[i]);
    if (!p) {
      if (void* h = loaded_library("libcudart.so", "libcudart.so.13")) {
        lib_loaded = true;
        p = dl(h, kNames[i]);
      }
    }
  } else {
    // The driver. It is loaded by whichever runtime the program uses; if nobody loaded it
    // yet, nobody can have a context and the callers handle nullptr.
    void* h = loaded_library("libcuda.so", "libcuda.so.1");
    lib_loaded = h != nullptr;
    if (h) p = dl(h, kNames[i]);
  }
  if (p == our_wrapper(f)) p = nullptr;  // never hand back ourselves as "real"
  if (p)
    note_real(f, p);
  else if (lib_loaded)
    g_missed_at[i].store(now, std::memory_order_relaxed);
  return g_real[i].load(std::memory_order_acquire);
}

void* lookup_for_caller(void* handle, const char* name, const void* caller) noexcept {
  auto dl = real_dlsym();
  if (!dl) return nullptr;
  if (handle != RTLD_NEXT) return dl(handle, name);
  // RTLD_NEXT means "after the caller's object", but glibc would now compute it relative
  // to libgpuheap.so. Walk the global link map from the caller's successor instead.
  Dl_info info;
  link_map* lm = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm)
    return dl(RTLD_NEXT, name);
  for (link_map* l = lm->l_next; l; l = l->l_next) {
    if (!l->l_name || !*l->l_name) continue;  // the main program comes first, never "next"
    void* h = dlopen(l->l_name, RTLD_NOLOAD | RTLD_LAZY);
    if (!h) continue;
    void* p = dl(h, name);
    dlclose(h);
    if (p) return p;
  }
  return nullptr;
}

}  // namespace detail
}  // namespace gpuheap
