"""The compatibility matrix (issue 39): each job of compat_jobs.py run natively and under
`gpuheap run` with its defaults (and, where the defaults change what the program observes, once
more with the documented remedy), comparing what the program itself printed (losses, the
statistics it read, the choices it made, its exit status, its run time) and checking the
traces (allocations seen, peak equal to torch's where that is defined, every trace complete and
listed, none empty or unfinished).

Each case returns (VERDICT, details) to run_all.py:
  PASS  the program behaved as natively and the traces are right
  DIFF  a difference docs/coverage.md documents (named in details["reason"]); the remedy run
        it names passed
  SKIP  the library is not installed (details["reason"] says which): never counted as passed
  FAIL  anything else
Selected by `scripts/gpu-test.sh --only compat` (all) or `--only compat.NAME`.
"""
import math
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gh  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "compat_jobs.py")
STEPS = int(os.environ.get("GPU_COMPAT_STEPS", "10"))
TIMEOUT = int(os.environ.get("GPU_COMPAT_TIMEOUT", "240"))
DEVICE_KINDS = ("pooled", "device")
LIMIT = 2 << 30  # the batch-size finder's cap: `gpuheap run --limit 2GiB`, torch's memory fraction natively
LOSS_RTOL = 1e-3  # losses of a deterministic job; bitwise equality is reported beside

# The differences docs/coverage.md ("Compatibility matrix") documents, with their remedy.
DOCUMENTED = {
    "stats": "torch's memory statistics read 0 under PYTORCH_NO_CUDA_MEMORY_CACHING=1 (gpuheap run's default); "
             "remedy: gpuheap run --framework-pools=keep",
    "oom_type": "under PYTORCH_NO_CUDA_MEMORY_CACHING=1 torch raises torch.AcceleratorError, not "
                "torch.cuda.OutOfMemoryError, when cudaMalloc fails; remedy: gpuheap run --framework-pools=keep",
    "graph_capture": "under PYTORCH_NO_CUDA_MEMORY_CACHING=1 torch calls cudaMalloc inside CUDA graph capture, which "
                     "CUDA refuses (natively too), and torch.compile's CUDA graph trees find the outputs outside "
                     "their private pool; remedy: gpuheap run --framework-pools=keep",
}


# ---- running -------------------------------------------------------------------------------------

def _result(out):
    try:
        return gh.last_json(out)
    except ValueError:
        return None


def native(ctx, job, env=None, args=()):
    cmd = [gh.PY, JOB, job, "--steps", str(STEPS), *args]
    rc, out, err, dt = gh.run(cmd, env=env, timeout=TIMEOUT)
    return {"rc": rc, "result": _result(out), "seconds": round(dt, 2), "stderr_tail": err[-1500:]}


def traced(ctx, case, job, tag="default", env=None, run_opts=(), args=()):
    """`gpuheap run [run_opts] -o DIR/t.%p.trace -- python compat_jobs.py JOB`; the traces of
    every process land in DIR, which holds nothing else."""
    d = os.path.join(ctx.work, "compat", f"{case}-{tag}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd = [gh.CLI, "run", "-o", os.path.join(d, "t.%p.trace"), *run_opts, "--", gh.PY, JOB, job, "--steps",
           str(STEPS), *args]
    rc, out, err, dt = gh.run(cmd, env=env, timeout=TIMEOUT)
    written = re.findall(r"^gpuheap: trace written to (.+)$", err, re.M)
    notes = [ln for ln in err.splitlines() if ln.startswith("gpuheap:") and "trace written" not in ln
             and not ln.startswith("gpuheap: tracing to") and not ln.startswith("Now run")][:12]
    return {"rc": rc, "result": _result(out), "seconds": round(dt, 2), "stderr_tail": err[-1500:],
            "gpuheap_lines": notes, "traces": inspect_traces(d, written), "dir": d}


def inspect_traces(d, written):
    """Every file in d: readable, complete (an end record, not cut), listed by `run`."""
    out = []
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        info = {"file": name, "listed": path in written, "bytes": os.path.getsize(path)}
        try:
            s = gh.summary_json(path)
            t = s.get("trace", {})
            devs = [x for x in s.get("devices", []) if x.get("device", 0) >= 0]
            info.update(pid=t.get("pid"), has_end=t.get("has_end"), truncated=t.get("truncated"),
                        events=t.get("events"), gpu_allocations=sum(x["allocations"]["allocated"] for x in devs),
                        gpu_requested_peak=max((x["requested_bytes"]["peak"] for x in devs), default=0),
                        host_allocations=sum(x["allocations"]["allocated"] for x in s.get("devices", [])
                                             if x.get("device", 0) < 0))
        except Exception as e:  # not a trace, empty, damaged: reported, the case fails
            info["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(info)
    return out


def trace_checks(run, min_traces=1):
    tr = run["traces"]
    good = [t for t in tr if not t.get("error")]
    return {"traces_written": len(tr) >= min_traces,
            "traces_complete": bool(tr) and all(t.get("has_end") and not t.get("truncated") and not t.get("error")
                                                for t in tr),
            "traces_listed": all(t["listed"] for t in tr),
            "allocations_seen": sum(t.get("gpu_allocations", 0) for t in good) > 0}


def trace_of(run, i=0):
    return os.path.join(run["dir"], run["traces"][i]["file"])


# ---- comparing -----------------------------------------------------------------------------------

def close(a, b, rtol=LOSS_RTOL):
    """Lists (possibly nested) of floats equal within rtol; a NaN equals only a NaN."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))
    return a == b


def max_rel(a, b):
    if isinstance(a, list) and isinstance(b, list):
        return max((max_rel(x, y) for x, y in zip(a, b)), default=0.0)
    try:
        return abs(a - b) / max(1e-12, abs(a), abs(b))
    except TypeError:
        return None


def outputs_same(nat, trc, keys):
    """The program's own outputs (keys of its JSON line) compared; returns checks and figures."""
    checks, figs = {}, {}
    n, t = nat.get("result") or {}, trc.get("result") or {}
    checks["exit_status_same"] = nat["rc"] == trc["rc"]
    for k in keys:
        checks[f"{k}_same"] = k in n and k in t and close(n[k], t[k])
        figs[f"{k}_bitwise"] = n.get(k) == t.get(k)
        figs[f"{k}_max_rel_diff"] = max_rel(n.get(k), t.get(k))
    figs["seconds_native"], figs["seconds_traced"] = nat["seconds"], trc["seconds"]
    figs["time_ratio"] = round(trc["seconds"] / nat["seconds"], 2) if nat["seconds"] else None
    return checks, figs


def torch_stats_same(nat, trc, keys=("memory_allocated", "max_memory_allocated", "memory_reserved",
                                      "max_memory_reserved", "requested_peak")):
    n, t = (nat.get("result") or {}).get("torch") or {}, (trc.get("result") or {}).get("torch") or {}
    return all(n.get(k) == t.get(k) for k in keys), {k: [n.get(k), t.get(k)] for k in keys}


def c10_peak(path):
    """gpuheap's peak of live requested bytes over allocations whose stack passes through
    PyTorch's allocator (libc10_cuda): what torch's requested_bytes.all.peak counts."""
    t = gh.Trace(path)
    return t.live_peak(DEVICE_KINDS, where=lambda kv: t.stack_has_module(int(kv.get("stack", 0)), "libc10_cuda"))


def evidence(documented, run):
    """Whether the default run failed the way DOCUMENTED[documented] says (not some other way)."""
    r = run.get("result") or {}
    if documented == "stats":
        return ((r.get("torch") or {}).get("max_memory_allocated") == 0)
    if documented == "oom_type":
        return str(r.get("uncaught", "")).endswith("AcceleratorError")
    if documented == "graph_capture":
        return run["rc"] != 0 and re.search(r"captur|not allocated in pool", run["stderr_tail"], re.I) is not None
    return False


def finish(details, checks, documented=None, remedy_checks=None):
    """The verdict. documented: the DOCUMENTED key the default run's failure is expected to be
    (its evidence must be in the default run); remedy_checks: the checks of the run with the
    documented remedy, all of which must hold."""
    details["checks"] = checks
    failed = sorted(k for k, v in checks.items() if not v)
    if not failed:
        details.update(verdict="PASS", reason="")
    elif (documented and remedy_checks is not None and all(remedy_checks.values())
          and evidence(documented, details["traced"])):
        details.update(verdict="DIFF", reason=f"{DOCUMENTED[documented]} (failed under the defaults: "
                                              f"{', '.join(failed)}; the remedy run passed)")
    else:
        bad_remedy = sorted(k for k, v in (remedy_checks or {}).items() if not v)
        details.update(verdict="FAIL", reason=f"failed: {', '.join(failed)}"
                                              + (f"; remedy run failed: {', '.join(bad_remedy)}" if bad_remedy else ""))
    return details["verdict"], details


def skipped(nat):
    r = nat.get("result") or {}
    return r.get("skip")


def simple_case(ctx, case, job, keys=("losses",), env=None, min_traces=1, peak=False, extra=None):
    """Native vs `gpuheap run` defaults; the program's outputs `keys` must match, the traces be
    complete; peak: gpuheap's requested peak over torch's allocator stacks must equal torch's
    requested_bytes.all.peak of the native run (one process, one stream, deterministic)."""
    nat = native(ctx, job, env=env)
    if skipped(nat):
        return "SKIP", {"verdict": "SKIP", "reason": skipped(nat), "native": nat}
    trc = traced(ctx, case, job, env=env)
    checks, figs = outputs_same(nat, trc, keys)
    checks.update(trace_checks(trc, min_traces))
    details = {"native": nat, "traced": trc, "figures": figs}
    if peak and trc["traces"] and checks["traces_complete"]:
        want = ((nat.get("result") or {}).get("torch") or {}).get("requested_peak")
        got = c10_peak(trace_of(trc))
        figs.update(torch_requested_peak_native=want, gpuheap_requested_peak_c10=got)
        checks["peak_equals_torch"] = want is not None and got == want
    if extra:
        extra(nat, trc, checks, figs)
    return finish(details, checks)


def with_remedy(ctx, case, job, keys, documented, env=None, default_opts=(), keep_extra=None, default_extra=None):
    """Native vs the defaults; when the defaults differ in the documented way, the remedy
    (`--framework-pools=keep`) must pass."""
    nat = native(ctx, job, env=env)
    if skipped(nat):
        return "SKIP", {"verdict": "SKIP", "reason": skipped(nat), "native": nat}
    trc = traced(ctx, case, job, env=env, run_opts=default_opts)
    checks, figs = outputs_same(nat, trc, keys)
    checks.update(trace_checks(trc))
    if default_extra:
        default_extra(nat, trc, checks, figs)
    details = {"native": nat, "traced": trc, "figures": figs}
    remedy = None
    if not all(checks.values()):
        keep = traced(ctx, case, job, tag="keep", env=env, run_opts=("--framework-pools=keep", *default_opts))
        remedy, kfigs = outputs_same(nat, keep, keys)
        remedy.update(trace_checks(keep))
        if keep_extra:
            keep_extra(nat, keep, remedy, kfigs)
        details.update(keep=keep, keep_figures=kfigs, keep_checks=remedy)
    return finish(details, checks, documented, remedy)


# ---- cases ---------------------------------------------------------------------------------------

def case_torch_compile(ctx):
    """torch.compile (inductor), compile workers as subprocesses, from an empty cache each run."""
    cache = os.path.join(ctx.work, "compat", "inductor-cache")

    def env(tag):
        d = f"{cache}-{tag}"
        shutil.rmtree(d, ignore_errors=True)
        return {"TORCHINDUCTOR_CACHE_DIR": d, "TRITON_CACHE_DIR": d + "/triton", "TORCHINDUCTOR_COMPILE_THREADS": "4"}

    nat = native(ctx, "compile", env=env("native"))
    if skipped(nat):
        return "SKIP", {"verdict": "SKIP", "reason": skipped(nat), "native": nat}
    trc = traced(ctx, "torch_compile", "compile", env=env("traced"))
    checks, figs = outputs_same(nat, trc, ("losses", "eval_sums"))
    checks.update(trace_checks(trc))
    figs["compile_workers"] = [(x.get("result") or {}).get("compile_worker_children") for x in (nat, trc)]
    return finish({"native": nat, "traced": trc, "figures": figs}, checks)


def case_torch_compile_reduce_overhead(ctx):
    env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(ctx.work, "compat", "inductor-cache-ro")}
    return with_remedy(ctx, "torch_compile_reduce_overhead", "compile_ro", ("losses", "eval_sums"), "graph_capture",
                       env=env)


def case_cuda_graphs(ctx):
    """torch.cuda.graph captured by hand and replayed 200 times; make_graphed_callables trained."""
    return with_remedy(ctx, "cuda_graphs", "graph", ("replay_sums", "losses"), "graph_capture")


def _async_extra(nat, trc, checks, figs):
    same, vals = torch_stats_same(nat, trc)
    figs["torch_stats_native_traced"] = vals
    checks["torch_stats_same"] = same
    if trc["traces"] and not trc["traces"][0].get("error"):
        t = gh.Trace(trace_of(trc))
        figs["async_allocs"] = t.count("alloc", kind="async")
        figs["async_requested_peak"] = t.live_peak(("async",))
        want = ((trc.get("result") or {}).get("torch") or {}).get("max_memory_allocated")
        figs["torch_max_memory_allocated_traced"] = want
        checks["async_allocs_seen"] = figs["async_allocs"] > 0


def case_alloc_conf_async(ctx):
    """PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: torch keeps its own statistics (the async
    backend ignores PYTORCH_NO_CUDA_MEMORY_CACHING); gpuheap sees every tensor as cudaMallocAsync."""
    return simple_case(ctx, "alloc_conf_async", "train", env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                       extra=_async_extra)


def _stats_extra(nat, trc, checks, figs):
    same, vals = torch_stats_same(nat, trc)
    figs["torch_stats_native_traced"] = vals
    checks["torch_stats_same"] = same


def _expandable_keep(nat, keep, checks, figs):
    _stats_extra(nat, keep, checks, figs)
    if keep["traces"] and not keep["traces"][0].get("error"):
        t = gh.Trace(trace_of(keep))
        figs["vmm_map_peak"] = t.live_peak(("vmm_map",), size_key="size")
        want = ((keep.get("result") or {}).get("torch") or {}).get("max_memory_reserved")
        figs["torch_max_memory_reserved"] = want
        checks["vmm_map_peak_equals_max_reserved"] = figs["vmm_map_peak"] == want


def case_alloc_conf_expandable(ctx):
    """expandable_segments:True: under the defaults PYTORCH_NO_CUDA_MEMORY_CACHING=1 wins (every
    tensor a cudaMalloc, torch's statistics 0); kept, gpuheap sees the VMM pages."""
    return with_remedy(ctx, "alloc_conf_expandable", "train", ("losses",), "stats",
                       env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                       default_extra=_stats_extra, keep_extra=_expandable_keep)


def case_torch_stats_adaptive(ctx):
    """A program that logs torch's statistics and picks its batch size from max_memory_allocated."""
    return with_remedy(ctx, "torch_stats_adaptive", "stats", ("losses", "batches"), "stats",
                       default_extra=_stats_extra, keep_extra=_stats_extra)


def _finder_checks(nat, run, checks, figs):
    r, n = run.get("result") or {}, nat.get("result") or {}
    figs["found_native_traced"] = [n.get("found"), r.get("found")]
    figs["uncaught"] = r.get("uncaught")
    checks["caught_out_of_memory_error"] = any(x[1] == "oom" for x in r.get("tries", []))
    checks["recovered_after_empty_cache"] = bool(r.get("recovered")) and bool(r.get("losses_finite"))
    f, g = n.get("found") or 0, r.get("found") or 0
    # Natively torch's memory fraction caps its allocator only; gpuheap's limit counts what the
    # process takes through it, cuBLAS's workspace included: one doubling apart at most.
    checks["found_within_one_doubling"] = bool(f and g) and max(f, g) <= 2 * min(f, g)
    if run.get("traces") and not run["traces"][0].get("error"):
        checks["oom_recorded"] = gh.Trace(trace_of(run)).count("oom") > 0


def case_batch_size_finder(ctx):
    """Doubles the batch until torch.cuda.OutOfMemoryError under `--limit 2GiB` (natively: torch's
    per-process memory fraction at 2 GiB), catches it, empty_cache(), trains on."""
    env = {"COMPAT_MEMORY_CAP": str(LIMIT)}
    nat = native(ctx, "bs_finder", env=env)
    if skipped(nat):
        return "SKIP", {"verdict": "SKIP", "reason": skipped(nat), "native": nat}
    ok_native = (nat.get("result") or {}).get("recovered")
    lim = ("--limit", f"{LIMIT}b")
    trc = traced(ctx, "batch_size_finder", "bs_finder", run_opts=lim)
    checks, figs = outputs_same(nat, trc, ())
    checks.update(trace_checks(trc))
    checks["native_run_found_a_batch"] = bool(ok_native)
    _finder_checks(nat, trc, checks, figs)
    details = {"native": nat, "traced": trc, "figures": figs}
    remedy = None
    if not all(checks.values()):
        keep = traced(ctx, "batch_size_finder", "bs_finder", tag="keep", run_opts=("--framework-pools=keep", *lim))
        remedy, kfigs = outputs_same(nat, keep, ())
        remedy.update(trace_checks(keep))
        _finder_checks(nat, keep, remedy, kfigs)
        details.update(keep=keep, keep_figures=kfigs, keep_checks=remedy)
    return finish(details, checks, "oom_type", remedy)


def _host_allocs(nat, trc, checks, figs):
    figs["host_allocations"] = sum(t.get("host_allocations", 0) for t in trc["traces"])


def case_dataloader_workers_pin(ctx):
    return simple_case(ctx, "dataloader_workers_pin", "dataloader", peak=True, extra=_host_allocs)


def _two_processes(nat, trc, checks, figs):
    with_gpu = [t for t in trc["traces"] if t.get("gpu_allocations")]
    figs["traces_with_gpu_allocations"] = len(with_gpu)
    checks["both_ranks_traced"] = len(with_gpu) >= 2


def case_mp_spawn(ctx):
    return simple_case(ctx, "mp_spawn", "spawn", min_traces=2, extra=_two_processes)


def case_hf_gpt2(ctx):
    return simple_case(ctx, "hf_gpt2", "hf_gpt2", peak=True)


def case_hf_llama(ctx):
    return simple_case(ctx, "hf_llama", "hf_llama", peak=True)


def case_lightning(ctx):
    return simple_case(ctx, "lightning", "lightning")


def case_jax_flax(ctx):
    return simple_case(ctx, "jax_flax", "jax")


def _numba_counts(nat, trc, checks, figs):
    if trc["traces"] and not trc["traces"][0].get("error"):
        t = gh.Trace(trace_of(trc))
        n = sum(t.count("alloc", kind=k) for k in DEVICE_KINDS)
        figs["device_allocations_traced"] = n
        checks["every_device_array_seen"] = n >= ((trc.get("result") or {}).get("device_arrays") or 1)


def case_numba(ctx):
    return simple_case(ctx, "numba", "numba", keys=("sums",), extra=_numba_counts)


def _cupy_counts(nat, trc, checks, figs):
    if trc["traces"] and not trc["traces"][0].get("error"):
        t = gh.Trace(trace_of(trc))
        n = sum(t.count("alloc", kind=k) for k in DEVICE_KINDS)
        figs["device_allocations_traced"] = n
        if not (trc.get("result") or {}).get("pool"):
            checks["every_array_seen"] = n >= ((trc.get("result") or {}).get("arrays_at_least") or 1)


def case_cupy_pool(ctx):
    return simple_case(ctx, "cupy_pool", "cupy_pool", keys=("sums",), extra=_cupy_counts)


def case_cupy_nopool(ctx):
    return simple_case(ctx, "cupy_nopool", "cupy_nopool", keys=("sums",), extra=_cupy_counts)


def case_train_baseline(ctx):
    """The plain loop the other torch cases build on: must PASS, peak included."""
    return simple_case(ctx, "train_baseline", "train", peak=True)


CASES = [("compat.train_baseline", case_train_baseline), ("compat.torch_compile", case_torch_compile),
         ("compat.torch_compile_reduce_overhead", case_torch_compile_reduce_overhead),
         ("compat.cuda_graphs", case_cuda_graphs), ("compat.alloc_conf_async", case_alloc_conf_async),
         ("compat.alloc_conf_expandable", case_alloc_conf_expandable),
         ("compat.torch_stats_adaptive", case_torch_stats_adaptive),
         ("compat.batch_size_finder", case_batch_size_finder),
         ("compat.dataloader_workers_pin", case_dataloader_workers_pin), ("compat.mp_spawn", case_mp_spawn),
         ("compat.hf_gpt2", case_hf_gpt2), ("compat.hf_llama", case_hf_llama), ("compat.lightning", case_lightning),
         ("compat.jax_flax", case_jax_flax), ("compat.numba", case_numba), ("compat.cupy_pool", case_cupy_pool),
         ("compat.cupy_nopool", case_cupy_nopool)]
