// libnext_a / libnext_b / libnext_c for prog_next: each defines next_probe() returning
// NEXT_ID; libnext_a also asks dlsym(RTLD_NEXT, ...) from inside itself.
#include <dlfcn.h>

extern "C" int next_probe() { return NEXT_ID; }

#if NEXT_ID == 1
extern "C" void* next_after_a(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  // No tail call: dlsym must see this library as its caller (its return address).
  __asm__ volatile("" : : "r"(p) : "memory");
  return p;
}
#endif
