// Test-control API of the simulated CUDA driver (build/simcuda/libcuda.so.1).
//
// Test programs either link the `simcuda_driver` CMake target (libcuda.so.1) or look these up
// with dlsym(RTLD_DEFAULT, "simcuda_...") once libcudart has loaded the driver.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// 1 when the loaded libcuda.so.1 is the simulator (lets tests assert they are not on a real GPU).
int simcuda_is_simulator(void);
// Number of simulated devices (SIMCUDA_DEVICE_COUNT).
int simcuda_device_count(void);
// Memory size of `device` (SIMCUDA_TOTAL_MEMORY unless changed below); 0 for a bad ordinal.
size_t simcuda_total_bytes(int device);
// Changes the memory size of `device` at run time (e.g. to provoke OOM); -1 for a bad ordinal.
int simcuda_set_total_bytes(int device, size_t bytes);
// Bytes charged to `device`: every allocation consuming device memory (cuMemAlloc*, async,
// managed, pitch, VMM physical handles), each rounded up to 512 bytes. Pending cuMemFreeAsync
// frees stay charged until their stream reaches them.
size_t simcuda_used_bytes(int device);
// Number of live allocations charged to `device` (same set as simcuda_used_bytes).
size_t simcuda_live_allocations(int device);
// How often the driver entry point with this exact (versioned) name was called, e.g.
// "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync_ptsz", "cuGetProcAddress_v2".
unsigned long long simcuda_call_count(const char* name);
void simcuda_reset_call_counts(void);
// Captures invalidated by a refused call (driver_capture.cpp): a potentially unsafe call on a
// prohibited thread, legacy-stream use beside a blocking capture, a captured-event query.
unsigned long long simcuda_capture_violations(void);

#ifdef __cplusplus
}
#endif
