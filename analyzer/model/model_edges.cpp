// Model's block-edge bookkeeping: for torch's inactive_split / inactive_split_bytes (the
// free pieces of segments with an active block), whether a block that becomes or stops
// being active touches a neighbour at each of its edges. The per-event part (seg_add_block,
// bits_add, bits_remove) is in model_events.cpp, inlined into the replay loop; this file
// holds the bitmaps' birth and death and the edges_ hash map's path (seg_edges_hash).
//
// Two representations, with the same answers. edges_ (a hash map: address -> active blocks
// starting / ending there) takes anything. Most segments instead keep a bitmap: two bits per
// 512-byte boundary of the segment (a block starts here, a block ends here), indexed from the
// segment find_segment already found. The benchmark's 1024 2-MiB segments need 1 MB of
// bitmap, which stays in L2, where the hash map's 4-8 MB of slots missed on nearly every
// probe (a quarter of the replay's time).
//
// A bit cannot count, and a bitmap sees only its own segment, so a segment holds a bitmap
// only while every edge in it is one bit: its blocks are 512-byte aligned relative to its
// start, and no two active blocks start or end at the same boundary (live blocks have
// distinct addresses, so only overlapping blocks of a damaged trace do). The first block
// that breaks this moves the segment's bits into edges_ for the rest of its life. What can
// put an edge inside another segment (overlapping segments, a block wrapping around the
// address space) moves every segment's bits and turns the bitmaps off for the trace
// (bits_off_). Queries never read an edge at a segment's own start or end (those boundaries
// touch by definition), so edges of a neighbouring segment at a shared boundary, which the
// hash map would have merged, change no answer.
//
// Memory: a bitmap is size / 2048 bytes (1 KiB for 2 MiB), only for segments of at most
// kBitsMaxSegment, and all bitmaps together stay under kBitsBudget (16 MiB, 32 GiB of
// segments); segments beyond it use edges_. So the bitmaps add a constant to the replay's
// peak memory, which stays O(live blocks + distinct stacks).
#include <memory>

#include "analyzer/model/model.h"

namespace gpuheap {

namespace {

constexpr unsigned kGranuleShift = Model::kGranuleShift;  // 512-byte boundaries
constexpr std::uint64_t kGranuleMask = Model::kGranuleMask;

// Bits 2p (a block starts at boundary p) and 2p+1 (a block ends there), p = 0..size/512.
std::size_t bits_words(std::uint64_t size) {
  return static_cast<std::size_t>((2 * ((size >> kGranuleShift) + 1) + 63) / 64);
}

}  // namespace

// A new segment (its slot in segs_ filled, seg_overlap_ updated): a bitmap if it qualifies.
void Model::bits_birth(std::uint32_t slot) {
  static_assert(kBitsMaxSegment <= UINT32_MAX, "SegHint::bits_span");
  seg_hints_forget(slot);  // none should name it (its last segment's went at its release): a guard
  auto& s = segs_[slot];
  s.bits = nullptr;
  if (bits_off_ || seg_overlap_ || s.size == 0 || s.size > kBitsMaxSegment || (s.size & kGranuleMask)) return;
  const std::size_t words = bits_words(s.size);
  if (bits_bytes_ + words * 8 > kBitsBudget) return;
  if (seg_bits_.size() < segs_.size()) seg_bits_.resize(segs_.size());
  seg_bits_[slot] = std::make_unique<std::uint64_t[]>(words);  // zeroed
  s.bits = seg_bits_[slot].get();
  bits_bytes_ += words * 8;
}

// Hints that name slot hold its segment's start and bitmap as they were: forgotten when
// they change (find_segment sets them again at its next search). Only the hints of the
// granules the segment covers can name it (find_segment sets a granule's hint to the segment
// that contains its address): a few for a segment of a few MiB, not all kSegHints.
void Model::seg_hints_forget(std::uint32_t slot) {
  const auto& s = segs_[slot];
  const std::uint64_t g0 = s.ptr >> 21, g1 = (s.ptr + (s.size ? s.size - 1 : 0)) >> 21;
  if (g1 < g0 || g1 - g0 >= kSegHints) {  // wraps around (a damaged trace), or covers them all
    for (auto& h : seg_hints_)
      if (h.slot == slot) h = SegHint{};
    return;
  }
  for (std::uint64_t g = g0; g <= g1; ++g) {
    auto& h = seg_hints_[g & (kSegHints - 1)];
    if (h.slot == slot) h = SegHint{};
  }
}

// Frees a segment's bitmap; to_edges: its edges go on in edges_ (what seg_add_block would
// have put there).
void Model::bits_drop(Segment& s, bool to_edges) {
  const std::size_t words = bits_words(s.size);
  if (to_edges) {
    for (std::size_t i = 0; i < words; ++i) {
      for (std::uint64_t w = s.bits[i]; w; w &= w - 1) {
        const std::uint64_t b = i * 64 + static_cast<std::uint64_t>(__builtin_ctzll(w));
        auto& x = edges_.get(s.ptr + ((b >> 1) << kGranuleShift));
        (b & 1 ? x.ends : x.starts)++;
      }
    }
  }
  const auto slot = static_cast<std::uint32_t>(&s - segs_.data());
  seg_bits_[slot].reset();
  s.bits = nullptr;
  bits_bytes_ -= words * 8;
  seg_hints_forget(slot);
}

void Model::edges_to_hash() {
  bits_off_ = true;
  for (auto& s : segs_)
    if (s.bits) bits_drop(s, true);
}

// seg_add_block's path for a block whose edges are in edges_ (its segment has no bitmap, or
// the bitmap could not hold it and moved its edges here): two slots per block.
void Model::seg_edges_hash(std::uint64_t ptr, const Live& e, int sign) {
  auto& s = segs_[e.seg];
  std::uint64_t a = ptr, b = ptr + e.size;
  if (sign > 0 && b < a && !bits_off_) {
    // A block that wraps around the address space ends below its segment, possibly inside
    // another one whose bitmap would not see it: all edges go to the hash map.
    edges_to_hash();
  }
  if (sign < 0) {
    // A block leaving: both its edges are in the map (it put them there). One probe each,
    // and the erase starts from the slot found.
    std::size_t ia = edges_.find_index(a), ib = edges_.find_index(b);
    if (ia != edges_.npos && ib != edges_.npos && a != edges_.kEmpty && b != edges_.kEmpty) {
      auto& ea = edges_.at(ia);
      auto& eb = edges_.at(ib);
      std::uint32_t t = (a == s.ptr || ea.ends > 0) ? 1 : 0;
      t += (b == s.ptr + s.size || eb.starts > 0) ? 1 : 0;
      ea.starts--, eb.ends--;
      bool drop_a = ea.starts == 0 && ea.ends == 0, drop_b = eb.starts == 0 && eb.ends == 0;
      if (drop_b) edges_.erase_at(ib);
      if (drop_a) {
        // The erase of b may have moved a's entry (backward shift): then probe again.
        if (drop_b && edges_.key_at(ia) != a) edges_.erase(a);
        else edges_.erase_at(ia);
      }
      seg_account(s, e.size, t, sign);
      return;
    }
  }
  if (sign > 0 && a != edges_.kEmpty && b != edges_.kEmpty) {
    // A block arriving (every allocation): room for both edges first, so neither insert
    // rehashes and `ea` stays valid; a new block's start count is at least 1 (never dropped),
    // and so is its end's end count.
    edges_.reserve_more(2);
    auto& ea = edges_.get_reserved(a);
    std::uint32_t t = (a == s.ptr || ea.ends > 0) ? 1 : 0;
    ea.starts++;
    const bool drop_a = ea.starts == 0 && ea.ends == 0;  // only if the count wrapped (u32)
    auto& eb = edges_.get_reserved(b);
    t += (b == s.ptr + s.size || eb.starts > 0) ? 1 : 0;
    eb.ends++;
    if (eb.starts == 0 && eb.ends == 0) edges_.erase(b);
    if (drop_a) edges_.erase(a);
    seg_account(s, e.size, t, sign);
    return;
  }
  auto& ea = edges_.get(a);
  std::uint32_t t = (a == s.ptr || ea.ends > 0) ? 1 : 0;
  ea.starts += static_cast<std::uint32_t>(sign);
  bool drop_a = ea.starts == 0 && ea.ends == 0;
  auto& eb = edges_.get(b);  // may rehash: `ea` is dead from here
  t += (b == s.ptr + s.size || eb.starts > 0) ? 1 : 0;
  eb.ends += static_cast<std::uint32_t>(sign);
  if (eb.starts == 0 && eb.ends == 0) edges_.erase(b);
  if (drop_a) edges_.erase(a);
  seg_account(s, e.size, t, sign);
}

}  // namespace gpuheap
