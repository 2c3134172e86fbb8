// The out-of-memory report written to stderr when an allocation finally fails. It gives a
// person what to act on right there (the numbers, whether fragmentation was the cause, a
// suggestion, the allocating stack as module+offset); exact source lines and the live sites
// come from `gpuheap summary` on the trace, since nothing in-process symbolizes with DWARF.
// Rate-limited: the first few in full, then one line per 10 s with a count.
#include "preload/core/oom.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <libunwind.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "preload/core/stderr_line.h"
#include "preload/record/recorder.h"
#include "preload/record/unwind.h"

namespace gpuheap {
namespace preload {

namespace {

constexpr int kFullReports = 3;
constexpr std::uint64_t kQuietNs = 10'000'000'000ull;

std::atomic<int> g_reports{0};
std::atomic<std::uint64_t> g_last_ns{0};
std::atomic<std::uint64_t> g_suppressed{0};

// Human size for the figures: B, KiB, MiB, GiB, TiB with two decimals (the diagnosis
// sentences are format/rules.h's, in the summary's size style).
const char* human(std::uint64_t b, char* buf, std::size_t cap) noexcept {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  if (u == 0) snprintf(buf, cap, "%llu B", static_cast<unsigned long long>(b));
  else snprintf(buf, cap, "%.2f %s", v, units[u]);
  return buf;
}

struct Out {
  char buf[4096];
  std::size_t n = 0;
  void line(const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3))) {
    if (n >= sizeof buf - 2) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    n += static_cast<std::size_t>(w) < sizeof buf - n - 1 ? static_cast<std::size_t>(w) : sizeof buf - n - 2;
    buf[n++] = '\n';
  }
  void flush() noexcept { write_stderr(buf, n); }
};

// One frame as "function (module+0xoff)" through dladdr (dynamic symbols only: exact
// source lines are the analyzer's job). False for frames of gpuheap and the CUDA libraries.
bool frame_line(Out& o, const void* ip, const char* indent) noexcept {
  Dl_info info{};
  if (!dladdr(ip, &info) || !info.dli_fname) return false;
  const char* mod = strrchr(info.dli_fname, '/');
  mod = mod ? mod + 1 : info.dli_fname;
  if (!strncmp(mod, "libgpuheap", 10) || !strncmp(mod, "libcudart", 9) || !strncmp(mod, "libcuda.so", 10) ||
      !strncmp(mod, "libunwind", 9))
    return false;
  auto off = reinterpret_cast<std::uintptr_t>(ip) - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
  o.line("gpuheap:%sat %s (%s+0x%lx)", indent, info.dli_sname ? info.dli_sname : "??", mod,
         static_cast<unsigned long>(off));
  return true;
}

void stack_lines(Out& o) noexcept {
  void* ips[32];
  int n = unw_backtrace(ips, 32);
  for (int i = 0, shown = 0; i < n && shown < 10; ++i) shown += frame_line(o, ips[i], "     ");
}

void site_lines(Out& o, const LiveSite* sites, int nsites) noexcept {
  for (int i = 0; i < nsites; ++i) {
    char b[32];
    o.line("gpuheap:     #%d %s in %u allocation%s", i + 1, human(sites[i].bytes, b, sizeof b), sites[i].count,
           sites[i].count == 1 ? "" : "s");
    const std::uint64_t* ips = nullptr;
    int depth = stacks_lookup(sites[i].stack, &ips);
    for (int f = 0, shown = 0; f < depth && shown < 4; ++f)
      shown += frame_line(o, reinterpret_cast<const void*>(ips[f] - 1), "         ");
  }
}

}  // namespace

void report_oom(const format::OomRecord& r, const char* api, std::uint64_t cached_unused, std::uint64_t held,
                const LiveSite* sites, int nsites) noexcept {
  int k = g_reports.fetch_add(1, std::memory_order_relaxed);
  if (k >= kFullReports) {
    std::uint64_t last = g_last_ns.load(std::memory_order_relaxed);
    if (r.ts - last < kQuietNs || !g_last_ns.compare_exchange_strong(last, r.ts)) {
      g_suppressed.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    char a[32];
    Out o;
    o.line("gpuheap: CUDA out of memory again: tried to allocate %s (%s) on device %d; %llu more not reported",
           human(r.requested, a, sizeof a), api, r.device, static_cast<unsigned long long>(g_suppressed.exchange(0)));
    o.flush();
    return;
  }
  g_last_ns.store(r.ts, std::memory_order_relaxed);
  char req[32], tot[32], cap[32], fr[32], df[32], hd[32], al[32], rs[32], cu[32], lf[32];
  Out o;
  o.line("gpuheap: CUDA out of memory. Tried to allocate %s (%s) on device %d, stream 0x%llx.",
         human(r.requested, req, sizeof req), api, r.device, static_cast<unsigned long long>(r.stream));
  std::uint64_t cap_free = r.limit ? (r.limit > held ? r.limit - held : 0) + cached_unused : 0;
  std::uint64_t free_now = r.limit && cap_free < r.device_free + cached_unused ? cap_free
                                                                               : r.device_free + cached_unused;
  o.line("gpuheap:   device total %s, cap %s, free %s (driver free %s); held by this process %s",
         human(r.device_total, tot, sizeof tot), r.limit ? human(r.limit, cap, sizeof cap) : "none",
         human(free_now, fr, sizeof fr), human(r.device_free, df, sizeof df), human(held, hd, sizeof hd));
  o.line("gpuheap:   pool: allocated %s, reserved %s, reserved but unused %s, largest free block %s",
         human(r.allocated, al, sizeof al), human(r.reserved, rs, sizeof rs), human(cached_unused, cu, sizeof cu),
         human(r.largest_free, lf, sizeof lf));
  // The diagnosis is the summary's (format/rules.h): same rule, same words.
  format::OomFacts facts = format::oom_facts(r, held);
  facts.cached_unused = cached_unused;
  format::OomText text;
  format::oom_text(facts, format::diagnose_oom(facts), &text);
  o.line("gpuheap:   %s", text.fit);
  o.line("gpuheap:   suggestion: %s", text.suggestion);
  o.line("gpuheap:   allocated from:");
  stack_lines(o);
  if (nsites > 0) {
    o.line("gpuheap:   top live allocation sites on device %d:", r.device);
    site_lines(o, sites, nsites);
  }
  const char* path = recorder_path();
  if (path && *path) o.line("gpuheap:   live allocation sites with source lines: gpuheap summary %s", path);
  o.flush();
}

namespace {

struct ErrorName {
  int code;
  const char* runtime;
  const char* driver;
};
// The errors an allocation meets when the GPU cannot be used at all (driver_types.h, cuda.h).
constexpr ErrorName kErrorNames[] = {
    {1, "cudaErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE"},
    {3, "cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED"},
    {34, "cudaErrorStubLibrary", "CUDA_ERROR_STUB_LIBRARY"},
    {35, "cudaErrorInsufficientDriver", nullptr},
    {46, "cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE"},
    {101, "cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE"},
    {201, "cudaErrorDeviceUninitialized", "CUDA_ERROR_INVALID_CONTEXT"},
    {700, "cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {709, "cudaErrorContextIsDestroyed", "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {803, "cudaErrorSystemDriverMismatch", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "cudaErrorCompatNotSupportedOnDevice", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {999, "cudaErrorUnknown", "CUDA_ERROR_UNKNOWN"},
};

std::atomic<bool> g_not_oom_named{false};

}  // namespace

bool is_out_of_memory(int code, bool runtime) noexcept {
  return code == (runtime ? int(cudaErrorMemoryAllocation) : int(CUDA_ERROR_OUT_OF_MEMORY));
}

void report_not_oom(const char* api, int code, bool runtime) noexcept {
  if (g_not_oom_named.exchange(true, std::memory_order_relaxed)) return;
  const char* name = nullptr;
  for (const ErrorName& e : kErrorNames)
    if (e.code == code) name = runtime ? e.runtime : e.driver;
  char line[256];
  int n = snprintf(line, sizeof line,
                   "gpuheap: %s returned %s %d%s%s%s, not an out-of-memory error: passed to the program "
                   "unchanged (named once)\n",
                   api, runtime ? "cudaError" : "CUresult", code, name ? " (" : "", name ? name : "", name ? ")" : "");
  if (n > 0)
    write_stderr(line, static_cast<std::size_t>(n) < sizeof line ? static_cast<std::size_t>(n) : sizeof line - 1);
}

}  // namespace preload
}  // namespace gpuheap
