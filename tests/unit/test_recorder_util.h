// Helpers for the in-process recorder tests: isolated output directories and a trace
// file reader built on format/trace.h.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "format/trace.h"
#include "preload/record/recorder.h"
#include "tests/trace_walk.h"

namespace rec_test {

namespace f = gpuheap::format;

// A stack captured right here (not inlined, so its own frame is the innermost one).
__attribute__((noinline)) inline std::uint32_t capture_here() {
  std::uint32_t id = gpuheap::preload::capture_stack(0);
  asm volatile("" ::: "memory");
  return id;
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/gpuheap-rec-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    if (!getenv("GPUHEAP_TEST_KEEP")) std::system(("rm -rf '" + path + "'").c_str());
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') out.push_back(path + "/" + e->d_name);
      closedir(d);
    }
    return out;
  }
};

struct Trace {
  std::string data;
  std::vector<f::Record> records;  // string views point into `data`
  f::HeaderStatus header = f::HeaderStatus::short_file;
  f::FrameStatus last = f::FrameStatus::ok;  // status that stopped decoding
  std::size_t tail_bytes = 0;                // undecoded bytes at the end
  std::size_t count(f::RecordType t) const {
    std::size_t n = 0;
    for (auto& r : records) n += r.type == t;
    return n;
  }
};

inline Trace read_trace(const std::string& path) {
  Trace t;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  t.data = ss.str();
  auto* p = reinterpret_cast<const unsigned char*>(t.data.data());
  t.header = f::decode_file_header(p, t.data.size(), nullptr);
  if (t.header != f::HeaderStatus::ok) return t;
  const gpuheap::test::WalkEnd e = gpuheap::test::walk_records(p, t.data.size(), f::kFileHeaderSize,
                                                               [&](const f::Record& r) { t.records.push_back(r); });
  t.last = e.status;
  t.tail_bytes = t.data.size() - e.offset;
  return t;
}

// Starts a session with the settings the environment holds now: libgpuheap.so reads them
// once at load (options.h), these tests change them between sessions.
inline bool start_recorder() {
  static gpuheap::preload::Settings s;
  gpuheap::preload::read_settings(&s);
  return gpuheap::preload::recorder_start(s);
}

// Points the recorder at `dir` for the next start_recorder().
inline void use_dir(const TempDir& dir, const char* name = "t.%p.trace") {
  setenv("GPUHEAP_OUTPUT", (dir.path + "/" + name).c_str(), 1);
  setenv("GPUHEAP_QUIET", "1", 1);
  unsetenv("GPUHEAP_STACKS");
  unsetenv("GPUHEAP_FLUSH_MS");
  unsetenv("GPUHEAP_BUFFER_MB");
  unsetenv("GPUHEAP_PATH_FILE");
  unsetenv("GPUHEAP_FOLLOW_FORK");
}

// Redirects fd 2 into a file while alive; text() returns what was written.
struct CaptureStderr {
  std::string file;
  int saved;
  explicit CaptureStderr(const TempDir& dir) : file(dir.path + "/stderr.txt") {
    fflush(stderr);
    saved = dup(2);
    int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2), close(fd);
  }
  ~CaptureStderr() { restore(); }
  void restore() {
    if (saved < 0) return;
    fflush(stderr);
    dup2(saved, 2), close(saved);
    saved = -1;
  }
  std::string text() const {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

inline f::AllocRecord alloc_rec(std::uint64_t ptr, std::uint32_t stack = 0) {
  f::AllocRecord a;
  a.ts = gpuheap::preload::now_ns(), a.tid = gpuheap::preload::current_tid();
  a.ptr = ptr, a.requested = 100, a.size = 512, a.stack = stack;
  return a;
}
inline f::FreeRecord free_rec(std::uint64_t ptr, std::uint32_t stack = 0) {
  f::FreeRecord x;
  x.ts = gpuheap::preload::now_ns(), x.tid = gpuheap::preload::current_tid();
  x.ptr = ptr, x.size = 512, x.stack = stack;
  return x;
}

}  // namespace rec_test
