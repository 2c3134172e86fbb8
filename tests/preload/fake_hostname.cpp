// Test shim, preloaded before libgpuheap.so (test_ranks.cpp): gethostname() answers
// $FAKE_HOSTNAME, so that processes on this one machine record the hostnames of the several
// hosts of a distributed job. Without FAKE_HOSTNAME it is the C library's.
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

extern "C" int gethostname(char* name, size_t len) {
  const char* h = std::getenv("FAKE_HOSTNAME");
  if (!h) {
    using Fn = int (*)(char*, size_t);
    auto real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "gethostname"));
    return real ? real(name, len) : -1;
  }
  const std::size_t n = std::strlen(h);
  if (n + 1 > len) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(name, h, n + 1);
  return 0;
}
