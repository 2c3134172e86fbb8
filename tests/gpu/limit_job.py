"""A job under GPUHEAP_LIMIT (issue 6): what the framework sees and where it runs out.
   python limit_job.py torch   PyTorch: mem_get_info inside the cap, an out-of-memory error
                               when the cap is reached
   python limit_job.py jax     JAX with its default BFC allocator: preallocates its fraction of
                               the capped total
Prints one JSON line; run_all.py / the caller compares it with the cap."""
import json
import os
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "torch"
res = {"mode": mode}
if mode == "torch":
    import torch

    free, total = torch.cuda.mem_get_info()
    res.update(total=total, free=free)
    chunk = 256 << 20
    held = []
    try:
        while len(held) < 100000:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except RuntimeError as e:
        # The caching allocator turns cudaErrorMemoryAllocation into torch.OutOfMemoryError; with
        # PYTORCH_NO_CUDA_MEMORY_CACHING=1 torch checks cudaMalloc's result directly and raises
        # torch.AcceleratorError("CUDA error: out of memory"), as it does without gpuheap.
        res.update(oom=True, held_at_oom=len(held) * chunk, exception=type(e).__name__,
                   message=str(e).splitlines()[0][:200])
    del held
    x = torch.ones(1 << 20, device="cuda")  # still usable after the OOM
    res["after_oom_ok"] = bool(x.sum().item() == (1 << 20))
elif mode == "jax":
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1024, 1024))
    x.block_until_ready()
    stats = jax.devices()[0].memory_stats() or {}
    res.update(bytes_limit=stats.get("bytes_limit"), bytes_reserved=stats.get("bytes_reserved"),
               fraction=float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")))
print(json.dumps(res))
