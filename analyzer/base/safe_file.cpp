#include "analyzer/base/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "analyzer/base/error.h"

namespace gpuheap {

namespace {

std::string kind_of(mode_t m) {
  const char* k = S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
                  : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : nullptr;
  return k != nullptr ? fmt::format("{}, not a regular file", k) : std::string("not a regular file");
}

}  // namespace

int open_regular(const std::string& path, std::uint64_t* size, std::string* why, std::uint64_t min_size,
                 std::uint64_t max_size) {
  if (path.find('\0') != std::string::npos) {
    *why = "a name with a NUL byte";
    return -1;
  }
  // stat() first: a device is never opened (opening some has effects: a watchdog starts, a
  // tape rewinds). fstat() after the open catches a name swapped in between.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *why = std::strerror(errno);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = kind_of(st.st_mode);
    return -1;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  if (::fstat(fd, &st) != 0) {
    *why = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    *why = kind_of(st.st_mode);
  } else if (static_cast<std::uint64_t>(st.st_size) < min_size) {
    *why = fmt::format("{} bytes, too small", st.st_size);
  } else if (static_cast<std::uint64_t>(st.st_size) > max_size) {
    *why = fmt::format("{} bytes, larger than the {} accepted", st.st_size, max_size);
  } else {
    *size = static_cast<std::uint64_t>(st.st_size);
    return fd;
  }
  ::close(fd);
  return -1;
}

std::string read_regular(const std::string& path, std::uint64_t max_bytes, const char* what) {
  std::uint64_t size = 0;
  std::string why;
  int fd = open_regular(path, &size, &why, 0, max_bytes);
  if (fd < 0) throw InputError(fmt::format("{}: cannot use as {}: {}", path, what, why));
  std::string out;
  // Reads to EOF rather than trusting st_size (the file may change meanwhile), never past the bound.
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      throw InputError(fmt::format("{}: read error: {}", path, std::strerror(e)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      throw InputError(fmt::format("{}: cannot use as {}: larger than {} bytes", path, what, max_bytes));
    }
  }
  ::close(fd);
  return out;
}

}  // namespace gpuheap
