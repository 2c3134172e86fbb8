#include "preload/record/modules.h"

#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>

#include "format/trace.h"
#include "preload/record/recorder.h"
#include "preload/record/sink.h"

namespace gpuheap {
namespace preload {
namespace {

constinit pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
constinit ModuleInfo* g_known = nullptr;  // written to the current file
constinit std::size_t g_nknown = 0;

struct ScanState {
  ModuleInfo* mods = nullptr;
  std::size_t n = 0, cap = 0;
  bool failed = false;
};

// NT_GNU_BUILD_ID lives in a PT_NOTE segment, which is mapped (it sits inside the first
// PT_LOAD), so it is read from memory rather than from the file on disk.
void read_build_id(const dl_phdr_info* info, const ElfW(Phdr) * ph, ModuleInfo* m) {
  auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph->p_vaddr);
  std::size_t left = ph->p_memsz;
  while (left >= sizeof(ElfW(Nhdr))) {
    ElfW(Nhdr) nh;
    memcpy(&nh, p, sizeof nh);
    std::size_t name_sz = (nh.n_namesz + 3u) & ~3u, desc_sz = (nh.n_descsz + 3u) & ~3u;
    std::size_t total = sizeof nh + name_sz + desc_sz;
    if (total > left) return;
    if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(p + sizeof nh, "GNU", 4) == 0 &&
        nh.n_descsz <= sizeof m->build_id) {
      memcpy(m->build_id, p + sizeof nh + name_sz, nh.n_descsz);
      m->build_id_len = nh.n_descsz;
      return;
    }
    p += total, left -= total;
  }
}

int on_object(dl_phdr_info* info, std::size_t, void* arg) {
  auto* st = static_cast<ScanState*>(arg);
  if (st->n == st->cap) {
    std::size_t cap = st->cap ? st->cap * 2 : 64;
    auto* m = static_cast<ModuleInfo*>(realloc(st->mods, cap * sizeof(ModuleInfo)));
    if (!m) {
      st->failed = true;
      return 1;
    }
    st->mods = m, st->cap = cap;
  }
  ModuleInfo m;
  m.base = info->dlpi_addr;
  std::uint64_t lo = UINT64_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      std::uint64_t a = info->dlpi_addr + ph.p_vaddr;
      if (a < lo) lo = a;
      if (a + ph.p_memsz > hi) hi = a + ph.p_memsz;
    } else if (ph.p_type == PT_NOTE && m.build_id_len == 0) {
      read_build_id(info, &ph, &m);
    }
  }
  if (hi == 0) return 0;  // nothing mapped: not interesting
  m.lo = lo, m.hi = hi;
  const char* name = info->dlpi_name;
  char exe[4096];
  if (st->n == 0 && (!name || !*name)) {  // the main program is listed first, unnamed
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[k > 0 ? k : 0] = '\0';
    name = exe;
  }
  m.path = strdup(name ? name : "");
  if (!m.path) {
    st->failed = true;
    return 1;
  }
  st->mods[st->n++] = m;
  return 0;
}

bool same(const ModuleInfo& a, const ModuleInfo& b) {
  return a.base == b.base && a.lo == b.lo && a.hi == b.hi && strcmp(a.path, b.path) == 0;
}

void append_module(const ModuleInfo& m) {
  format::ModuleRecord r;
  r.base = m.base, r.lo = m.lo, r.hi = m.hi, r.path = m.path;
  r.build_id = std::string_view(reinterpret_cast<const char*>(m.build_id), m.build_id_len);
  std::size_t cap = format::kFrameHeaderSize + 3 * 8 + 8 + strlen(m.path) + m.build_id_len;
  auto* buf = static_cast<unsigned char*>(malloc(cap));
  if (!buf) return;
  std::size_t n = format::encode(buf, cap, r);
  if (n) sink_append(buf, n, /*start_thread=*/false);
  free(buf);
}

}  // namespace

std::size_t modules_scan(ModuleInfo** out) noexcept {
  ScanState st;
  dl_iterate_phdr(on_object, &st);
  *out = st.mods;
  return st.n;
}

void modules_free(ModuleInfo* mods, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) free(mods[i].path);
  free(mods);
}

void modules_sync() noexcept {
  pthread_mutex_lock(&g_mu);
  ModuleInfo* now = nullptr;
  std::size_t n = modules_scan(&now);
  for (std::size_t i = 0; i < n; ++i) {
    bool known = false;
    for (std::size_t j = 0; j < g_nknown && !known; ++j) known = same(now[i], g_known[j]);
    if (!known) append_module(now[i]);
  }
  for (std::size_t j = 0; j < g_nknown; ++j) {
    bool present = false;
    for (std::size_t i = 0; i < n && !present; ++i) present = same(now[i], g_known[j]);
    if (!present) {
      unsigned char buf[format::kMaxEventRecordSize];
      std::size_t k = format::encode(buf, sizeof buf, format::ModuleUnloadRecord{now_ns(), g_known[j].base});
      sink_append(buf, k, false);
    }
  }
  modules_free(g_known, g_nknown);
  g_known = now, g_nknown = n;
  pthread_mutex_unlock(&g_mu);
}

namespace {
std::atomic<unsigned long long> g_seen_adds{0}, g_seen_subs{0};

int read_counters(dl_phdr_info* info, std::size_t size, void* out) {
  auto* c = static_cast<unsigned long long*>(out);
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
    c[0] = info->dlpi_adds, c[1] = info->dlpi_subs;
  return 1;  // the counters are the same in every entry: stop after the first
}
}  // namespace

void modules_sync_if_changed() noexcept {
  unsigned long long c[2] = {~0ull, ~0ull};
  dl_iterate_phdr(read_counters, c);
  if (c[0] == g_seen_adds.load(std::memory_order_relaxed) && c[1] == g_seen_subs.load(std::memory_order_relaxed))
    return;
  modules_sync();
  g_seen_adds.store(c[0], std::memory_order_relaxed);
  g_seen_subs.store(c[1], std::memory_order_relaxed);
}

unsigned long long modules_seen_adds() noexcept { return g_seen_adds.load(std::memory_order_relaxed); }

void modules_reset() noexcept {
  g_seen_adds.store(0), g_seen_subs.store(0);  // the next check syncs again
  pthread_mutex_lock(&g_mu);
  modules_free(g_known, g_nknown);
  g_known = nullptr, g_nknown = 0;
  pthread_mutex_unlock(&g_mu);
}

void modules_fork_prepare() noexcept { pthread_mutex_lock(&g_mu); }
void modules_fork_parent() noexcept { pthread_mutex_unlock(&g_mu); }
void modules_fork_child() noexcept {
  pthread_mutex_init(&g_mu, nullptr);
  modules_reset();
}

}  // namespace preload
}  // namespace gpuheap
