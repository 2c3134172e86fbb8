// libFuzzer target: arbitrary bytes as a trace file through the path `gpuheap summary`
// takes (reader -> model -> text/JSON reports), plus check, diff and dump.
// The input goes through a memfd (the reader wants a path to a regular file it can map);
// an InputError is the analyzer's clean "bad input" answer (exit 2), anything else that
// escapes is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#include "analyzer/error.h"
#include "tests/fuzz/pipeline.h"

namespace {

struct Env {
  int fd = -1;
  std::string path;
  std::FILE* sink = nullptr;
  Env() {
    fd = ::memfd_create("gpuheap-fuzz", MFD_CLOEXEC);
    if (fd < 0) std::abort();
    path = "/proc/self/fd/" + std::to_string(fd);
    sink = std::fopen("/dev/null", "w");
    if (sink == nullptr) std::abort();
    spdlog::set_level(spdlog::level::off);  // warnings per input would dominate the run
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Env env;
  if (::ftruncate(env.fd, 0) != 0) std::abort();
  std::size_t off = 0;
  while (off < size) {
    ssize_t n = ::pwrite(env.fd, data + off, size - off, static_cast<off_t>(off));
    if (n <= 0) std::abort();
    off += static_cast<std::size_t>(n);
  }
  try {
    (void)gpuheap::test::run_pipeline(env.path, env.sink);
  } catch (const gpuheap::InputError&) {
    // clean rejection
  }
  return 0;
}
