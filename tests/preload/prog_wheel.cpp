// A Python wheel's renamed CUDA runtime (libcudart-<hash>.so.13, its DT_SONAME renamed too),
// loaded RTLD_LOCAL as an extension module's dependency. Links no CUDA library.
//   prog_wheel PATH   dlopen PATH (RTLD_LOCAL), then 4 cudaMalloc/cudaFree pairs of 3001..3004
//                     bytes through the global-scope cudaMalloc/cudaFree (what the extension's
//                     own calls bind to under the preload: its interposers come first in the
//                     global scope, and must find the real functions in the renamed copy),
//                     then 4 pairs of 5001..5004 bytes through dlsym(handle, ...).
// Prints "bound failures=N" (or "bound skipped" without the preload) and "handle failures=N".
#include <dlfcn.h>

#include <cstdio>

namespace {
using Malloc = int (*)(void**, size_t);
using Free = int (*)(void*);

int pairs(Malloc m, Free f, size_t first) {
  int bad = 0;
  for (size_t i = 0; i < 4; ++i) {
    void* p = nullptr;
    bad += m(&p, first + i) != 0 || !p;
    if (p) bad += f(p) != 0;
  }
  return bad;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 3;
  }
  auto gm = reinterpret_cast<Malloc>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
  auto gf = reinterpret_cast<Free>(dlsym(RTLD_DEFAULT, "cudaFree"));
  if (gm && gf) std::printf("bound failures=%d\n", pairs(gm, gf, 3001));
  else std::printf("bound skipped\n");
  auto hm = reinterpret_cast<Malloc>(dlsym(h, "cudaMalloc"));
  auto hf = reinterpret_cast<Free>(dlsym(h, "cudaFree"));
  if (!hm || !hf) return 4;
  std::printf("handle failures=%d\n", pairs(hm, hf, 5001));
  return 0;
}
