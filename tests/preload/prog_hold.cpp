// One rank of a distributed job, for test_ranks.cpp: holds MIB MiB of device memory from
// one cudaMalloc while another process runs.
//   prog_hold MIB [GO_FILE]   cudaMalloc(MIB MiB), print "held" (flushed); with GO_FILE, wait
//                             until that file exists (at most 30 s); cudaFree; exit 0.
// Exits 10 when a CUDA call fails, 11 when GO_FILE never appeared.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::size_t bytes = std::strtoull(argv[1], nullptr, 10) << 20;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return 10;
  std::printf("held\n");
  std::fflush(stdout);
  int waited_ms = 0;
  if (argc > 2)
    for (; access(argv[2], F_OK) != 0; ++waited_ms) {
      if (waited_ms >= 30000) return 11;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  return cudaFree(p) == cudaSuccess ? 0 : 10;
}
