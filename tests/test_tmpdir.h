// Scratch directories for test programs: made with mkdtemp under /tmp and removed when the
// test program exits, so repeated ctest runs do not pile up thousands of directories (they
// did: 4,700 gpuheap-preload-* after a few days). GPUHEAP_TEST_KEEP=1 keeps them, to look
// at the traces after a failure.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace gpuheap::test {

inline std::string temp_dir(const std::string& prefix) {
  struct Registry {
    pid_t owner = ::getpid();
    std::vector<std::string> dirs;
    ~Registry() {
      // Only the process that made them: a forked child that exits through exit() must
      // not delete its parent's directories.
      if (::getpid() != owner || std::getenv("GPUHEAP_TEST_KEEP")) return;
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Registry registry;
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return "/tmp";
  registry.dirs.push_back(tmpl);
  return tmpl;
}

}  // namespace gpuheap::test
