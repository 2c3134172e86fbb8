"""Issue 13 on a real GPU: gpuheap's torch-snapshot export of a PyTorch job is read by torch itself,
and its allocations agree with torch.cuda.memory._snapshot() of the same job run natively.

The GPT job runs twice: natively with the caching allocator recording its history (torch_job.py
--snapshot), and under gpuheap with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (each tensor one cudaMalloc,
the run case 1 already uses). Passes when torch.cuda._memory_viz's trace_plot, segment_plot, segsum
and trace all produce their output from gpuheap's export, and the allocations made through
libc10_cuda — in the trace and in the export alike — match torch's own `alloc` entries in number
and in sizes (rounded up to 512 B, the caching allocator's rounding, as multisets).

Written without a GPU at hand (the export is tested offline by tests/unit/test_export); registered
in run_all.py as case "torch_snapshot".
"""
import collections
import os
import pickle
import subprocess

import gh


def _round512(n):
    return max(512, (n + 511) // 512 * 512)


def case_torch_snapshot(ctx, torch_job, steps, device_kinds):
    from torch.cuda import _memory_viz as mv

    native = os.path.join(ctx.work, "gpt_native.snapshot.pickle")
    rc, out, err, _ = gh.run([gh.PY, torch_job, "--model", "gpt", "--steps", str(steps), "--snapshot", native],
                             timeout=300)
    if rc != 0:
        raise RuntimeError(f"native torch_job --snapshot exited {rc}: {err[-3000:]}")
    _, tr = ctx.torch("gpt_nocache", "gpt", env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    ours = os.path.join(ctx.work, "gpt_nocache.gpuheap-snapshot.pickle")
    p = subprocess.run([gh.CLI, "export", "-q", "--format", "torch-snapshot", "-o", ours, tr], capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"gpuheap export exited {p.returncode}: {p.stderr[-2000:]}")
    with open(ours, "rb") as f:
        raw = f.read()
    snap = pickle.loads(raw)
    res = {"export": ours, "export_bytes": len(raw), "pickle_protocol": raw[1]}

    # torch's own readers of a snapshot.
    viz = {}
    for name, fn in (("trace_plot", lambda s: mv.trace_plot(s)), ("segment_plot", lambda s: mv.segment_plot(s)),
                     ("segsum", mv.segsum), ("trace", mv.trace)):
        try:
            viz[name] = len(fn(snap))
        except Exception as e:  # noqa: BLE001 - the reason goes into the results
            viz[name] = f"{type(e).__name__}: {e}"
    res["memory_viz_output_chars"] = viz
    viz_ok = all(isinstance(v, int) and v > 0 for v in viz.values())

    with open(native, "rb") as f:
        tsnap = pickle.load(f)
    torch_sizes = [e["size"] for d in tsnap["device_traces"] for e in d if e["action"] == "alloc"]
    t = gh.Trace(tr)
    trace_sizes = [int(kv["requested"]) for kv in t.of("alloc") if kv.get("kind") in device_kinds
                   and t.stack_has_module(int(kv.get("stack", 0)), "libc10_cuda")]
    export_allocs = [e for d in snap["device_traces"] for e in d if e["action"] == "alloc"
                     and any("libc10_cuda" in fr["filename"] for fr in e["frames"])]
    r = collections.Counter(_round512(x) for x in torch_sizes)
    g = collections.Counter(_round512(x) for x in trace_sizes)
    res.update({"torch_allocs": len(torch_sizes), "gpuheap_c10_allocs": len(trace_sizes),
                "export_c10_allocs": len(export_allocs),
                "torch_bytes_rounded": sum(k * v for k, v in r.items()),
                "gpuheap_bytes_rounded": sum(k * v for k, v in g.items()),
                "exact_sizes_equal": sorted(torch_sizes) == sorted(trace_sizes),
                "size_mismatches": [[k, r.get(k, 0), g.get(k, 0)] for k in sorted(set(r) | set(g))
                                    if r.get(k, 0) != g.get(k, 0)][:20]})
    ok = viz_ok and r == g and len(export_allocs) == len(trace_sizes)
    return ok, res
