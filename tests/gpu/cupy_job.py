"""CuPy work whose device allocations are counted in the script, printing one JSON line.

  python cupy_job.py pool|none

pool: CuPy's MemoryPool (the class of its default pool) over a counting upstream allocator, so the
number of upstream allocations the pool made is known exactly; none: cupy.cuda.set_allocator(None)
semantics (every array allocates) through a counting allocator that allocates exactly as CuPy's
`_malloc` does (cupy.cuda.Memory). CuPy links cudart statically: what gpuheap sees comes through its
driver hooks (dlsym / cuGetProcAddress).
"""
import json
import sys

import cupy as cp

mode = sys.argv[1] if len(sys.argv) > 1 else "none"
count = {"alloc": 0, "bytes": 0, "sizes": []}


def counting_malloc(size):
    if size > 0:
        count["alloc"] += 1
        count["bytes"] += size
        count["sizes"].append(size)
    mem = cp.cuda.memory.Memory(size)
    return cp.cuda.memory.MemoryPointer(mem, 0)


if mode == "pool":
    pool = cp.cuda.MemoryPool(counting_malloc)
    cp.cuda.set_allocator(pool.malloc)
else:
    pool = None
    cp.cuda.set_allocator(counting_malloc)

rs = cp.random.RandomState(7)
acc = cp.zeros((256, 256), dtype=cp.float32)
for i in range(40):
    a = rs.standard_normal((256 + i, 256), dtype=cp.float32)
    b = rs.standard_normal((256, 256), dtype=cp.float32)
    c = a[:256] @ b
    acc += cp.tanh(c) * 0.01
    del a, b, c
total = float(acc.sum())
cp.cuda.Device().synchronize()
res = {"mode": mode, "script_allocs": count["alloc"], "script_bytes": count["bytes"], "sizes": count["sizes"], "checksum": total,
       "pool_total_bytes": pool.total_bytes() if pool else None, "cupy": cp.__version__}
del acc
if pool:
    pool.free_all_blocks()
print(json.dumps(res), flush=True)
