// Rewrites a trace with its event records (alloc, free, free_completed, segment_*) in one
// encoding: --compact, the version-5 compact records the preload writes (format/compact.h), or
// --plain, the fixed-layout records of version 4 and before (the file then says the oldest
// version its records allow, at most the input's). Every other record is copied as it is, in the same order. For the
// tests that compare the analyzer's output on both encodings of one recording, and for the
// trace-size benchmark (scripts/bench-trace-size.sh) on stored traces of older versions.
//   gpuheap_recode_trace IN OUT --compact|--plain      (IN raw or zstd; OUT raw)
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "format/block.h"
#include "format/trace.h"

using namespace gpuheap::format;

namespace {

std::vector<unsigned char> read_all(const char* path) {
  std::vector<unsigned char> raw;
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return raw;
  unsigned char b[1 << 16];
  std::size_t n;
  while ((n = std::fread(b, 1, sizeof b, f)) > 0) raw.insert(raw.end(), b, b + n);
  std::fclose(f);
  const unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
  if (raw.size() < 4 || std::memcmp(raw.data(), kZstdMagic, 4) != 0) return raw;
  std::vector<unsigned char> out, chunk(ZSTD_DStreamOutSize());
  ZSTD_DCtx* z = ZSTD_createDCtx();
  ZSTD_inBuffer in{raw.data(), raw.size(), 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    if (ZSTD_isError(ZSTD_decompressStream(z, &o, &in))) {
      out.clear();
      break;
    }
    out.insert(out.end(), chunk.data(), chunk.data() + o.pos);
  }
  ZSTD_freeDCtx(z);
  return out;
}

// A version-7 stream with its event blocks expanded (format/block.h): the frames the
// compressor was given. The first frame that cannot be walked, and what follows it, stay as
// they are (a damaged block too: the decoder then refuses it).
std::vector<unsigned char> expand_blocks(const std::vector<unsigned char>& in) {
  std::vector<unsigned char> out(in.begin(), in.begin() + kFileHeaderSize);
  std::size_t off = kFileHeaderSize;
  while (off < in.size()) {
    const FrameExtent e = frame_extent(in.data() + off, in.size() - off);
    if (e.kind == FrameKind::stop || e.kind == FrameKind::need_more) break;
    const std::size_t at = out.size();
    if (in[off] == kEventBlockType) {
      out.resize(at + e.size);
      const std::size_t n = expand_event_block(in.data() + off + kFrameHeaderSize, e.size - kFrameHeaderSize,
                                               out.data() + at, e.size);
      out.resize(at + n);
      if (n == 0) break;
    } else {
      out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(off),
                 in.begin() + static_cast<std::ptrdiff_t>(off + e.size));
    }
    off += e.size;
  }
  out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(off), in.end());
  return out;
}

// The record's event encoding in `compact` or plain form into b; 0 for a record of another type.
std::size_t encode_event(unsigned char* b, std::size_t cap, const Record& r, bool compact, CompactState& s) {
  switch (r.type) {
    case RecordType::alloc: return compact ? encode_compact(b, cap, s, r.alloc) : encode(b, cap, r.alloc);
    case RecordType::free: return compact ? encode_compact(b, cap, s, r.free) : encode(b, cap, r.free);
    case RecordType::free_completed:
      return compact ? encode_compact(b, cap, s, r.free_completed) : encode(b, cap, r.free_completed);
    case RecordType::segment_alloc:
    case RecordType::segment_free: {
      const bool is_free = r.type == RecordType::segment_free;
      return compact ? encode_compact(b, cap, s, r.segment, is_free) : encode(b, cap, r.segment, is_free);
    }
    default: return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool compact = argc == 4 && !std::strcmp(argv[3], "--compact");
  if (argc != 4 || (!compact && std::strcmp(argv[3], "--plain") != 0)) {
    std::fprintf(stderr, "usage: %s IN OUT --compact|--plain\n", argv[0]);
    return 2;
  }
  std::vector<unsigned char> in = read_all(argv[1]);
  std::uint16_t version = 0;
  if (in.size() < kFileHeaderSize || decode_file_header(in.data(), in.size(), &version) != HeaderStatus::ok) {
    std::fprintf(stderr, "%s: not a trace this build reads\n", argv[1]);
    return 2;
  }
  if (version >= kFirstBlockVersion) in = expand_blocks(in), version = kRecordVersion;
  std::vector<unsigned char> out(in.begin(), in.begin() + kFileHeaderSize);
  std::uint8_t max_type = 0;  // of the records copied: what a plain file's version must allow
  CompactState read_state, write_state;
  read_state.enabled = version >= kFirstCompactVersion;
  std::size_t off = kFileHeaderSize;
  unsigned char b[kMaxEventRecordSize + kCompactMaxEventSize];
  FrameStatus st = FrameStatus::ok;
  while (off < in.size()) {
    Record r;
    std::size_t used = 0;
    if ((st = decode_frame(in.data() + off, in.size() - off, r, &used, &read_state)) != FrameStatus::ok) break;
    const std::size_t n = encode_event(b, sizeof b, r, compact, write_state);
    if (n) out.insert(out.end(), b, b + n);
    else
      out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(off),
                 in.begin() + static_cast<std::ptrdiff_t>(off + used));
    max_type = std::max(max_type, static_cast<std::uint8_t>(r.type));
    off += used;
  }
  // Plain: the version the records need (3 up to the symbol records, 19; 4 beyond), never more
  // than the input's, so that a reader of that version reads it.
  const std::uint16_t need = max_type <= static_cast<std::uint8_t>(RecordType::symbol_frames) ? 3 : 4;
  const std::uint16_t out_version = compact ? kRecordVersion : std::min(version, need);
  std::memcpy(out.data() + 8, &out_version, sizeof out_version);
  // A cut trace (the end of its written data, a frame cut short) keeps its tail as it is, so a
  // reader finds the same cut; a corrupt frame fails the rewrite.
  const bool corrupt = st == FrameStatus::corrupt;
  if (corrupt) std::fprintf(stderr, "%s: corrupt record at byte %zu of %zu\n", argv[1], off, in.size());
  else out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(off), in.end());
  std::FILE* f = std::fopen(argv[2], "wbx");  // never over an existing file
  if (!f || std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "%s: cannot write\n", argv[2]);
    return 1;
  }
  return corrupt ? 1 : 0;
}
