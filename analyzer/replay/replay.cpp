// The replay engine of `gpuheap replay` (replay.h): one simulated device per trace device,
// each with gpuheap's Pool on a fake upstream whose fences are the trace's free_completed
// records. Reports (text/JSON), the policy parser and the limit bisection are in
// replay_report.cpp.
#include "analyzer/replay/replay.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/flat_map.h"
#include "analyzer/model/model.h"
#include "analyzer/replay/replay_sim.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/symbolize.h"
#include "analyzer/trace/reader.h"
#include "format/decode.h"

namespace gpuheap {
namespace {

using format::AllocKind;
using format::RecordType;
using replay_sim::kDriverGranularity;
using replay_sim::round_up;
using replay_sim::SegTracker;
using replay_sim::SimUpstream;

struct DeviceSim {
  DeviceSim(int device, const ReplayOptions& o) : up(&out, o.limit), none(o.policy.kind == ReplayPolicy::Kind::none) {
    out.device = device;
    if (o.policy.kind == ReplayPolicy::Kind::torch) {
      torch = std::make_unique<TorchAllocator>(up, o.policy.torch, &segs);
    } else if (!none) {
      pool::PoolConfig cfg = o.policy.pool;
      cfg.seal_interval_ns = 0;  // one fence per free: each completes on its own record
      cfg.unsafe_reuse = false;
      cfg.limit = 0;  // the upstream is the cap, as in-process
      pool = std::make_unique<pool::Pool>(up, cfg, &segs);
    }
  }
  ReplayDevice out;
  SimUpstream up;
  SegTracker segs;
  std::unique_ptr<pool::Pool> pool;
  std::unique_ptr<TorchAllocator> torch;
  bool none;
  std::uint64_t largest_free() const { return torch ? torch->largest_free() : pool->stats().largest_free; }
  std::uint64_t none_segments = 0, snap_reserved = 0, bypass_current = 0;
  std::int64_t recorded_reserved = 0;
};

// No block size: the free gets it back from the pool or torch model (none: recomputed), and
// without it a slot of the live map is 32 bytes, not 64 (the map is probed at random).
//
// A pooled free leaves its entry in the live map as kPending, holding the fence, until the
// trace's free_completed for the address: the free updates the slot its lookup found and the
// completion finds it in the slot prefetched for it, where a separate fence map cost an
// insert and a lookup (a cache miss each) per free. Should the address be allocated again
// before its free_completed (a trace only a racing or hostile program writes), the fence
// moves to overflow_ until then (Replayer::on_alloc).
constexpr std::uint8_t kServed = 0, kPassthrough = 1, kBypass = 2, kPending = 3;  // Live::how
struct Live {
  // addr: the pool's or the torch model's handle for the replayed block; kPending: the fence
  std::uint64_t addr = 0, requested = 0;
  std::uint32_t seg = 0;
  std::uint16_t dev = 0;
  std::uint8_t how = 0;  // kServed, kPassthrough, kBypass or kPending
};
static_assert(sizeof(Live) <= 24, "a live-map slot (key + Live) stays 32 bytes");
struct Pending {
  std::uint64_t fence = 0;
  std::uint16_t dev = 0;
};

class Replayer {
 public:
  Replayer(const std::string& path, const ReplayOptions& o) : opt_(o), model_(path), dev_index_(65536, -1) {
    res_.trace = path, res_.policy = o.policy.name, res_.limit = o.limit;
  }

  ReplayResult run() {
    auto t0 = std::chrono::steady_clock::now();
    TraceReader rd(res_.trace);
    // Room in the live map up front for a live block per 64 bytes of file, up to 64 Ki
    // (a 4 MiB table): fewer of the rehashes that a growing live set costs.
    live_.reserve_more(static_cast<std::size_t>(std::min<std::uint64_t>(rd.file_size() / 64, 65536)));
    format::Record r;
    // Events wait kAhead records in a ring after their map slots were prefetched, so the
    // cache misses of consecutive events overlap (the replay's cost is those misses). Any
    // other record first drains the ring: order is kept.
    Ahead ring[kAhead];
    std::size_t head = 0, n = 0;
    bool ok = true;
    auto drain_one = [&] {
      Ahead& a = ring[head];
      head = (head + 1) % kAhead, --n;
      return on_event(a.ev, a.index);
    };
    while (ok) {
      if (n == kAhead) ok = drain_one();  // a free slot to decode into (not a copy: records are large)
      if (!ok) break;
      Ahead& slot = ring[(head + n) % kAhead];
      auto got = rd.next_any(slot.ev, r);
      if (got == TraceReader::Got::none) break;
      if (got == TraceReader::Got::event) {
        prefetch(slot.ev);
        slot.index = rd.records();
        ++n;
        continue;
      }
      while (ok && n) ok = drain_one();
      if (ok) ok = on_record(r, rd.records());
      else rest_record(r);  // the ring's OOM came before this record: it is part of the rest
    }
    while (ok && n) ok = drain_one();  // !ok: out of memory under the limit, the job stops there
    if (!ok) {
      // The replay stops at its OOM, the recording does not: the rest is read for what
      // describes the recording (its segments: the recorded peak; its stored symbols; its
      // end record: whether it is truncated), so neither moves with --limit.
      for (; n; head = (head + 1) % kAhead, --n) note_recorded(ring[head].ev);
      read_rest(rd);
    }
    res_.truncated = rd.truncated();
    resolve_oom_stack();
    for (auto& d : devs_) {
      if (d->pool || d->torch) d->out.retries = d->segs.retries();
      res_.devices.push_back(std::move(d->out));
    }
    std::sort(res_.devices.begin(), res_.devices.end(), [](auto& a, auto& b) { return a.device < b.device; });
    res_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::move(res_);
  }

 private:
  static constexpr std::size_t kAhead = 8;
  struct Ahead {
    format::EventRecord ev;
    std::uint64_t index = 0;
  };
  void prefetch(const format::EventRecord& e) const {
    if (e.type == RecordType::alloc) live_.prefetch(key(e.alloc.ptr));
    else if (e.type == RecordType::free) live_.prefetch(key(e.free.ptr));
    else if (e.type == RecordType::free_completed) live_.prefetch(key(e.free_completed.ptr));
  }

  DeviceSim& dev(int device, std::uint16_t* idx) {
    if (device == last_device_ && last_dev_) {  // nearly every event: the device of the one before
      *idx = last_idx_;
      return *last_dev_;
    }
    return find_dev(device, idx);
  }
  [[gnu::noinline]] DeviceSim& find_dev(int device, std::uint16_t* idx) {
    int& i = dev_index_[static_cast<std::uint16_t>(device)];
    if (i < 0) {
      i = static_cast<int>(devs_.size());
      devs_.push_back(std::make_unique<DeviceSim>(device, opt_));
    }
    *idx = static_cast<std::uint16_t>(i);
    last_device_ = device, last_idx_ = *idx, last_dev_ = devs_[static_cast<std::size_t>(i)].get();
    return *last_dev_;
  }
  static std::uint64_t none_size(std::uint64_t requested) {
    return round_up(requested ? requested : 1, kDriverGranularity);
  }
  // The live map's key for a trace address: the address itself (FlatMap's hash folds the
  // high bits in; folding them here as well would cancel that fold: (k ^ k>>29) twice is
  // k ^ k>>58, and addresses at power-of-two strides would cluster again).
  static std::uint64_t key(std::uint64_t ptr) { return ptr; }
  static bool pool_kind(AllocKind k) { return k == AllocKind::device_pooled || k == AllocKind::device_passthrough; }
  // Other device kinds are keyed by address space as the model keys them (a VMM handle
  // may equal an address).
  static std::uint64_t other_key(std::uint64_t ptr, AllocKind k) { return format::space_key(ptr, k); }

  bool on_record(const format::Record& r, std::uint64_t index) {
    switch (r.type) {
      case RecordType::process: mono0_ = r.process.mono_ns; break;
      case RecordType::device: {
        std::uint16_t i;
        dev(r.device.device, &i).out.name = std::string(r.device.name);
        break;
      }
      case RecordType::stack:
      case RecordType::module:
      case RecordType::py_code:
      case RecordType::symbol_string:
      case RecordType::symbol_frames: model_.feed(r); break;  // for the failing event's stack
      case RecordType::snapshot:
        // A rolling window's segment: the allocator cannot be replayed from a state it never
        // saw being built (its blocks, segments and cache), and a verdict on the window alone
        // would pass for the run's.
        throw InputError(
            fmt::format("replay: {} is a rolling window (gpuheap run --aggregate): the events before it "
                        "are not in the file, and replay needs every event; summary reads its peaks, "
                        "leaks and sites",
                        res_.trace));
      case RecordType::alloc:
      case RecordType::free:
      case RecordType::free_completed:
      case RecordType::segment_alloc:
      case RecordType::segment_free: {
        format::EventRecord ev;
        ev.type = r.type;
        if (r.type == RecordType::alloc) ev.alloc = r.alloc;
        else if (r.type == RecordType::free) ev.free = r.free;
        else if (r.type == RecordType::free_completed) ev.free_completed = r.free_completed;
        else ev.segment = r.segment;
        return on_event(ev, index);
      }
      case RecordType::empty_cache: {
        // What the program (gpuheap_empty_cache) or its settings (GPUHEAP_RELEASE_THRESHOLD)
        // asked for is asked again; the OOM path's releases happen by themselves, and the
        // exit-time release changes no peak.
        std::uint16_t i;
        DeviceSim& d = dev(r.empty_cache.device, &i);
        if (d.torch && r.empty_cache.reason == format::EmptyCacheReason::api) d.torch->empty_cache();
        if (!d.pool) break;
        if (r.empty_cache.reason == format::EmptyCacheReason::api) d.pool->empty_cache(format::EmptyCacheReason::api);
        else if (r.empty_cache.reason == format::EmptyCacheReason::threshold)
          d.pool->trim(format::EmptyCacheReason::threshold);
        break;
      }
      default: break;
    }
    return true;
  }

  bool on_event(const format::EventRecord& e, std::uint64_t index) {
    switch (e.type) {
      case RecordType::alloc: ++res_.events; return on_alloc(e.alloc, index);
      case RecordType::free: ++res_.events, on_free(e.free); break;
      case RecordType::free_completed: ++res_.events, on_free_completed(e.free_completed.ptr); break;
      case RecordType::segment_alloc:
      case RecordType::segment_free: {
        std::uint16_t i;
        DeviceSim& d = dev(e.segment.device, &i);
        if (e.type == RecordType::segment_alloc) d.up.offer(e.segment.ptr, e.segment.size);
        else d.up.withdraw(e.segment.ptr);
        note_recorded(e);
        break;
      }
      default: break;
    }
    return true;
  }

  bool on_alloc(const format::AllocRecord& a, std::uint64_t index) {
    if (!pool_kind(a.kind) && !format::holds_device_memory(a.kind)) {  // pinned host memory: no device
      ++res_.other_kind_events;
      return true;
    }
    if (std::uint64_t n = pool_kind(a.kind) ? a.requested : a.size; n >= replay_sim::kTop) too_large(n, index);
    std::uint16_t di;
    DeviceSim& d = dev(a.device, &di);
    if (!pool_kind(a.kind)) {
      ++res_.other_kind_events;
      bool inserted = false;
      std::uint64_t& held = other_.get(other_key(a.ptr, a.kind), &inserted);
      if (!inserted) d.up.charge_other(-static_cast<std::int64_t>(held));
      held = a.size;
      d.up.charge_other(static_cast<std::int64_t>(a.size));
      return true;
    }
    bool inserted = false;
    Live& slot = live_.get(key(a.ptr), &inserted);  // one probe; nothing else touches live_ before slot is set
    if (!inserted) {
      if (slot.how != kPending) return true;         // recorded twice without a free: a corrupt trace
      overflow_.get(a.ptr) = {slot.addr, slot.dev};  // allocated again before its free_completed
      slot = Live{};
    }
    Live l;
    std::uint64_t size = 0;
    l.requested = a.requested, l.dev = di, l.how = a.kind == AllocKind::device_passthrough ? kPassthrough : kServed;
    if (d.torch && !callers_.served(a.stack)) {  // not torch's allocation: straight to the driver
      size = none_size(a.requested);
      if (!d.up.fits(size)) return oom(d, a, index, d.largest_free());
      d.up.charge_other(static_cast<std::int64_t>(size));
      ++d.out.bypass_allocations, d.out.bypass_bytes += size, d.bypass_current += size;
      d.out.bypass_peak = std::max(d.out.bypass_peak, d.bypass_current);
      l.how = kBypass;
      slot = l;
      return true;
    }
    if (d.none) {
      size = none_size(a.requested);
      if (!d.up.fits(size)) return oom(d, a, index, 0);
      d.out.reserved.add(static_cast<std::int64_t>(size));
      d.up.charge_other(static_cast<std::int64_t>(size));  // the driver's bytes count as held
      ++d.none_segments;
    } else if (d.torch) {
      std::uint64_t ptr = 0;
      if (!d.torch->allocate(a.requested, a.stream, &ptr, &size, &l.addr)) return oom(d, a, index, d.largest_free());
      l.seg = d.segs.find(ptr);
      d.segs.add(l.seg, size);
    } else {
      // Single-owner calls: no pool lock, no pool address map (the live map here indexes
      // the block by its trace address and keeps the pool's handle).
      pool::OwnedBlock b;
      if (d.pool->allocate_owned(a.requested, &b, a.stack) != pool::PoolStatus::ok) {
        return oom(d, a, index, d.pool->stats().largest_free);
      }
      l.addr = reinterpret_cast<std::uint64_t>(b.handle), size = b.size;
      l.seg = d.segs.find_base(b.segment);
      d.segs.add(l.seg, b.size);
    }
    d.out.allocated.add(static_cast<std::int64_t>(size));
    d.out.requested.add(static_cast<std::int64_t>(l.requested));
    slot = l;  // (an out-of-memory return above leaves a default entry: the replay stops there)
    std::uint64_t reserved = d.none ? static_cast<std::uint64_t>(d.out.reserved.current) : d.up.reserved();
    if (reserved > d.snap_reserved) {  // a new peak of reserved bytes: what it looked like then
      d.snap_reserved = reserved;
      if (d.none) {
        d.out.segments_at_peak = d.none_segments;
      } else {
        d.out.non_releasable_at_peak = d.segs.non_releasable();
        d.out.largest_free_at_peak = d.largest_free();
        d.out.segments_at_peak = d.segs.count();
      }
    }
    return true;
  }

  void on_free(const format::FreeRecord& f) {
    if (f.flags & format::kFlagFailed) return;  // the call failed: nothing was freed
    if (!pool_kind(f.kind)) {
      ++res_.other_kind_events;
      std::uint64_t k = other_key(f.ptr, f.kind);
      if (std::uint64_t* held = other_.find(k)) {
        std::uint16_t di;
        dev(f.device, &di).up.charge_other(-static_cast<std::int64_t>(*held));
        other_.erase(k);
      }
      return;
    }
    Live* slot = live_.find(key(f.ptr));
    if (!slot || slot->how == kPending) {
      ++res_.unmatched_frees;
      return;
    }
    const Live l = *slot;
    DeviceSim& d = *devs_[l.dev];
    // The entry goes, unless this is a pooled free (below); the slot stays valid until then:
    // nothing inserts into or erases from live_ on the way.
    if (l.how != kServed || !d.pool) drop(f.ptr, slot);
    if (l.how == kBypass) {  // cudaFree of a library's own cudaMalloc: back to the driver
      std::uint64_t size = none_size(l.requested);
      d.up.charge_other(-static_cast<std::int64_t>(size));
      d.bypass_current -= size;
      return;
    }
    d.out.requested.add(-static_cast<std::int64_t>(l.requested));
    if (d.none) {  // cudaFree: back to the driver at once
      std::uint64_t size = none_size(l.requested);
      d.out.allocated.add(-static_cast<std::int64_t>(size));
      d.out.reserved.add(-static_cast<std::int64_t>(size));
      d.up.charge_other(-static_cast<std::int64_t>(size));
      --d.none_segments;
      return;
    }
    if (d.torch) {  // stream-ordered: reusable at once on its stream; free_completed is not waited for
      std::uint64_t size = d.torch->deallocate_handle(l.addr);
      if (size == 0) throw std::logic_error("replay: the torch model does not know a block it handed out");
      d.out.allocated.add(-static_cast<std::int64_t>(size));
      d.segs.remove(l.seg, size);
      return;
    }
    pool::Upstream::Fence before = d.up.last_fence();
    std::size_t size = d.pool->deallocate_owned(reinterpret_cast<void*>(l.addr));
    if (size == 0) throw std::logic_error("replay: the pool does not know a block it handed out");
    d.out.allocated.add(-static_cast<std::int64_t>(size));
    d.segs.remove(l.seg, size);
    pool::Upstream::Fence f_id = d.up.last_fence();
    if (f_id == before) throw std::logic_error("replay: a free recorded no fence");
    // A pass-through cudaFree synchronized the device: reusable at once. A pooled free is
    // reusable when the trace's free_completed for it appears.
    if (l.how == kPassthrough) {
      d.up.complete(f_id);
      return;
    }
    slot->addr = f_id, slot->how = kPending;       // l.dev stays
    if (overflow_.size()) overflow_.erase(f.ptr);  // a newer free's fence replaces the older one's
  }

  // The live entry of a freed block goes; a fence waiting in overflow_ for that address takes
  // its place.
  void drop(std::uint64_t ptr, Live* slot) {
    Pending p;
    if (overflow_.size() && overflow_.take(ptr, &p)) {
      *slot = Live{};
      slot->addr = p.fence, slot->dev = p.dev, slot->how = kPending;
    } else {
      live_.erase_found(key(ptr), slot);
    }
  }

  // The recorded GPU finished with the block freed at ptr: its fence completes.
  void on_free_completed(std::uint64_t ptr) {
    Live* slot = live_.find(key(ptr));
    if (!slot) return;
    if (slot->how == kPending) {
      devs_[slot->dev]->up.complete(slot->addr);
      live_.erase_found(key(ptr), slot);
      return;
    }
    Pending p;
    if (overflow_.size() && overflow_.take(ptr, &p)) devs_[p.dev]->up.complete(p.fence);
  }

  // A recorded allocation no device can have made: the policies' roundings (2 MiB, 512 B,
  // powers of two) would wrap past 2^64 and the signed totals turn negative. Refused (exit
  // 2), as a corrupt record is, rather than replayed into figures that are wrong.
  [[noreturn]] void too_large(std::uint64_t n, std::uint64_t index) const {
    throw InputError(
        fmt::format("{}: record {}: an allocation of {} bytes, more than any device's address space "
                    "(2^63 bytes): the trace is damaged; replay refuses it",
                    res_.trace, index, n));
  }

  // The recorded segments' running total and peak (the "recorded peak reserved" row).
  void note_recorded(const format::EventRecord& e) {
    if (e.type != RecordType::segment_alloc && e.type != RecordType::segment_free) return;
    std::uint16_t i;
    DeviceSim& d = dev(e.segment.device, &i);
    d.recorded_reserved += (e.type == RecordType::segment_alloc ? 1 : -1) * static_cast<std::int64_t>(e.segment.size);
    d.out.recorded_reserved_peak = std::max<std::uint64_t>(d.out.recorded_reserved_peak,
                                                           static_cast<std::uint64_t>(
                                                               std::max<std::int64_t>(d.recorded_reserved, 0)));
  }

  // After the OOM: the recorded segments, the stacks and stored symbols, the end record.
  void read_rest(TraceReader& rd) {
    format::EventRecord ev;
    format::Record r;
    for (;;) {
      auto got = rd.next_any(ev, r);
      if (got == TraceReader::Got::none) return;
      if (got == TraceReader::Got::event) note_recorded(ev);
      else rest_record(r);
    }
  }
  void rest_record(const format::Record& r) {
    switch (r.type) {
      case RecordType::segment_alloc:
      case RecordType::segment_free: {
        format::EventRecord e;
        e.type = r.type, e.segment = r.segment;
        note_recorded(e);
        break;
      }
      case RecordType::stack:
      case RecordType::module:
      case RecordType::py_code:
      case RecordType::symbol_string:
      case RecordType::symbol_frames: model_.feed(r); break;
      default: break;
    }
  }

  // The failing allocation's stack, named from the whole trace: the symbols that `run` or
  // `gpuheap symbolize` stored follow the events (summary names the same frames with them).
  void resolve_oom_stack() {
    ReplayOom& o = res_.oom;
    if (!o.hit || !o.stack) return;
    StackResolver sr(model_, false);
    for (const Frame& f : sr.frames(o.stack)) o.frames.push_back(Symbolizer::format_frame(f));
  }

  bool oom(DeviceSim& d, const format::AllocRecord& a, std::uint64_t index, std::uint64_t largest_free) {
    ReplayOom& o = res_.oom;
    o.hit = true, o.device = a.device, o.event_index = index, o.requested = a.requested;
    o.ts_ns = a.ts >= mono0_ ? a.ts - mono0_ : 0;
    o.reserved = d.none ? static_cast<std::uint64_t>(d.out.reserved.current) : d.up.reserved();
    o.allocated = static_cast<std::uint64_t>(d.out.allocated.current);
    o.largest_free = largest_free;
    o.stack = a.stack;  // named at the end (resolve_oom_stack)
    return false;
  }

  const ReplayOptions& opt_;
  ReplayResult res_;
  Model model_;                 // stacks, modules and Python code only: what StackResolver needs
  std::vector<int> dev_index_;  // by u16(device)
  std::vector<std::unique_ptr<DeviceSim>> devs_;
  TorchCallers callers_{model_};  // policy torch: which allocations torch's allocator makes
  base::FlatMap<Live> live_;      // trace address -> replayed block
  // Trace address -> fence of a pooled free whose address was allocated again before its
  // free_completed (the live entry is the new block's); empty in a well-formed trace.
  base::FlatMap<Pending> overflow_;
  base::FlatMap<std::uint64_t> other_;  // other device kinds: bytes held
  std::uint64_t mono0_ = 0;
  int last_device_ = 0;  // dev()'s last answer
  std::uint16_t last_idx_ = 0;
  DeviceSim* last_dev_ = nullptr;
};

}  // namespace

ReplayResult replay_trace(const std::string& path, const ReplayOptions& opt) { return Replayer(path, opt).run(); }

}  // namespace gpuheap
