# One allocation through the simulated runtime, then os._exit(5): no exit handler runs
# (what multiprocessing's forked workers do). The trace must still end with `end`.
import ctypes
import os

cudart = ctypes.CDLL("libcudart.so.13")
p = ctypes.c_void_p()
if cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) != 0:
    os._exit(1)
os._exit(5)
