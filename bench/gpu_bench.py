"""GPU benchmarks, side by side in one run (writes one JSON document):

1. Training step time of the ~200-allocations/step model (tests/gpu/torch_job.py --model mlp):
   native caching allocator; PYTORCH_NO_CUDA_MEMORY_CACHING=1 under gpuheap (pool on; native + Python
   stacks, native stacks only, no stacks); NO_CACHING without gpuheap. Rounds interleave the configurations; the median over rounds of
   each run's median step time is reported. Peak reserved: gpuheap pool vs torch's caching allocator.
2. Allocation latency from C++: a ring of 64 live blocks of mixed sizes (512 B..4 MiB), each
   iteration frees the oldest and allocates one, through c10::cuda::CUDACachingAllocator::raw_alloc/
   raw_delete and through cudaMalloc/cudaFree, in the same process (natively and under gpuheap).

   python bench/gpu_bench.py --out bench/results/gpu-DATE.json
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import gh  # noqa: E402

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


def step_configs():
    nc = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    return [("native_caching", {}, None), ("nocache_raw", nc, None),
            ("nocache_gpuheap_stacks", nc, {"GPUHEAP_STACKS": "1"}),
            ("nocache_gpuheap_native_stacks", nc, {"GPUHEAP_STACKS": "1", "GPUHEAP_PYTHON_STACKS": "0"}),
            ("nocache_gpuheap_nostacks", nc, {"GPUHEAP_STACKS": "0"})]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--work", default="/tmp/gpuheap-bench")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    job = os.path.join(ROOT, "tests", "gpu", "torch_job.py")
    runs = {name: [] for name, _, _ in step_configs()}
    extra = {}
    for r in range(a.rounds):
        for name, env, ghv in step_configs():
            tr = os.path.join(a.work, f"{name}.{r}.trace") if ghv is not None else None
            rc, out, err, _ = gh.run([gh.PY, job, "--model", "mlp", "--warmup", "30", "--steps", str(a.steps)], env=env,
                                     trace=tr, gpuheap=ghv, timeout=300)
            if rc != 0:
                raise SystemExit(f"{name}: exited {rc}: {err[-2000:]}")
            j = gh.last_json(out)
            runs[name].append(j["step_ms_median"])
            if r == 0 and name == "native_caching":
                extra["torch_max_reserved"] = j["max_memory_reserved"]
                extra["losses_native"] = j["losses"]
            if r == 0 and name == "nocache_gpuheap_stacks":
                s = gh.summary_json(tr)
                extra["gpuheap_pool_reserved_peak"] = gh.gpu_device(s)["reserved_bytes"]["peak"]
                extra["gpuheap_allocs_per_step"] = gh.gpu_device(s)["allocations"]["allocated"] / (a.steps + 30)
                extra["losses_gpuheap"] = j["losses"]
            if tr and os.path.exists(tr):
                os.unlink(tr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = med["native_caching"]
    step = {"rounds": a.rounds, "steps_timed": a.steps, "step_ms_per_round": runs, "step_ms_median": med,
            "ratio_vs_native": {k: v / base for k, v in med.items()},
            "ratio_vs_nocache_raw": {k: v / med["nocache_raw"] for k, v in med.items()},
            "torch_max_reserved": extra.get("torch_max_reserved"),
            "gpuheap_pool_reserved_peak": extra.get("gpuheap_pool_reserved_peak"),
            "gpuheap_allocs_per_step": extra.get("gpuheap_allocs_per_step"),
            "losses_identical": extra.get("losses_native") == extra.get("losses_gpuheap")}

    with open(a.out, "w") as f:  # the step-time part survives a latency run cut short
        json.dump({"schema": "gpuheap.gpu-bench/1", "date": datetime.date.today().isoformat(), "step_time": step}, f,
                  indent=1)
    print(json.dumps({"step_ms_median": med, "ratio_vs_native": step["ratio_vs_native"]}), flush=True)

    # allocation latency: build natively once (so no compiler runs under the preload), then time
    src = os.path.join(a.work, "lat.cpp")
    drv = os.path.join(a.work, "lat.py")
    bdir = os.path.join(a.work, "ext")
    os.makedirs(bdir, exist_ok=True)
    open(src, "w").write(LAT_SRC)
    open(drv, "w").write(LAT_DRIVER)
    lat = {}
    for name, ghv, n_cuda in (("native", None, 20000), ("gpuheap_nostacks", {"GPUHEAP_STACKS": "0"}, 200000),
                              ("gpuheap_stacks", {"GPUHEAP_STACKS": "1"}, 200000)):
        tr = os.path.join(a.work, f"lat_{name}.trace") if ghv is not None else None
        rc, out, err, _ = gh.run([gh.PY, drv, src, bdir, "200000", str(n_cuda)], trace=tr, gpuheap=ghv, timeout=400)
        if rc != 0:
            lat[name] = {"error": err[-2000:]}
            continue
        j = gh.last_json(out)
        lat[name] = {k: min(v) for k, v in j.items()}
        lat[name]["runs"] = j
    doc = {"schema": "gpuheap.gpu-bench/1", "date": datetime.date.today().isoformat(),
           "versions": _versions(), "step_time": step, "alloc_latency": lat}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({"step_ms_median": med, "ratio_vs_native": step["ratio_vs_native"], "alloc_latency": {
        k: {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in lat.items()},
        "reserved": [step["torch_max_reserved"], step["gpuheap_pool_reserved_peak"]]}, indent=1))


def _versions():
    v = {}
    v["commit"] = gh.commit()
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True)
    v["gpu"] = p.stdout.strip()
    p = subprocess.run([gh.PY, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], capture_output=True,
                       text=True)
    v["torch_cuda"] = p.stdout.strip()
    return v


if __name__ == "__main__":
    main()
