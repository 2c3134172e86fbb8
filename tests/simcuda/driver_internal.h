// Internal state of the simulated CUDA driver (libcuda.so.1). Not installed, not used by tests.
//
// Everything here is host memory: "device memory" is anonymous mmap, streams are worker threads,
// events are generation counters. All state lives in this library; libcudart.so.13 is a thin
// layer that reaches it only through cuGetProcAddress_v2 like the real runtime does.
#pragma once

// Declares the legacy (pre-_v2) entry points too, so we can export them like the real driver.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#define SIM_API extern "C" __attribute__((visibility("default")))

// Exported by the real driver but not declared by cuda.h (its per-thread names come from macros).
extern "C" {
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode);
}

namespace simcuda::drv {

constexpr int kDriverVersion = 13000;
// The version the driver reports: kDriverVersion, or SIMCUDA_DRIVER_VERSION (1000..13000),
// for a driver older than the runtime.
int driver_version();
constexpr size_t kAllocAlign = 512;                  // accounting granularity of every allocation
constexpr size_t kVmmGranularity = size_t{2} << 20;  // cuMemGetAllocationGranularity

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// ---- call counters (simcuda_call_count) -------------------------------------------------------
std::atomic<uint64_t>* counter_slot(const char* name);
#define SIM_COUNT(name) \
  do { \
    static std::atomic<uint64_t>* sim_counter_ = ::simcuda::drv::counter_slot(name); \
    sim_counter_->fetch_add(1, std::memory_order_relaxed); \
  } while (0)

// ---- allocations ------------------------------------------------------------------------------
enum class Kind : uint8_t { device, pitch, managed, async, host, vmm_map };

struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;       // bytes requested (what cuMemGetAddressRange reports)
  size_t accounted = 0;  // bytes charged to the device (size rounded up to kAllocAlign); 0 for host
  size_t map_len = 0;    // bytes mmapped
  int device = 0;
  Kind kind = Kind::device;
  uint64_t id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID
  CUmemoryPool pool = nullptr;
  uint64_t vmm_handle = 0;  // Kind::vmm_map: the physical handle mapped here
  // The context whose destruction frees it (cuCtxDestroy, cuDevicePrimaryCtxReset); nullptr
  // for kinds no context owns (stream-ordered, VMM: "cuCtxDestroy() will not destroy memory
  // allocations by cuMemCreate(), cuMemAllocAsync() and cuMemAllocFromPoolAsync()").
  CUctx_st* ctx = nullptr;
  bool graph = false;  // a graph allocation: cuMemAllocAsync into a capturing stream
};

}  // namespace simcuda::drv

// Opaque handle types of cuda.h are defined here (the runtime shares them: cudaStream_t is
// CUstream_st*, cudaEvent_t is CUevent_st*, cudaMemPool_t is CUmemPoolHandle_st*).
// Primary contexts live in their Device; created ones (cuCtxCreate) are never freed but
// recycled by a later cuCtxCreate, so a stale handle never points to freed memory.
struct CUctx_st {
  int device = 0;
  bool primary = false;
  unsigned flags = 0;
  std::atomic<int> refs{0};
  std::atomic<bool> destroyed{false};  // cuCtxDestroy ran; until the handle is recycled
};

struct CUmemPoolHandle_st {
  int device = 0;
  bool is_default = false;
};

struct CUevent_st {
  int device = 0;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;                 // generation of the latest record (guarded by mu)
  std::atomic<uint64_t> done{0};         // highest generation reached by a stream worker
  std::atomic<int64_t> time_ns{0};       // CLOCK_MONOTONIC when `done` was last advanced
  std::atomic<int> refs{1};              // handle + one per pending record
  std::atomic<uint64_t> captured_in{0};  // the capture its latest record was captured into, 0: none
};

namespace simcuda::drv {
struct Op {
  std::function<void()> fn;
  std::vector<std::pair<CUstream_st*, uint64_t>> deps;  // wait until stream completed >= seq
};
}  // namespace simcuda::drv

struct CUstream_st {
  int device = 0;
  CUctx_st* ctx = nullptr;  // created streams: the context that destroys them
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;
  bool per_thread = false;
  std::mutex mu;
  std::condition_variable cv_work;
  std::condition_variable cv_done;
  std::deque<simcuda::drv::Op> queue;
  uint64_t enqueued = 0;               // guarded by mu
  std::atomic<uint64_t> completed{0};  // written under mu, read lock-free by queries
  bool worker_started = false;
  bool destroyed = false;
};

namespace simcuda::drv {

struct Device {
  int ordinal = 0;
  size_t total = 0;  // guarded by State::mem_mu
  size_t used = 0;   // guarded by State::mem_mu
  size_t live = 0;   // live allocations charged to this device (guarded by mem_mu)
  CUctx_st primary;
  CUstream_st legacy;
  CUmemPoolHandle_st default_pool;
  // Streams that take part in legacy-default-stream ordering; order_mu also makes "capture
  // dependencies + enqueue" atomic so cross-stream dependencies always point to older work.
  std::mutex order_mu;
  std::vector<CUstream_st*> streams;
};

struct State {
  int device_count = 1;
  std::unique_ptr<Device[]> devices;
  std::atomic<bool> initialized{false};

  std::mutex mem_mu;
  std::map<uintptr_t, Allocation> allocs;  // keyed by base; non-overlapping
  uint64_t next_alloc_id = 1;

  std::mutex handle_mu;  // registries of live handles (so garbage handles are rejected)
  std::unordered_set<CUstream_st*> streams;
  std::unordered_set<CUevent_st*> events;
  std::unordered_set<CUmemPoolHandle_st*> pools;
  std::unordered_set<CUctx_st*> contexts;  // created contexts, live or destroyed
  std::vector<CUctx_st*> spare_contexts;   // destroyed ones, handed out again LIFO
};

State& state();  // created on first use, never destroyed (worker threads may outlive main)

// Returns CUDA_ERROR_NOT_INITIALIZED until cuInit succeeded.
CUresult check_init();

// ---- contexts (driver_ctx.cpp) ----------------------------------------------------------------
CUctx_st* current_ctx();
// Current context's device, or CUDA_ERROR_INVALID_CONTEXT (none current) /
// CUDA_ERROR_CONTEXT_IS_DESTROYED (destroyed on another thread), after the init check.
CUresult ctx_device(int* device);
bool valid_device(int device);
Device& device(int ordinal);

// ---- streams (driver_stream.cpp) --------------------------------------------------------------
// Resolves a user stream handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream);
// `ptsz` selects the per-thread default stream for handle 0.
CUresult resolve_stream(CUstream handle, bool ptsz, CUstream_st** out);
// Appends work; `trivial` work (event records, frees) runs inline when the stream is idle.
// Returns the sequence number of the op on `s`.
uint64_t enqueue(CUstream_st* s, std::function<void()> fn, bool trivial);
void wait_stream(CUstream_st* s, uint64_t seq);
void sync_stream(CUstream_st* s);
void sync_device(int device);
void destroy_context_streams(CUctx_st* ctx);  // context reset or destroy

// ---- memory (driver_mem.cpp) ------------------------------------------------------------------
// `ctx`: the owning context (Allocation::ctx), nullptr for kinds no context owns.
CUresult alloc_memory(int device, CUctx_st* ctx, size_t size, Kind kind, CUmemoryPool pool, bool low32, uintptr_t* out);
// Removes the allocation at exactly `base` whose kind is in `kinds`; `out` receives it.
CUresult take_allocation(uintptr_t base, std::initializer_list<Kind> kinds, Allocation* out);
void release_allocation(const Allocation& a);        // munmap + uncharge
bool find_allocation(uintptr_t p, Allocation* out);  // containing range
bool range_is_known(uintptr_t p, size_t n);
// Frees every allocation `ctx` owns; for a primary context also the device's stream-ordered
// ones (cudaDeviceReset drops those too).
void free_context_allocations(CUctx_st* ctx);

// Marks a live allocation as a graph allocation (the only memory cuMemFreeAsync may free
// into a capturing stream).
void mark_graph_allocation(uintptr_t base);

// ---- stream capture (driver_capture.cpp) ----------------------------------------------------
// Each returns CUDA_SUCCESS when the call may go on, else the error the call returns (the
// captures the call conflicts with are invalidated).
CUresult capture_unsafe_call();  // a potentially unsafe call (memory, synchronization)
// Work on s (sync: a synchronize or query of s): *captured when s captures (the work is captured,
// not run); the legacy stream while a blocking stream of its device captures is refused.
CUresult capture_stream_use(CUstream_st* s, bool sync, bool* captured);
CUresult capture_device_sync(int device);  // cuCtxSynchronize
CUresult capture_event_use(CUevent e);     // cuEventQuery / cuEventSynchronize
uint64_t capture_id_of(CUstream_st* s);    // 0 when s does not capture

// ---- vmm (driver_vmm.cpp) ---------------------------------------------------------------------
void vmm_unref_handle(uint64_t handle);

}  // namespace simcuda::drv
