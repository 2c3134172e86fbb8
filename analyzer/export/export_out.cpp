#include "analyzer/export/export_out.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "analyzer/export/export.h"

namespace gpuheap::exporter {

OutFile::OutFile(std::string path, const std::vector<std::string>& inputs, bool force, const char* cmd)
    : path_(std::move(path)) {
  if (path_ == "-") {
    f_ = stdout;
    return;
  }
  check_output_path(path_, inputs, force, cmd);
  int fd = -1;
  if (is_special_output(path_)) {
    // A device or pipe (/dev/null, /dev/stdout, a FIFO) is written directly: it cannot be
    // replaced by a rename, and a partial write to it cannot be taken back anyway. Opened
    // without O_CREAT/O_TRUNC and checked again: a regular file swapped in meanwhile is
    // refused untouched.
    fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    struct stat st {};
    if (fd >= 0 && (::fstat(fd, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
      ::close(fd);
      fd = -1;
      errno = EEXIST;
    }
    if (fd < 0) throw InputError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
    tmp_ = path_;
    direct_ = true;
  } else {
    fd = create_beside(path_, derived_mode(inputs), &tmp_);
  }
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    int err = errno;
    ::close(fd);
    if (!direct_) std::remove(tmp_.c_str());
    throw InputError(fmt::format("cannot write {}: {}", path_, std::strerror(err)));
  }
}

OutFile::~OutFile() {
  if (closed_ || f_ == stdout) return;
  // Not closed: an error happened on the way; the partial file goes.
  std::fclose(f_);
  if (!direct_) std::remove(tmp_.c_str());
}

void OutFile::flush() {
  if (buf_.size() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) failed_ = true;
  buf_.clear();
}

void OutFile::close() {
  flush();
  closed_ = true;
  if (f_ == stdout) {
    if (std::fflush(stdout) != 0 || failed_) throw InputError("write to stdout failed");
    return;
  }
  bool bad = failed_ || std::fflush(f_) != 0;
  bad = std::fclose(f_) != 0 || bad;
  if (bad || (!direct_ && std::rename(tmp_.c_str(), path_.c_str()) != 0)) {
    int err = errno;
    if (!direct_) std::remove(tmp_.c_str());
    throw InputError(fmt::format("cannot write {}: {}", path_, std::strerror(err)));
  }
}

void json_str(fmt::memory_buffer& b, std::string_view raw) {
  std::string s = utf8_clean(std::string(raw));
  b.push_back('"');
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    switch (c) {
      case '"': b.append(std::string_view("\\\"")); break;
      case '\\': b.append(std::string_view("\\\\")); break;
      case '\n': b.append(std::string_view("\\n")); break;
      case '\r': b.append(std::string_view("\\r")); break;
      case '\t': b.append(std::string_view("\\t")); break;
      case '<': b.append(std::string_view("\\u003c")); break;  // never "</script>" or "<!--" in a page
      case '>': b.append(std::string_view("\\u003e")); break;
      case '&': b.append(std::string_view("\\u0026")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) fmt::format_to(std::back_inserter(b), "\\u{:04x}", c);
        else b.push_back(c);
    }
  }
  b.push_back('"');
}

void csv_str(fmt::memory_buffer& b, std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) {
    b.append(s);
    return;
  }
  b.push_back('"');
  for (char c : s) {
    if (c == '"') b.push_back('"');
    b.push_back(c);
  }
  b.push_back('"');
}

}  // namespace gpuheap::exporter
