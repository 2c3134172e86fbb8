// NVTX ranges as phases (nvtx.cpp): the body of InitializeInjectionNvtx2 (interpose.cpp).
#pragma once

#include <cstdint>

namespace gpuheap {
namespace preload {

// Fills NVTX's CORE/CORE2 function-table slots of the calls gpuheap records, through the
// export-table getter NVTX hands its injection. 1: attached; 0: not (tracing off, or an
// NVTX whose tables we do not understand), and NVTX then keeps its no-ops.
int nvtx_attach(const void* (*get_export_table)(std::uint32_t)) noexcept;

}  // namespace preload
}  // namespace gpuheap
