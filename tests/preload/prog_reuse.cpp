// Early-reuse detector. cudaFree implicitly waits for earlier GPU work, so memory freed while
// a stream still writes to it must not be handed out before that write is done. Here a
// host function on stream A writes 0xAA into a buffer after a delay; the host frees the
// buffer at once, allocates the same size and fills it with 0x55. If the new buffer ever
// shows 0xAA, it was reused early. Exit 3 = corruption seen (expected only with
// GPUHEAP_UNSAFE_REUSE=1, which proves this test can catch it), 0 = clean.
// `prog_reuse N destroy`: stream A is destroyed right after the free (cudaStreamDestroy
// returns at once; A's queued work still runs), each iteration on a fresh stream.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {
constexpr std::size_t kBytes = 10u << 20;  // own segment: the only candidate for reuse

struct SlowWrite {
  void* ptr;
};

void CUDART_CB slow_write(void* arg) {
  auto* w = static_cast<SlowWrite*>(arg);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::memset(w->ptr, 0xAA, kBytes);  // simulated device memory is host memory
}
}  // namespace

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 5;
  const bool destroy = argc > 2 && std::strcmp(argv[2], "destroy") == 0;
  cudaStream_t a;
  if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) != cudaSuccess) return 10;
  std::vector<SlowWrite> writes(static_cast<std::size_t>(iters));
  std::vector<unsigned char> host(kBytes);
  int corrupt = 0;
  for (int i = 0; i < iters; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, kBytes) != cudaSuccess) return 10;
    writes[static_cast<std::size_t>(i)].ptr = p;
    if (cudaLaunchHostFunc(a, slow_write, &writes[static_cast<std::size_t>(i)]) != cudaSuccess) return 10;
    if (cudaFree(p) != cudaSuccess) return 10;  // stream A still has to write into p
    if (destroy && cudaStreamDestroy(a) != cudaSuccess) return 10;
    void* q = nullptr;
    if (cudaMalloc(&q, kBytes) != cudaSuccess) return 10;
    if (cudaMemset(q, 0x55, kBytes) != cudaSuccess) return 10;
    if (destroy) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // A's write is done by now
      if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) != cudaSuccess) return 10;
    } else if (cudaStreamSynchronize(a) != cudaSuccess) {
      return 10;
    }
    if (cudaMemcpy(host.data(), q, kBytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 10;
    for (unsigned char c : host)
      if (c != 0x55) {
        ++corrupt;
        break;
      }
    if (cudaFree(q) != cudaSuccess) return 10;
  }
  std::printf("prog_reuse: %d of %d iterations corrupted\n", corrupt, iters);
  return corrupt ? 3 : 0;
}
