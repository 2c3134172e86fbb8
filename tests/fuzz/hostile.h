// Helpers for the bad-input tests: raw trace assembly with format/trace.h's encoders (any
// record size up to kMaxPayload, hand-made frames), files, RSS and CLI runs.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "format/trace.h"
#include "tests/test_tmpdir.h"

namespace gpuheap::test {

class RawTrace {
 public:
  RawTrace() {
    unsigned char h[format::kFileHeaderSize];
    format::encode_file_header(h);
    bytes.assign(h, h + sizeof h);
  }
  template <class R>
  RawTrace& put(const R& r) {
    scratch_.resize(format::kMaxPayload + 64);
    bytes.insert(bytes.end(), scratch_.data(), scratch_.data() + format::encode(scratch_.data(), scratch_.size(), r));
    return *this;
  }
  RawTrace& segment(const format::SegmentRecord& r, bool is_free) {
    unsigned char b[64];
    bytes.insert(bytes.end(), b, b + format::encode(b, sizeof b, r, is_free));
    return *this;
  }
  RawTrace& stack(std::uint32_t id, const std::vector<std::uint64_t>& ips) {
    scratch_.resize(format::stack_record_size(static_cast<std::uint16_t>(ips.size())));
    auto n = format::encode_stack(scratch_.data(), scratch_.size(), id, ips.data(),
                                  static_cast<std::uint16_t>(ips.size()));
    bytes.insert(bytes.end(), scratch_.data(), scratch_.data() + n);
    return *this;
  }
  // A frame header with any type/length, followed by `payload` bytes of filler.
  RawTrace& frame(std::uint8_t type, std::uint32_t len, std::size_t payload) {
    bytes.push_back(type);
    auto* l = reinterpret_cast<const unsigned char*>(&len);
    bytes.insert(bytes.end(), l, l + 4);
    bytes.insert(bytes.end(), payload, 0xA5);
    return *this;
  }
  RawTrace& process(std::string_view cmdline = std::string_view("prog\0arg", 8)) {
    format::ProcessRecord p;
    p.pid = 42, p.ppid = 1, p.wall_ns = 1'700'000'000'000'000'000ull, p.mono_ns = 1'000'000'000;
    p.hostname = "host", p.cmdline = cmdline, p.version = "0.1.0", p.exe = "/bin/prog";
    return put(p);
  }
  std::string write(const std::string& name) const {
    std::string path = dir() + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  static std::string dir() {
    static std::string d = test::temp_dir("gpuheap-badinput");
    return d;
  }
  std::vector<unsigned char> bytes;

 private:
  std::vector<unsigned char> scratch_;
};

inline std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
inline void write_file(const std::string& path, const unsigned char* p, std::size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
}
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Peak resident set of this process in bytes (a high-water mark).
inline std::uint64_t max_rss() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

// Sanitizer runtimes keep quarantines and shadow memory: RSS is not the analyzer's then.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs a shell command line (stdout/stderr to files); returns the exit status, or -1 when
// it was killed (timeout(1) kills after `limit_s`).
struct CliResult {
  int status = -1;
  std::string out, err;
};
inline CliResult run_cli(const std::string& args, int limit_s = 120) {
  static int n = 0;
  std::string base = RawTrace::dir() + "/cli" + std::to_string(n++);
  std::string cmd = "timeout -s KILL " + std::to_string(limit_s) + " " + args + " >" + base + ".out 2>" + base + ".err";
  int rc = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (r.status == 137 || r.status == 124) r.status = -1;
  r.out = slurp(base + ".out"), r.err = slurp(base + ".err");
  return r;
}

inline bool scale_small() {
  const char* s = std::getenv("GPUHEAP_TEST_SCALE");
  return s != nullptr && std::string(s) == "small";
}

}  // namespace gpuheap::test
