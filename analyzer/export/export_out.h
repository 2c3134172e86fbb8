// Buffered output of an export: a file (written to a temporary name and renamed into place
// when complete, so a failed export never leaves a half file under the asked name), stdout
// ("-"), or a device or pipe such as /dev/null (written directly).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace gpuheap::exporter {

class OutFile {
 public:
  // "-" = stdout. Refuses an output that is one of `inputs`, or exists without `force`
  // (check_output_path, safe_file.h); throws InputError when not creatable.
  OutFile(std::string path, const std::vector<std::string>& inputs, bool force, const char* cmd);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  fmt::memory_buffer& buf() { return buf_; }
  void put(std::string_view s) {
    buf_.append(s.data(), s.data() + s.size());
    maybe_flush();
  }
  void maybe_flush() {
    if (buf_.size() >= kChunk) flush();
  }
  void flush();
  // Flushes, checks for write errors and moves the file into place; throws InputError.
  void close();

 private:
  static constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool closed_ = false, failed_ = false, direct_ = false;
  fmt::memory_buffer buf_;
};

// JSON string literal (quotes included) of arbitrary trace bytes: invalid UTF-8 becomes
// U+FFFD, controls and "</" are escaped so that the text is also safe inside <script>.
void json_str(fmt::memory_buffer& b, std::string_view s);
// CSV field: quoted when it holds a comma, quote, CR or LF (quotes doubled).
void csv_str(fmt::memory_buffer& b, std::string_view s);

}  // namespace gpuheap::exporter
