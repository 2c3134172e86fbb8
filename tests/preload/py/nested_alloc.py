"""Allocates device memory through ctypes from nested functions, for the Python-stack tests
(tests/preload/test_pystacks.cpp). Run under LD_PRELOAD=libgpuheap.so on the simulated runtime.

  nested_alloc.py MODE
    nested     inner() <- middle() <- outer(): 3 MiB leaked from inner, 1 MiB freed
    thread     a threading.Thread allocates (ctypes releases the GIL around the call)
    native     a thread the Python runtime never saw allocates (pthread from the C library)
    recursion  a recursion 500 deep allocates at the bottom
    churn [N]  N allocations (400) from a few call paths and depths, each freed (the stack cache's
               test; scripts/bench-stacks.sh counts the instructions they take)
    redefine N N functions compiled, called and dropped in turn, each from its own source at its
               own first line: a freed code object's address is usually taken by a later one
               (printed: "CODE <function> <line of its cudaMalloc> <address>"); each leaks
               (i + 1) * 4 KiB
    fork       allocates from a chain 12 deep, forks; the child allocates from the same chain
    chain N D  N allocations, each freed, D Python frames deep (D >= 6: <module>, main, chain, D - 4
               levels, each its own function as a model's modules are, and a leaf), the innermost
               three levels and the leaf taking one of two lines each in turn: 16 stacks that share
               their outer frames, as a training step's do
Prints one line per allocation: "LINE <function> <line>" (the line of its cudaMalloc call).
"""
import ctypes
import os
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


CHAIN_LEVEL = """
def level_{j}(i):
    if (i >> {b}) & 1:
        return level_{k}(i)
    return level_{k}(i)
"""
CHAIN_LEAF = """
def level_{j}(i):
    p = ctypes.c_void_p()
    if i & 1:
        rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(256))
    else:
        rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(512))
    assert rc == 0, rc
    rt.cudaFree(p)
"""


def chain(n, depth):
    levels = depth - 3  # below <module>, main() and chain()
    assert levels >= 3, depth
    src = "".join(CHAIN_LEVEL.format(j=j, k=j + 1, b=min(levels - 2 - j, 3)) for j in range(levels - 1))
    scope = {"ctypes": ctypes, "rt": rt}
    exec(compile(src + CHAIN_LEAF.format(j=levels - 1), "<chain>", "exec"), scope)
    top = scope["level_0"]
    for i in range(n):
        top(i)


def redefine(n):
    for i in range(n):
        name = f"f_{i:03d}"
        src = "\n" * i + f"def {name}(p):\n    return rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t({(i + 1) * 4096}))\n"
        scope = {"rt": rt, "ctypes": ctypes}
        exec(compile(src, "<redefine>", "exec"), scope)
        f = scope.pop(name)
        print(f"CODE {name} {i + 2} {id(f.__code__)}", flush=True)
        p = ctypes.c_void_p()
        assert f(p) == 0  # leaked: each function is its own leak site
        del f, scope


def fork_chain():
    chain(40, 12)
    pid = os.fork()
    if pid == 0:
        chain(40, 12)
        rt.cudaDeviceSynchronize()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status


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
    elif mode == "redefine":
        redefine(int(sys.argv[2]))
    elif mode == "fork":
        fork_chain()
    elif mode == "chain":
        chain(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "recursion":
        sys.setrecursionlimit(5000)
        recurse(500)
    else:
        raise SystemExit(f"unknown mode {mode}")
    rt.cudaDeviceSynchronize()


if __name__ == "__main__":
    main()
