"""Helpers shared by the GPU test cases and benchmarks: where gpuheap's binaries are, running a
command under the preload, and reading traces back through the CLI (`gpuheap dump` for
per-record questions, `gpuheap summary --json` for the replayed statistics).

The binaries come from $GPUHEAP_BIN_DIR (a build tree: gpuheap and libgpuheap.so side by side),
else from the gpuheap wheel installed for this interpreter (scripts/gpu-test.sh installs it
into a venv), else from build/ of this checkout. The traced jobs themselves only get
LD_PRELOAD, never extra library paths.
"""
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _installed_wheel():
    """The gpuheap package of the installed wheel (None without one, or with the source tree's
    python/gpuheap, which has no binaries)."""
    if os.environ.get("GPUHEAP_BIN_DIR"):
        return None
    try:
        import gpuheap
    except ImportError:
        return None
    return gpuheap if os.path.isfile(gpuheap.cli_path()) else None


WHEEL = _installed_wheel()
if WHEEL is not None:
    CLI, PRELOAD = WHEEL.cli_path(), WHEEL.preload_path()
    BIN = os.path.dirname(CLI)
else:
    BIN = os.path.abspath(os.environ.get("GPUHEAP_BIN_DIR", os.path.join(ROOT, "build")))
    PRELOAD = os.path.join(BIN, "libgpuheap.so")
    CLI = os.path.join(BIN, "gpuheap")
PY = sys.executable


def commit():
    """The commit the binaries were built from: the wheel's build commit, or
    $GPUHEAP_BIN_DIR/COMMIT when a build tree was carried to the GPU machine (the copy's git
    HEAD can be stale and once recorded the wrong commit), else this checkout's HEAD."""
    if WHEEL is not None:
        return WHEEL.build_commit()
    try:
        with open(os.path.join(BIN, "COMMIT")) as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "unknown"

# Env vars a framework reads to pick its allocator; scrubbed so each run states its own.
FRAMEWORK_VARS = ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_ALLOCATOR",
                  "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def base_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAP_") and k not in FRAMEWORK_VARS}
    env.pop("LD_PRELOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (torch.use_deterministic_algorithms)
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env=None, timeout=300, trace=None, gpuheap=None, check=False):
    """Runs cmd. With trace set, under the preload writing that trace; gpuheap: extra GPUHEAP_* vars.
    Returns (rc, stdout, stderr, seconds)."""
    e = base_env(env)
    if trace is not None:
        e["LD_PRELOAD"] = PRELOAD
        e.setdefault("NVTX_INJECTION64_PATH", PRELOAD)  # NVTX ranges as phases, as `gpuheap run` does
        e["GPUHEAP_OUTPUT"] = trace
        e["GPUHEAP_QUIET"] = "1"
        if os.path.exists(trace):
            os.unlink(trace)
        for k, v in (gpuheap or {}).items():
            e[k] = str(v)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as x:
        rc, out, err = 124, _text(x.stdout), _text(x.stderr) + f"\n[timeout after {timeout}s]"
    dt = time.monotonic() - t0
    if check and rc != 0:
        raise RuntimeError(f"{cmd} exited {rc}: {err[-2000:]}")
    return rc, out, err, dt


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def last_json(text):
    """The last line of text that parses as a JSON object (the jobs print one result line)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise ValueError("no JSON result line in output:\n" + text[-2000:])


def summary_json(trace, top=10):
    p = subprocess.run([CLI, "summary", "--json", "--top", str(top), trace], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"gpuheap summary --json {trace} exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def summary_text(trace, top=10):
    p = subprocess.run([CLI, "summary", "--top", str(top), trace], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


class Trace:
    """The records of one trace as `gpuheap dump` prints them (type, then key=value pairs)."""

    def __init__(self, path):
        p = subprocess.run([CLI, "dump", path], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"gpuheap dump {path} exited {p.returncode}: {p.stderr[-2000:]}")
        self.records = []
        self.modules = []  # (lo, hi, path)
        self.stacks = {}   # id -> [ip]
        for line in p.stdout.splitlines():
            parts = line.split(" ", 1)
            if len(parts) < 2:
                continue
            kv = {k: v.strip('"') for k, v in _KV.findall(parts[1])}
            kind = parts[0]
            if kind == "module":
                self.modules.append((int(kv["lo"], 16), int(kv["hi"], 16), kv.get("path", "")))
            elif kind == "stack":
                ips = kv.get("ips", "")
                # Python frames ("py:CODE@LASTI", format v2) have no address: native ips only
                self.stacks[int(kv["id"])] = [int(x, 16) for x in ips.split(",") if x and not x.startswith("py:")]
            self.records.append((kind, kv))

    def of(self, rtype, **match):
        """Records of one type whose fields equal match (e.g. of("alloc", kind="async"))."""
        return [kv for k, kv in self.records if k == rtype and all(kv.get(a) == b for a, b in match.items())]

    def count(self, rtype, **match):
        return len(self.of(rtype, **match))

    def module_of(self, ip):
        for lo, hi, path in self.modules:
            if lo <= ip < hi:
                return path
        return ""

    def stack_has_module(self, stack_id, name):
        return any(name in self.module_of(ip) for ip in self.stacks.get(stack_id, []))

    def live_peak(self, kinds, size_key="requested", where=None):
        """Peak of the sum of live allocations of the given kinds (alloc/free matched by ptr),
        optionally only those whose alloc record satisfies where(kv)."""
        live, cur, peak = {}, 0, 0
        for k, kv in self.records:
            if kv.get("kind") not in kinds:
                continue
            key = (kv.get("device"), kv.get("kind"), kv.get("ptr"))
            if k == "alloc":
                if where is not None and not where(kv):
                    continue
                n = int(kv.get(size_key) or kv.get("size") or 0)
                live[key] = n
                cur += n
                peak = max(peak, cur)
            elif k == "free" and key in live:
                cur -= live.pop(key)
        return peak


def kinds_seen(trace):
    out = {}
    for k, kv in trace.records:
        if k in ("alloc", "free"):
            name = f"{k}:{kv.get('kind')}"
            out[name] = out.get(name, 0) + 1
    return out


def gpu_device(summary):
    """The summary's entry for the first real device (device -1 holds host-pinned memory)."""
    devs = [d for d in summary["devices"] if d.get("device", 0) >= 0]
    return devs[0] if devs else {}


def frames_text(stack, n=6):
    """A short one-line rendering of a summary JSON stack (function or module+offset)."""
    out = []
    for f in stack[:n]:
        fn = f.get("function") or ""
        if f.get("file"):
            fn += f" ({os.path.basename(f['file'])}:{f.get('line')})"
        if not fn:
            fn = f"{os.path.basename(f.get('module', '?'))}+0x{int(f.get('offset', 0)):x}"
        out.append(fn[:120])
    return " <- ".join(out)
