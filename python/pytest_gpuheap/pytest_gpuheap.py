"""pytest-gpuheap: GPU memory limits for tests, measured by gpuheap (docs/pytest.md).

    @pytest.mark.limit_gpu_memory("2 GiB")   # the test's peak GPU memory (requested bytes)
    @pytest.mark.limit_gpu_memory("+5%")     # or relative to --gpuheap-baseline FILE
    @pytest.mark.limit_gpu_leaks("1 MiB")    # what the test leaves allocated at its end

Numbers come from libgpuheap.so's C API (preload/gpuheap.h) through ctypes.CDLL(None), so
the plugin works whenever the preload is in the process: under `gpuheap run -- pytest ...`,
or with `pytest --gpuheap`, which re-executes pytest under `gpuheap run` before anything
(conftest files, CUDA) is loaded. Each test runs inside a gpuheap range named by its node id,
so `gpuheap summary --phase NODEID TRACE` shows its allocation sites; a failure message lists
the top ones. CI gates: ini switches (`gpuheap`, `gpuheap_required`, `gpuheap_simulate`,
`gpuheap_baseline`, `gpuheap_default_limit`), per-test baselines (--gpuheap-write-baseline)
and limits relative to them ("+5%"). Only the standard library is used.
"""

import ctypes
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

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
    """Bytes in "2 GiB", "512MiB", "1.5G", "2GB", "1e9B", 123 (as the gpuheap CLI reads sizes:
    KiB/K/Ki binary, KB decimal; a string needs a unit, as in the CLI and GPUHEAP_LIMIT, so
    "8" meant as 8 GiB is not an 8-byte limit; a Python int is bytes)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"invalid size {text!r}")
        return text
    if isinstance(text, float):
        text = repr(text) + "B"
    m = _SIZE_RE.match(str(text))
    if not m or (m.group(3).lower() in ("i", "ib") and not m.group(2)):
        raise ValueError(f"invalid size {text!r} (examples: 123B, 512MiB, 2 GiB, 2GB, 1e9B)")
    number, letter, rest = float(m.group(1)), m.group(2).lower(), m.group(3).lower()
    if not letter and not rest and number != 0:
        n = m.group(1)
        raise ValueError(f"size {text!r} has no unit: write {n}B for bytes, or {n}MiB, {n}GiB, ... "
                         "(every size needs a unit, as in the gpuheap CLI and GPUHEAP_LIMIT)")
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
    tree or PREFIX/lib/gpuheap), the wheel's, PREFIX/bin of an installed plugin, then PATH."""
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
    cands.append(os.path.join(here, "gpuheap", "bin", "gpuheap"))  # the wheel, beside this module
    cands.append(os.path.join(here, "..", "..", "..", "bin", "gpuheap"))  # share/gpuheap/python
    found = shutil.which("gpuheap")
    if found:
        cands.append(found)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


# ---- options -------------------------------------------------------------------------------

# Each switch is also an ini option of the same name ([tool.pytest.ini_options], pytest.ini),
# so a CI job's gate lives in the project, not in a command line it can lose
# (bloomberg/pytest-memray#49).
_INI = {
    "gpuheap": ("bool", "check the GPU memory limits, as --gpuheap"),
    "gpuheap_required": ("bool", "a test with a GPU memory limit is an error when gpuheap is "
                                 "not loaded, as --gpuheap-required"),
    "gpuheap_simulate": ("bool", "run on the simulated CUDA runtime, as --gpuheap-simulate"),
    "gpuheap_baseline": ("string", "baseline file of relative limits, as --gpuheap-baseline"),
    "gpuheap_default_limit": ("string", "limit_gpu_memory of every test without one of its "
                                        "own, e.g. '2 GiB' or '+5%'"),
}


def pytest_addoption(parser):
    group = parser.getgroup("gpuheap", "GPU memory limits (gpuheap)")
    group.addoption("--gpuheap", action="store_true", default=False,
                    help="check limit_gpu_memory/limit_gpu_leaks; re-executes pytest under "
                         "`gpuheap run` when libgpuheap.so is not preloaded yet (ini: gpuheap)")
    group.addoption("--gpuheap-required", action="store_true", default=False,
                    help="a test with a GPU memory limit is a usage error (exit 4) when "
                         "gpuheap is not loaded (ini: gpuheap_required)")
    group.addoption("--gpuheap-simulate", action="store_true", default=False,
                    help="re-execute under `gpuheap run --simulate` (the simulated CUDA "
                         "runtime: no GPU needed); implies --gpuheap (ini: gpuheap_simulate)")
    group.addoption("--gpuheap-baseline", default=None, metavar="FILE",
                    help="per-test figures for relative limits such as limit_gpu_memory('+5%%'), "
                         "written by --gpuheap-write-baseline; implies --gpuheap "
                         "(ini: gpuheap_baseline)")
    group.addoption("--gpuheap-write-baseline", default=None, metavar="FILE",
                    help="write every test's peak and leaked bytes to FILE (JSON) at the end; "
                         "an existing FILE only with --gpuheap-force; implies --gpuheap")
    group.addoption("--gpuheap-force", action="store_true", default=False,
                    help="let --gpuheap-write-baseline replace an existing FILE")
    group.addoption("--gpuheap-bin", default=None, metavar="PATH",
                    help="the gpuheap CLI (default: $GPUHEAP_BIN, beside the preload, PATH)")
    group.addoption("--gpuheap-top", type=int, default=5, metavar="N",
                    help="allocation sites listed in a failure message (default 5)")
    for name, (kind, text) in _INI.items():
        parser.addini(name, text, type=kind, default=False if kind == "bool" else "")


def _setting(config, name, ns=None):
    """The command-line value of option `name`, else its ini option."""
    value = getattr(ns if ns is not None else config.option, name, None)
    if value or name not in _INI:
        return value
    return config.getini(name)


def _wanted(config, ns=None):
    return any(_setting(config, n, ns) for n in
               ("gpuheap", "gpuheap_simulate", "gpuheap_baseline", "gpuheap_write_baseline"))


def _simcuda_on_path():
    return any(os.path.isfile(os.path.join(d, "libcudart.so.13")) and os.path.basename(d) == "simcuda"
               for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Outermost wrapper: runs before the capture plugin redirects fd 1/2 and before any
    # conftest (which may import torch) is loaded, so an exec here is still clean.
    ns = early_config.known_args_namespace
    simulate = bool(_setting(early_config, "gpuheap_simulate", ns))
    if _wanted(early_config, ns) and _api() is None:
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
        os.execv(exe, [exe, "run"] + (["--simulate"] if simulate else []) + ["--"] + argv)
    if simulate and not _simcuda_on_path():
        # Already preloaded by someone else's `gpuheap run`: too late to choose the runtime.
        raise pytest.UsageError(
            "--gpuheap-simulate: pytest already runs under gpuheap without the simulated "
            "runtime; use `gpuheap run --simulate -- pytest ...` or let the plugin start it")
    yield


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "limit_gpu_memory(size): fail when the test's peak requested GPU memory "
                   "(above what was live when it started) exceeds size, or the "
                   "baseline's figure by '+5%' / '+16 MiB' (gpuheap)")
    config.addinivalue_line(
        "markers", "limit_gpu_leaks(size): fail when the test leaves more than size of GPU "
                   "memory allocated at its end (gpuheap)")
    lib = _api()
    config._gpuheap = None
    if lib is not None:
        config._gpuheap = _Session(config, lib)
    elif _wanted(config):
        raise pytest.UsageError("--gpuheap: libgpuheap.so is not loaded")


def pytest_report_header(config):
    g = getattr(config, "_gpuheap", None)
    if g is None:
        if _setting(config, "gpuheap_required"):
            return "gpuheap: not loaded (gpuheap_required: a GPU memory limit is an error)"
        return "gpuheap: not loaded (GPU memory limits not checked; pass --gpuheap)"
    where = " on the simulated CUDA runtime" if _simcuda_on_path() else ""
    base = f"; baseline {g.baseline_path}" if g.baseline_path else ""
    return f"gpuheap: tracing{where} ({g.trace_path() or 'trace file created at the first CUDA event'}){base}"


@pytest.hookimpl(trylast=True)  # the tests that run: after -k/-m deselection
def pytest_collection_modifyitems(session, config, items):
    # gpuheap_required: fail closed when limits would go unchecked (a CI job that lost --gpuheap).
    if getattr(config, "_gpuheap", None) is not None or not _setting(config, "gpuheap_required"):
        return
    default = _setting(config, "gpuheap_default_limit")
    limited = [i for i in items if default or i.get_closest_marker("limit_gpu_memory")
               or i.get_closest_marker("limit_gpu_leaks")]
    if limited:
        raise pytest.UsageError(
            f"gpuheap_required: {len(limited)} test(s) have GPU memory limits (first: "
            f"{limited[0].nodeid}) but gpuheap is not loaded: pass --gpuheap, set `gpuheap = true` "
            f"in the pytest configuration, or run under `gpuheap run`")


def pytest_sessionfinish(session):
    g = getattr(session.config, "_gpuheap", None)
    if g is not None and g.write_path:
        g.write_baseline()


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


# ---- limits and the baseline ---------------------------------------------------------------

def parse_limit(text):
    """("abs", bytes) for "2 GiB"; relative to the baseline: ("pct", 5.0) for "+5%",
    ("plus", bytes) for "+16 MiB"."""
    if isinstance(text, str) and text.strip().startswith("+"):
        rest = text.strip()[1:].strip()
        if rest.endswith("%"):
            try:
                pct = float(rest[:-1])
            except ValueError:
                pct = -1.0
            if not 0 <= pct < float("inf"):
                raise ValueError(f"invalid relative limit {text!r} (examples: '+5%', '+16 MiB')")
            return "pct", pct
        return "plus", parse_size(rest)
    return "abs", parse_size(text)


_BASELINE_SCHEMA = "gpuheap-pytest-baseline/1"


def _load_baseline(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise pytest.UsageError(f"--gpuheap-baseline {path}: {e}") from None
    tests = doc.get("tests") if isinstance(doc, dict) else None
    if not isinstance(tests, dict) or doc.get("schema") != _BASELINE_SCHEMA:
        raise pytest.UsageError(f"--gpuheap-baseline {path}: not a baseline written by "
                                f"--gpuheap-write-baseline (schema {_BASELINE_SCHEMA})")
    return tests


def _write_new_file(path, text, force):
    """Write `text` to `path` through an O_EXCL temporary beside it, then linked to `path`
    (renamed over it with force): a reader never sees half a file, and an existing `path` is
    replaced only with force."""
    if os.path.lexists(path) and not force:
        raise FileExistsError(f"{path} exists (pass --gpuheap-force to replace it)")
    d = os.path.dirname(os.path.abspath(path))
    for n in range(100):
        tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{n}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.rename(tmp, path)
        else:  # link(2) never replaces: a file made at `path` meanwhile is kept
            os.link(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


class _Session:
    def __init__(self, config, lib):
        self.config = config
        self.lib = lib
        self.records = {}
        self.write_path = _setting(config, "gpuheap_write_baseline")
        if self.write_path and os.path.lexists(self.write_path) and not _setting(config, "gpuheap_force"):
            raise pytest.UsageError(f"--gpuheap-write-baseline {self.write_path}: the file exists "
                                    f"(pass --gpuheap-force to replace it)")
        self.baseline_path = _setting(config, "gpuheap_baseline") or ""
        if self.baseline_path and not getattr(config.option, "gpuheap_baseline", None) and config.inipath:
            self.baseline_path = os.path.join(str(config.inipath.parent), self.baseline_path)
        self.baseline = _load_baseline(self.baseline_path) if self.baseline_path else None
        default = _setting(config, "gpuheap_default_limit")
        try:
            self.default = parse_limit(default) if default else None
        except ValueError as e:
            raise pytest.UsageError(f"gpuheap_default_limit: {e}") from None

    def trace_path(self):
        p = self.lib.gpuheap_trace_path()
        return p.decode(errors="replace") if p else ""

    def write_baseline(self):
        doc = {"schema": _BASELINE_SCHEMA, "tests": dict(sorted(self.records.items()))}
        try:
            _write_new_file(self.write_path, json.dumps(doc, indent=1) + "\n",
                            _setting(self.config, "gpuheap_force"))
        except OSError as e:  # pytest.exit: the run's exit status says the file is missing
            pytest.exit(f"--gpuheap-write-baseline {self.write_path}: {e}",
                        returncode=pytest.ExitCode.USAGE_ERROR)

    def _limit(self, item, name):
        """(spec text, parsed limit, from the default) of the test, or None."""
        m = item.get_closest_marker(name)
        if m is None:
            if name == "limit_gpu_memory" and self.default is not None:
                return _setting(self.config, "gpuheap_default_limit"), self.default, True
            return None
        arg = m.args[0] if m.args else m.kwargs.get("size")
        if arg is None:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs a size")
        try:
            return arg, parse_limit(arg), False
        except ValueError as e:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name}: {e}") from None

    def _resolve(self, item, name, spec, key):
        """(limit bytes, note) of a limit; (None, None) when unchecked; (None, error)."""
        if spec is None:
            return None, None
        text, (kind, value), from_default = spec
        if kind == "abs":
            return value, ""
        if self.baseline is None:
            if self.write_path:  # the run that writes the baseline checks absolute limits only
                return None, None
            return None, (f"{name}({text!r}) is relative to a baseline: pass --gpuheap-baseline "
                          f"FILE (written by a run with --gpuheap-write-baseline FILE)")
        entry = self.baseline.get(item.nodeid)
        if not isinstance(entry, dict) or not isinstance(entry.get(key), int):
            why = (f"{item.nodeid} is not in the baseline {self.baseline_path}: write it again "
                   f"with --gpuheap-write-baseline on the reference branch")
            if from_default:  # a new test: the default limit does not gate it yet
                warnings.warn(pytest.PytestWarning(f"gpuheap_default_limit not checked: {why}"))
                return None, None
            return None, f"{name}({text!r}): {why}"
        base = entry[key]
        extra = int(base * value / 100) if kind == "pct" else value
        return base + extra, f" (baseline {human(base)} {text.strip()})"

    def around_call(self, item):
        mem = self._limit(item, "limit_gpu_memory")
        leak = self._limit(item, "limit_gpu_leaks")
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
        if outcome.excinfo is not None or (mem is None and leak is None and not self.write_path):
            return
        gc.collect()  # objects of the test that only a reference cycle keeps (tensors)
        after = _read_stats(lib)
        dev, peak = max(((d, s.requested_peak_bytes - before.get(d, 0)) for d, s in after.items()),
                        key=lambda x: x[1], default=(0, 0))
        peak = max(peak, 0)
        left = sum(s.requested_bytes for s in after.values()) - sum(before.values())
        if self.write_path:
            self.records[item.nodeid] = {"peak": peak, "leaked": max(left, 0)}
        problems, errors = [], []
        mem_limit, note = self._resolve(item, "limit_gpu_memory", mem, "peak")
        if mem_limit is None and note:
            errors.append(note)
        elif mem_limit is not None and peak > mem_limit:
            problems.append(("peak", f"GPU memory peak {human(peak)} > limit {human(mem_limit)}"
                                     f"{note} on device {dev}"))
        leak_limit, note = self._resolve(item, "limit_gpu_leaks", leak, "leaked")
        if leak_limit is None and note:
            errors.append(note)
        elif leak_limit is not None and left > leak_limit:
            problems.append(("leak", f"GPU memory left allocated {human(left)} > limit "
                                     f"{human(leak_limit)}{note}"))
        if problems:
            pytest.fail(self._message(item, problems, errors), pytrace=False)
        if errors:
            item._gpuheap_crash = (str(item.path), (item.location[1] or 0) + 1, errors[0])
            pytest.fail("\n".join(errors), pytrace=False)

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
