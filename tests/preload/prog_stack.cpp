// Stack and descriptor budgets (test_harm_stack.cpp): what a hook costs the thread that calls
// it, and what gpuheap costs the process's RLIMIT_NOFILE.
//   prog_stack measure runtime|driver first|later|steady
//       Runs cudaMalloc+cudaFree (or cuMemAlloc+cuMemFree) on a thread whose 1 MiB stack was
//       filled with a pattern; prints "stack_used N": the bytes below the thread's entry frame
//       written by then. `first`: the process's first event is on that thread; `later`: the
//       main thread made one before; `steady`: that thread made one before (the pattern is
//       laid again below its frame in between).
//   prog_stack small runtime|driver
//       The same calls, the process's first event, on a thread with a PTHREAD_STACK_MIN stack.
//   prog_stack fds N
//       Sets RLIMIT_NOFILE to N, allocates, opens /dev/null until it fails, allocates again;
//       prints "opened K", then a "pipe FD cloexec|inherited" line for each pipe above stdio.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/preload/prog_expect.h"

namespace {

constexpr unsigned char kPattern = 0xA5;
bool g_driver = false;
bool g_steady = false;
unsigned char* g_stack_lo = nullptr;
volatile std::uintptr_t g_entry_sp = 0;
volatile std::uintptr_t g_deepest = 0;

using mem_alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
using mem_free_fn = CUresult (*)(CUdeviceptr);
mem_alloc_fn g_mem_alloc;
mem_free_fn g_mem_free;

int load_driver() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  EXPECT(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &q) == cudaSuccess && fn);
  g_mem_alloc = reinterpret_cast<mem_alloc_fn>(fn);
  EXPECT(cudaGetDriverEntryPoint("cuMemFree", &fn, cudaEnableDefault, &q) == cudaSuccess && fn);
  g_mem_free = reinterpret_cast<mem_free_fn>(fn);
  return 0;
}

// One allocation and its free through the chosen API; 0 when both succeed.
__attribute__((noinline)) int alloc_and_free() {
  if (g_driver) {
    // The runtime makes its primary context current on this thread (cuMemAlloc needs one).
    EXPECT(cudaSetDevice(0) == cudaSuccess);
    CUdeviceptr d = 0;
    EXPECT(g_mem_alloc(&d, 1u << 20) == CUDA_SUCCESS);
    EXPECT(g_mem_free(d) == CUDA_SUCCESS);
    return 0;
  }
  void* p = nullptr;
  EXPECT(cudaMalloc(&p, 1u << 20) == cudaSuccess);
  EXPECT(cudaFree(p) == cudaSuccess);
  return 0;
}

void* thread_main(void*) {
  volatile char anchor = 0;
  g_entry_sp = reinterpret_cast<std::uintptr_t>(&anchor);
  if (g_steady) {
    if (alloc_and_free() != 0) return reinterpret_cast<void*>(1);
    // The pattern again below this frame's stack pointer (a loop, no call: nothing lives
    // below it meanwhile; 128 bytes of red zone spared).
    std::uintptr_t sp;
    asm volatile("mov %%rsp, %0" : "=r"(sp));
    for (volatile unsigned char* p = g_stack_lo; p < reinterpret_cast<unsigned char*>(sp - 128); ++p) *p = kPattern;
  }
  int rc = alloc_and_free();
  // The deepest byte written so far, read here (a loop, no call), before the thread's exit
  // runs destructors below this frame.
  const unsigned char* p = g_stack_lo;  // null: not measuring
  while (p && p < reinterpret_cast<const unsigned char*>(g_entry_sp) && *p == kPattern) ++p;
  g_deepest = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<void*>(static_cast<std::intptr_t>(rc));
}

int run_thread(pthread_attr_t* attr) {
  pthread_t t;
  EXPECT(pthread_create(&t, attr, thread_main, nullptr) == 0);
  void* rc = nullptr;
  EXPECT(pthread_join(t, &rc) == 0);
  EXPECT(rc == nullptr);
  return 0;
}

int measure(const char* when) {
  g_steady = std::strcmp(when, "steady") == 0;
  if (std::strcmp(when, "first") != 0) EXPECT(alloc_and_free() == 0);
  constexpr std::size_t kSize = 1u << 20;
  void* mem = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(mem != MAP_FAILED);
  auto* lo = static_cast<unsigned char*>(mem);
  std::memset(lo, kPattern, kSize);
  g_stack_lo = lo;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  EXPECT(pthread_attr_setstack(&attr, mem, kSize) == 0);
  EXPECT(run_thread(&attr) == 0);
  EXPECT(g_entry_sp > g_deepest && g_deepest > reinterpret_cast<std::uintptr_t>(lo));
  std::printf("stack_used %lu\n", static_cast<unsigned long>(g_entry_sp - g_deepest));
  return 0;
}

int small() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  EXPECT(pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) == 0);
  EXPECT(run_thread(&attr) == 0);
  std::printf("ok\n");
  return 0;
}

int fds(long n) {
  rlimit rl{};
  EXPECT(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  rl.rlim_cur = static_cast<rlim_t>(n);
  EXPECT(setrlimit(RLIMIT_NOFILE, &rl) == 0);
  EXPECT(alloc_and_free() == 0);
  long opened = 0;
  while (open("/dev/null", O_RDONLY) >= 0) ++opened;
  EXPECT(alloc_and_free() == 0);
  std::printf("opened %ld\n", opened);
  // Pipes above stdio (the program opens none): "pipe FD cloexec|inherited".
  for (int fd = 3; fd < 4096; ++fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    std::printf("pipe %d %s\n", fd, (fcntl(fd, F_GETFD) & FD_CLOEXEC) ? "cloexec" : "inherited");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "fds") == 0 && argc > 2) return fds(std::atol(argv[2]));
  g_driver = argc > 2 && std::strcmp(argv[2], "driver") == 0;
  if (g_driver) EXPECT(load_driver() == 0);
  if (std::strcmp(mode, "measure") == 0) return measure(argc > 3 ? argv[3] : "first");
  if (std::strcmp(mode, "small") == 0) return small();
  std::fprintf(stderr, "usage: prog_stack measure|small runtime|driver [first|later|steady] | fds N\n");
  return 2;
}
