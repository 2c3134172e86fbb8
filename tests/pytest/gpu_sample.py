"""Tests run by tests/pytest/run_plugin_test.py under pytest-gpuheap on the simulated CUDA
runtime (not collected by itself: the driver names this file). cudaMalloc/cudaFree through
ctypes on $GPUHEAP_TEST_CUDART (build/simcuda/libcudart.so.13)."""
import ctypes
import os

import pytest

_rt = ctypes.CDLL(os.environ["GPUHEAP_TEST_CUDART"])
_rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_rt.cudaFree.argtypes = [ctypes.c_void_p]
MiB = 1 << 20


def cuda_malloc(n):
    p = ctypes.c_void_p()
    assert _rt.cudaMalloc(ctypes.byref(p), n) == 0
    return p


def cuda_free(p):
    assert _rt.cudaFree(p) == 0


def allocate_big_buffer():
    return cuda_malloc(24 * MiB)


def leak_some_memory():
    return cuda_malloc(6 * MiB)


_kept = []


@pytest.mark.limit_gpu_memory("16 MiB")
def test_small_peak_passes():
    p = cuda_malloc(8 * MiB)
    cuda_free(p)


@pytest.mark.limit_gpu_memory("16 MiB")
def test_big_peak_fails():
    small = cuda_malloc(1 * MiB)
    p = allocate_big_buffer()
    cuda_free(p)
    cuda_free(small)


@pytest.mark.limit_gpu_leaks("1 MiB")
def test_leak_fails():
    _kept.append(leak_some_memory())


@pytest.mark.limit_gpu_leaks("1MiB")
def test_small_leak_passes():
    _kept.append(cuda_malloc(512 * 1024))


@pytest.mark.limit_gpu_memory("1e7B")
def test_peak_counts_only_this_test():
    # 6.5 MiB left by the tests above are not this test's: 8 MiB < 1e7 bytes passes.
    p = cuda_malloc(8 * MiB)
    cuda_free(p)


def test_unmarked_passes():
    cuda_free(cuda_malloc(64 * MiB))


def test_gpuheap_is_loaded():
    assert hasattr(ctypes.CDLL(None), "gpuheap_stats")


@pytest.mark.limit_gpu_leaks(0)
def test_odd_leak_fails():
    # 1000001 bytes requested, more allocated (pool blocks): the message and the site line
    # both say the requested figure the limit counts.
    _kept.append(cuda_malloc(1000001))
