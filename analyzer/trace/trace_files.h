// Rewriting trace files in place, safely: `gpuheap symbolize` (symbol records added) and
// `gpuheap compress` (the same records, zstd; the compact event frames regrouped into event
// blocks, format version 7: format/block.h). Output goes to a temporary file beside the trace
// (same directory, so rename(2) is atomic), is fsync'ed, and only then replaces or joins the
// original; on any error the temporary file is removed and the original is left as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gpuheap {

class BlockPacker;

// A new file written through a temporary name beside `final_path`, plain or zstd. A zstd one
// has its compact event frames regrouped into event blocks (BlockPacker): what is written is
// the stream of a version-5/6 trace, what the file holds its version-7 form.
class TraceOutput {
 public:
  // Creates DIR/.NAME.gpuheap-tmp.XXXXXX (create_beside, safe_file.h), with the mode of
  // `mode_from` when given (a rewrite or the compressed copy of the same trace keeps its mode).
  TraceOutput(const std::string& final_path, bool zstd, const std::string& mode_from = {});
  ~TraceOutput();  // not committed: the temporary file is removed
  TraceOutput(const TraceOutput&) = delete;
  TraceOutput& operator=(const TraceOutput&) = delete;

  void write(const void* data, std::size_t n);
  // Ends the zstd frame, fsyncs, closes; the file is still under its temporary name.
  void finish();
  // finish() then rename onto final_path (replacing it).
  void commit();
  const std::string& temp_path() const { return tmp_; }
  std::uint64_t bytes_in() const { return in_; }
  bool packed() const;  // event blocks were written (the file says version 7)

 private:
  void put(const void* data, std::size_t n);
  void drain();  // the buffered bytes to the file (through zstd when compressing)
  struct Z;
  std::string buf_;  // records are small: written out 1 MiB at a time
  std::string final_, tmp_;
  int fd_ = -1;
  bool finished_ = false, committed_ = false;
  std::uint64_t in_ = 0;
  std::unique_ptr<Z> z_;
  std::unique_ptr<BlockPacker> packer_;
};

// Whether the file starts with the zstd frame magic.
bool is_zstd_file(const std::string& path);

struct CompressOptions {
  bool keep = false;   // keep the original after TRACE.zst is verified
  bool force = false;  // replace an existing TRACE.zst
};
struct CompressResult {
  std::string output;  // TRACE.zst
  std::uint64_t bytes_before = 0, bytes_after = 0;
};
// TRACE -> TRACE.zst, read back (its event blocks expanded) and compared byte for byte before
// the original is removed.
// Throws InputError (exit 2): not a trace, already compressed, TRACE.zst exists (without
// force), unreadable, or the verification failed (the original is then kept).
CompressResult compress_trace(const std::string& path, const CompressOptions& opt);

}  // namespace gpuheap
