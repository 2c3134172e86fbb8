"""GPU benchmark: the training-step cost of gpuheap beside what a PyTorch user would pick instead
(writes one JSON document).

1. Step time, side by side in one run. Each round runs every configuration once on each job,
   as its own process, in an order rotated from round to round; each run reports its median
   step time, and each configuration's ratio is taken against the native run of the same round
   and job (so a slow stretch of the machine moves both). Reported per job and configuration:
   the median of the per-round ratios, their min/max and quartiles.
   Configurations:
     native_caching         torch's caching allocator, nothing recording
     torch_history_default  torch.cuda.memory._record_memory_history() with its defaults
                            (C++ + Python stacks), turned on in-process (torch_job.py --torch-history)
     torch_history_python   the same with stacks="python"
     gpuheap_default        `gpuheap run` (framework pools off: PyTorch without its cache; native + Python stacks)
     gpuheap_native_stacks  `gpuheap run` with GPUHEAP_PYTHON_STACKS=0 (run has no option for it)
     gpuheap_no_stacks      `gpuheap run --no-stacks`
     gpuheap_no_stack_cache (optional) the default with GPUHEAP_STACK_CACHE=0: what the stack cache saves
     gpuheap_base           (optional) the default run by another gpuheap CLI, --base-cli (an earlier
                            build, e.g. an unpacked older wheel's gpuheap/bin/gpuheap): before and after
                            a change in the same rounds
     gpuheap_keep           `gpuheap run --framework-pools=keep` (torch's cache kept: gpuheap sees its segments)
     native_again           (optional) a second native run per round: the machine's own noise floor
     nocache_raw            (optional) PYTORCH_NO_CUDA_MEMORY_CACHING=1 without gpuheap
   `gpuheap run` is the CLI itself (not a hand-made LD_PRELOAD), with -q --no-symbolize
   --no-compress: the finishing step runs after the job has exited and cannot change its step
   times, so it is skipped to keep rounds short.
   Jobs: tests/gpu/torch_job.py --model mlp (12 x Linear 1024, AdamW, ~200 allocations/step) and
   --model gpt2 (transformers' GPT2LMHeadModel from a config, no weights; AdamW).
2. (--latency) Allocation latency from C++: a ring of 64 live blocks of mixed sizes (512 B..4 MiB),
   each iteration frees the oldest and allocates one, through c10::cuda::CUDACachingAllocator::
   raw_alloc/raw_delete and through cudaMalloc/cudaFree, in the same process (natively and under gpuheap).

   python bench/gpu_bench.py --out bench/results/            (named gpu-bench-DATE-COMMIT-CARD.json)
   python bench/gpu_bench.py --dry-run                       (prints the plan of runs, runs nothing)
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import gh  # noqa: E402

JOB = os.path.join(ROOT, "tests", "gpu", "torch_job.py")
JOBS = {"mlp": ["--model", "mlp"], "gpt2": ["--model", "gpt2"]}
NC = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
# name -> (gpuheap run options, or None for no gpuheap; extra environment; extra torch_job.py arguments)
CONFIGS = {
    "native_caching": (None, {}, []),
    "torch_history_default": (None, {}, ["--torch-history", "default"]),
    "torch_history_python": (None, {}, ["--torch-history", "python"]),
    "gpuheap_default": ([], {}, []),
    "gpuheap_native_stacks": ([], {"GPUHEAP_PYTHON_STACKS": "0"}, []),
    "gpuheap_no_stack_cache": ([], {"GPUHEAP_STACK_CACHE": "0"}, []),
    "gpuheap_base": ([], {}, []),
    "gpuheap_no_stacks": (["--no-stacks"], {}, []),
    "gpuheap_keep": (["--framework-pools=keep"], {}, []),
    "native_again": (None, {}, []),
    "nocache_raw": (None, NC, []),
}
DEFAULT_CONFIGS = ["native_caching", "torch_history_default", "torch_history_python", "gpuheap_default",
                   "gpuheap_native_stacks", "gpuheap_no_stacks", "gpuheap_keep"]
BASE = "native_caching"
# issue 36's targets: (configuration, the most its median ratio may be)
TARGETS = [("gpuheap_default", 1.03), ("gpuheap_no_stacks", 1.01)]

LAT_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <chrono>
#include <vector>

// Same ring pattern for both allocators: 64 live blocks, sizes cycling over a fixed mix.
static size_t size_of(int64_t i) {
  static const size_t mix[] = {512, 4096, 65536, 1 << 20, 3000, 262144, 4 << 20, 12288};
  return mix[i % 8] + size_t(i % 5) * 512;
}
double torch_raw(int64_t n) {
  std::vector<void*> ring(64, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    void*& slot = ring[i % 64];
    if (slot) c10::cuda::CUDACachingAllocator::raw_delete(slot);
    slot = c10::cuda::CUDACachingAllocator::raw_alloc(size_of(i));
  }
  auto t1 = std::chrono::steady_clock::now();
  for (void* p : ring) if (p) c10::cuda::CUDACachingAllocator::raw_delete(p);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
double cuda_pair(int64_t n) {
  std::vector<void*> ring(64, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    void*& slot = ring[i % 64];
    if (slot) cudaFree(slot);
    if (cudaMalloc(&slot, size_of(i)) != cudaSuccess) return -1;
  }
  auto t1 = std::chrono::steady_clock::now();
  for (void* p : ring) if (p) cudaFree(p);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
"""

LAT_DRIVER = r"""
import json, sys, torch
from torch.utils.cpp_extension import load_inline
src = open(sys.argv[1]).read()
ext = load_inline("gpuheap_lat", cpp_sources=src, functions=["torch_raw", "cuda_pair"], with_cuda=True,
                  build_directory=sys.argv[2], verbose=False)
torch.cuda.init(); torch.empty(1, device="cuda")
n_raw, n_cuda = int(sys.argv[3]), int(sys.argv[4])
ext.torch_raw(20000); ext.cuda_pair(min(n_cuda, 2000))  # warm both paths
r = {"torch_raw_alloc_ns_per_op": [ext.torch_raw(n_raw) for _ in range(3)],
     "cudaMalloc_ns_per_op": [ext.cuda_pair(n_cuda) for _ in range(3)]}
print(json.dumps(r), flush=True)
"""


def command(cfg, job, warmup, steps, trace, base_cli=None):
    """The command line of one run; a gpuheap configuration is `gpuheap run` around the job."""
    ghopts, _, jobargs = CONFIGS[cfg]
    cmd = [gh.PY, JOB, *JOBS[job], "--warmup", str(warmup), "--steps", str(steps), *jobargs]
    if ghopts is None:
        return cmd
    cli = base_cli if cfg == "gpuheap_base" else gh.CLI
    return [cli, "run", "-q", "--no-symbolize", "--no-compress", "--force", "-o", trace, *ghopts, "--", *cmd]


def round_plan(r, configs, jobs):
    """(job, configuration) pairs of round r: the configurations rotated by r, the jobs' order
    alternating, so that no configuration always runs first or right after another."""
    k = r % len(configs)
    order = configs[k:] + configs[:k]
    return [(job, cfg) for job in (jobs if r % 2 == 0 else jobs[::-1]) for cfg in order]


def run_one(a, r, job, cfg):
    tr = os.path.join(a.work, f"{job}.{cfg}.{r}.trace") if CONFIGS[cfg][0] is not None else None
    rec = {"round": r, "job": job, "config": cfg}
    rc, out, err, dt = gh.run(command(cfg, job, a.warmup, a.steps, tr, a.base_cli), env=CONFIGS[cfg][1], timeout=a.run_timeout)
    rec.update(rc=rc, wall_s=round(dt, 2))
    try:
        j = gh.last_json(out) if rc == 0 else None
    except ValueError:
        j = None
    if j is None:
        rec["error"] = (err or out)[-1500:]
    else:
        rec.update(step_ms_median=j["step_ms_median"], step_ms_min=j["step_ms_min"], step_ms_q1=j.get("step_ms_q1"),
                   losses=j["losses"],
                   max_memory_reserved=j.get("max_memory_reserved"))
        if j.get("gpuheap_stack_stats"):  # cache hits and walks: where a stack's cost comes from
            rec["gpuheap_stack_stats"] = j["gpuheap_stack_stats"]
        if CONFIGS[cfg][2]:  # torch's recorder: proof that it was on, and the signature that was called
            rec.update(torch_history_on=j.get("torch_history_on"),
                       record_memory_history_signature=j.get("record_memory_history_signature"))
    if tr and os.path.exists(tr):
        rec["trace_bytes"] = os.path.getsize(tr)
        if j is not None and r == 0 and cfg == "gpuheap_default":
            try:
                dev = gh.gpu_device(gh.summary_json(tr))
                rec["allocs_per_step"] = dev["allocations"]["allocated"] / (a.warmup + a.steps)
                rec["gpuheap_reserved_peak"] = dev["reserved_bytes"]["peak"]
            except (RuntimeError, KeyError, ValueError) as e:
                rec["summary_error"] = str(e)[-500:]
        os.unlink(tr)
    return rec


def hit_shares(records, job, cfg):
    """Each run's stacks served by the stack cache, as a share of the stacks it took: a stack
    cost that does not fall with the cache on is a cache that misses."""
    return [x["gpuheap_stack_stats"]["cache_hits"] / x["gpuheap_stack_stats"]["captures"] for x in records
            if x["job"] == job and x["config"] == cfg and (x.get("gpuheap_stack_stats") or {}).get("captures")]


def stack_line(st):
    """gpuheap's stack counters of a run, short: where its stacks' cost went."""
    if not st:
        return ""
    failed = sum(v for k, v in st.items() if k.startswith("fill_failed"))
    return (f" stacks={st['captures']} hits={st['cache_hits']} walks={st['walks']} rewalks={st['rewalks']}"
            f" fills={st['fills']} waits={st['fill_waits']} failed={failed} stale={st['cache_stale']}")


def spread(vals):
    """Median, min/max and quartiles of a list (None for an empty one)."""
    if not vals:
        return None
    s = sorted(vals)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "q1": q[0], "q3": q[2], "n": len(s)}


def verdict(ratios, limit):
    """A target is met or missed only where every round agrees; otherwise the machine's spread
    is larger than the margin and the run cannot tell."""
    if not ratios:
        return "unknown"
    if max(ratios) <= limit:
        return "met"
    if min(ratios) > limit:
        return "missed"
    return "unresolved: the rounds straddle the target"


def per_job(records, job, configs):
    """Per-round step times and ratios of one job against the same round's native run."""
    by = {(x["round"], x["config"]): x for x in records if x["job"] == job}
    rounds = sorted({x["round"] for x in records if x["job"] == job})
    step = {c: [by[(r, c)].get("step_ms_median") for r in rounds if (r, c) in by] for c in configs}
    ratio = {}
    for c in configs:
        ratio[c] = [by[(r, c)]["step_ms_median"] / by[(r, BASE)]["step_ms_median"] for r in rounds
                    if by.get((r, c), {}).get("step_ms_median") and by.get((r, BASE), {}).get("step_ms_median")]
    def paired(c, d):  # c's step time over d's, round by round
        return [by[(r, c)]["step_ms_median"] / by[(r, d)]["step_ms_median"] for r in rounds
                if by.get((r, c), {}).get("step_ms_median") and by.get((r, d), {}).get("step_ms_median")]

    def ratios_of(key):  # each run's `key` step statistic over the same round's native run
        return {c: spread([by[(r, c)][key] / by[(r, BASE)][key] for r in rounds
                           if by.get((r, c), {}).get(key) and by.get((r, BASE), {}).get(key)]) for c in configs}

    vs_torch = {c: {d: spread(paired(c, d)) for d in configs if d.startswith("torch_history")}
                for c in configs if c.startswith("gpuheap")}
    first = {c: next((by[(r, c)] for r in rounds if by.get((r, c), {}).get("losses")), None) for c in configs}
    base_losses = (first.get(BASE) or {}).get("losses")
    out = {"rounds": rounds, "step_ms_per_round": step, "ratio_per_round": ratio,
           "ratio": {c: spread(v) for c, v in ratio.items()}, "vs_torch_history": vs_torch,
           "ratio_of_step_q1": ratios_of("step_ms_q1"), "ratio_of_step_min": ratios_of("step_ms_min"),
           "gpuheap_default_over_torch_history_default_per_round": paired("gpuheap_default", "torch_history_default")
           if {"gpuheap_default", "torch_history_default"} <= set(configs) else [],
           "step_ms": {c: spread([x for x in v if x is not None]) for c, v in step.items()},
           "losses_identical_vs_native": {c: (f["losses"] == base_losses) if f and base_losses else None
                                          for c, f in first.items() if c != BASE},
           "torch_history_on": {c: f.get("torch_history_on") for c, f in first.items()
                                if f and CONFIGS[c][2]},
           "trace_bytes_median": {c: statistics.median(v) for c in configs
                                  if (v := [x["trace_bytes"] for x in records if x["job"] == job and
                                            x["config"] == c and "trace_bytes" in x])},
           "errors": [{k: x[k] for k in ("round", "config", "rc", "error")} for x in records
                      if x["job"] == job and "error" in x]}
    out["stack_cache_hit_share"] = {c: spread(v) for c in configs if (v := hit_shares(records, job, c))}
    d = by.get((0, "gpuheap_default"), {})
    out["gpuheap_allocs_per_step"] = d.get("allocs_per_step")
    out["gpuheap_reserved_peak"] = d.get("gpuheap_reserved_peak")
    out["torch_max_reserved"] = by.get((0, BASE), {}).get("max_memory_reserved")
    return out


def targets(step):
    res = {}
    for job, s in step.items():
        t = {}
        for cfg, limit in TARGETS:
            v = s["ratio_per_round"].get(cfg, [])
            t[f"{cfg} <= {limit}x native"] = {"median": statistics.median(v) if v else None, "verdict": verdict(v, limit)}
        # below torch's own recorder, per round (same round, same machine state)
        rel = s["gpuheap_default_over_torch_history_default_per_round"]
        if rel:
            t["gpuheap_default < torch_history_default"] = {"ratio": spread(rel), "verdict": verdict(rel, 1.0)}
        res[job] = t
    return res


def versions():
    v = {"commit": gh.commit()}
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True)
    v["gpu"] = p.stdout.strip()
    p = subprocess.run([gh.PY, "-c", "import torch, transformers; print(torch.__version__, torch.version.cuda, "
                        "transformers.__version__)"], capture_output=True, text=True)
    v["torch_cuda_transformers"] = p.stdout.strip() or p.stderr.strip()[-300:]
    return v


def card(gpu):
    for name in ("H100", "H200", "B200", "A100"):
        if name in gpu:
            return name.lower()
    return "".join(ch for ch in gpu.split(",")[0].lower() if ch.isalnum()) or "unknown"


def out_path(a, v, date):
    if a.out.endswith("/") or os.path.isdir(a.out):
        return os.path.join(a.out, f"gpu-bench-{date}-{v['commit']}-{card(v['gpu'])}.json")
    return a.out


def write(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def print_plan(a, configs, jobs):
    for r in range(a.rounds):
        for job, cfg in round_plan(r, configs, jobs):
            env = " ".join(f"{k}={v}" for k, v in CONFIGS[cfg][1].items())
            tr = os.path.join(a.work, f"{job}.{cfg}.{r}.trace") if CONFIGS[cfg][0] is not None else None
            print(f"round {r} {job:5} {cfg:22} {env + ' ' if env else ''}{' '.join(command(cfg, job, a.warmup, a.steps, tr, a.base_cli))}")
    print(f"{a.rounds * len(configs) * len(jobs)} runs; ratios against {BASE} of the same round and job")


def combine(a, files):
    """One result from the runs of several result files of the same commit, card and
    configurations (calls cut short by the device's per-call limit), rounds renumbered in
    file order; the statistics recomputed over all of them."""
    docs = [json.load(open(f)) for f in files]
    keys = {(d["versions"]["commit"], d["card"], tuple(d["settings"]["configs"]), tuple(d["settings"]["jobs"]),
             d["settings"]["steps_timed"], d["settings"]["warmup"]) for d in docs}
    if len(keys) != 1:
        raise SystemExit(f"--combine: the files differ in commit, card, configurations, jobs or steps: {keys}")
    records, base = [], 0
    for f, d in zip(files, docs):
        rounds = sorted({x["round"] for x in d["runs"]})
        records += [dict(x, round=base + rounds.index(x["round"]), source=os.path.basename(f)) for x in d["runs"]]
        base += len(rounds)
    first = docs[0]
    jobs, configs = first["settings"]["jobs"], first["settings"]["configs"]
    step = {job: per_job(records, job, configs) for job in jobs}
    doc = dict(first, step_time=step, targets=targets(step), runs=records,
               settings=dict(first["settings"], rounds_done=base, combined_from=[os.path.basename(f) for f in files],
                             seconds=sum(d["settings"]["seconds"] for d in docs), stopped=None))
    path = out_path(a, first["versions"], first["date"])
    write(path, doc)
    print(json.dumps(doc["targets"], indent=1))
    print(f"written: {path}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results") + "/",
                    help="JSON file, or a directory (named gpu-bench-DATE-COMMIT-CARD.json there)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--jobs", default="mlp,gpt2")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"from: {','.join(CONFIGS)}")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no round that would end past this many seconds (the longest round so far as its "
                         "estimate); 0: no limit")
    ap.add_argument("--run-timeout", type=int, default=180)
    ap.add_argument("--latency", action="store_true", help="also the C++ allocation-latency part")
    ap.add_argument("--work", default="/tmp/gpuheap-bench")
    ap.add_argument("--base-cli", help="the gpuheap CLI of configuration gpuheap_base")
    ap.add_argument("--dry-run", action="store_true", help="print the plan of runs and exit")
    ap.add_argument("--combine", nargs="+", metavar="RESULT",
                    help="merge the runs of these result files (same commit, card, settings) into one and exit")
    a = ap.parse_args()
    if a.combine:
        return combine(a, a.combine)
    jobs, configs = a.jobs.split(","), a.configs.split(",")
    bad = [j for j in jobs if j not in JOBS] + [c for c in configs if c not in CONFIGS]
    if bad or BASE not in configs or a.rounds < 1:
        ap.error(f"unknown job/configuration {bad}, or {BASE} missing, or no rounds")
    configs = [BASE] + [c for c in configs if c != BASE]
    if "gpuheap_base" in configs and not (a.base_cli and os.access(a.base_cli, os.X_OK)):
        ap.error("gpuheap_base needs --base-cli, an executable gpuheap CLI")
    if a.dry_run:
        print_plan(a, configs, jobs)
        return 0
    os.makedirs(a.work, exist_ok=True)
    v = versions()
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    path = out_path(a, v, date)
    t0, longest, records, stopped = time.monotonic(), 0.0, [], None
    for r in range(a.rounds):
        if a.budget_s and time.monotonic() - t0 + longest > a.budget_s:
            stopped = f"round {r} not started: {time.monotonic() - t0:.0f} s spent, the longest round took {longest:.0f} s"
            print(stopped, flush=True)
            break
        tr0 = time.monotonic()
        for job, cfg in round_plan(r, configs, jobs):
            rec = run_one(a, r, job, cfg)
            records.append(rec)
            print(f"round {r} {job:5} {cfg:22} rc={rec['rc']} step_ms={rec.get('step_ms_median')} "
                  f"wall={rec['wall_s']}s" + stack_line(rec.get("gpuheap_stack_stats")) +
                  (f" ERROR {rec['error'][-300:]!r}" if "error" in rec else ""), flush=True)
        longest = max(longest, time.monotonic() - tr0)
        step = {job: per_job(records, job, configs) for job in jobs}
        doc = {"schema": "gpuheap.gpu-bench/2", "date": date, "versions": v, "card": card(v["gpu"]),
               "settings": {"rounds_planned": a.rounds, "rounds_done": r + 1, "steps_timed": a.steps,
                            "warmup": a.warmup, "jobs": jobs, "configs": configs, "budget_s": a.budget_s,
                            "gpuheap_run": "gpuheap run -q --no-symbolize --no-compress --force -o TRACE [opts] -- JOB",
                            "base_cli": base_version(a.base_cli) if "gpuheap_base" in configs else None,
                            "seconds": round(time.monotonic() - t0, 1), "stopped": stopped},
               "step_time": step, "targets": targets(step),
               "runs": [{k: x for k, x in rec.items() if k != "losses"} for rec in records]}
        write(path, doc)  # after every round: a run cut short keeps the rounds it finished
    doc["settings"]["stopped"] = stopped
    if a.latency:
        doc["alloc_latency"] = latency(a)
    write(path, doc)
    print(json.dumps({job: {c: (s["ratio"][c] or {}).get("median") for c in configs} for job, s in step.items()},
                     indent=1))
    print(json.dumps(doc["targets"], indent=1))
    print(f"written: {path}", flush=True)
    failed = [x for x in records if "error" in x]
    if failed:
        print(f"{len(failed)} of {len(records)} runs failed (their errors are in the JSON)", flush=True)
    return 1 if failed else 0


def base_version(cli):
    """What gpuheap_base ran: the CLI's path and its --version line."""
    r = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30)
    return {"path": cli, "version": (r.stdout or r.stderr).strip()}


def latency(a):
    """C++ allocation latency: build natively once (so no compiler runs under the preload), then time."""
    src = os.path.join(a.work, "lat.cpp")
    drv = os.path.join(a.work, "lat.py")
    bdir = os.path.join(a.work, "ext")
    os.makedirs(bdir, exist_ok=True)
    with open(src, "w") as f:
        f.write(LAT_SRC)
    with open(drv, "w") as f:
        f.write(LAT_DRIVER)
    lat = {}
    for name, ghv, n_cuda in (("native", None, 20000), ("gpuheap_nostacks", {"GPUHEAP_STACKS": "0"}, 200000),
                              ("gpuheap_stacks", {"GPUHEAP_STACKS": "1"}, 200000)):
        tr = os.path.join(a.work, f"lat_{name}.trace") if ghv is not None else None
        rc, out, err, _ = gh.run([gh.PY, drv, src, bdir, "200000", str(n_cuda)], trace=tr, gpuheap=ghv, timeout=400)
        if tr and os.path.exists(tr):
            os.unlink(tr)
        if rc != 0:
            lat[name] = {"error": err[-2000:]}
            continue
        j = gh.last_json(out)
        lat[name] = {k: min(v) for k, v in j.items()}
        lat[name]["runs"] = j
    return lat


if __name__ == "__main__":
    sys.exit(main())
