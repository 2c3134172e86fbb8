#!/usr/bin/env python3
"""What one allocation costs under each stack mode, from Python, on a real GPU (writes one JSON).

Step times of a training job move by 10-30 % between runs on a shared machine, more than the
stacks cost; a tight loop of allocations does not: it times the hook itself. One process per
configuration, all driven by the same script: a Python call chain DEPTH frames deep (plain
recursion, so each level is one interpreter frame) ends in a loop of N
`x = torch.empty(size, device="cuda"); del x` (PyTorch's cache off, so each is one
cudaMalloc and one cudaFree) or of N `y = a @ b; del y` (the output of a cuBLAS matmul: a
longer native path through the dispatcher). Each (op, depth) is timed REPS times, interleaved;
the median of the reps is kept. The differences between configurations are the costs:
native stacks - no stacks = the native unwind (with the stack cache), default - native stacks
= the Python frames; their slope over depth = the cost of one Python frame.

   python bench/alloc_cost.py --out bench/results/     (alloc-cost-DATE-COMMIT-CARD.json)
"""
import argparse
import datetime
import json
import os
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import gh  # noqa: E402

DRIVER = r"""
import json, sys, time, torch
n, reps, depths = int(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
torch.cuda.init()
a = torch.randn(64, 64, device="cuda"); b = torch.randn(64, 64, device="cuda")

def empty_loop():
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = torch.empty(4096, device="cuda"); del x
    return (time.perf_counter_ns() - t0) / n

def mm_loop():
    t0 = time.perf_counter_ns()
    for _ in range(n):
        y = a @ b; del y
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / n

def chain(d, fn):
    return fn() if d <= 1 else chain(d - 1, fn)

ops = {"empty": empty_loop, "mm": mm_loop}
for name, fn in ops.items():  # warm: every stack of every depth seen once
    for d in depths:
        chain(d, fn)
res = {f"{name}@{d}": [] for name in ops for d in depths}
for _ in range(reps):
    for name, fn in ops.items():
        for d in depths:
            res[f"{name}@{d}"].append(chain(d, fn))
import ctypes
class Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(f, ctypes.c_uint64) for f in STACK_FIELDS]
try:
    st = Stats(); st.size = ctypes.sizeof(Stats)
    if ctypes.CDLL(None).gpuheap_stack_stats(ctypes.byref(st)) == 0:
        res["stack_stats"] = {f: getattr(st, f) for f in STACK_FIELDS}
except AttributeError:  # no gpuheap, or one without the call
    pass
print(json.dumps(res), flush=True)
"""
STACK_FIELDS = ["captures", "cache_hits", "walks", "rewalks", "fills", "fill_waits", "native_frames",
                "python_frames", "cache_stale", "fill_failed_size", "fill_failed_off_stack",
                "fill_failed_register", "fill_failed_walk"]
DRIVER = DRIVER.replace("import ctypes\n", f"import ctypes\nSTACK_FIELDS = {STACK_FIELDS!r}\n", 1)

NC = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
# name -> (GPUHEAP_* variables, or None without gpuheap)
CONFIGS = {
    "torch_caching": None,
    "gpuheap_no_stacks": {"GPUHEAP_STACKS": "0"},
    "gpuheap_native_stacks": {"GPUHEAP_PYTHON_STACKS": "0"},
    "gpuheap_default": {},
    "gpuheap_no_stack_cache": {"GPUHEAP_STACK_CACHE": "0"},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/")
    ap.add_argument("--n", type=int, default=20000, help="allocations per timed loop")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--depths", default="1,16,48")
    ap.add_argument("--work", default="/tmp/gpuheap-alloc-cost")
    ap.add_argument("--baseline-preload", help="another libgpuheap.so (e.g. an earlier commit's, from its wheel) "
                    "measured beside this one: configurations baseline_default and baseline_no_stack_cache")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    drv = os.path.join(a.work, "driver.py")
    with open(drv, "w") as f:
        f.write(DRIVER)
    results, errors, stack_stats = {}, {}, {}
    plan = [(cfg, ghv, gh.PRELOAD) for cfg, ghv in CONFIGS.items()]
    if a.baseline_preload:
        base = os.path.abspath(a.baseline_preload)
        plan += [("baseline_default", {}, base), ("baseline_no_stack_cache", {"GPUHEAP_STACK_CACHE": "0"}, base)]
    this_preload = gh.PRELOAD
    v = {"commit": gh.commit(), "torch": torch_version(), "gpu": gpu_name()}
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    card = "h200" if "H200" in (v["gpu"] or "") else "h100" if "H100" in (v["gpu"] or "") else "gpu"
    path = a.out if a.out.endswith(".json") else os.path.join(a.out, f"alloc-cost-{date}-{v['commit']}-{card}.json")
    doc = {"schema": "gpuheap.alloc-cost/1", "date": date, "versions": v,
           "unit": "ns per allocation+free pair from Python (median of reps)",
           "settings": {"n": a.n, "reps": a.reps, "depths": a.depths, "preload": this_preload,
                        "baseline_preload": a.baseline_preload},
           "ns_per_pair": results, "derived_ns": {}, "stack_stats": stack_stats, "errors": errors}
    for cfg, ghv, preload in plan:
        gh.PRELOAD = preload  # gh.run reads it at each call
        tr = os.path.join(a.work, f"{cfg}.trace") if ghv is not None else None
        rc, out, err, dt = gh.run([gh.PY, drv, str(a.n), str(a.reps), a.depths], env=None if ghv is None else NC,
                                  trace=tr, gpuheap=ghv, timeout=500)
        if tr and os.path.exists(tr):
            os.unlink(tr)
        if rc != 0:
            errors[cfg] = err[-2000:]
            print(f"{cfg}: rc={rc} {err[-500:]}", flush=True)
            continue
        j = gh.last_json(out)
        if "stack_stats" in j:
            stack_stats[cfg] = j.pop("stack_stats")
        results[cfg] = {k: round(statistics.median(v), 1) for k, v in j.items()}
        print(f"{cfg:24} {json.dumps(results[cfg])} {json.dumps(stack_stats.get(cfg))} ({dt:.0f} s)", flush=True)
        doc["derived_ns"] = derive(results, a.depths)
        with open(path, "w") as f:  # after every configuration: a run cut short keeps what it measured
            json.dump(doc, f, indent=1)
    gh.PRELOAD = this_preload
    print(json.dumps(doc["derived_ns"], indent=1))
    print(f"written: {path}", flush=True)
    return 1 if errors else 0


def derive(r, depths):
    """Per op and depth: the native unwind, the Python frames, and what the cache saves; per op: ns a frame."""
    out = {}
    ds = [int(x) for x in depths.split(",")]
    need = {"gpuheap_no_stacks", "gpuheap_native_stacks", "gpuheap_default"}
    if not need <= set(r):
        return out
    for op in ("empty", "mm"):
        o = {}
        for d in ds:
            k = f"{op}@{d}"
            o[k] = {"native_unwind": round(r["gpuheap_native_stacks"][k] - r["gpuheap_no_stacks"][k], 1),
                    "python_frames": round(r["gpuheap_default"][k] - r["gpuheap_native_stacks"][k], 1)}
            if "gpuheap_no_stack_cache" in r:
                o[k]["cache_saves"] = round(r["gpuheap_no_stack_cache"][k] - r["gpuheap_default"][k], 1)
            if "baseline_default" in r:
                o[k]["saved_vs_baseline"] = round(r["baseline_default"][k] - r["gpuheap_default"][k], 1)
        lo, hi = f"{op}@{ds[0]}", f"{op}@{ds[-1]}"
        if ds[-1] > ds[0]:
            o["per_python_frame"] = round((o[hi]["python_frames"] - o[lo]["python_frames"]) / (ds[-1] - ds[0]), 1)
        out[op] = o
    return out


def torch_version():
    try:
        import torch
        return torch.__version__
    except Exception:  # noqa: BLE001 - reported, not needed
        return None


def gpu_name():
    try:
        rc, out, _, _ = gh.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], timeout=30)
    except OSError:
        return None
    return out.strip().splitlines()[0] if rc == 0 and out.strip() else None


if __name__ == "__main__":
    sys.exit(main())
