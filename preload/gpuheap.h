/* gpuheap.h: the C API of libgpuheap.so (installed as include/gpuheap.h).
 *
 * Every function is exported by libgpuheap.so, the library gpuheap preloads into a CUDA
 * job (`gpuheap run -- CMD`, or LD_PRELOAD=.../libgpuheap.so). Plain C, stable ABI: new
 * fields are only ever appended to gpuheap_stats_t, whose `size` says how much of it the
 * caller has. No function throws, aborts or blocks on I/O; all are thread-safe and may be
 * called before CUDA is initialised.
 *
 * A program that must also run without gpuheap should look the functions up at run time
 * (dlsym(RTLD_DEFAULT, "gpuheap_push"), or ctypes.CDLL(None).gpuheap_push from Python)
 * instead of linking libgpuheap.so: without the preload they are simply absent. */
#ifndef GPUHEAP_H_
#define GPUHEAP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the API described here: 2 (1: phases and stats; 2: gpuheap_stack_stats). */
#define GPUHEAP_API_VERSION 2

/* GPUHEAP_API_VERSION of the loaded library (a newer library keeps every older call). */
int gpuheap_api_version(void);

/* Version of gpuheap itself, e.g. "0.1.0" (static string). */
const char* gpuheap_version(void);

/* 1 while gpuheap is tracing this process (the trace file may not exist before the first
 * event), 0 when tracing is off (stopped, setuid, or the file could not be created). */
int gpuheap_active(void);

/* Path of the current trace file, "" before the process's first event. */
const char* gpuheap_trace_path(void);

/* Returns once everything recorded so far is in the trace file (e.g. before another
 * process reads it). */
void gpuheap_flush(void);

/* Returns the pool's unused cached segments to the driver; answers the bytes released. */
size_t gpuheap_empty_cache(void);

/* ---- phases (trace record `phase`, docs/trace-format.md) ----
 * Names are copied (the caller's buffer may be reused at once) and cut to 256 bytes; NULL
 * is an empty name. Ranges nest per thread: gpuheap_pop closes the calling thread's
 * innermost open range (an NVTX range included: both share one stack per thread). The
 * analyzer attributes allocations to the ranges open on their thread
 * (`gpuheap summary --phase NAME`). */

/* A point in time named `name` (e.g. "epoch 3"). */
void gpuheap_mark(const char* name);
/* Opens a range named `name` on the calling thread. */
void gpuheap_push(const char* name);
/* Closes the calling thread's innermost open range (no-op in the analysis if none is open). */
void gpuheap_pop(void);

/* ---- live counters ----
 * Device memory of the process as gpuheap sees it, per CUDA device ordinal:
 *  requested: bytes the program asked for, live now;
 *  allocated: bytes handed out for those (pool blocks are rounded up), live now;
 *  reserved:  bytes held from the driver (pool segments + pass-through allocations).
 * Peaks are the highest values since the start or the last gpuheap_reset_peak. Counted
 * kinds: cudaMalloc/cuMemAlloc (pooled or not), pitch, async, managed, VMM physical memory;
 * pinned host memory is not device memory and not counted. */
typedef struct gpuheap_stats_t {
  size_t size; /* in: sizeof(gpuheap_stats_t) as the caller knows it */
  int device;  /* out: the device these counters are for */
  uint64_t requested_bytes, requested_peak_bytes;
  uint64_t allocated_bytes, allocated_peak_bytes;
  uint64_t reserved_bytes, reserved_peak_bytes;
  uint64_t alloc_count, free_count; /* successful allocations / frees since the start */
} gpuheap_stats_t;

/* Fills at most out->size bytes of *out with device `device`'s counters. Returns 0, or -1
 * when out is NULL, out->size is smaller than the first two fields or the device ordinal is
 * outside 0..63. A device the process never used reads as all zeros. */
int gpuheap_stats(int device, gpuheap_stats_t* out);

/* Restarts the peaks of `device` (-1: every device) from the current values, e.g. at the
 * start of a test whose own peak is wanted. */
void gpuheap_reset_peak(int device);

/* What recording call stacks did in this process, summed over its threads since the start
 * (a forked child's include its parent's before the fork): what a stack costs depends on how
 * many the stack cache served and how many were walked. Appended-to like gpuheap_stats_t. */
typedef struct gpuheap_stack_stats_t {
  size_t size;            /* in: sizeof(gpuheap_stack_stats_t) as the caller knows it */
  uint64_t captures;      /* stacks taken */
  uint64_t cache_hits;    /* served by the stack cache (GPUHEAP_STACK_CACHE) without a walk */
  uint64_t walks;         /* libunwind walks, repeated ones included */
  uint64_t rewalks;       /* walks repeated in full (the interpreter was deeper than last time) */
  uint64_t fills;         /* stack cache entries made */
  uint64_t fill_waits;    /* walked stacks not cached now: a key's first miss, or rationed */
  uint64_t native_frames; /* frames the walks returned */
  uint64_t python_frames; /* Python frames read */
  uint64_t cache_stale;   /* misses where a cached stack of that start failed on a saved
                           * frame pointer rather than on a caller (rbp holding data) */
  /* walked stacks the cache cannot hold, by why: more frames or words than an entry holds; a
   * word off the thread's stack; a register saved in another register (or rbp near the stack
   * at the start); the cache's stepping walk disagreeing with the first walk */
  uint64_t fill_failed_size, fill_failed_off_stack, fill_failed_register, fill_failed_walk;
} gpuheap_stack_stats_t;

/* Fills at most out->size bytes of *out. Returns 0, or -1 when out is NULL or out->size is
 * smaller than the first two fields. All zeros with stacks off (GPUHEAP_STACKS=0). */
int gpuheap_stack_stats(gpuheap_stack_stats_t* out);

#ifdef __cplusplus
}
#endif

#endif /* GPUHEAP_H_ */
