// Event blocks (format/block.h, version 7) on a stream of trace bytes: BlockExpander turns a
// version-7 stream back into the frames the compressor was given (the reader's window is
// filled through it, and `compress` verifies its output with it); BlockPacker regroups the
// compact event frames of a version-5/6 stream into blocks (what TraceOutput writes when it
// compresses). Both walk frames with format::frame_extent, so they stop at the same byte: a
// zero type byte, a length no record can have; what follows crosses as it is, for the reader
// to judge (the unwritten tail of a killed process's trace, or damage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpuheap {

class BlockExpander {
 public:
  // Offsets count stream bytes from the start of the stream; `start` is the offset of the
  // first byte given (past the file header).
  explicit BlockExpander(std::uint64_t start, std::size_t initial_capacity);

  // Room for more bytes of the stream at space() (at least one byte while needs_input()),
  // then added(n) of them.
  unsigned char* space();
  std::size_t room() const { return raw_.size() - end_; }
  void added(std::size_t n) { end_ += n; }
  // No more bytes will come: what is left (a frame cut short) crosses as it is.
  void finish() { finished_ = true; }
  bool finished() const { return finished_; }
  // Nothing can cross without more bytes (after finish(): nothing is left).
  bool needs_input() const;
  bool empty() const { return begin_ == end_; }
  // The stream ended inside a block (dropped: what came before it is all there is).
  bool cut() const { return cut_; }

  // Moves whole frames, each block expanded (a damaged block as it is, which the reader then
  // refuses: decode_frame never accepts an event_block), into [dst, dst + cap) while they fit;
  // returns the bytes written.
  std::size_t take(unsigned char* dst, std::size_t cap);
  // The stream offset (before expansion) of out_offset (after): for an offset inside an
  // expanded block, the block's own offset.
  std::uint64_t raw_offset(std::uint64_t out_offset) const;
  // out_offset and before will not be asked for again.
  void forget_before(std::uint64_t out_offset);

 private:
  struct Span {  // one expanded block
    std::uint64_t out_begin, out_end, raw_begin, raw_end;
  };
  std::vector<unsigned char> raw_;
  std::size_t begin_ = 0, end_ = 0;
  bool finished_ = false, cut_ = false, verbatim_ = false;  // verbatim: the walk stopped; the rest crosses as it is
  std::uint64_t raw_at_, out_at_;                           // offsets of raw_[begin_] and of the next byte out
  Span base_;                                               // the last span forgotten (or the start)
  std::vector<Span> spans_;
};

// The compressor's side: a version-5/6 trace's bytes in (any cut), its version-7 form out.
// The header is held back until the first block: a file with none keeps its version (and
// holds exactly the bytes it was given), so `version 7` means `has blocks`.
class BlockPacker {
 public:
  // Appends the stream's next n bytes; what is ready goes to out.
  void write(const unsigned char* p, std::size_t n, std::string& out);
  // The end of the stream: everything left goes to out.
  void finish(std::string& out);
  bool packed() const { return packed_; }  // at least one block was written

 private:
  void walk(std::string& out);
  void flush_run(std::string& out);
  void release(std::string& out);     // the held header (and what followed it) goes out
  void check_held(std::string& out);  // held too long without a block: released as it is
  std::string in_;                    // bytes not walked yet (a frame cut short)
  std::string held_;                  // the header and the frames after it, until the first block
  std::string run_;                   // consecutive compact frames not written yet
  std::size_t run_count_ = 0;
  std::uint16_t version_ = 0;  // the input's
  std::vector<unsigned char> block_;
  bool header_ = false, packing_ = false, verbatim_ = false, packed_ = false;
};

}  // namespace gpuheap
