// Model's fast path for event records decoded in place (format::EventRecord): dispatch and
// prefetch, kept apart from model.cpp's replay semantics. Each case does exactly what
// Model::feed / Model::prefetch do for the same record in a format::Record. Out of line on
// purpose: GCC (12, -O1 and up) deems a function of loads and __builtin_prefetch free of
// side effects and deletes the calls to it wherever it sees the body, so prefetch() made
// inline lost every prefetch of the replay loops (9bcdc28, fixed in the next commit).
#include "analyzer/model.h"

namespace gpuheap {

using format::AllocKind;
using format::RecordType;

void Model::feed(const format::EventRecord& e) {
  switch (e.type) {
    case RecordType::alloc: ++info.events, on_alloc(e.alloc); break;
    case RecordType::free: ++info.events, on_free(e.free); break;
    case RecordType::free_completed: ++info.events, on_free_completed(e.free_completed); break;
    case RecordType::segment_alloc: ++info.events, on_segment(e.segment, false); break;
    case RecordType::segment_free: ++info.events, on_segment(e.segment, true); break;
    default: break;
  }
}

void Model::feed_batch(const format::EventRecord* e, std::size_t n, const format::EventRecord* ahead,
                       std::size_t n_ahead) {
  info.events += n;  // every batched record is an event (alloc, free, free_completed)
  const std::size_t steps = n > n_ahead ? n : n_ahead;
  for (std::size_t i = 0; i < steps; ++i) {
    if (i < n_ahead) prefetch(ahead[i]);
    if (i >= n) continue;
    switch (e[i].type) {
      case RecordType::alloc: on_alloc(e[i].alloc); break;
      case RecordType::free: on_free(e[i].free); break;
      default: on_free_completed(e[i].free_completed); break;
    }
  }
}

// noipa: called from this file too, where GCC would otherwise see that it has no side
// effects (the reason it is out of line, above) and drop the calls. Clang has no noipa (and
// warns); it treats llvm.prefetch as a memory effect, so not inlining is enough there.
#if defined(__clang__)
__attribute__((noinline))
#else
__attribute__((noipa))
#endif
void Model::prefetch(const format::EventRecord& e) const {
  switch (e.type) {
    case RecordType::alloc: {
      const auto& a = e.alloc;
      live_.prefetch(key(a.ptr, a.kind));
      // Its site's counters (72 bytes each: thousands of sites outgrow L1).
      if (a.stack < sites.size()) __builtin_prefetch(&sites[a.stack]);
      if (a.kind != AllocKind::device_pooled) break;
      if (const auto* w = bits_word(a.ptr)) {
        // The block's edges in its segment's bitmap (model_edges.cpp): a line covers 128 KiB
        // of the segment, so usually both edges.
        __builtin_prefetch(w);
      } else if (edges_.size()) {
        // The block's edges (seg_add_block), when some segment keeps them in the hash map.
        edges_.prefetch(a.ptr);
        edges_.prefetch(a.ptr + (a.size ? a.size : a.requested));
      }
      break;
    }
    case RecordType::free: live_.prefetch(key(e.free.ptr, e.free.kind)); break;
    case RecordType::free_completed: {
      const auto& f = e.free_completed;
      live_.prefetch(key(f.ptr, AllocKind::device_pooled));
      if (const auto* w = bits_word(f.ptr)) {
        __builtin_prefetch(w);
      } else if (edges_.size()) {
        edges_.prefetch(f.ptr);
        if (f.size) edges_.prefetch(f.ptr + f.size);  // the writer's size; the replay uses its own
      }
      break;
    }
    default: break;
  }
}

}  // namespace gpuheap
