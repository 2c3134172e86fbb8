"""Issue 38: the wheel installed into a venv (scripts/gpu-test.sh) on the GPU machine. A PyTorch
job marked with `import gpuheap` (a mark and a range per step) traced by the venv's `gpuheap`
console script: the markers are phases of the trace, gpuheap.stats() inside the job covers
what AdamW keeps live, and `python -m gpuheap` is the same CLI."""
import json
import os

import gh

JOB = r'''
import json, torch, gpuheap
assert gpuheap.active(), "gpuheap.active() is False under gpuheap run"
gpuheap.mark("start")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    with gpuheap.phase("step"):
        x = torch.randn(256, 1024, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
dev = torch.cuda.current_device()
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "gpuheap" in l.split()[-1]})
print(json.dumps({"stats": gpuheap.stats(dev), "device": dev, "maps": maps,
                  "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                  "trace": gpuheap.trace_path()}))
'''


def case_wheel(ctx):
    if gh.WHEEL is None:
        raise RuntimeError(f"{gh.PY} has no installed gpuheap wheel (scripts/gpu-test.sh installs it into a venv)")
    console = os.path.join(os.path.dirname(gh.PY), "gpuheap")
    if not os.access(console, os.X_OK):
        raise RuntimeError(f"no console script {console}")
    d = os.path.join(ctx.work, "wheel_case")
    os.makedirs(d, exist_ok=True)
    job = os.path.join(d, "marked_job.py")
    with open(job, "w") as f:
        f.write(JOB)
    raw = os.path.join(d, "marked.trace")
    for p in (raw, raw + ".zst"):
        if os.path.exists(p):
            os.unlink(p)
    rc, out, err, dt = gh.run([console, "run", "-o", raw, "--", gh.PY, job], timeout=300)
    if rc != 0:
        raise RuntimeError(f"{console} run exited {rc}: {err[-3000:]}")
    j = gh.last_json(out)
    src, sout, serr, _ = gh.run([console, "summary", "--json", raw + ".zst"], timeout=300)
    if src != 0:
        raise RuntimeError(f"{console} summary exited {src}: {serr[-2000:]}")
    doc = json.loads(sout)
    phases = doc.get("phases", [])
    steps = [p for p in phases if p["name"] == "step" and p["kind"] == "range"]
    rcv, vout, _, _ = gh.run([gh.PY, "-m", "gpuheap", "--version"])
    stats = j.get("stats") or {}
    checks = {
        "run_rc": rc == 0, "summary_rc": src == 0,
        "mark_start": any(p["name"] == "start" and p["kind"] == "mark" for p in phases),
        "three_steps": len(steps) == 3,
        "steps_allocate": all(p["devices"] and p["devices"][0]["peak_requested"] > 0 for p in steps),
        # NO_CACHING (gpuheap run's default): every tensor is a cudaMalloc gpuheap counts, and
        # torch's own statistics read 0. At opt.step parameters, gradients and AdamW's two
        # moments are live (4x the parameters); after it, three of them.
        "stats_peak_covers_adamw": stats.get("requested_peak_bytes", 0) >= 4 * j.get("param_bytes", 1 << 62),
        "stats_now_covers_adamw": stats.get("requested_bytes", 0) >= 3 * j.get("param_bytes", 1 << 62),
        "python_m_version": rcv == 0 and vout.strip() == gh.WHEEL.__version__,
        # The job loaded the wheel's preload and its bundled unwinder (the GPU machine has no
        # libunwind of its own), not a build tree's.
        "preload_of_the_wheel": os.path.realpath(gh.WHEEL.preload_path()) in j.get("maps", []),
        "unwinder_of_the_wheel": os.path.join(os.path.dirname(os.path.realpath(gh.WHEEL.preload_path())),
                                              "libunwind-gpuheap.so.8") in j.get("maps", []),
    }
    res = {"console": console, "seconds": round(dt, 1), "steps": len(steps), "stats": stats,
           "param_bytes": j.get("param_bytes"), "version": vout.strip(), "maps": j.get("maps"), "commit": gh.WHEEL.build_commit(),
           "checks": checks}
    return all(checks.values()), res
