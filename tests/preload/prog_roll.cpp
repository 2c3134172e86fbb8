// A job whose memory grows step by step under a rolling window (`gpuheap run --aggregate`),
// for `gpuheap top` following it across rolls (test_top.py, Top.rolling*). Step N waits for
// the file GODIR/go.N (the test's handshake: no timing), makes CHURN short-lived allocations
// (events that fill the window's segments and roll them), then keeps one more allocation of
// N MiB from one of two sites (odd and even steps), inside a "step" range, and prints
// "step N". Step BIG (optional) makes BIG_CHURN short-lived allocations instead.
//   prog_roll STEPS CHURN GODIR [BIG BIG_CHURN]
// Exits 10 when a CUDA call fails, 12 when a go file never comes.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/preload/prog_expect.h"

namespace {

// One call site each: two sites live at the end.
__attribute__((noinline)) bool keep_odd(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess;
}
__attribute__((noinline)) bool keep_even(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess;
}
__attribute__((noinline)) bool churn(long n) {
  for (long i = 0; i < n; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, 512u * (1 + i % 7)) != cudaSuccess || cudaFree(p) != cudaSuccess) return false;
  }
  return true;
}

bool wait_for(const std::string& path) {
  for (int i = 0; i < 120 * 100; ++i) {  // 120 s: the test ends long before
    if (::access(path.c_str(), F_OK) == 0) return true;
    ::usleep(10000);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  EXPECT(argc == 4 || argc == 6);
  const int steps = std::atoi(argv[1]);
  const long churn_n = std::atol(argv[2]);
  const std::string dir = argv[3];
  const int big = argc == 6 ? std::atoi(argv[4]) : 0;
  const long big_churn = argc == 6 ? std::atol(argv[5]) : 0;
  auto* push = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "gpuheap_push"));
  auto* pop = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_pop"));
  EXPECT(push && pop);
  for (int i = 1; i <= steps; ++i) {
    if (!wait_for(dir + "/go." + std::to_string(i))) return 12;
    push("step");
    if (!churn(i == big ? big_churn : churn_n)) return 10;
    const std::size_t bytes = static_cast<std::size_t>(i) << 20;
    if (!(i % 2 ? keep_odd(bytes) : keep_even(bytes))) return 10;
    pop();
    std::printf("step %d\n", i);
    std::fflush(stdout);
  }
  return 0;
}
