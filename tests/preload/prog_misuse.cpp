// Misuse of the allocation API, for comparing gpuheap's answers with the runtime's own
// (the test runs each case with and without the preload and compares the output).
//   prog_misuse CASE       prints "<what> rc=<code> last=<cudaGetLastError()>" lines, then
//                          "integrity ok" if fresh allocations afterwards hold their data.
// Cases: double_free foreign interior size0 too_large no_context drv_no_context
//        concurrent other_device (SIMCUDA_DEVICE_COUNT=2) set_device (2 devices)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

void show(const char* what, int rc) { std::printf("%s rc=%d last=%d\n", what, rc, int(cudaGetLastError())); }

// Fresh blocks must not overlap and must keep what is written into them: a corrupted pool
// (e.g. a block handed out twice after a bad free) fails this.
bool integrity() {
  constexpr int kBlocks = 16;
  void* p[kBlocks] = {};
  for (int i = 0; i < kBlocks; ++i) {
    if (cudaMalloc(&p[i], 4096u * static_cast<unsigned>(1 + i % 3)) != cudaSuccess) return false;
    if (cudaMemset(p[i], i + 1, 4096) != cudaSuccess) return false;
  }
  for (int i = 0; i < kBlocks; ++i) {
    unsigned char buf[4096];
    if (cudaMemcpy(buf, p[i], sizeof buf, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (unsigned char c : buf)
      if (c != i + 1) return false;
  }
  for (void* q : p)
    if (cudaFree(q) != cudaSuccess) return false;
  return true;
}

using MemFree = CUresult (*)(CUdeviceptr);
using MemAlloc = CUresult (*)(CUdeviceptr*, size_t);

}  // namespace

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "double_free";
  auto is = [&](const char* s) { return std::strcmp(c, s) == 0; };
  if (cudaFree(nullptr) != cudaSuccess) return 3;
  void* p = nullptr;
  if (is("double_free")) {
    show("malloc", cudaMalloc(&p, 4096));
    show("free1", cudaFree(p));
    show("free2", cudaFree(p));
  } else if (is("foreign")) {
    void* h = std::malloc(4096);
    int local = 0;
    show("free_heap", cudaFree(h));
    show("free_stack", cudaFree(&local));
    show("free_bogus", cudaFree(reinterpret_cast<void*>(0x1000)));
    std::free(h);
  } else if (is("interior")) {
    show("malloc", cudaMalloc(&p, 8192));
    show("free_interior", cudaFree(static_cast<char*>(p) + 512));
    show("free_base", cudaFree(p));
  } else if (is("size0")) {
    p = reinterpret_cast<void*>(0x1234);
    int rc = cudaMalloc(&p, 0);
    std::printf("ptr_is_null=%d\n", p == nullptr);
    show("malloc0", rc);
    show("free0", cudaFree(p));
  } else if (is("too_large")) {
    size_t fr = 0, total = 0;
    show("info", cudaMemGetInfo(&fr, &total));
    show("malloc_huge", cudaMalloc(&p, total + (1u << 20)));
    show("malloc_max", cudaMalloc(&p, ~size_t{0} - 4096));
  } else if (is("no_context")) {
    show("malloc", cudaMalloc(&p, 4096));
    int rc = -1;
    std::thread([&] { rc = cudaFree(p); }).join();  // fresh thread: no current context yet
    show("free_other_thread", rc);
  } else if (is("drv_no_context")) {
    auto mfree = reinterpret_cast<MemFree>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
    auto malloc_ = reinterpret_cast<MemAlloc>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    if (!mfree || !malloc_) return 4;
    show("malloc", cudaMalloc(&p, 4096));
    int rc = -1, rc2 = -1;
    CUdeviceptr q = 0;
    std::thread([&] {
      rc = mfree(reinterpret_cast<CUdeviceptr>(p));
      rc2 = malloc_(&q, 4096);
    }).join();
    show("cuMemFree_no_ctx", rc);
    show("cuMemAlloc_no_ctx", rc2);
    show("free_after", cudaFree(p));
  } else if (is("concurrent")) {
    int one_ok = 0, rounds = 200;
    for (int r = 0; r < rounds; ++r) {
      if (cudaMalloc(&p, 4096) != cudaSuccess) return 5;
      std::atomic<int> ready{0};
      int rc[2] = {-1, -1};
      std::thread t[2];
      for (int k = 0; k < 2; ++k)
        t[k] = std::thread([&, k] {
          cudaSetDevice(0);
          ready++;
          while (ready.load() < 2) {
          }
          rc[k] = cudaFree(p);
        });
      for (auto& th : t) th.join();
      one_ok += (rc[0] == cudaSuccess) + (rc[1] == cudaSuccess) == 1 &&
                (rc[0] == cudaErrorInvalidValue || rc[1] == cudaErrorInvalidValue);
    }
    std::printf("rounds=%d exactly_one_succeeded=%d\n", rounds, one_ok);
    show("after", 0);
  } else if (is("other_device") || is("set_device")) {
    int n = 0;
    show("count", cudaGetDeviceCount(&n));
    if (n < 2) return 6;
    void *p0 = nullptr, *p1 = nullptr;
    show("set1", cudaSetDevice(1));
    show("malloc_dev1", cudaMalloc(&p1, 4096));
    show("set0", cudaSetDevice(0));
    show("malloc_dev0", cudaMalloc(&p0, 4096));
    cudaPointerAttributes a{};
    show("attr_dev1", cudaPointerGetAttributes(&a, p1));
    std::printf("p1_device=%d\n", a.device);
    show("free_dev1_while_dev0", cudaFree(p1));
    int cur = -1;
    cudaGetDevice(&cur);
    std::printf("current_after=%d\n", cur);
    show("free_dev1_again", cudaFree(p1));
    show("free_dev0", cudaFree(p0));
    if (is("set_device")) {
      // Switching devices between every call.
      std::vector<void*> v;
      for (int i = 0; i < 64; ++i) {
        cudaSetDevice(i % 2);
        void* q = nullptr;
        if (cudaMalloc(&q, 1000u + 512u * static_cast<unsigned>(i)) != cudaSuccess) return 7;
        v.push_back(q);
      }
      int bad = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        cudaSetDevice(static_cast<int>((i + 1) % 2));  // always the other device
        bad += cudaFree(v[i]) != cudaSuccess;
      }
      std::printf("switching_frees_failed=%d\n", bad);
      cudaSetDevice(1);
      std::printf("integrity_dev1 %s\n", integrity() ? "ok" : "BROKEN");
      cudaSetDevice(0);
    }
  } else {
    return 2;
  }
  std::printf("integrity %s\n", integrity() ? "ok" : "BROKEN");
  return 0;
}
