// A training step's allocation pattern in native code, for the stack cache's counters
// (gpuheap_stack_stats): each step runs LAYERS layers of K distinct call paths (as a model's
// ops repeat per layer), then ONCE paths seen once a step (embedding, loss, optimizer), on
// the main thread and, like autograd's engine, again on a second thread (the backward pass).
//   prog_stackmix same|varied LAYERS K ONCE STEPS
// same: every path's allocating frame has the same size, so all K+ONCE paths reach the
// allocator at one stack depth (one cache key, stacks differing only in return addresses);
// varied: each path's frame has its own size. Prints the counters as "name value" pairs.
#include <alloca.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "preload/gpuheap.h"
#include "tests/preload/prog_expect.h"

namespace {

constexpr int kPaths = 320;
bool g_varied = false;

template <int N>
__attribute__((noinline)) void* path(std::size_t size) {
  auto* pad = static_cast<volatile char*>(alloca(g_varied ? 16 * (N + 1) : 16));
  pad[0] = static_cast<char>(N);
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
  asm volatile("" ::: "memory");  // not a tail call: this frame is the path
  return p;
}

template <std::size_t... I>
constexpr std::array<void* (*)(std::size_t), sizeof...(I)> make_paths(std::index_sequence<I...>) {
  return {&path<static_cast<int>(I)>...};
}
constexpr auto kPathFns = make_paths(std::make_index_sequence<kPaths>{});

// The trunk every path is called through (a layer's forward, say).
__attribute__((noinline)) int run_paths(int first, int n, std::vector<void*>* held) {
  for (int i = first; i < first + n; ++i) {
    void* p = kPathFns[static_cast<std::size_t>(i)](256u * static_cast<std::size_t>(i + 1));
    if (!p) return 1;
    held->push_back(p);
  }
  return 0;
}

__attribute__((noinline)) int step(int base, int layers, int k, int once) {
  std::vector<void*> held;
  int rc = 0;
  for (int l = 0; l < layers && rc == 0; ++l) rc = run_paths(base, k, &held);
  if (rc == 0) rc = run_paths(base + k, once, &held);
  for (void* p : held) rc |= cudaFree(p) != cudaSuccess;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) return 2;
  g_varied = std::strcmp(argv[1], "varied") == 0;
  const int layers = std::atoi(argv[2]), k = std::atoi(argv[3]), once = std::atoi(argv[4]), steps = std::atoi(argv[5]);
  if (layers < 1 || k < 0 || once < 0 || 2 * (k + once) > kPaths || steps < 1) return 2;
  // Each thread's cache is its own, so the two passes need not alternate: a long-lived second
  // thread runs its steps beside the main thread's.
  int rc_fwd = 0, rc_bwd = 0;
  std::thread backward([&] {
    for (int s = 0; s < steps && rc_bwd == 0; ++s) rc_bwd = step(k + once, layers, k, once);
  });
  for (int s = 0; s < steps && rc_fwd == 0; ++s) rc_fwd = step(0, layers, k, once);
  backward.join();
  EXPECT(rc_fwd == 0 && rc_bwd == 0);
  auto* stack_stats = reinterpret_cast<int (*)(gpuheap_stack_stats_t*)>(dlsym(RTLD_DEFAULT, "gpuheap_stack_stats"));
  gpuheap_stack_stats_t st{};
  st.size = sizeof st;
  if (!stack_stats || stack_stats(&st) != 0) return 0;  // not under gpuheap: nothing to print
  const std::uint64_t failed = st.fill_failed_size + st.fill_failed_off_stack + st.fill_failed_register +
                               st.fill_failed_walk;
  const std::pair<const char*, std::uint64_t> shown[] = {{"captures", st.captures}, {"hits", st.cache_hits},
                                                         {"walks", st.walks},       {"rewalks", st.rewalks},
                                                         {"fills", st.fills},       {"waits", st.fill_waits},
                                                         {"stale", st.cache_stale}, {"failed", failed}};
  for (const auto& [name, v] : shown) std::printf("%s %llu\n", name, static_cast<unsigned long long>(v));
  return 0;
}
