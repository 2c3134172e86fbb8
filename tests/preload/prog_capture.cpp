// CUDA graph capture as PyTorch does it, for comparing the answers under gpuheap with the
// runtime's own (the test runs each case with and without the preload and compares the
// output). Every call prints "<step> rc=<code>", the end "violations=<n>" (calls the driver
// refused because of a capture, simcuda_capture_violations()).
//   prog_capture relaxed   a warm pool; a GLOBAL capture on a blocking stream; on the capturing
//                          thread cudaMalloc/cudaFree inside
//                          cudaThreadExchangeStreamCaptureMode(RELAXED) (torch's graph-pool
//                          pattern), then the same from another thread in RELAXED mode, and a
//                          THREAD_LOCAL thread beside it; then a GLOBAL thread (prohibited).
//   prog_capture async     cudaMallocAsync/cudaFreeAsync inside a capture (graph allocations:
//                          the driver's, never the pool's), a cudaFreeAsync of pool memory
//                          there (not a graph allocation: refused), and the driver calls made.
//   prog_capture free      cudaFree and cudaMalloc of pool memory on one thread while a blocking
//                          stream of another thread captures (THREAD_LOCAL, RELAXED, GLOBAL
//                          captures; the freeing thread RELAXED beside a GLOBAL capture, then
//                          GLOBAL, which is prohibited; a capture of a per-thread default stream).
//   prog_capture order     a block freed during a capture of the stream whose earlier work
//                          still writes it is not handed out again before that work is done.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

void show(const char* step, int rc) { std::printf("%s rc=%d\n", step, rc); }

template <class F>
F sim(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}
unsigned long long violations() {
  static auto fn = sim<unsigned long long (*)()>("simcuda_capture_violations");
  return fn ? fn() : ~0ull;
}
unsigned long long calls(const char* name) {
  static auto fn = sim<unsigned long long (*)(const char*)>("simcuda_call_count");
  return fn ? fn(name) : ~0ull;
}

// Allocations and frees of several sizes (small and large pool), with a created stream's work
// in between, so that the pool holds cached blocks and its fences cover created streams.
void warm(cudaStream_t s) {
  std::vector<void*> ps;
  for (int round = 0; round < 3; ++round) {
    for (size_t n : {512ul, 4096ul, 100000ul, 3ul << 20, 8ul << 20}) {
      void* p = nullptr;
      if (cudaMalloc(&p, n) == cudaSuccess) ps.push_back(p);
      cudaMemsetAsync(p, 1, n, s);
    }
    for (void* p : ps) cudaFree(p);
    ps.clear();
  }
  cudaStreamSynchronize(s);
}

// Allocates and frees under mode (exchanged and restored), printing each answer.
void malloc_free(const char* who, cudaStreamCaptureMode mode) {
  char step[96];
  cudaStreamCaptureMode m = mode;
  std::snprintf(step, sizeof step, "%s exchange", who);
  show(step, cudaThreadExchangeStreamCaptureMode(&m));
  void* ps[4] = {};
  const size_t sizes[4] = {512, 4096, 1ul << 20, 12ul << 20};  // the last is not cached: a new segment
  for (int i = 0; i < 4; ++i) {
    std::snprintf(step, sizeof step, "%s malloc %zu", who, sizes[i]);
    show(step, cudaMalloc(&ps[i], sizes[i]));
  }
  for (int i = 0; i < 4; ++i) {
    std::snprintf(step, sizeof step, "%s free %zu", who, sizes[i]);
    if (ps[i]) show(step, cudaFree(ps[i]));
  }
  std::snprintf(step, sizeof step, "%s exchange back", who);
  show(step, cudaThreadExchangeStreamCaptureMode(&m));
  std::printf("%s mode was %d\n", who, int(m));
}

void end_capture(cudaStream_t s, const char* what) {
  cudaGraph_t g = nullptr;
  char step[96];
  std::snprintf(step, sizeof step, "end %s", what);
  show(step, cudaStreamEndCapture(s, &g));
  std::printf("graph %s\n", g ? "made" : "none");
  show("last error", cudaGetLastError());
}

void relaxed_case(cudaStream_t cs) {
  show("begin global", cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  malloc_free("capturing thread", cudaStreamCaptureModeRelaxed);
  std::thread([] {
    cudaSetDevice(0);
    malloc_free("other thread", cudaStreamCaptureModeRelaxed);
    malloc_free("thread-local thread", cudaStreamCaptureModeThreadLocal);
  }).join();
  end_capture(cs, "global");
  // A GLOBAL thread beside a GLOBAL capture is prohibited from allocating and freeing: the
  // runtime refuses and invalidates the capture (what torch without its caching allocator does).
  show("begin global again", cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  std::thread([] {
    cudaSetDevice(0);
    malloc_free("global thread", cudaStreamCaptureModeGlobal);
  }).join();
  end_capture(cs, "global again");
  // The same into an existing graph (cudaStreamBeginCaptureToGraph, CUDA 12.3).
  cudaGraph_t g = nullptr;
  show("begin for a graph", cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
  show("end for a graph", cudaStreamEndCapture(cs, &g));
  show("begin to graph", cudaStreamBeginCaptureToGraph(cs, g, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal));
  std::thread([] {
    cudaSetDevice(0);
    malloc_free("global thread to graph", cudaStreamCaptureModeGlobal);
  }).join();
  end_capture(cs, "to graph");
}

void async_case(cudaStream_t cs) {
  void* pooled = nullptr;
  show("malloc pooled", cudaMalloc(&pooled, 4096));
  unsigned long long allocs = calls("cuMemAllocAsync"), frees = calls("cuMemFreeAsync");
  show("begin global", cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  void* g[3] = {};
  for (int i = 0; i < 3; ++i) show("malloc async", cudaMallocAsync(&g[i], 4096ul << i, cs));
  show("memset async", cudaMemsetAsync(g[0], 0, 4096, cs));
  show("free async pooled", cudaFreeAsync(pooled, cs));
  for (int i = 0; i < 3; ++i) show("free async graph", cudaFreeAsync(g[i], cs));
  end_capture(cs, "global");
  std::printf("driver cuMemAllocAsync calls +%llu, cuMemFreeAsync +%llu\n", calls("cuMemAllocAsync") - allocs,
              calls("cuMemFreeAsync") - frees);
  show("free pooled", cudaFree(pooled));
}

// Pool memory freed and taken on this thread while the blocking stream cs of another thread
// captures in mode cap; this thread's own mode is mine.
void free_beside(cudaStream_t cs, cudaStream_t side, cudaStreamCaptureMode cap, cudaStreamCaptureMode mine) {
  std::printf("capture mode %d, freeing thread mode %d\n", int(cap), int(mine));
  std::vector<void*> ps(6);
  for (size_t i = 0; i < ps.size(); ++i) {
    cudaMalloc(&ps[i], 1000 * (i + 1));
    cudaMemsetAsync(ps[i], 2, 1000 * (i + 1), side);  // pending work: the pool must fence it
  }
  std::atomic<bool> began{false}, freed{false};
  std::thread capturer([&] {
    cudaSetDevice(0);
    show("begin", cudaStreamBeginCapture(cs, cap));
    began = true;
    while (!freed) std::this_thread::yield();
    end_capture(cs, "capture");
  });
  while (!began) std::this_thread::yield();
  cudaStreamCaptureMode m = mine;
  cudaThreadExchangeStreamCaptureMode(&m);
  for (void* p : ps) show("free", cudaFree(p));
  void* again[3] = {};
  for (int i = 0; i < 3; ++i) show("malloc", cudaMalloc(&again[i], 1000 * (i + 1)));
  for (void* p : again)
    if (p) show("free again", cudaFree(p));
  cudaThreadExchangeStreamCaptureMode(&m);
  freed = true;
  capturer.join();
  show("sync side", cudaStreamSynchronize(side));
}

void free_case(cudaStream_t cs) {
  cudaStream_t side = nullptr;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  free_beside(cs, side, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal);
  free_beside(cs, side, cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal);
  free_beside(cs, side, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed);
  free_beside(cs, side, cudaStreamCaptureModeGlobal, cudaStreamCaptureModeGlobal);  // prohibited
  // The capturing thread's per-thread default stream: blocking like cs, but never registered.
  free_beside(cudaStreamPerThread, side, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal);
  cudaStreamDestroy(side);
}

// A block freed during a capture of the stream whose work queued before the capture still
// uses it: cudaFree waits for that work, so memory handed out afterwards is never written by it.
// Its own segment in the pool (larger than the large segments): the block a later
// allocation of this size gets once the freed one is reusable.
constexpr size_t kBig = 30ul << 20;

void order_case() {
  cudaStream_t cs = nullptr;  // non-blocking: the legacy stream's cudaMemset below does not wait for it
  show("create", cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  void* p = nullptr;
  show("malloc", cudaMalloc(&p, kBig));
  static void* target = p;  // simulated device memory is host memory: the host function writes it
  show("host func", cudaLaunchHostFunc(
                        cs,
                        [](void*) {
                          std::this_thread::sleep_for(std::chrono::milliseconds(200));
                          std::memset(target, 0xAB, 4096);
                        },
                        nullptr));
  show("begin relaxed", cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
  show("free", cudaFree(p));
  end_capture(cs, "relaxed");
  void* q = nullptr;
  show("malloc again", cudaMalloc(&q, kBig));
  show("memset", cudaMemset(q, 0x11, 4096));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  unsigned char host[4096];
  show("copy", cudaMemcpy(host, q, sizeof host, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (unsigned char b : host) bad += b != 0x11;
  std::printf("block after the capture %s\n", bad ? "OVERWRITTEN by work queued before its free" : "intact");
  show("free again", cudaFree(q));
  show("destroy", cudaStreamDestroy(cs));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  cudaStream_t cs = nullptr;
  if (cudaStreamCreate(&cs) != cudaSuccess) return 1;  // blocking: the legacy stream waits for it
  warm(cs);
  if (std::strcmp(argv[1], "relaxed") == 0) relaxed_case(cs);
  else if (std::strcmp(argv[1], "async") == 0) async_case(cs);
  else if (std::strcmp(argv[1], "free") == 0) free_case(cs);
  else if (std::strcmp(argv[1], "order") == 0) order_case();
  else return 2;
  show("device sync", cudaDeviceSynchronize());
  show("stream destroy", cudaStreamDestroy(cs));
  std::printf("violations=%llu\n", violations());
  return 0;
}
