"""gpuheap from Python: phase markers, live counters and where the installed files are.

    import gpuheap
    gpuheap.mark("warmup")                 # a point in time, a phase in the trace
    with gpuheap.phase("epoch 3"):         # a range: allocations inside are attributed to it
        train_one_epoch()

Every call goes to the C API (preload/gpuheap.h) of the libgpuheap.so that `gpuheap run`
preloaded into this process, found with ctypes.CDLL(None): this module never loads the library
itself. Without the preload each call does nothing (active() is False, stats() is None), so
the markers can stay in code that also runs untraced. Ranges nest per thread, as the C API's
gpuheap_push/gpuheap_pop do.
"""

import contextlib
import ctypes
import os

try:  # written by the wheel build (setup.py); absent in a source checkout
    from ._build import __version__, commit as _commit
except ImportError:
    __version__, _commit = "0+unknown", "unknown"

__all__ = ["mark", "push", "pop", "phase", "active", "stats", "reset_peak", "flush", "trace_path",
           "cli_path", "preload_path", "__version__"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_MAX_DEVICES = 64  # gpuheap_stats accepts ordinals 0..63


class _Stats(ctypes.Structure):
    # gpuheap_stats_t (preload/gpuheap.h); `size` tells the library how much of it we know.
    _fields_ = [("size", ctypes.c_size_t), ("device", ctypes.c_int)] + [
        (name, ctypes.c_uint64) for name in (
            "requested_bytes", "requested_peak_bytes", "allocated_bytes", "allocated_peak_bytes",
            "reserved_bytes", "reserved_peak_bytes", "alloc_count", "free_count")]


_SIGNATURES = {
    "gpuheap_active": ([], ctypes.c_int),
    "gpuheap_mark": ([ctypes.c_char_p], None),
    "gpuheap_push": ([ctypes.c_char_p], None),
    "gpuheap_pop": ([], None),
    "gpuheap_flush": ([], None),
    "gpuheap_trace_path": ([], ctypes.c_char_p),
    "gpuheap_stats": ([ctypes.c_int, ctypes.POINTER(_Stats)], ctypes.c_int),
    "gpuheap_reset_peak": ([ctypes.c_int], None),
}
_lib = None
_looked_up = False


def _api():
    """The preloaded library's functions, or None. Looked up once: a preload is there from
    the process's start or never."""
    global _lib, _looked_up
    if not _looked_up:
        try:
            lib = ctypes.CDLL(None)
            for name, (args, res) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _lib = lib
        except (OSError, AttributeError):
            _lib = None
        _looked_up = True
    return _lib


def _name(name):
    if name is None:
        return None
    return name.encode("utf-8", "replace") if isinstance(name, str) else bytes(name)


def active():
    """True while gpuheap traces this process."""
    lib = _api()
    return bool(lib and lib.gpuheap_active())


def mark(name):
    """Records a point in time named `name` (a phase in `gpuheap summary`)."""
    lib = _api()
    if lib is not None:
        lib.gpuheap_mark(_name(name))


def push(name):
    """Opens a range named `name` on the calling thread (close it with pop())."""
    lib = _api()
    if lib is not None:
        lib.gpuheap_push(_name(name))


def pop():
    """Closes the calling thread's innermost open range."""
    lib = _api()
    if lib is not None:
        lib.gpuheap_pop()


class phase(contextlib.ContextDecorator):
    """`with gpuheap.phase("forward"):` (or `@gpuheap.phase("forward")`): push on entry, pop on
    exit, also when the block raises."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        push(self.name)
        return self

    def __exit__(self, *exc):
        pop()
        return False


def flush():
    """Returns once everything recorded so far is in the trace file."""
    lib = _api()
    if lib is not None:
        lib.gpuheap_flush()


def trace_path():
    """The current trace file, "" before the first event, None when not traced."""
    lib = _api()
    if lib is None:
        return None
    p = lib.gpuheap_trace_path()
    return p.decode(errors="replace") if p else ""


def stats(device=0):
    """Device `device`'s counters as a dict (requested/allocated/reserved bytes, their peaks,
    alloc_count, free_count), or None when not traced."""
    lib = _api()
    if lib is None:
        return None
    s = _Stats()
    s.size = ctypes.sizeof(_Stats)
    if lib.gpuheap_stats(int(device), ctypes.byref(s)) != 0:
        raise ValueError(f"gpuheap.stats: device {device} is outside 0..{_MAX_DEVICES - 1}")
    return {name: getattr(s, name) for name, _ in _Stats._fields_ if name != "size"}


def reset_peak(device=-1):
    """Restarts the peaks of `device` (-1: every device) from the current values."""
    lib = _api()
    if lib is not None:
        lib.gpuheap_reset_peak(int(device))


def cli_path():
    """The gpuheap CLI binary of this installation (the `gpuheap` command runs it)."""
    return os.path.join(_HERE, "bin", "gpuheap")


def preload_path():
    """libgpuheap.so of this installation (e.g. for LD_PRELOAD without `gpuheap run`)."""
    return os.path.join(_HERE, "lib", "gpuheap", "libgpuheap.so")


def build_commit():
    """The commit the wheel was built from ("unknown" in a source checkout)."""
    return _commit
