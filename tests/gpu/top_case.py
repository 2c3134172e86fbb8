"""Issue 37 on a real GPU: `gpuheap top --interval 0.25 --json` beside a PyTorch training job
shows, while the job runs, the rise of the optimizer state on the first step and a flat line
after it.

The job: torch_job.py --model mlp (12 x Linear(1024), AdamW) with NVTX ranges (step > forward,
backward, optimizer_step) and a pause after each step, under gpuheap with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor one cudaMalloc, so requested bytes are the
tensors' own). top follows the trace's directory, started before the job. Passes when:
- top saw the job running (lines before the last) and ended by itself with "process ended";
- its step is the job's "step" range, counted to the job's number of steps;
- the first step's growth (requested bytes at the start of step 2 minus those at the start of
  step 1) is at least the optimizer state the job reports (AdamW's exp_avg and exp_avg_sq on
  the GPU, summed by the job itself), and every later step's growth is within 1% of it
  around zero (flat) -- seen in a line written while the job was still running;
- the last line's device figures equal `gpuheap summary --json` of the finished trace.
Written without a GPU at hand (the same checks run on the simulated runtime in ctest Top.*);
registered in run_all.py as case "top".
"""
import json
import os
import shutil
import subprocess
import time

import gh

STEPS = 16


def _growth(line, dev):
    for p in line.get("processes", []):
        for d in p["devices"]:
            if d["device"] == dev:
                return [s["growth"] for s in d["steps"]], p
    return [], None


def case_top(ctx, torch_job):
    d = os.path.join(ctx.work, "top_live")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    tr = os.path.join(d, "mlp_top.trace")
    top = subprocess.Popen([gh.CLI, "top", "--interval", "0.25", "--json", d], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    rc, out, err, _ = gh.run([gh.PY, torch_job, "--model", "mlp", "--steps", str(STEPS), "--nvtx", "--step-sleep",
                              "0.5"], env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, trace=tr, timeout=300)
    job_s = time.monotonic() - t0
    try:
        top_out, top_err = top.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        top.kill()
        raise RuntimeError("gpuheap top did not end within 60 s of the job's end")
    if rc != 0:
        raise RuntimeError(f"torch_job exited {rc}: {err[-3000:]}")
    job = gh.last_json(out)
    lines = [json.loads(x) for x in top_out.splitlines()]
    if top.returncode != 0 or not lines:
        raise RuntimeError(f"gpuheap top exited {top.returncode}: {top_err[-2000:]}")
    s = gh.summary_json(tr)
    want = gh.gpu_device(s)
    dev = want["device"]
    last = lines[-1]
    growth, proc = _growth(last, dev)
    running = [x for x in lines[:-1] if x["processes"] and x["processes"][0]["state"] == "running"]
    # The rise and the flat line as seen while the job ran: the last running line that knew a
    # later step's growth.
    live = [g for g in (_growth(x, dev)[0] for x in running) if len(g) >= 3 and g[1] is not None]
    live_growth = live[-1] if live else []
    opt_bytes = job["optimizer_state_bytes"]
    first = growth[0] if growth else None
    later = [g for g in growth[1:] if g is not None]
    flat = first is not None and later and all(abs(g) <= first // 100 for g in later)
    got = next(dd for dd in last["processes"][0]["devices"] if dd["device"] == dev)
    figures_equal = all(got[k][f] == want[k][f] for k in ("requested_bytes", "allocated_bytes", "reserved_bytes")
                        for f in ("current", "peak"))
    res = {"lines": len(lines), "running_lines": len(running), "job_seconds": round(job_s, 1),
           "param_bytes": job["param_bytes"], "optimizer_state_bytes": opt_bytes, "step_growth": growth,
           "step_growth_seen_live": live_growth, "step": proc["step"] if proc else None,
           "top_sites": [(x["label"], x["bytes"]) for x in last["processes"][0]["top_sites"][:5]],
           "final_requested": got["requested_bytes"], "summary_requested": want["requested_bytes"]}
    res["checks"] = {
        "seen_running": len(running) >= 3,
        "ended_by_itself": last.get("message") == "process ended" and "process ended" in top_err,
        "step_counted": bool(proc) and proc["step"] == {"name": "step", "number": STEPS},
        "first_step_rise_ge_optimizer_state": first is not None and opt_bytes > 0 and first >= opt_bytes,
        "flat_after": bool(flat),
        "rise_and_flat_seen_live": bool(live_growth) and live_growth[0] == first and
        all(g is None or abs(g) <= first // 100 for g in live_growth[1:]),
        "final_equals_summary": figures_equal,
    }
    return all(res["checks"].values()), res
