// Builds synthetic traces in memory with format/trace.h's encoders, for analyzer tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <sstream>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "analyzer/model/analysis.h"
#include "format/trace.h"
#include "tests/test_tmpdir.h"

namespace gpuheap::test {

// A shell command's exit status (128+N when killed by signal N) and its stdout + stderr.
struct Result {
  int code = -1;
  std::string out;
};
inline Result run(const std::string& cmd) {
  Result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

using format::AllocKind;

class TraceBuilder {
 public:
  static constexpr std::uint64_t kMono = 5'000'000'000ull;

  explicit TraceBuilder(std::uint64_t wall_ns = 1'700'000'000'000'000'000ull, std::uint32_t pid = 100) {
    unsigned char h[format::kFileHeaderSize];
    format::encode_file_header(h);
    data.insert(data.end(), h, h + sizeof h);
    format::ProcessRecord p;
    p.pid = pid, p.ppid = 1, p.wall_ns = wall_ns, p.mono_ns = kMono;
    p.hostname = "testhost", p.cmdline = std::string_view("python\0train.py", 15), p.version = "0.1.0";
    p.exe = "/usr/bin/python3";
    put(p);
    put(format::DeviceRecord{0, 16ull << 30, "Test GPU"});
    ts = kMono;
  }
  template <class R>
  void put(const R& r) {
    unsigned char b[8192];
    auto n = format::encode(b, sizeof b, r);
    data.insert(data.end(), b, b + n);
  }
  void stack(std::uint32_t id, std::vector<std::uint64_t> ips) {
    unsigned char b[8192];
    auto n = format::encode_stack(b, sizeof b, id, ips.data(), static_cast<std::uint16_t>(ips.size()));
    data.insert(data.end(), b, b + n);
  }
  void module(std::uint64_t lo, std::uint64_t hi, std::string_view path) {
    // "" rather than {}: a null string_view data pointer reaches memcpy in the encoder (UB).
    put(format::ModuleRecord{lo, lo, hi, path, ""});
  }
  void segment(std::uint64_t ptr, std::uint64_t size, bool small, bool is_free = false, int device = 0,
               std::uint8_t extra_flags = 0) {
    unsigned char b[256];
    format::SegmentRecord s{tick(), static_cast<std::int16_t>(device),
                            static_cast<std::uint8_t>((small ? format::kFlagSmallPool : 0) | extra_flags), ptr, size};
    auto n = format::encode(b, sizeof b, s, is_free);
    data.insert(data.end(), b, b + n);
  }
  void alloc(std::uint64_t ptr, std::uint64_t requested, std::uint64_t size, std::uint32_t stack = 0,
             AllocKind kind = AllocKind::device_pooled, std::uint8_t flags = 0, std::uint32_t tid = 1, int device = 0,
             std::uint64_t stream = 0) {
    format::AllocRecord a;
    a.ts = tick(), a.tid = tid, a.device = static_cast<std::int16_t>(device), a.kind = kind, a.flags = flags;
    a.ptr = ptr, a.requested = requested, a.size = size, a.stack = stack, a.stream = stream;
    put(a);
  }
  void free(std::uint64_t ptr, AllocKind kind = AllocKind::device_pooled, std::uint32_t tid = 1, int device = 0,
            std::uint8_t flags = 0) {
    format::FreeRecord f;
    f.ts = tick(), f.tid = tid, f.device = static_cast<std::int16_t>(device), f.kind = kind, f.flags = flags;
    f.ptr = ptr;
    put(f);
  }
  void completed(std::uint64_t ptr, int device = 0) {
    put(format::FreeCompletedRecord{tick(), static_cast<std::int16_t>(device), ptr, 0});
  }
  void end() { put(format::EndRecord{tick(), format::EndReason::exit, 0}); }
  std::uint64_t tick(std::uint64_t d = 1000) { return ts += d; }

  std::string write(const std::string& name) const {
    std::string path = dir() + "/" + name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    return path;
  }
  static std::string dir() {
    static std::string d = temp_dir("gpuheap-anatest");
    return d;
  }

  std::vector<unsigned char> data;
  std::uint64_t ts = kMono;
};

inline Analysis analyze_one(const TraceBuilder& b, const std::string& name, std::size_t buckets = 2048) {
  AnalyzeOptions o;
  o.timeline_buckets = buckets;
  o.progress = false;
  o.warn_truncated = false;
  return analyze({b.write(name)}, o);
}

}  // namespace gpuheap::test
