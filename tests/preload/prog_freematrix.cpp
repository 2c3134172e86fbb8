// Every allocation API x every free API, for comparing gpuheap's answers with the runtime's
// own (the test runs each with and without the preload, pool on and off, and compares).
//   prog_freematrix FREE   FREE over every allocation API, then null and foreign pointers.
//                          Prints "<alloc> <free> <case> rc=<code> peek=<peek> last=<last>"
//                          after each call (peek = cudaPeekAtLastError, last =
//                          cudaGetLastError), and "<alloc> <free> neighbour <ok|BROKEN>"
//                          where the blocks beside a freed one must keep their data.
//   prog_freematrix order  a stream-ordered free (cudaFreeAsync on a non-blocking stream
//                          whose work is still pending) must not let the block be reused
//                          by other streams before that work is done.
//   prog_freematrix order_ptsz   the same on per-thread default streams of two threads.
//   prog_freematrix no_gpu  allocations where CUDA cannot be used at all (no device, old driver).
// FREE: cudaFree cudaFreeAsync cudaFreeAsync_legacy cudaFreeAsync_ptsz cuMemFree
//       cuMemFree_entry cuMemFreeAsync cuMemFreeAsync_ptsz cuMemFreeAsync_ptds0 cudaFreeHost
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#undef cuGetProcAddress

namespace {

using FreeAsyncRt = cudaError_t (*)(void*, cudaStream_t);
using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);
using MemAllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using MemFree = CUresult (*)(CUdeviceptr);
using MemFreeAsync = CUresult (*)(CUdeviceptr, CUstream);
using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

cudaStream_t g_stream = nullptr;  // blocking, created through the runtime

void show(const char* a, const char* f, const char* what, int rc) {
  int peek = int(cudaPeekAtLastError());
  std::printf("%s %s %s rc=%d peek=%d last=%d\n", a, f, what, rc, peek, int(cudaGetLastError()));
}

// A driver function as programs get it: from the runtime's entry-point query.
template <class F>
F entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q) != cudaSuccess) return nullptr;
  return reinterpret_cast<F>(fn);
}

// The per-thread-default-stream variant, as code built with per-thread streams gets it.
template <class F>
F entry_ptsz(const char* name) {
  auto gpa = reinterpret_cast<GetProc>(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult q{};
  if (!gpa || gpa(name, &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<F>(fn);
}

CUdeviceptr dp(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

const char* const kFrees[] = {"cudaFree",           "cudaFreeAsync",       "cudaFreeAsync_legacy",
                              "cudaFreeAsync_ptsz", "cuMemFree",           "cuMemFree_entry",
                              "cuMemFreeAsync",     "cuMemFreeAsync_ptsz", "cuMemFreeAsync_ptds0",
                              "cudaFreeHost"};

int free_with(const char* f, void* p) {
  auto is = [&](const char* s) { return std::strcmp(f, s) == 0; };
  if (is("cudaFree")) return cudaFree(p);
  if (is("cudaFreeAsync")) return cudaFreeAsync(p, g_stream);
  if (is("cudaFreeAsync_legacy")) return cudaFreeAsync(p, nullptr);
  if (is("cudaFreeAsync_ptsz")) {
    static auto fn = reinterpret_cast<FreeAsyncRt>(dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz"));
    return fn ? fn(p, g_stream) : -1;
  }
  if (is("cuMemFree")) {  // the exported symbol, as code linked against libcuda calls it
    static auto fn = reinterpret_cast<MemFree>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
    return fn ? fn(dp(p)) : -1;
  }
  if (is("cuMemFree_entry")) {
    static auto fn = entry<MemFree>("cuMemFree");
    return fn ? fn(dp(p)) : -1;
  }
  if (is("cuMemFreeAsync")) {
    static auto fn = entry<MemFreeAsync>("cuMemFreeAsync");
    return fn ? fn(dp(p), reinterpret_cast<CUstream>(g_stream)) : -1;
  }
  if (is("cuMemFreeAsync_ptsz")) {
    static auto fn = entry_ptsz<MemFreeAsync>("cuMemFreeAsync");
    return fn ? fn(dp(p), reinterpret_cast<CUstream>(g_stream)) : -1;
  }
  if (is("cuMemFreeAsync_ptds0")) {  // stream 0 of the _ptsz variant: this thread's stream
    static auto fn = entry_ptsz<MemFreeAsync>("cuMemFreeAsync");
    return fn ? fn(dp(p), nullptr) : -1;
  }
  if (is("cudaFreeHost")) return cudaFreeHost(p);
  return -2;
}

const char* const kAllocs[] = {"cudaMalloc",      "cuMemAlloc",        "cudaMallocAsync", "cudaMallocFromPoolAsync",
                               "cuMemAllocAsync", "cudaMallocManaged", "cudaMallocPitch", "cudaMallocHost"};

int alloc_with(const char* a, void** p, size_t n) {
  auto is = [&](const char* s) { return std::strcmp(a, s) == 0; };
  *p = nullptr;
  if (is("cudaMalloc")) return cudaMalloc(p, n);
  if (is("cuMemAlloc")) {
    static auto fn = entry<MemAlloc>("cuMemAlloc");
    return fn ? fn(reinterpret_cast<CUdeviceptr*>(p), n) : -1;
  }
  if (is("cudaMallocAsync")) return cudaMallocAsync(p, n, g_stream);
  if (is("cudaMallocFromPoolAsync")) {
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess) return -1;
    return cudaMallocFromPoolAsync(p, n, pool, g_stream);
  }
  if (is("cuMemAllocAsync")) {
    static auto fn = entry<MemAllocAsync>("cuMemAllocAsync");
    return fn ? fn(reinterpret_cast<CUdeviceptr*>(p), n, reinterpret_cast<CUstream>(g_stream)) : -1;
  }
  if (is("cudaMallocManaged")) return cudaMallocManaged(p, n, cudaMemAttachGlobal);
  if (is("cudaMallocPitch")) {
    size_t pitch = 0;
    return cudaMallocPitch(p, &pitch, n, 1);
  }
  if (is("cudaMallocHost")) return cudaMallocHost(p, n);
  return -2;
}

// The free that matches an allocation API (to clean up what FREE could not free).
int matching_free(const char* a, void* p) {
  if (!std::strcmp(a, "cudaMallocHost")) return cudaFreeHost(p);
  return cudaFree(p);
}

bool holds(void* p, size_t n, unsigned char v) {
  std::vector<unsigned char> buf(n);
  if (cudaMemcpy(buf.data(), p, n, cudaMemcpyDefault) != cudaSuccess) return false;
  for (unsigned char c : buf)
    if (c != v) return false;
  return true;
}

// a and b: small blocks (in a fresh process, a is the first block of a pool segment and b
// lies beside it); c: a block of its own segment. Each is freed, freed again, and freed at
// an interior address with FREE; whatever FREE could not free goes back with the match.
void row(const char* a, const char* f) {
  constexpr size_t kSmall = 4096, kLarge = 12u << 20;
  void *pa = nullptr, *pb = nullptr, *pc = nullptr;
  show(a, f, "alloc_a", alloc_with(a, &pa, kSmall));
  show(a, f, "alloc_b", alloc_with(a, &pb, kSmall));
  show(a, f, "alloc_c", alloc_with(a, &pc, kLarge));
  show(a, f, "sync", cudaDeviceSynchronize());
  show(a, f, "fill_b", cudaMemset(pb, 0x5b, kSmall));
  show(a, f, "free_a", free_with(f, pa));
  show(a, f, "sync", cudaDeviceSynchronize());
  std::printf("%s %s neighbour %s\n", a, f, holds(pb, kSmall, 0x5b) ? "ok" : "BROKEN");
  show(a, f, "free_b_interior", free_with(f, static_cast<char*>(pb) + 512));
  show(a, f, "free_b", free_with(f, pb));
  show(a, f, "free_b_again", free_with(f, pb));
  show(a, f, "free_c_interior", free_with(f, static_cast<char*>(pc) + 4096));
  show(a, f, "free_c", free_with(f, pc));
  show(a, f, "free_a_again", free_with(f, pa));
  show(a, f, "sync", cudaDeviceSynchronize());
  show(a, f, "cleanup_a", matching_free(a, pa));
  show(a, f, "cleanup_b", matching_free(a, pb));
  show(a, f, "cleanup_c", matching_free(a, pc));
}

void foreign(const char* f) {
  void* heap = std::malloc(4096);
  int local = 0;
  show("none", f, "free_null", free_with(f, nullptr));
  show("none", f, "free_heap", free_with(f, heap));
  show("none", f, "free_stack", free_with(f, &local));
  show("none", f, "free_bogus", free_with(f, reinterpret_cast<void*>(0x1000)));
  std::free(heap);
}

void slow_host_fn(void*) { usleep(200000); }

// p's free is queued behind 200 ms of work on stream s that writes p; a block allocated
// meanwhile and written on another stream must not be overwritten by that pending work.
int order(bool per_thread) {
  constexpr size_t kBytes = 12u << 20;  // a segment of its own: nothing else to reuse
  void* p = nullptr;
  if (cudaMalloc(&p, kBytes) != cudaSuccess) return 4;
  auto producer = [&](cudaStream_t s) {
    cudaLaunchHostFunc(s, slow_host_fn, nullptr);
    cudaMemsetAsync(p, 0x11, kBytes, s);
    show("cudaMalloc", "cudaFreeAsync", "free_pending", cudaFreeAsync(p, s));
  };
  cudaStream_t s = nullptr;
  // The producer thread lives until the end: a thread's per-thread stream goes with it.
  std::atomic<int> stage{0};
  std::thread t;
  if (per_thread) {
    t = std::thread([&] {
      producer(cudaStreamPerThread);
      stage = 1;
      while (stage != 2) usleep(1000);
    });
    while (stage != 1) usleep(1000);
  } else if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    return 5;
  } else {
    producer(s);
  }
  void* q = nullptr;
  show("cudaMalloc", "-", "alloc_q", cudaMalloc(&q, kBytes));
  // Per-thread streams do not wait for each other; a non-blocking stream does not wait for
  // the legacy stream either way round.
  cudaStream_t other = nullptr;
  if (!per_thread && cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) != cudaSuccess) return 6;
  cudaMemsetAsync(q, 0x22, kBytes, per_thread ? cudaStreamPerThread : other);
  show("cudaMalloc", "-", "sync", cudaDeviceSynchronize());
  std::printf("order q %s\n", holds(q, kBytes, 0x22) ? "ok" : "BROKEN");
  show("cudaMalloc", "-", "free_q", cudaFree(q));
  stage = 2;
  if (t.joinable()) t.join();
  return 0;
}

// Allocations on a machine where CUDA cannot be used (SIMCUDA_DEVICE_COUNT=0,
// SIMCUDA_DRIVER_VERSION older than the runtime): each answer and the latched error.
int no_gpu() {
  void* p = nullptr;
  show("cudaMalloc", "-", "alloc", cudaMalloc(&p, 4096));
  show("cudaMalloc", "-", "alloc_again", cudaMalloc(&p, 1u << 20));
  show("cudaMallocManaged", "-", "alloc", cudaMallocManaged(&p, 4096, cudaMemAttachGlobal));
  show("cudaMallocAsync", "-", "alloc", cudaMallocAsync(&p, 4096, nullptr));
  auto mem_alloc = reinterpret_cast<MemAlloc>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  CUdeviceptr d = 0;
  show("cuMemAlloc", "-", "alloc", mem_alloc ? mem_alloc(&d, 4096) : -1);
  show("none", "cudaFree", "free_null", cudaFree(nullptr));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* f = argc > 1 ? argv[1] : "cudaFreeAsync";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash shows how far the answers matched
  if (!std::strcmp(f, "no_gpu")) return no_gpu();
  if (cudaFree(nullptr) != cudaSuccess) return 3;
  if (!std::strcmp(f, "order")) return order(false);
  if (!std::strcmp(f, "order_ptsz")) return order(true);
  if (cudaStreamCreate(&g_stream) != cudaSuccess) return 3;
  bool known = false;
  for (const char* k : kFrees) known = known || !std::strcmp(k, f);
  if (!known) return 2;
  for (const char* a : kAllocs) row(a, f);
  foreign(f);
  show("none", f, "stream_destroy", cudaStreamDestroy(g_stream));
  return 0;
}
