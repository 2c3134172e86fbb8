"""Allocates device memory through ctypes from nested functions, for the Python-stack tests
(tests/preload/test_pystacks.cpp). Run under LD_PRELOAD=libgpuheap.so on the simulated runtime.

  nested_alloc.py MODE
    nested     inner() <- middle() <- outer(): 3 MiB leaked from inner, 1 MiB freed
    thread     a threading.Thread allocates (ctypes releases the GIL around the call)
    native     a thread the Python runtime never saw allocates (pthread from the C library)
    recursion  a recursion 500 deep allocates at the bottom
    churn [N]  N allocations (400) from a few call paths and depths, each freed (the stack cache's
               test; scripts/bench-stacks.sh counts the instructions they take)
Prints one line per allocation: "LINE <function> <line>" (the line of its cudaMalloc call).
"""
import ctypes
import sys
import threading

rt = ctypes.CDLL("libcudart.so.13")
MiB = 1 << 20


def malloc(n, where):
    p = ctypes.c_void_p()
    line = sys._getframe(1).f_lineno
    here = sys._getframe(0).f_lineno + 1
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))  # the line every test names
    assert rc == 0, rc
    print(f"LINE {where} {line} {here}", flush=True)
    return p


def inner():
    keep = malloc(3 * MiB, "inner")
    tmp = malloc(1 * MiB, "inner_tmp")
    rt.cudaFree(tmp)
    return keep


def middle():
    return inner()


def outer():
    return middle()


def in_thread(out):
    out.append(malloc(5 * MiB, "in_thread"))


def recurse(n):
    if n == 0:
        return malloc(7 * MiB, "recurse")
    return recurse(n - 1)


def churn_at(n, k):
    if n > 0:
        return churn_at(n - 1, k)
    p = ctypes.c_void_p()
    if k % 2:  # two call sites at one depth
        rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(256 * (k + 1)))
    else:
        rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(512 * (k + 1)))
    assert rc == 0, rc
    rt.cudaFree(p)


def churn(n):
    for i in range(n):
        churn_at(i % 5, i % 7)


def main():
    mode = sys.argv[1]
    if mode == "nested":
        outer()
    elif mode == "thread":
        out = []
        t = threading.Thread(target=in_thread, args=(out,), name="py-worker")
        t.start()
        t.join()
    elif mode == "native":
        lib = ctypes.CDLL(sys.argv[2])
        assert lib.py_native_thread_alloc(ctypes.c_size_t(9 * MiB)) == 0
    elif mode == "churn":
        churn(int(sys.argv[2]) if len(sys.argv) > 2 else 400)
    elif mode == "recursion":
        sys.setrecursionlimit(5000)
        recurse(500)
    else:
        raise SystemExit(f"unknown mode {mode}")
    rt.cudaDeviceSynchronize()


if __name__ == "__main__":
    main()
