#include "analyzer/trace/trace_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "analyzer/trace/block_stream.h"
#include "analyzer/trace/reader.h"
#include "format/trace.h"

namespace gpuheap {

namespace {

constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
// Level 3 (zstd's default): traces are mostly small fixed-layout records, and a higher level
// costs far more time than it saves bytes (docs/trace-format.md, Compression).
constexpr int kLevel = 3;

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw InputError(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
    p += w, n -= static_cast<std::size_t>(w);
  }
}

// Reads to EOF in chunks; throws naming the file.
struct ChunkReader {
  int fd;
  const std::string& path;
  std::size_t read(unsigned char* buf, std::size_t cap) const {
    for (;;) {
      ssize_t n = ::read(fd, buf, cap);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw InputError(fmt::format("{}: read error: {}", path, std::strerror(errno)));
      return static_cast<std::size_t>(n);
    }
  }
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The decompressed bytes of `zst` (its event blocks expanded, when `packed`) equal the bytes of
// `plain`: what compress checks before it removes anything. A packed file's header says
// version 7 where the original's says its own.
void verify_same(const std::string& plain, const std::string& zst, bool packed) {
  std::uint64_t size = 0;
  std::string why;
  Fd a, b;
  a.fd = open_regular(plain, &size, &why);
  if (a.fd < 0) throw InputError(fmt::format("{}: cannot reopen to verify: {}", plain, why));
  b.fd = open_regular(zst, &size, &why);
  if (b.fd < 0) throw InputError(fmt::format("{}: cannot reopen to verify: {}", zst, why));
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::unique_ptr<ZSTD_DCtx, std::size_t (*)(ZSTD_DCtx*)> guard(d, ZSTD_freeDCtx);
  std::vector<unsigned char> in(1u << 20), out(ZSTD_DStreamOutSize()), ref(ZSTD_DStreamOutSize());
  ChunkReader ra{a.fd, plain}, rb{b.fd, zst};
  std::size_t last = 0;
  std::uint64_t at = 0;
  auto fail = [&](const char* what) {
    throw InputError(
        fmt::format("{}: verification failed ({} at byte {}): the original {} is kept", zst, what, at, plain));
  };
  auto compare = [&](const unsigned char* p, std::size_t n) {
    if (ref.size() < n) ref.resize(n);
    for (std::size_t got = 0; got < n;) {
      std::size_t m = ra.read(ref.data(), n - got);
      if (m == 0) fail("the compressed file holds more bytes");
      if (std::memcmp(ref.data(), p + got, m) != 0) fail("bytes differ");
      got += m, at += m;
    }
  };
  // A packed stream: its header, then its frames through the expander.
  unsigned char head[format::kFileHeaderSize];
  std::size_t head_n = packed ? 0 : sizeof head;
  BlockExpander x(format::kFileHeaderSize, 1u << 20);
  std::vector<unsigned char> expanded(format::kFrameHeaderSize + format::kMaxPayload);
  auto drain = [&] {
    for (std::size_t n; (n = x.take(expanded.data(), expanded.size())) > 0;) compare(expanded.data(), n);
  };
  auto feed = [&](const unsigned char* p, std::size_t n) {
    while (n > 0 && head_n < sizeof head) {
      head[head_n++] = *p++, --n;
      if (head_n < sizeof head) continue;
      std::uint16_t v;
      std::memcpy(&v, head + 8, 2);
      if (v != format::kFirstBlockVersion) fail("not version 7");
      unsigned char orig[sizeof head];
      if (ra.read(orig, sizeof orig) != sizeof orig) fail("the compressed file holds more bytes");
      std::memcpy(head + 8, orig + 8, 2);
      if (std::memcmp(head, orig, sizeof head) != 0) fail("headers differ");
      at += sizeof head;
    }
    if (!packed) return compare(p, n);
    while (n > 0) {
      drain();
      unsigned char* dst = x.space();  // room for at least one byte: drain() left no whole frame
      const std::size_t m = std::min(n, x.room());
      std::memcpy(dst, p, m);
      x.added(m);
      p += m, n -= m;
    }
    drain();
  };
  for (;;) {
    std::size_t n = rb.read(in.data(), in.size());
    if (n == 0) break;
    ZSTD_inBuffer ib{in.data(), n, 0};
    while (ib.pos < ib.size) {
      ZSTD_outBuffer ob{out.data(), out.size(), 0};
      last = ZSTD_decompressStream(d, &ob, &ib);
      if (ZSTD_isError(last)) fail(ZSTD_getErrorName(last));
      feed(out.data(), ob.pos);
    }
  }
  if (last != 0) fail("the compressed stream is cut short");
  if (head_n < sizeof head) fail("the compressed file holds fewer bytes");
  x.finish();
  drain();
  if (ra.read(ref.data(), 1) != 0) fail("the compressed file holds fewer bytes");
}

}  // namespace

struct TraceOutput::Z {
  ZSTD_CCtx* c = nullptr;
  std::vector<unsigned char> out;
  ~Z() { ZSTD_freeCCtx(c); }
};

TraceOutput::TraceOutput(const std::string& final_path, bool zstd, const std::string& mode_from) : final_(final_path) {
  mode_t mode = 0644;
  struct stat st {};
  if (!mode_from.empty() && ::stat(mode_from.c_str(), &st) == 0) mode = st.st_mode & 07777;
  // A random name (safe_file.h): a predictable one let a planted link or file stand in.
  fd_ = create_beside(final_path, 0600, &tmp_);
  ::fchmod(fd_, mode);
  if (zstd) {
    z_ = std::make_unique<Z>();
    z_->c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(z_->c, ZSTD_c_compressionLevel, kLevel);
    ZSTD_CCtx_setParameter(z_->c, ZSTD_c_checksumFlag, 1);
    // Worker threads where libzstd has them (an error otherwise: then single-threaded).
    unsigned cores = std::thread::hardware_concurrency();
    ZSTD_CCtx_setParameter(z_->c, ZSTD_c_nbWorkers, static_cast<int>(std::min(cores > 1 ? cores : 0u, 8u)));
    z_->out.resize(ZSTD_CStreamOutSize());
    packer_ = std::make_unique<BlockPacker>();
  }
}

bool TraceOutput::packed() const { return packer_ && packer_->packed(); }

TraceOutput::~TraceOutput() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void TraceOutput::put(const void* data, std::size_t n) { write_all(fd_, data, n, tmp_); }

void TraceOutput::write(const void* data, std::size_t n) {
  in_ += n;
  if (packer_) packer_->write(static_cast<const unsigned char*>(data), n, buf_);
  else buf_.append(static_cast<const char*>(data), n);
  if (buf_.size() >= (1u << 20)) drain();
}

void TraceOutput::drain() {
  if (!z_) {
    put(buf_.data(), buf_.size());
    buf_.clear();
    return;
  }
  ZSTD_inBuffer ib{buf_.data(), buf_.size(), 0};
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{z_->out.data(), z_->out.size(), 0};
    std::size_t rc = ZSTD_compressStream2(z_->c, &ob, &ib, ZSTD_e_continue);
    if (ZSTD_isError(rc)) throw InputError(fmt::format("{}: zstd: {}", tmp_, ZSTD_getErrorName(rc)));
    put(z_->out.data(), ob.pos);
  }
  buf_.clear();
}

void TraceOutput::finish() {
  if (finished_) return;
  if (packer_) packer_->finish(buf_);
  drain();
  if (z_) {
    ZSTD_inBuffer ib{nullptr, 0, 0};
    std::size_t rc = 0;
    do {
      ZSTD_outBuffer ob{z_->out.data(), z_->out.size(), 0};
      rc = ZSTD_compressStream2(z_->c, &ob, &ib, ZSTD_e_end);
      if (ZSTD_isError(rc)) throw InputError(fmt::format("{}: zstd: {}", tmp_, ZSTD_getErrorName(rc)));
      put(z_->out.data(), ob.pos);
    } while (rc != 0);
  }
  if (::fsync(fd_) != 0) throw InputError(fmt::format("{}: cannot write: {}", tmp_, std::strerror(errno)));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw InputError(fmt::format("{}: cannot write: {}", tmp_, std::strerror(errno)));
  finished_ = true;
}

void TraceOutput::commit() {
  finish();
  if (::rename(tmp_.c_str(), final_.c_str()) != 0)
    throw InputError(fmt::format("{}: cannot rename the new file into place: {}", final_, std::strerror(errno)));
  committed_ = true;
}

bool is_zstd_file(const std::string& path) {
  std::uint64_t size = 0;
  std::string why;
  Fd f;
  f.fd = open_regular(path, &size, &why);
  unsigned char head[4] = {0, 0, 0, 0};
  return f.fd >= 0 && ::pread(f.fd, head, 4, 0) == 4 && std::memcmp(head, kZstdMagic, 4) == 0;
}

CompressResult compress_trace(const std::string& path, const CompressOptions& opt) {
  CompressResult res;
  res.output = path + ".zst";
  {
    TraceReader probe(path);  // not a trace, unreadable: refused here (exit 2)
    if (probe.compressed()) throw InputError(fmt::format("{}: already compressed (zstd)", path));
    res.bytes_before = probe.file_size();
  }
  struct stat st {};
  if (!opt.force && ::lstat(res.output.c_str(), &st) == 0)
    throw InputError(fmt::format("{}: exists; --force replaces it", res.output));
  std::uint64_t size = 0;
  std::string why;
  Fd in;
  in.fd = open_regular(path, &size, &why);
  if (in.fd < 0) throw InputError(fmt::format("{}: cannot open: {}", path, why));
  TraceOutput out(res.output, true, path);
  std::vector<unsigned char> buf(1u << 20);
  ChunkReader r{in.fd, path};
  for (std::size_t n; (n = r.read(buf.data(), buf.size())) > 0;) out.write(buf.data(), n);
  out.finish();
  verify_same(path, out.temp_path(), out.packed());
  out.commit();
  if (::stat(res.output.c_str(), &st) == 0) res.bytes_after = static_cast<std::uint64_t>(st.st_size);
  if (!opt.keep && ::unlink(path.c_str()) != 0)
    throw InputError(
        fmt::format("{}: compressed to {}, but cannot remove it: {}", path, res.output, std::strerror(errno)));
  return res;
}

}  // namespace gpuheap
