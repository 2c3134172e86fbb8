// dlsym(RTLD_NEXT, ...) under the preload must answer relative to the caller's object, not
// to libgpuheap.so (which interposes dlsym). Linked against libnext_a then libnext_b, both
// defining next_probe(); libnext_a asks for the next next_probe and must get libnext_b's.
//   prog_next order     prints "next=<id of what RTLD_NEXT from libnext_a found>" and
//                       "missing=<null|found>" for a symbol nobody defines
//   prog_next churn LIB another thread dlopens/dlcloses LIB (libnext_c) in a loop while
//                       this one asks for RTLD_NEXT lookups (the walk over the loaded objects
//                       must neither crash nor deadlock with the loader); prints "churn ok N"
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

extern "C" int next_probe();
extern "C" void* next_after_a(const char* name);

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "order")) {
    auto fn = reinterpret_cast<int (*)()>(next_after_a("next_probe"));
    std::printf("first=%d\n", next_probe());
    std::printf("next=%d\n", fn ? fn() : -1);
    std::printf("missing=%s\n", next_after_a("gpuheap_test_no_such_symbol") ? "found" : "null");
    return 0;
  }
  if (argc >= 3 && !std::strcmp(argv[1], "churn")) {
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    std::thread t([&] {
      while (!stop.load()) {
        void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (h) dlclose(h);
        cycles.fetch_add(1);
      }
    });
    int wrong = 0, n = 0;
    for (; n < 3000 || cycles.load() < 50; ++n) {
      auto fn = reinterpret_cast<int (*)()>(next_after_a("next_probe"));
      wrong += !fn || fn() != 2;
      wrong += next_after_a("gpuheap_test_no_such_symbol") != nullptr;
      if (n > 200000) break;
    }
    stop.store(true);
    t.join();
    std::printf("churn %s %d cycles=%d\n", wrong ? "wrong" : "ok", n, cycles.load());
    return wrong ? 1 : 0;
  }
  return 2;
}
