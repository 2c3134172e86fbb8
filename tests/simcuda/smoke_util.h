// Helpers shared by the simcuda smoke tests. The tests are built like user programs: against
// the toolkit's libcudart, run with LD_LIBRARY_PATH=build/simcuda, and reach the driver API
// through cudaGetDriverEntryPoint* / cuGetProcAddress like CUDA applications do.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "simcuda.h"

namespace simcuda_test {

inline void* sym(const char* name) { return dlsym(RTLD_DEFAULT, name); }

// cuGetProcAddress_v2 of the loaded driver, obtained through the runtime.
inline decltype(&cuGetProcAddress) proc_address() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st{};
  if (cudaGetDriverEntryPointByVersion("cuGetProcAddress", &fn, 12000, cudaEnableDefault, &st) != cudaSuccess)
    return nullptr;
  return reinterpret_cast<decltype(&cuGetProcAddress)>(fn);
}

// Driver function `base` for CUDA 13.0, default (legacy stream) flavour.
template <typename F>
F driver_fn(const char* base, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT, int version = 13000) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  auto gpa = proc_address();
  if (gpa == nullptr || gpa(base, &fn, version, flags, &st) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<F>(fn);
}

}  // namespace simcuda_test
