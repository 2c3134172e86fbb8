"""The jobs of the compatibility matrix (issue 39): programs as users write them, each printing
one JSON line with what the program itself observed (losses, the statistics it read, the
choices it made on them). tests/gpu/compat/matrix.py runs each natively and under
`gpuheap run` and compares the two lines.

  python compat_jobs.py JOB [--steps N]

Every job is deterministic natively (fixed seeds, small models, bounded steps) so that a
difference between the two runs is gpuheap's doing. A job whose library is missing prints
{"skip": "why"} and exits 0: the matrix reports SKIP, never PASS.
"""
import argparse
import json
import os
import sys
import time

T0 = time.monotonic()


def emit(res):
    res["seconds"] = round(time.monotonic() - T0, 2)
    print(json.dumps(res), flush=True)


def need(module):
    """Imports module or prints the skip line and exits 0."""
    try:
        return __import__(module)
    except Exception as e:  # ImportError, or a library that fails to load its CUDA parts
        emit({"skip": f"{module} not importable: {type(e).__name__}: {str(e)[:200]}"})
        sys.exit(0)


def torch_stats(torch):
    """The statistics a program can read from torch (0 under PYTORCH_NO_CUDA_MEMORY_CACHING)."""
    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"memory_allocated": torch.cuda.memory_allocated(), "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "memory_reserved": torch.cuda.memory_reserved(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "requested_peak": s.get("requested_bytes.all.peak", 0), "num_ooms": s.get("num_ooms", 0),
            "stats_keys": len(s), "mem_get_info_free": free, "mem_get_info_total": total}


def seed_all(torch, seed=0):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def mlp(torch, d=512, depth=4, out=10):
    nn = torch.nn
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(d, d), nn.LayerNorm(d), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(d, out))


def batches(torch, n, batch, d=512, classes=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, d, generator=g), torch.randint(0, classes, (batch,), generator=g)) for _ in range(n)]


def train(torch, model, data, lr=1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---- jobs ----------------------------------------------------------------------------------------

def job_train(a):
    """A plain training loop; the allocator is chosen by the environment (PYTORCH_CUDA_ALLOC_CONF)."""
    torch = need("torch")
    seed_all(torch)
    model = mlp(torch).cuda()
    losses = train(torch, model, batches(torch, a.steps, 64))
    return {"losses": losses, "torch": torch_stats(torch), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}


def children_of(pid):
    """Live child processes of pid (from /proc): the compile workers inductor started."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(p))
        except OSError:
            continue
    return out


def job_compile(a, mode=None):
    torch = need("torch")
    import torch._inductor.config as icfg
    seed_all(torch)
    model = mlp(torch).cuda()
    cmodel = torch.compile(model, mode=mode) if mode else torch.compile(model)
    data = batches(torch, a.steps, 64)
    losses = train(torch, cmodel, data)
    # Inference through the compiled module as well (another graph; under reduce-overhead a
    # second CUDA graph), replayed for every step.
    with torch.no_grad():
        outs = [float(cmodel(x.cuda()).float().sum().item()) for x, _ in data]
    return {"losses": losses, "eval_sums": outs, "torch": torch_stats(torch), "mode": mode or "default",
            "compile_threads": icfg.compile_threads, "worker_start": getattr(icfg, "worker_start_method", None),
            "compile_worker_children": len(children_of(os.getpid()))}


def job_compile_ro(a):
    return job_compile(a, mode="reduce-overhead")


def job_graph(a):
    """CUDA graphs by hand: torch.cuda.graph around a forward, replayed with new inputs, and
    make_graphed_callables for a module trained with it."""
    torch = need("torch")
    seed_all(torch)
    model = mlp(torch).cuda().eval()
    static_x = torch.zeros(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):  # warm-up on a side stream, as the documentation asks
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = model(static_x)
    sums = []
    for x, _ in batches(torch, a.replays, 64, seed=2):
        static_x.copy_(x.cuda())
        g.replay()
        sums.append(float(static_y.sum().item()))
    # make_graphed_callables: forward and backward graphed, trained for a.steps.
    model2 = mlp(torch).cuda()
    sample = torch.randn(64, 512, device="cuda", requires_grad=False)
    gmodel = torch.cuda.make_graphed_callables(model2, (sample,))
    losses = train(torch, gmodel, batches(torch, a.steps, 64))
    return {"replay_sums": sums, "losses": losses, "replays": a.replays, "torch": torch_stats(torch)}


def job_stats(a):
    """Reads torch's memory statistics and acts on them: logs them each step and picks the next
    batch size so that the step's peak fits a budget (peak per sample from max_memory_allocated)."""
    torch = need("torch")
    seed_all(torch)
    model = mlp(torch, d=1024).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    budget = 256 << 20
    batch, log, losses = 16, [], []
    g = torch.Generator().manual_seed(3)
    for step in range(a.steps):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        x = torch.randn(batch, 1024, generator=g).cuda()
        y = torch.randint(0, 10, (batch,), generator=g).cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        peak = torch.cuda.max_memory_allocated()
        per_sample = (peak - base) / batch if peak > base else 0
        # The program's decision: a batch that fits the budget, or keep it when it cannot tell.
        nxt = max(1, min(4096, int((budget - base) // per_sample))) if per_sample > 0 else batch
        log.append({"batch": batch, "allocated": base, "peak": peak, "reserved": torch.cuda.memory_reserved(),
                    "next": nxt})
        batch = nxt
    summary = torch.cuda.memory_summary()
    return {"losses": losses, "log": log, "batches": [e["batch"] for e in log], "torch": torch_stats(torch),
            "summary_lines": len(summary.splitlines()), "summary_allocated_row": next(
                (ln for ln in summary.splitlines() if "Allocated memory" in ln), "")}


def job_bs_finder(a):
    """Lightning's batch-size finder pattern: double the batch until torch.cuda.OutOfMemoryError,
    catch it, empty_cache(), step back and go on training with the last batch that fit. Only
    OutOfMemoryError is caught, as user code does; anything else ends the job (exit 1)."""
    torch = need("torch")
    seed_all(torch)
    cap = os.environ.get("COMPAT_MEMORY_CAP")
    if cap:  # the native run's stand-in for `gpuheap run --limit`: torch's own cap
        torch.cuda.set_per_process_memory_fraction(int(cap) / torch.cuda.mem_get_info()[1])
    model = mlp(torch, d=2048, depth=2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(n):
        x = torch.randn(n, 2048, device="cuda")
        h = model(x)
        loss = h.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    batch, fit, tries, res = 256, None, [], {}
    try:
        while batch <= (1 << 24):
            try:
                step(batch)
                tries.append([batch, "ok"])
                fit = batch
                batch *= 2
            except torch.cuda.OutOfMemoryError as e:
                tries.append([batch, "oom"])
                res["oom_message"] = str(e).splitlines()[0][:160]
                break
        torch.cuda.empty_cache()
        losses = [step(fit) for _ in range(a.steps)] if fit else []
        res.update(found=fit, tries=tries, losses_finite=all(x == x for x in losses), recovered=bool(losses))
        res["torch"] = torch_stats(torch)
        return res
    except Exception as e:  # what an uncaught exception would end the program with
        res.update(tries=tries, uncaught=f"{type(e).__module__}.{type(e).__name__}",
                   message=str(e).splitlines()[0][:200] if str(e) else "")
        emit(res)
        sys.exit(1)


class _Squares:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, generator=g), int(i % 10)


def job_dataloader(a):
    torch = need("torch")
    seed_all(torch)
    model = mlp(torch).cuda()
    dl = torch.utils.data.DataLoader(_Squares(a.steps * 32), batch_size=32, num_workers=2, pin_memory=True,
                                     shuffle=False)
    losses = train(torch, model, dl)
    return {"losses": losses, "torch": torch_stats(torch), "workers": 2}


def _spawned(rank, steps, out_dir):
    import torch
    seed_all(torch, seed=rank)
    torch.cuda.set_device(0)
    model = mlp(torch).cuda()
    losses = train(torch, model, batches(torch, steps, 64, seed=10 + rank))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "torch": torch_stats(torch), "pid": os.getpid()}, f)


def job_spawn(a):
    torch = need("torch")
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_spawned, args=(a.steps, d), nprocs=2, join=True)
        ranks = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
    return {"losses": [r["losses"] for r in ranks], "torch": [r["torch"] for r in ranks], "nprocs": 2}


def _hf(a, kind):
    torch = need("torch")
    transformers = need("transformers")
    seed_all(torch)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=4096, n_positions=256)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                                       max_position_embeddings=256)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(4)
    losses = []
    for _ in range(a.steps):
        ids = torch.randint(0, 4096, (4, 128), generator=g).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "torch": torch_stats(torch), "transformers": transformers.__version__}


def job_hf_gpt2(a):
    return _hf(a, "gpt2")


def job_hf_llama(a):
    return _hf(a, "llama")


def job_lightning(a):
    torch = need("torch")
    try:
        import lightning as L
    except Exception:
        L = need("pytorch_lightning")
    seed_all(torch)
    losses = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp(torch)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = batches(torch, a.steps, 64)
    dl = torch.utils.data.DataLoader([(x[i], y[i]) for x, y in data for i in range(len(y))], batch_size=64)
    trainer = L.Trainer(max_steps=a.steps, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(Module(), dl)
    return {"losses": losses, "torch": torch_stats(torch), "lightning": L.__version__}


def job_jax(a):
    jax = need("jax")
    flax = need("flax")
    import jax.numpy as jnp
    from flax import linen as nn
    optax = need("optax")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(3):
                x = nn.gelu(nn.Dense(512)(x))
            return nn.Dense(10)(x)

    model = MLP()
    key = jax.random.PRNGKey(0)
    params = model.init(key, jnp.zeros((64, 512)))
    tx = optax.adamw(1e-3)
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        def loss_fn(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        upd, state = tx.update(grads, state, params)
        return optax.apply_updates(params, upd), state, loss

    losses = []
    for i in range(a.steps):
        kx, ky = jax.random.split(jax.random.PRNGKey(100 + i))
        x = jax.random.normal(kx, (64, 512))
        y = jax.random.randint(ky, (64,), 0, 10)
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    st = jax.devices()[0].memory_stats() or {}
    return {"losses": losses, "jax": jax.__version__, "flax": flax.__version__,
            "jax_stats": {k: st.get(k) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")}}


def job_numba(a):
    need("numba")
    try:
        from numba import cuda
    except Exception as e:  # numba-cuda built against another numpy: broken natively too
        return {"skip": f"numba.cuda not importable: {type(e).__name__}: {str(e)[:200]}"}
    import numpy as np
    if not cuda.is_available():
        return {"skip": "numba.cuda.is_available() is False"}

    @cuda.jit
    def axpy(out, x, y, k):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = k * x[i] + y[i]

    sums, arrays = [], 0
    for i in range(a.steps):
        n = 1 << (16 + i % 4)
        x = cuda.to_device(np.arange(n, dtype=np.float32))
        y = cuda.to_device(np.ones(n, dtype=np.float32))
        out = cuda.device_array(n, dtype=np.float32)
        arrays += 3
        axpy[(n + 255) // 256, 256](out, x, y, np.float32(i))
        sums.append(float(out.copy_to_host().astype(np.float64).sum()))
        del x, y, out
    free, total = cuda.current_context().get_memory_info()
    return {"sums": sums, "device_arrays": arrays, "mem_free": free, "mem_total": total}


def job_cupy(a, pool):
    cp = need("cupy")
    if not pool:
        cp.cuda.set_allocator(None)
    cp.random.seed(5)
    sums, arrays = [], 0
    for i in range(a.steps):
        n = 256 + 64 * (i % 5)
        x = cp.random.standard_normal((n, n), dtype=cp.float32)
        y = x @ x.T + cp.ones((n, n), dtype=cp.float32)
        arrays += 3  # at least x, the product and the ones (temporaries come on top)
        sums.append(float(cp.abs(y).sum()))
        del x, y
    return {"sums": sums, "arrays_at_least": arrays, "pool": pool,
            "pool_used": cp.get_default_memory_pool().used_bytes() if pool else None}


def job_cupy_pool(a):
    return job_cupy(a, True)


def job_cupy_nopool(a):
    return job_cupy(a, False)


JOBS = {k[4:]: v for k, v in dict(globals()).items() if k.startswith("job_") and callable(v)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=sorted(JOBS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--replays", type=int, default=200)
    a = ap.parse_args()
    res = JOBS[a.job](a)
    res["job"] = a.job
    res["pid"] = os.getpid()
    emit(res)


if __name__ == "__main__":
    main()
