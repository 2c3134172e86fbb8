"""pytest-gpuheap: GPU memory limits for tests, measured by gpuheap (docs/pytest.md).

    @pytest.mark.limit_gpu_memory("2 GiB")   # the test's peak GPU memory (requested bytes)
    @pytest.mark.limit_gpu_leaks("1 MiB")    # what the test leaves allocated at its end

Numbers come from libgpuheap.so's C API (preload/gpuheap.h) through ctypes.CDLL(None), so
the plugin works whenever the preload is in the process: under `gpuheap run -- pytest ...`,
or with `pytest --gpuheap`, which re-executes pytest under `gpuheap run` before anything
(conftest files, CUDA) is loaded. Each test runs inside a gpuheap range named by its node id,
so `gpuheap summary --phase NODEID TRACE` shows its allocation sites; a failure message lists
the top ones. Only the standard library is used.
"""

import ctypes
import gc
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

try:  # the crash entry of a report (pytest's short summary line); absent: no summary reason
    from _pytest._code.code import ReprFileLocation
except ImportError:
    ReprFileLocation = None

_REEXEC_ENV = "GPUHEAP_PYTEST_REEXEC"
_MAX_DEVICES = 64  # gpuheap_stats accepts ordinals 0..63


class _Stats(ctypes.Structure):
    # gpuheap_stats_t (preload/gpuheap.h); `size` tells the library how much of it we know.
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("device", ctypes.c_int),
        ("requested_bytes", ctypes.c_uint64),
        ("requested_peak_bytes", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("allocated_peak_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("reserved_peak_bytes", ctypes.c_uint64),
        ("alloc_count", ctypes.c_uint64),
        ("free_count", ctypes.c_uint64),
    ]


# ---- sizes ---------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kmgtp]?)(i?b?)\s*$", re.I)


def parse_size(text):
    """Bytes in "2 GiB", "512MiB", "1.5G", "2GB", "1e9", 123 (as the gpuheap CLI reads sizes:
    KiB/K/Ki binary, KB decimal, B optional)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"invalid size {text!r}")
        return text
    if isinstance(text, float):
        text = repr(text)
    m = _SIZE_RE.match(str(text))
    if not m or (m.group(3).lower() in ("i", "ib") and not m.group(2)):
        raise ValueError(f"invalid size {text!r} (examples: 123, 512MiB, 2 GiB, 2GB, 1e9)")
    number, letter, rest = float(m.group(1)), m.group(2).lower(), m.group(3).lower()
    if not letter:
        mult = 1
    else:
        base = 1000 if rest == "b" else 1024
        mult = base ** ("kmgtp".index(letter) + 1)
    return int(round(number * mult))


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


# ---- the preload ---------------------------------------------------------------------------

def _api():
    """The loaded libgpuheap.so's C API, or None when the preload is not in the process."""
    try:
        lib = ctypes.CDLL(None)
        lib.gpuheap_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        lib.gpuheap_stats.restype = ctypes.c_int
        lib.gpuheap_reset_peak.argtypes = [ctypes.c_int]
        lib.gpuheap_reset_peak.restype = None
        lib.gpuheap_push.argtypes = [ctypes.c_char_p]
        lib.gpuheap_push.restype = None
        lib.gpuheap_pop.argtypes = []
        lib.gpuheap_pop.restype = None
        lib.gpuheap_flush.argtypes = []
        lib.gpuheap_flush.restype = None
        lib.gpuheap_trace_path.argtypes = []
        lib.gpuheap_trace_path.restype = ctypes.c_char_p
    except (OSError, AttributeError):
        return None
    return lib


def _read_stats(lib):
    """{device: _Stats} for every device ordinal with any recorded activity."""
    out = {}
    for dev in range(_MAX_DEVICES):
        s = _Stats()
        s.size = ctypes.sizeof(_Stats)
        if lib.gpuheap_stats(dev, ctypes.byref(s)) != 0:
            continue
        if s.alloc_count or s.reserved_peak_bytes or s.requested_bytes:
            out[dev] = s
    return out


def _find_gpuheap(config=None):
    """The gpuheap CLI: --gpuheap-bin, $GPUHEAP_BIN, next to the preload in LD_PRELOAD (build
    tree or PREFIX/lib/gpuheap), PREFIX/bin of an installed plugin, then PATH."""
    cands = []
    if config is not None:
        opt = config.getoption("gpuheap_bin", None) if hasattr(config, "getoption") else \
            getattr(config, "gpuheap_bin", None)
        if opt:
            cands.append(opt)
    if os.environ.get("GPUHEAP_BIN"):
        cands.append(os.environ["GPUHEAP_BIN"])
    for lib in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":"):
        if lib.endswith("libgpuheap.so"):
            d = os.path.dirname(os.path.abspath(lib))
            cands += [os.path.join(d, "gpuheap"), os.path.join(d, "..", "..", "bin", "gpuheap")]
    here = os.path.dirname(os.path.abspath(__file__))
    cands.append(os.path.join(here, "..", "..", "..", "bin", "gpuheap"))  # share/gpuheap/python
    found = shutil.which("gpuheap")
    if found:
        cands.append(found)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


# ---- hooks ---------------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("gpuheap", "GPU memory limits (gpuheap)")
    group.addoption("--gpuheap", action="store_true", default=False,
                    help="check limit_gpu_memory/limit_gpu_leaks; re-executes pytest under "
                         "`gpuheap run` when libgpuheap.so is not preloaded yet")
    group.addoption("--gpuheap-bin", default=None, metavar="PATH",
                    help="the gpuheap CLI (default: $GPUHEAP_BIN, beside the preload, PATH)")
    group.addoption("--gpuheap-top", type=int, default=5, metavar="N",
                    help="allocation sites listed in a failure message (default 5)")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Outermost wrapper: runs before the capture plugin redirects fd 1/2 and before any
    # conftest (which may import torch) is loaded, so an exec here is still clean.
    ns = early_config.known_args_namespace
    if getattr(ns, "gpuheap", False) and _api() is None:
        if os.environ.get(_REEXEC_ENV):
            raise pytest.UsageError(
                "--gpuheap: re-executed under gpuheap run, but libgpuheap.so is not loaded "
                "(a setuid interpreter, or LD_PRELOAD cleared by a wrapper script?)")
        exe = _find_gpuheap(ns)
        if exe is None:
            raise pytest.UsageError(
                "--gpuheap: the gpuheap CLI was not found (pass --gpuheap-bin PATH, set "
                "GPUHEAP_BIN, put it on PATH, or run `gpuheap run -- pytest ...`)")
        argv = list(getattr(sys, "orig_argv", []) or [sys.executable, "-m", "pytest"] + sys.argv[1:])
        argv[0] = sys.executable
        os.environ[_REEXEC_ENV] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(exe, [exe, "run", "--"] + argv)
    yield


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "limit_gpu_memory(size): fail when the test's peak requested GPU memory "
                   "(above what was live when it started) exceeds size (gpuheap)")
    config.addinivalue_line(
        "markers", "limit_gpu_leaks(size): fail when the test leaves more than size of GPU "
                   "memory allocated at its end (gpuheap)")
    lib = _api()
    config._gpuheap = _Session(config, lib) if lib is not None else None


def pytest_report_header(config):
    g = getattr(config, "_gpuheap", None)
    if g is None:
        if config.getoption("gpuheap"):
            return "gpuheap: libgpuheap.so not loaded"
        return "gpuheap: not loaded (GPU memory limits not checked; pass --gpuheap)"
    return f"gpuheap: tracing ({g.trace_path() or 'trace file created at the first CUDA event'})"


# tryfirst: the outermost wrapper, so a limit failure raised after the test is the last
# thing torn down (the other wrappers, e.g. logging's, have finished).
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    g = getattr(item.config, "_gpuheap", None)
    if g is None:
        yield
        return
    yield from g.around_call(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    crash = getattr(item, "_gpuheap_crash", None)
    rep = outcome.get_result()
    if crash is None or call.when != "call" or not rep.failed:
        return
    longrepr = rep.longrepr
    if getattr(longrepr, "reprcrash", False) is None and ReprFileLocation is not None:
        longrepr.reprcrash = ReprFileLocation(crash[0], crash[1], crash[2])


class _Session:
    def __init__(self, config, lib):
        self.config = config
        self.lib = lib

    def trace_path(self):
        p = self.lib.gpuheap_trace_path()
        return p.decode(errors="replace") if p else ""

    def _limit(self, item, name):
        m = item.get_closest_marker(name)
        if m is None:
            return None
        arg = m.args[0] if m.args else m.kwargs.get("size")
        if arg is None:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs a size")
        try:
            return parse_size(arg)
        except ValueError as e:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name}: {e}") from None

    def around_call(self, item):
        mem_limit = self._limit(item, "limit_gpu_memory")
        leak_limit = self._limit(item, "limit_gpu_leaks")
        lib = self.lib
        # Requested bytes: deterministic (pool blocks' rounding is not), as `gpuheap check
        # --max-leaked` and the sites of `gpuheap summary` count them.
        before = {d: s.requested_bytes for d, s in _read_stats(lib).items()}
        lib.gpuheap_reset_peak(-1)
        lib.gpuheap_push(item.nodeid.encode())
        try:
            outcome = yield
        finally:
            lib.gpuheap_pop()
        if outcome.excinfo is not None or (mem_limit is None and leak_limit is None):
            return
        gc.collect()  # objects of the test that only a reference cycle keeps (tensors)
        after = _read_stats(lib)
        problems = []
        if mem_limit is not None:
            dev, peak = max(((d, s.requested_peak_bytes - before.get(d, 0)) for d, s in after.items()),
                            key=lambda x: x[1], default=(0, 0))
            if peak > mem_limit:
                problems.append(("peak", f"GPU memory peak {human(peak)} > limit {human(mem_limit)}"
                                         f" on device {dev}"))
        if leak_limit is not None:
            left = sum(s.requested_bytes for s in after.values()) - sum(before.values())
            if left > leak_limit:
                problems.append(("leak", f"GPU memory left allocated {human(left)} > limit "
                                         f"{human(leak_limit)}"))
        if problems:
            pytest.fail(self._message(item, problems, []), pytrace=False)

    def _message(self, item, problems, errors):
        """The failure: its first line (pytest's short-summary line, -rf) says what went over
        which limit and at which line of the test; then the sites and the trace to read."""
        trace = self.trace_path()
        top = self.config.getoption("gpuheap_top")
        doc, err = self._summary(item.nodeid, trace, top)
        first, lines, where = [], [], None
        for kind, text in problems:
            key, title = (("peak_consumers", "top allocation sites at the peak")
                          if kind == "peak" else ("leaks", "top sites of what is left allocated"))
            sites = (doc or {}).get(key) or []
            path, line = _test_line(item, sites)
            where = where or (path, line)
            first.append(f"{text} at {os.path.basename(path)}:{line}")
            if doc is not None:
                lines.append(f"{title} (gpuheap summary --phase):")
                lines += [f"  {_site_line(s)}" for s in sites[:top]] or ["  (none recorded)"]
        if doc is None:
            lines.append(f"(no allocation sites: {err})")
        lines += errors
        final = _final_trace_path(trace)
        if final:
            lines.append(f"trace: {final}  (gpuheap summary --phase '{item.nodeid}' {final})")
        # pytest.fail(pytrace=False) gives no crash entry, so pytest's short summary (-rf)
        # would show only the test's name: pytest_runtest_makereport adds this one.
        item._gpuheap_crash = (where[0], where[1], "; ".join(first))
        return "\n".join(["; ".join(first)] + lines)

    def _summary(self, nodeid, trace, top):
        if not trace:
            return None, "no trace file"
        exe = _find_gpuheap(self.config)
        if exe is None:
            return None, "gpuheap CLI not found (--gpuheap-bin)"
        self.lib.gpuheap_flush()
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GPUHEAP_PATH_FILE")}
        cmd = [exe, "summary", "--json", "--top", str(max(top, 1)), "--phase", nodeid, trace]
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        try:
            return json.loads(r.stdout), None
        except ValueError as e:
            return None, f"bad JSON from gpuheap summary: {e}"


def _frame_text(f):
    fn = f.get("function") or f.get("ip") or "?"
    if f.get("file"):
        return f"{fn} ({os.path.basename(f['file'])}:{f.get('line', 0)})"
    return fn


def _site_line(site):
    stack = site.get("stack") or []
    # Python frames (module "python") say where in the test the memory came from; show the
    # innermost few of them, else the native frames from the site's label on (the first frame
    # below the allocator's own, `label_frame`).
    py = [f for f in stack if f.get("module") == "python"]
    frames = (py or stack[site.get("label_frame", 0):] or stack)[:3]
    where = " <- ".join(_frame_text(f) for f in frames) or "(no stack)"
    n = site.get("count", 0)
    # Requested bytes, as the limits and the message count them.
    return f"{human(site.get('bytes', 0))} in {n} allocation{'s' if n != 1 else ''}: {where}"


def _test_line(item, sites):
    """(FILE, LINE) of the test that made the top site: the test function's own frame in its
    stack, else its innermost Python frame, else the test's definition."""
    stack = (sites[0].get("stack") or []) if sites else []
    py = [f for f in stack if f.get("module") == "python" and f.get("file")]
    name = getattr(item, "originalname", None) or item.name
    for f in [f for f in py if f.get("function") == name] or py[:1]:
        return f["file"], int(f.get("line", 0))
    return str(item.path), (item.location[1] or 0) + 1


def _final_trace_path(path):
    """The trace as it is named once the run is over: `gpuheap run` (GPUHEAP_PATH_FILE is its
    list of traces) compresses TRACE to TRACE.zst after pytest exits, unless --no-compress."""
    if not path or path.endswith(".zst") or not os.environ.get("GPUHEAP_PATH_FILE"):
        return path
    return path if _run_no_compress() else path + ".zst"


def _run_no_compress():
    # The parent is the `gpuheap run` that waits for us: its words before our own argv are
    # its options. Another parent (a shell between them) has none of them: compressed.
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().split(b"\0")[:-1]
    except OSError:
        return False
    own = getattr(sys, "orig_argv", None) or sys.argv
    return b"--no-compress" in parent[1:max(len(parent) - len(own), 1)]
