// Load and kill scenarios for the reliability tests (test_reliability.cpp).
//   prog_load THREADS EVENTS_PER_THREAD
//       each thread makes exactly EVENTS_PER_THREAD/2 cudaMalloc and as many cudaFree
//       calls (some blocks held across iterations so threads interleave); prints
//       "allocs=A frees=F failures=X hwm_kb=H rss_kb=R" (VmHWM/VmRSS of this process).
//   prog_load THREADS 0 PROGRESS_FILE
//       runs until killed; each thread publishes (CLOCK_MONOTONIC ns, completed pairs)
//       into its slot of PROGRESS_FILE (MAP_SHARED) so the test knows, after SIGKILL,
//       which pairs had completed and when. Prints "ready" once every thread is running.
// PROG_LOAD_FSIZE_KB=N (environment): once CUDA is initialised (tracing has started), the
// program lowers its own RLIMIT_FSIZE to N KiB, SIGXFSZ left at its default (terminate).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/preload/progress.h"

namespace {

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

long status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  std::size_t klen = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, klen) == 0) v = std::atol(line + klen);
  std::fclose(f);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  long events = argc > 2 ? std::atol(argv[2]) : 1000;
  const char* progress_path = argc > 3 ? argv[3] : nullptr;
  if (threads < 1 || threads > gpuheap::test::kProgressThreads) return 2;
  gpuheap::test::Progress* prog = nullptr;
  if (progress_path) {
    int fd = open(progress_path, O_RDWR);
    if (fd < 0) return 2;
    void* m = mmap(nullptr, sizeof(gpuheap::test::Progress), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 2;
    prog = static_cast<gpuheap::test::Progress*>(m);
  }
  const long pairs = events / 2;
  std::atomic<long> allocs{0}, frees{0}, failures{0};
  std::atomic<int> running{0};
  if (cudaFree(nullptr) != cudaSuccess) return 3;
  if (const char* kb = std::getenv("PROG_LOAD_FSIZE_KB")) {
    rlimit rl{};
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = static_cast<rlim_t>(std::atol(kb)) << 10;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 4;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      static const std::size_t sizes[] = {256, 1000, 4096, 65536, 300000};
      void* held[4] = {};
      long my_allocs = 0, my_frees = 0;
      unsigned x = 2654435761u * static_cast<unsigned>(t + 1);
      gpuheap::test::ThreadProgress* slot = prog ? &prog->threads[t] : nullptr;
      if (slot) slot->tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
      running++;
      // Kill mode: after the last pair of iteration i, (now, pairs completed) is published.
      for (long i = 0; pairs == 0 || i < pairs; ++i) {
        x = x * 1664525u + 1013904223u;
        void*& h = held[(x >> 16) & 3];
        if (h) {
          if (cudaFree(h) != cudaSuccess) failures++;
          ++my_frees;
          h = nullptr;
        }
        void* p = nullptr;
        if (cudaMalloc(&p, sizes[(x >> 8) % 5]) != cudaSuccess) {
          failures++;
          continue;
        }
        ++my_allocs;
        h = p;
        if (slot && (i & 63) == 0) {
          std::uint64_t k = slot->count.load(std::memory_order_relaxed);
          slot->ring[k % gpuheap::test::kProgressRing] = {mono_ns(), static_cast<std::uint64_t>(my_frees)};
          slot->count.store(k + 1, std::memory_order_release);
        }
        if (slot && i == 64 && t == 0) {
          // Every thread has published at least one snapshot before the test may kill us.
          for (int u = 0; u < threads; ++u)
            while (prog->threads[u].count.load(std::memory_order_acquire) == 0) std::this_thread::yield();
          std::printf("ready\n");
          std::fflush(stdout);
        }
      }
      for (void* p : held)
        if (p) {
          if (cudaFree(p) != cudaSuccess) failures++;
          ++my_frees;
        }
      allocs += my_allocs;
      frees += my_frees;
    });
  }
  for (auto& th : pool) th.join();
  std::printf("allocs=%ld frees=%ld failures=%ld hwm_kb=%ld rss_kb=%ld\n", allocs.load(), frees.load(), failures.load(),
              status_kb("VmHWM:"), status_kb("VmRSS:"));
  return failures.load() == 0 ? 0 : 1;
}
