// dlopen scenarios: this program does not link libcudart; it loads it later by path.
//   prog_dlopen late CUDART          dlopen CUDART, 10 cudaMalloc/cudaFree pairs through
//                                    dlsym(handle, ...), dlclose, dlopen again, 10 more pairs
//   prog_dlopen two CUDART COPY      CUDART (RTLD_LOCAL) and a copy under another file name
//                                    (RTLD_LOCAL|RTLD_DEEPBIND): allocate with each, free
//                                    with each and crosswise
//   prog_dlopen secure GPUHEAP CUDART  dlopen libgpuheap.so itself (as a setuid program
//                                    could only get it), then CUDART; prints gpuheap_active()
// Each prints "<what> rc=<code>" lines.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace {

using Malloc = int (*)(void**, size_t);
using Free = int (*)(void*);

struct Rt {
  void* h = nullptr;
  Malloc malloc_ = nullptr;
  Free free_ = nullptr;
  bool open(const char* path, int flags) {
    h = dlopen(path, flags);
    if (!h) {
      std::printf("dlopen %s failed: %s\n", path, dlerror());
      return false;
    }
    malloc_ = reinterpret_cast<Malloc>(dlsym(h, "cudaMalloc"));
    free_ = reinterpret_cast<Free>(dlsym(h, "cudaFree"));
    return malloc_ && free_;
  }
};

int pairs(Rt& rt, int n) {
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    bad += rt.malloc_(&p, 2048) != 0;
    bad += rt.free_(p) != 0;
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const char* mode = argv[1];
  if (std::strcmp(mode, "late") == 0) {
    Rt rt;
    if (!rt.open(argv[2], RTLD_NOW | RTLD_LOCAL)) return 3;
    std::printf("first failures=%d\n", pairs(rt, 10));
    std::printf("dlclose rc=%d\n", dlclose(rt.h));
    Rt again;
    if (!again.open(argv[2], RTLD_NOW | RTLD_LOCAL)) return 4;
    std::printf("second failures=%d\n", pairs(again, 10));
    return 0;
  }
  if (std::strcmp(mode, "two") == 0 && argc > 3) {
    Rt a, b;
    if (!a.open(argv[2], RTLD_NOW | RTLD_LOCAL)) return 3;
    if (!b.open(argv[3], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return 4;
    std::printf("distinct copies=%d\n", a.malloc_ != b.malloc_);
    void *pa = nullptr, *pb = nullptr, *pc = nullptr, *pd = nullptr;
    std::printf("malloc_a rc=%d\n", a.malloc_(&pa, 4096));
    std::printf("malloc_b rc=%d\n", b.malloc_(&pb, 4096));
    std::printf("free_a rc=%d\n", a.free_(pa));
    std::printf("free_b rc=%d\n", b.free_(pb));
    std::printf("malloc_a2 rc=%d\n", a.malloc_(&pc, 8192));
    std::printf("malloc_b2 rc=%d\n", b.malloc_(&pd, 8192));
    std::printf("free_a2_by_b rc=%d\n", b.free_(pc));
    std::printf("free_b2_by_a rc=%d\n", a.free_(pd));
    std::printf("pairs_a failures=%d\n", pairs(a, 10));
    std::printf("pairs_b failures=%d\n", pairs(b, 10));
    return 0;
  }
  if (std::strcmp(mode, "secure") == 0 && argc > 3) {
    void* g = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!g) {
      std::printf("dlopen gpuheap failed: %s\n", dlerror());
      return 3;
    }
    auto active = reinterpret_cast<int (*)()>(dlsym(g, "gpuheap_active"));
    Rt rt;
    if (!rt.open(argv[3], RTLD_NOW | RTLD_GLOBAL)) return 4;
    std::printf("pairs failures=%d\n", pairs(rt, 10));
    std::printf("gpuheap_active=%d\n", active ? active() : -1);
    return 0;
  }
  return 2;
}
