// Test helper: the one loop tests use to walk a trace's records with format/decode.h's
// decode_frame, over bytes in memory (walk_records) or streamed from a file (walk_file, for
// the gigabyte traces of the load tests). What a test keeps of each record is its own
// business; how a trace is cut into records is the format's, decided in one place.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "format/trace.h"

namespace gpuheap::test {

struct WalkEnd {
  format::FrameStatus status = format::FrameStatus::need_more;  // need_more: ran out of bytes
  std::size_t offset = 0;                                       // where the first record not decoded starts
};

// Calls fn(const format::Record&) for each whole record of p[off..n), until the bytes end or a
// frame does not decode. The record's strings and stack ips point into p. `cs`: the compact
// records' state where the walk goes on from an earlier one (walk_file); else a fresh one,
// compact records allowed (tests read traces of the current version).
template <class Fn>
inline WalkEnd walk_records(const unsigned char* p, std::size_t n, std::size_t off, Fn&& fn,
                            format::CompactState* cs = nullptr) {
  format::Record r;
  format::CompactState own;
  own.enabled = true;
  if (!cs) cs = &own;
  for (;;) {
    std::size_t used = 0;
    const format::FrameStatus st = off <= n ? format::decode_frame(p + off, n - off, r, &used, cs)
                                            : format::FrameStatus::need_more;
    if (st != format::FrameStatus::ok) return {st, off};
    off += used;
    fn(static_cast<const format::Record&>(r));
  }
}

struct FileWalk {
  bool opened = false, header_ok = false;
  bool corrupt = false;        // a frame did not decode
  std::size_t bytes = 0;       // bytes read
  std::size_t tail_bytes = 0;  // bytes after the last whole record (a cut or unwritten tail)
};

// Streams the trace at `path` through walk_records in chunks: memory stays bounded by the
// chunk, whatever the file's size. Records passed to fn are valid only during the call.
template <class Fn>
inline FileWalk walk_file(const std::string& path, Fn&& fn, std::size_t chunk = 4u << 20) {
  FileWalk w;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return w;
  w.opened = true;
  std::vector<unsigned char> buf(chunk);
  std::size_t have = 0;
  bool eof = false;
  auto refill = [&](std::size_t keep_from) {  // drops buf[0..keep_from), reads after the rest
    std::memmove(buf.data(), buf.data() + keep_from, have - keep_from);
    have -= keep_from;
    std::size_t n = std::fread(buf.data() + have, 1, buf.size() - have, f);
    eof = n == 0;
    have += n, w.bytes += n;
  };
  refill(0);
  if (format::decode_file_header(buf.data(), have, nullptr) == format::HeaderStatus::ok) {
    w.header_ok = true;
    std::size_t off = format::kFileHeaderSize;
    format::CompactState cs;
    cs.enabled = true;
    for (;;) {
      const WalkEnd e = walk_records(buf.data(), have, off, fn, &cs);
      off = e.offset;
      if (e.status == format::FrameStatus::corrupt) {
        w.corrupt = true;
        break;
      }
      if (eof) {
        w.tail_bytes = have - off;
        break;
      }
      refill(off);
      off = 0;
    }
  }
  std::fclose(f);
  return w;
}

}  // namespace gpuheap::test
