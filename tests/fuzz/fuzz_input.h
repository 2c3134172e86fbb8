// Shared by the libFuzzer targets: the analyzer reads traces by path (it maps regular
// files), so each input is written to one memfd that lives for the whole run and is named
// through /proc/self/fd.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

namespace gpuheap::test {

class FuzzInput {
 public:
  FuzzInput() {
    fd_ = ::memfd_create("gpuheap-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
    spdlog::set_level(spdlog::level::off);  // warnings per input would dominate the run
  }
  // Replaces the file's contents with data; returns its path.
  const std::string& set(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    std::size_t off = 0;
    while (off < size) {
      ssize_t n = ::pwrite(fd_, data + off, size - off, static_cast<off_t>(off));
      if (n <= 0) std::abort();
      off += static_cast<std::size_t>(n);
    }
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace gpuheap::test
