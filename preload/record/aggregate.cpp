#include "preload/record/aggregate.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace gpuheap {
namespace preload {
namespace {

using format::AllocKind;

// An array in an anonymous mapping, grown by doubling (mremap moves it when it must).
template <class T>
struct MapVec {
  T* data = nullptr;
  std::size_t n = 0, cap = 0;
  bool reserve(std::size_t want) {
    if (want <= cap) return true;
    std::size_t c = cap ? cap : 4096 / sizeof(T) + 1;
    while (c < want) c *= 2;
    void* p = data ? mremap(data, cap * sizeof(T), c * sizeof(T), MREMAP_MAYMOVE)
                   : mmap(nullptr, c * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data = static_cast<T*>(p), cap = c;
    return true;
  }
  bool push(const T& v) {
    if (!reserve(n + 1)) return false;
    data[n++] = v;
    return true;
  }
  void release() {
    if (data) munmap(data, cap * sizeof(T));
    *this = MapVec{};
  }
};

struct Live {
  std::uint64_t key = 0;  // space_key + 1: 0 is an empty slot
  format::SnapLive e;
};

struct Site {
  std::uint64_t allocs = 0, bytes = 0, allocated = 0, max_live = 0;
  std::int64_t live = 0;
};

struct Device {
  std::int16_t id = 0;
  std::int64_t held = 0, held_requested = 0, peak = 0, peak_allocated = 0;
  std::uint64_t peak_ts = 0, peak_seq = 0;
  std::uint64_t ooms = 0, retries = 0, empty_calls = 0, empty_released = 0;  // in the segments before
  MapVec<format::SnapFreed> freed;                                           // live at the peak, freed since
};

constexpr std::size_t kMaxDevices = 64;

// File bytes holding table records only (sink order), and how many records they hold.
struct Extent {
  std::uint64_t off = 0, len = 0, records = 0;
};

struct State {
  MapVec<Live> table;  // open addressing, linear probing, at most half full
  std::size_t live = 0;
  MapVec<Site> sites;     // by stack id
  MapVec<Extent> tables;  // the current file's table records
  Device devices[kMaxDevices];
  std::size_t n_devices = 0;
  std::uint64_t seq = 0, events = 0, first_ts = 0;
  bool broken = false;
};
constinit State g;

std::size_t slot_of(std::uint64_t key) {
  std::uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return static_cast<std::size_t>(h >> 20) & (g.table.cap - 1);
}

// The slot holding key, or the empty one where it would go.
Live* find_slot(std::uint64_t key) {
  for (std::size_t i = slot_of(key);; i = (i + 1) & (g.table.cap - 1)) {
    Live& s = g.table.data[i];
    if (s.key == key || s.key == 0) return &s;
  }
}

bool grow_table() {
  std::size_t old_cap = g.table.cap;
  Live* old = g.table.data;
  std::size_t cap = old_cap ? old_cap * 2 : 4096;
  void* p = mmap(nullptr, cap * sizeof(Live), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  g.table.data = static_cast<Live*>(p), g.table.cap = cap;
  for (std::size_t i = 0; i < old_cap; ++i)
    if (old[i].key) *find_slot(old[i].key) = old[i];
  if (old) munmap(old, old_cap * sizeof(Live));
  return true;
}

// Backward-shift deletion: the probe chains stay unbroken without tombstones.
void erase_slot(Live* s) {
  std::size_t mask = g.table.cap - 1;
  std::size_t i = static_cast<std::size_t>(s - g.table.data);
  for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    Live& n = g.table.data[j];
    if (n.key == 0) break;
    std::size_t home = slot_of(n.key);
    // n may move to i when its home is not in (i, j] (cyclically).
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) g.table.data[i] = n, i = j;
  }
  g.table.data[i].key = 0;
  --g.live;
}

Device* device(std::int16_t id) {
  for (std::size_t i = 0; i < g.n_devices; ++i)
    if (g.devices[i].id == id) return &g.devices[i];
  if (g.n_devices == kMaxDevices) {
    g.broken = true;
    return nullptr;
  }
  Device* d = &g.devices[g.n_devices++];
  d->id = id;
  return d;
}

Site* site(std::uint32_t stack) {
  if (stack >= g.sites.n) {
    if (!g.sites.reserve(std::size_t{stack} + 1)) {
      g.broken = true;
      return nullptr;
    }
    memset(static_cast<void*>(g.sites.data + g.sites.n), 0, (stack + 1 - g.sites.n) * sizeof(Site));
    g.sites.n = std::size_t{stack} + 1;
  }
  return &g.sites.data[stack];
}

// The program gave e back (model_events.cpp: Model::release): its bytes leave its site and
// its device; a pooled block stays (pending) until its free_completed unless `completes`.
void release(Live* s, bool completes) {
  format::SnapLive& e = s->e;
  if (!(e.flags & format::kSnapPending)) {
    if (Site* st = site(e.stack)) st->live -= static_cast<std::int64_t>(e.requested);
    if (format::holds_device_memory(e.kind)) {
      Device* d = device(e.device);
      if (!d) return;
      d->held -= static_cast<std::int64_t>(e.size), d->held_requested -= static_cast<std::int64_t>(e.requested);
      if (e.seq <= d->peak_seq && !d->freed.push({e.stack, e.device, e.requested, e.size})) g.broken = true;
    }
  }
  if (e.kind == AllocKind::device_pooled && !completes) {
    e.flags |= format::kSnapPending;
    return;
  }
  erase_slot(s);
}

void note_event(std::uint64_t ts) {
  if (g.events++ == 0) g.first_ts = ts;
}

}  // namespace

void agg_on_alloc(const format::AllocRecord& a) noexcept {
  if (g.broken) return;
  note_event(a.ts);
  if ((g.live + 1) * 2 > g.table.cap && !grow_table()) {
    g.broken = true;
    return;
  }
  const std::uint64_t key = format::space_key(a.ptr, a.kind) + 1;
  Live* s = find_slot(key);
  if (s->key) {  // still tracked (a lost free): retired first, as the analyzer does
    release(s, true);
    s = find_slot(key);
  }
  const std::uint64_t size = a.size ? a.size : a.requested;
  s->key = key, ++g.live;
  s->e = format::SnapLive{++g.seq,
                          a.ts,
                          a.ptr,
                          size,
                          a.requested,
                          a.stream,
                          a.tid,
                          a.stack,
                          a.device,
                          a.kind,
                          static_cast<std::uint8_t>(a.flags & ~format::kSnapPending)};
  Site* st = site(a.stack);
  if (!st) return;
  st->allocs++, st->bytes += a.requested, st->allocated += size;
  st->live += static_cast<std::int64_t>(a.requested);
  if (st->live > static_cast<std::int64_t>(st->max_live)) st->max_live = static_cast<std::uint64_t>(st->live);
  if (!format::holds_device_memory(a.kind)) return;
  Device* d = device(a.device);
  if (!d) return;
  d->held += static_cast<std::int64_t>(size), d->held_requested += static_cast<std::int64_t>(a.requested);
  if (d->held_requested > d->peak) {
    d->peak = d->held_requested, d->peak_allocated = d->held;
    d->peak_ts = a.ts, d->peak_seq = g.seq;
    d->freed.n = 0;
  }
}

void agg_on_free(const format::FreeRecord& f) noexcept {
  if (g.broken) return;
  note_event(f.ts);
  if ((f.flags & format::kFlagFailed) || !g.table.cap) return;
  Live* s = find_slot(format::space_key(f.ptr, f.kind) + 1);
  if (!s->key || (s->e.flags & format::kSnapPending)) return;  // not seen, or freed twice
  release(s, false);
}

void agg_on_free_completed(const format::FreeCompletedRecord& f) noexcept {
  if (g.broken) return;
  note_event(f.ts);
  if (!g.table.cap) return;
  Live* s = find_slot(format::space_key(f.ptr, AllocKind::device_pooled) + 1);
  if (s->key && (s->e.flags & format::kSnapPending)) erase_slot(s);
}

void agg_on_segment(std::uint64_t ts) noexcept { note_event(ts); }
bool agg_ok() noexcept { return !g.broken; }
std::uint64_t agg_events() noexcept { return g.events; }

namespace {

// Encodes the snapshot's records into one scratch mapping (entries, then the frame).
struct SnapWriter {
  AggOut out;
  void* ctx;
  unsigned char* entries;
  unsigned char* frame;
  std::size_t frame_cap;
  bool put(const format::SnapshotRecord& r) {
    std::size_t n = format::encode(frame, frame_cap, r);
    return n && out(ctx, frame, n);
  }
  // Writes `count` entries of `size` bytes made by fill(i, q) in records of kSnapMaxEntries.
  template <class Fill>
  bool chunks(format::SnapshotPart part, std::size_t count, std::size_t size, Fill fill) {
    format::SnapshotRecord r;
    r.part = part;
    for (std::size_t at = 0; at < count;) {
      std::uint32_t k = 0;
      for (; k < format::kSnapMaxEntries && at < count; ++at)
        if (fill(at, entries + size * k)) ++k;
      if (k == 0) break;
      r.count = k, r.entries = entries;
      if (!put(r)) return false;
    }
    return true;
  }
};

}  // namespace

bool agg_write_snapshot(std::uint64_t ts, std::uint32_t segment, AggOut out, void* ctx) noexcept {
  if (g.broken) return false;
  constexpr std::size_t kEntryBytes = format::kSnapLiveSize * format::kSnapMaxEntries;
  constexpr std::size_t kFrameCap = kEntryBytes + 64;
  void* p = mmap(nullptr, kEntryBytes + kFrameCap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  SnapWriter w{out, ctx, static_cast<unsigned char*>(p), static_cast<unsigned char*>(p) + kEntryBytes, kFrameCap};
  format::SnapshotRecord r;
  r.part = format::SnapshotPart::begin;
  r.ts = ts, r.segment = segment, r.events_before = g.events, r.first_ts = g.first_ts;
  bool ok = w.put(r);
  std::uint64_t n_freed = 0, n_sites = 0;
  for (std::size_t i = 0; ok && i < g.n_devices; ++i) {
    const Device& d = g.devices[i];
    format::SnapshotRecord x;
    x.part = format::SnapshotPart::device;
    x.device = d.id, x.peak_requested = static_cast<std::uint64_t>(d.peak);
    x.peak_allocated = static_cast<std::uint64_t>(d.peak_allocated), x.peak_ts = d.peak_ts, x.peak_seq = d.peak_seq;
    x.ooms = d.ooms, x.retries = d.retries, x.empty_cache_calls = d.empty_calls;
    x.empty_cache_released = d.empty_released;
    ok = w.put(x);
    n_freed += d.freed.n;
  }
  ok = ok &&
       w.chunks(format::SnapshotPart::live, g.table.cap, format::kSnapLiveSize, [](std::size_t i, unsigned char* q) {
         if (!g.table.data[i].key) return false;
         format::encode_snap_live(q, g.table.data[i].e);
         return true;
       });
  for (std::size_t i = 0; ok && i < g.n_devices; ++i) {
    const Device& d = g.devices[i];
    ok = w.chunks(format::SnapshotPart::peak_freed, d.freed.n, format::kSnapFreedSize,
                  [&d](std::size_t k, unsigned char* q) {
                    format::encode_snap_freed(q, d.freed.data[k]);
                    return true;
                  });
  }
  ok = ok && w.chunks(format::SnapshotPart::site, g.sites.n, format::kSnapSiteSize,
                      [&n_sites](std::size_t i, unsigned char* q) {
                        const Site& s = g.sites.data[i];
                        if (s.allocs == 0) return false;
                        ++n_sites;
                        format::encode_snap_site(q, format::SnapSite{static_cast<std::uint32_t>(i), s.allocs, s.bytes,
                                                                     s.allocated, s.max_live});
                        return true;
                      });
  if (ok) {
    format::SnapshotRecord e;
    e.part = format::SnapshotPart::end;
    e.n_live = g.live, e.n_freed = n_freed, e.n_sites = n_sites;
    ok = w.put(e);
  }
  munmap(p, kEntryBytes + kFrameCap);
  return ok;
}

namespace {
bool is_table(std::uint8_t t) { return format::is_table_record(static_cast<format::RecordType>(t)); }

// The oom, retry and empty_cache records of the segment being replaced are counted into their
// device (their payloads: format/trace.h): the next segment's snapshot carries the counts.
void count_rare(const unsigned char* f, std::size_t len) {
  const auto t = static_cast<format::RecordType>(f[0]);
  const unsigned char* p = f + format::kFrameHeaderSize;
  const std::size_t at = t == format::RecordType::oom ? 12 : 8;  // the i16 device
  if (len < format::kFrameHeaderSize + at + 2) return;
  std::int16_t id;
  memcpy(&id, p + at, 2);
  Device* d = device(id);
  if (!d) return;
  if (t == format::RecordType::oom) {
    ++d->ooms;
  } else if (t == format::RecordType::retry) {
    ++d->retries;
  } else if (len >= format::kFrameHeaderSize + 19) {  // empty_cache: u8 reason, u64 released
    std::uint64_t released;
    memcpy(&released, p + 11, 8);
    ++d->empty_calls, d->empty_released += released;
  }
}

}  // namespace

void agg_on_record(const unsigned char* f, std::size_t len, std::uint64_t at) noexcept {
  if (g.broken || (f[0] & format::kCompactBit)) return;
  const auto t = static_cast<format::RecordType>(f[0]);
  if (t == format::RecordType::oom || t == format::RecordType::retry || t == format::RecordType::empty_cache) {
    count_rare(f, len);
    return;
  }
  if (!is_table(f[0])) return;
  if (g.tables.n) {
    Extent& last = g.tables.data[g.tables.n - 1];
    if (last.off + last.len == at) {
      last.len += len, ++last.records;
      return;
    }
  }
  if (!g.tables.push(Extent{at, len, 1})) g.broken = true;
}

bool agg_copy_tables(int old_fd, AggOut out, void* ctx, std::uint64_t* records) noexcept {
  // Read through a scratch mapping in pieces; out() takes any run of whole records in pieces.
  constexpr std::size_t kBuf = 1u << 20;
  void* p = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  auto* buf = static_cast<unsigned char*>(p);
  bool ok = true;
  *records = 0;
  for (std::size_t i = 0; ok && i < g.tables.n; ++i) {
    const Extent& e = g.tables.data[i];
    for (std::uint64_t pos = 0; ok && pos < e.len;) {
      const std::size_t want = e.len - pos < kBuf ? static_cast<std::size_t>(e.len - pos) : kBuf;
      ssize_t n = pread(old_fd, buf, want, static_cast<off_t>(e.off + pos));
      if (n < 0 && errno == EINTR) continue;
      // An extent starts with a table record's type byte, as the sink wrote it: else the file is
      // not what was written.
      ok = n > 0 && (pos > 0 || is_table(buf[0])) && out(ctx, buf, static_cast<std::size_t>(n));
      pos += n > 0 ? static_cast<std::uint64_t>(n) : 0;
    }
    *records += e.records;
  }
  munmap(p, kBuf);
  return ok;
}

void agg_tables_moved(std::uint64_t end, std::uint64_t records) noexcept {
  g.tables.n = 0;
  if (end > format::kFileHeaderSize &&
      !g.tables.push(Extent{format::kFileHeaderSize, end - format::kFileHeaderSize, records}))
    g.broken = true;
}

void agg_reset() noexcept {
  g.table.release(), g.sites.release(), g.tables.release();
  for (std::size_t i = 0; i < g.n_devices; ++i) g.devices[i].freed.release();
  g.n_devices = 0, g.live = 0, g.seq = 0, g.events = 0, g.first_ts = 0, g.broken = false;
  for (auto& d : g.devices) d = Device{};
}

}  // namespace preload
}  // namespace gpuheap
