// Model's fast path for event records decoded in place (format::EventRecord): dispatch and
// prefetch, kept apart from model.cpp's replay semantics. Each case does exactly what
// Model::feed / Model::prefetch do for the same record in a format::Record. Inline (model.h
// includes this at its end): both run once per event from the reader loops (analysis.cpp,
// replay.cpp), where a call and a second switch each cost ~10 instructions a record.
#pragma once

#include "analyzer/model.h"

namespace gpuheap {

inline void Model::feed(const format::EventRecord& e) {
  switch (e.type) {
    case format::RecordType::alloc: ++info.events, on_alloc(e.alloc); break;
    case format::RecordType::free: ++info.events, on_free(e.free); break;
    case format::RecordType::free_completed: ++info.events, on_free_completed(e.free_completed); break;
    case format::RecordType::segment_alloc: ++info.events, on_segment(e.segment, false); break;
    case format::RecordType::segment_free: ++info.events, on_segment(e.segment, true); break;
    default: break;
  }
}

inline void Model::prefetch(const format::EventRecord& e) const {
  switch (e.type) {
    case format::RecordType::alloc: {
      const auto& a = e.alloc;
      live_.prefetch(key(a.ptr, a.kind));
      if (a.kind == format::AllocKind::device_pooled) {
        // The block's edges (seg_add_block).
        edges_.prefetch(a.ptr);
        edges_.prefetch(a.ptr + (a.size ? a.size : a.requested));
      }
      break;
    }
    case format::RecordType::free: live_.prefetch(key(e.free.ptr, e.free.kind)); break;
    case format::RecordType::free_completed: {
      const auto& f = e.free_completed;
      live_.prefetch(key(f.ptr, format::AllocKind::device_pooled));
      edges_.prefetch(f.ptr);
      if (f.size) edges_.prefetch(f.ptr + f.size);  // the writer's size; the replay uses its own
      break;
    }
    default: break;
  }
}

}  // namespace gpuheap
