#include "analyzer/base/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "analyzer/base/error.h"

namespace gpuheap {

namespace {

std::string kind_of(mode_t m) {
  const char* k = S_ISDIR(m)    ? "a directory"
                  : S_ISFIFO(m) ? "a FIFO"
                  : S_ISCHR(m)  ? "a character device"
                  : S_ISBLK(m)  ? "a block device"
                  : S_ISSOCK(m) ? "a socket"
                                : nullptr;
  return k != nullptr ? fmt::format("{}, not a regular file", k) : std::string("not a regular file");
}

bool special_mode(mode_t m) { return S_ISCHR(m) || S_ISBLK(m) || S_ISFIFO(m) || S_ISSOCK(m); }

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

int create_beside(const std::string& final_path, mode_t mode, std::string* tmp) {
  auto slash = final_path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : final_path.substr(0, slash);
  // The name's first 200 bytes: the suffix must not push a long name past NAME_MAX.
  std::string base = (slash == std::string::npos ? final_path : final_path.substr(slash + 1)).substr(0, 200);
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::mt19937_64 rng((std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()));
  int err = EEXIST;
  for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
    std::string suffix(6, 'x');
    for (char& c : suffix) c = kAlnum[rng() % (sizeof kAlnum - 1)];
    *tmp = fmt::format("{}/.{}.gpuheap-tmp.{}", dir, base, suffix);
    int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, mode & 0666);
    if (fd >= 0) return fd;
    err = errno;
  }
  throw InputError(fmt::format("cannot create {} (a temporary file beside it): {}", final_path, std::strerror(err)));
}

mode_t derived_mode(const std::vector<std::string>& inputs) {
  // The owner keeps rw (the file is theirs to replace); group and others get a permission
  // only when every input grants it.
  mode_t shared = 0066;
  for (const auto& in : inputs) {
    struct stat st {};
    if (::stat(in.c_str(), &st) == 0) shared &= st.st_mode;
  }
  return 0600 | shared;
}

bool is_special_output(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && special_mode(st.st_mode);
}

void check_output_path(const std::string& output, const std::vector<std::string>& inputs, bool force, const char* cmd) {
  struct stat out {};
  if (::stat(output.c_str(), &out) == 0) {
    if (special_mode(out.st_mode)) return;  // /dev/null, a pipe: written directly, nothing replaced
    for (const auto& in : inputs) {
      struct stat st {};
      if (::stat(in.c_str(), &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
        throw UsageError(
            fmt::format("{}: {} is the input {}: writing it would replace the trace (name another "
                        "output)",
                        cmd, output, in));
    }
  }
  struct stat l {};
  if (!force && ::lstat(output.c_str(), &l) == 0)
    throw UsageError(fmt::format("{}: {} exists; --force replaces it", cmd, output));
}

}  // namespace gpuheap
