#!/usr/bin/env bash
# Checks the ELF interface of the simulated libraries against the real CUDA 13 ones:
#  - libcudart.so.13: SONAME, every exported symbol versioned libcudart.so.13 (like the real one),
#    every name also exported by the toolkit's libcudart, RUNPATH $ORIGIN, no DT_NEEDED libcuda;
#  - libcuda.so.1: SONAME, no symbol versions at all (like the real driver), every cu* name also
#    exported by the toolkit's stub libcuda.so, the required versioned names present.
# Usage: check_symbols.sh <build/simcuda> <cuda root>
set -u
dir=$1
cuda=$2
rt=$dir/libcudart.so.13
drv=$dir/libcuda.so.1
fail=0
err() { echo "FAIL: $*"; fail=1; }

[[ -f $rt && -f $drv ]] || { echo "FAIL: missing $rt or $drv"; exit 1; }

# ---- runtime ----
readelf -dW "$rt" | grep -q 'SONAME.*\[libcudart.so.13\]' || err "libcudart SONAME"
readelf -dW "$rt" | grep 'RUNPATH' | grep -qF "[\$ORIGIN]" || err "libcudart RUNPATH \$ORIGIN"
readelf -dW "$rt" | grep -q 'NEEDED.*libcuda\.so' && err "libcudart must dlopen libcuda, not link it"
# Defined dynamic symbols: "name@@version" in readelf --dyn-syms (skip the version-node symbol).
mapfile -t rt_syms < <(readelf --dyn-syms -W "$rt" | awk '$7 != "UND" && $4 == "FUNC" {print $8}')
(( ${#rt_syms[@]} >= 60 )) || err "libcudart exports only ${#rt_syms[@]} functions"
real_rt=$(readelf --dyn-syms -W "$cuda/lib64/libcudart.so.13" | awk '$7 != "UND" {print $8}')
for s in "${rt_syms[@]}"; do
  [[ $s == *@@libcudart.so.13 ]] || err "runtime symbol without version libcudart.so.13: $s"
  grep -qxF "$s" <<<"$real_rt" || err "runtime exports $s which the real libcudart.so.13 does not"
done
for s in cudaMalloc cudaFree cudaMemGetInfo cudaMallocAsync cudaFreeAsync cudaMallocFromPoolAsync \
         cudaMallocAsync_ptsz cudaGetDriverEntryPoint cudaGetDriverEntryPointByVersion \
         cudaGetDeviceProperties cudaStreamSynchronize cudaEventQuery cudaLaunchHostFunc; do
  printf '%s\n' "${rt_syms[@]}" | grep -qxF "$s@@libcudart.so.13" || err "runtime lacks $s@@libcudart.so.13"
done

# ---- driver ----
readelf -dW "$drv" | grep -q 'SONAME.*\[libcuda.so.1\]' || err "libcuda SONAME"
readelf -VW "$drv" | grep -q 'Version definition' && err "libcuda must not define symbol versions"
mapfile -t drv_syms < <(readelf --dyn-syms -W "$drv" | awk '$7 != "UND" && $4 == "FUNC" {print $8}')
stub=$(readelf --dyn-syms -W "$cuda/lib64/stubs/libcuda.so" | awk '$7 != "UND" {print $8}')
for s in "${drv_syms[@]}"; do
  [[ $s == *@* ]] && err "driver symbol carries a version: $s"
  [[ $s == simcuda_* ]] && continue
  grep -qxF "$s" <<<"$stub" || err "driver exports $s which the real libcuda.so.1 does not"
done
for s in cuInit cuGetProcAddress cuGetProcAddress_v2 cuMemAlloc cuMemAlloc_v2 cuMemFree_v2 cuMemGetInfo_v2 \
         cuMemAllocAsync cuMemAllocAsync_ptsz cuMemFreeAsync_ptsz cuMemAllocFromPoolAsync_ptsz \
         cuMemAllocPitch_v2 cuStreamDestroy_v2 cuEventDestroy_v2 cuCtxPushCurrent_v2 cuCtxPopCurrent_v2 \
         cuCtxCreate cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4 cuCtxDestroy cuCtxDestroy_v2 cuDevicePrimaryCtxGetState \
         cuDeviceTotalMem_v2 cuMemGetAddressRange_v2 cuMemsetD8_v2 cuMemcpyHtoD_v2 cuMemcpyDtoH_v2 \
         cuDevicePrimaryCtxRelease_v2 cuEventRecord_ptsz cuStreamSynchronize_ptsz cuLaunchHostFunc_ptsz \
         cuMemCreate cuMemMap cuMemUnmap cuMemSetAccess cuPointerGetAttribute simcuda_used_bytes; do
  printf '%s\n' "${drv_syms[@]}" | grep -qxF "$s" || err "driver lacks $s"
done

echo "libcudart.so.13: ${#rt_syms[@]} functions, libcuda.so.1: ${#drv_syms[@]} functions"
exit $fail
