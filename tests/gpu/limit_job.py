"""A job under GPUHEAP_LIMIT (issue 6): what the framework sees and where it runs out.
   python limit_job.py torch   PyTorch (NO_CACHING under gpuheap): mem_get_info inside the cap,
                               OutOfMemoryError when the cap is reached
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
    except torch.OutOfMemoryError as e:  # the error torch raises for cudaErrorMemoryAllocation
        res.update(oom=True, held_at_oom=len(held) * chunk, message=str(e).splitlines()[0][:200])
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
