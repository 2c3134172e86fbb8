# The C API through ctypes, as a Python program (or the pytest plugin) uses it: found in the
# process's own symbol table (ctypes.CDLL(None)) when libgpuheap.so is preloaded; prints
# "OK" and the counters it read, exits 1 on a wrong value.
import ctypes
import sys


class Stats(ctypes.Structure):  # gpuheap_stats_t (preload/gpuheap.h)
    _fields_ = [("size", ctypes.c_size_t), ("device", ctypes.c_int)] + [
        (n, ctypes.c_uint64)
        for n in ("requested_bytes", "requested_peak_bytes", "allocated_bytes", "allocated_peak_bytes",
                  "reserved_bytes", "reserved_peak_bytes", "alloc_count", "free_count")
    ]


me = ctypes.CDLL(None)
if not hasattr(me, "gpuheap_push"):
    print("ABSENT")
    sys.exit(0)
me.gpuheap_version.restype = ctypes.c_char_p
cudart = ctypes.CDLL("libcudart.so.13")
me.gpuheap_mark(b"py-start")
me.gpuheap_push(b"py-load")
p = ctypes.c_void_p()
if cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(3 << 20)) != 0:
    sys.exit("cudaMalloc failed")
me.gpuheap_pop()
s = Stats()
s.size = ctypes.sizeof(s)
rc = me.gpuheap_stats(0, ctypes.byref(s))
cudart.cudaFree(p)
after = Stats()
after.size = ctypes.sizeof(after)
me.gpuheap_stats(0, ctypes.byref(after))
print("version", me.gpuheap_api_version(), me.gpuheap_version().decode(), "active", me.gpuheap_active())
print("stats", rc, s.requested_bytes, s.allocated_bytes, after.allocated_bytes, after.allocated_peak_bytes)
ok = rc == 0 and s.requested_bytes == 3 << 20 and after.allocated_bytes == 0 and after.allocated_peak_bytes >= 3 << 20
print("OK" if ok else "WRONG")
sys.exit(0 if ok else 1)
