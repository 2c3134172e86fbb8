"""A deterministic PyTorch training job (random weights, fixed seed) printing one JSON line:
losses (exact, as float.hex), torch's own memory statistics and step times.

  python torch_job.py --model gpt|gpt2|cnn|mlp --steps N [--warmup W] [--oom] [--nvtx] [--phase-peaks]
                      [--torch-history default|python] [--step-sleep S]

--nvtx wraps each step in NVTX ranges (torch.cuda.nvtx.range_push/pop): "step", and inside it
"forward", "backward", "optimizer_step" (what gpuheap records as phases). --phase-peaks resets
torch's peak statistics at the start of each of the three and reports the largest peak of
each over the steps (requested_bytes.all.peak and max_memory_allocated), without changing what
is allocated. --torch-history turns on PyTorch's own allocator recorder before the model is
built, as a user would: `default` calls torch.cuda.memory._record_memory_history() with its
defaults (C++ and Python stacks on every allocation and free), `python` passes stacks="python"
(the benchmark's "what users would pick instead").

Models: gpt — a small GPT-style decoder (token + position embeddings, causal self-attention written
out with matmuls so the backward is deterministic, MLP, LayerNorm, AdamW); gpt2 — transformers'
GPT2LMHeadModel from a GPT2Config (no weights: 4 layers, n_embd 512, 8 heads, vocab 8192,
batch 8 x 256 tokens, the library's default attention and dropout, AdamW); cnn — torchvision's
resnet18 (10 classes, 64x64 inputs, SGD with momentum); mlp — 12 blocks of Linear(1024) +
LayerNorm + GELU with AdamW, batch 64 (about 200 allocations per step: the benchmark model).
The allocator is chosen by the environment (PYTORCH_NO_CUDA_MEMORY_CACHING, PYTORCH_CUDA_ALLOC_CONF).
"""
import argparse
import inspect
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=512, d=256, layers=4, heads=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.ln(self.blocks(x)))


class MLP(nn.Module):
    def __init__(self, width=1024, blocks=12):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())
                                      for _ in range(blocks)])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.layers(x))


def make(model, gen):
    dev = "cuda"
    if model == "gpt":
        net = GPT().to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
        data = [torch.randint(0, 512, (16, 129), generator=gen).to(dev) for _ in range(4)]

        def step(i):
            batch = data[i % len(data)]
            logits = net(batch[:, :-1])
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    elif model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=8192, n_positions=256, n_embd=512, n_layer=4, n_head=8)
        net = GPT2LMHeadModel(cfg).to(dev)
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
        data = [torch.randint(0, 8192, (8, 256), generator=gen).to(dev) for _ in range(4)]

        def step(i):
            ids = data[i % len(data)]
            return net(input_ids=ids, labels=ids).loss
    elif model == "cnn":
        import torchvision
        net = torchvision.models.resnet18(num_classes=10).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        data = [(torch.randn(16, 3, 64, 64, generator=gen).to(dev), torch.randint(0, 10, (16,), generator=gen).to(dev))
                for _ in range(4)]

        def step(i):
            x, y = data[i % len(data)]
            return F.cross_entropy(net(x), y)
    else:
        net = MLP().to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        data = [(torch.randn(64, 1024, generator=gen).to(dev), torch.randint(0, 10, (64,), generator=gen).to(dev))
                for _ in range(4)]

        def step(i):
            x, y = data[i % len(data)]
            return F.cross_entropy(net(x), y)
    return net, opt, step


def _history_on():
    """Whether torch's recorder is on at the end (proof that --torch-history took), None where
    this torch has no query for it."""
    f = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    try:
        return bool(f()) if f else None
    except RuntimeError:
        # backend:cudaMallocAsync refuses the query ("does not yet support
        # recordHistory"); its recorder cannot be on.
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt", "gpt2", "cnn", "mlp"], default="gpt")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=0, help="untimed steps before the timed ones")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--nvtx", action="store_true", help="NVTX ranges: step > forward, backward, optimizer_step")
    ap.add_argument("--phase-peaks", action="store_true",
                    help="torch's peaks per phase (reset at the start of each), largest over the steps")
    ap.add_argument("--snapshot", default=None,
                    help="record the caching allocator's history and write torch.cuda.memory._dump_snapshot here")
    ap.add_argument("--category-truth", action="store_true",
                    help="torch's own bytes per category (tests/gpu/categories_case.py): parameters, the last "
                         "step's gradients, optimizer state, and the storages autograd saved in step 2's forward")
    ap.add_argument("--torch-history", choices=["default", "python"], default=None,
                    help="torch.cuda.memory._record_memory_history() with its defaults, or with stacks='python'")
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="seconds to sleep after each step, outside its ranges (a job `gpuheap top` can watch)")
    a = ap.parse_args()
    if a.snapshot and a.torch_history:
        ap.error("--snapshot and --torch-history both set the recorder: give one")
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=10_000_000)
    if a.torch_history:
        torch.cuda.memory._record_memory_history(**({"stacks": "python"} if a.torch_history == "python" else {}))

    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)  # resnet18: adaptive_avg_pool2d backward has none
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator().manual_seed(a.seed)
    net, opt, step = make(a.model, gen)

    phase_peaks = {}

    def phase(name, fn):
        if a.nvtx:
            torch.cuda.nvtx.range_push(name)
        if a.phase_peaks:
            torch.cuda.reset_peak_memory_stats()
        r = fn()
        if a.phase_peaks:
            st = torch.cuda.memory_stats()
            p = phase_peaks.setdefault(name, {"requested_peak": 0, "max_memory_allocated": 0})
            p["requested_peak"] = max(p["requested_peak"], st.get("requested_bytes.all.peak", 0))
            p["max_memory_allocated"] = max(p["max_memory_allocated"], torch.cuda.max_memory_allocated())
        if a.nvtx:
            torch.cuda.nvtx.range_pop()
        return r

    losses, times, saved = [], [], []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if a.nvtx:
            torch.cuda.nvtx.range_push("step")
        opt.zero_grad(set_to_none=True)
        if a.nvtx or a.phase_peaks:
            loss = phase("forward", lambda: step(i))
            phase("backward", loss.backward)
            phase("optimizer_step", opt.step)
        elif a.category_truth and i == 1:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                loss = step(i)
            loss.backward()
            opt.step()
        else:
            loss = step(i)
            loss.backward()
            opt.step()
        if a.nvtx:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
            losses.append(loss.item())
        if a.step_sleep:
            time.sleep(a.step_sleep)
    stats = torch.cuda.memory_stats()
    if a.snapshot:
        torch.cuda.memory._dump_snapshot(a.snapshot)
    res = {
        "model": a.model,
        "steps": a.steps,
        "losses": [float(x).hex() for x in losses],
        "loss_last": losses[-1] if losses else None,
        "requested_peak": stats.get("requested_bytes.all.peak"),
        "allocated_peak": stats.get("allocated_bytes.all.peak"),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "num_device_alloc": stats.get("num_device_alloc"),
        "step_ms_median": statistics.median(times) * 1e3 if times else None,
        "step_ms_min": min(times) * 1e3 if times else None,
        # The lower quartile: the host's scheduling hiccups lengthen some steps of a run and
        # move its median; most steps are untouched.
        "step_ms_q1": statistics.quantiles(times, n=4)[0] * 1e3 if len(times) > 1 else None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "phase_peaks": phase_peaks,
        "param_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                                     if torch.is_tensor(t) and t.is_cuda),
        "torch_history": a.torch_history,
        "torch_history_on": _history_on(),
        "record_memory_history_signature": str(inspect.signature(torch.cuda.memory._record_memory_history)),
    }
    if a.category_truth:
        res["category_truth"] = category_truth(net, opt, saved)
    res["gpuheap_stack_stats"] = gpuheap_stack_stats()
    print(json.dumps(res), flush=True)


def gpuheap_stack_stats():
    """gpuheap's stack counters (preload/gpuheap.h) when running under it, else None: how many
    stacks the cache served and how many were walked over the whole run, all threads."""
    import ctypes
    fields = ["captures", "cache_hits", "walks", "rewalks", "fills", "fill_waits", "native_frames",
              "python_frames", "cache_stale", "fill_failed_size", "fill_failed_off_stack",
              "fill_failed_register", "fill_failed_walk"]

    class Stats(ctypes.Structure):
        _fields_ = [("size", ctypes.c_size_t)] + [(f, ctypes.c_uint64) for f in fields]
    try:
        fn = ctypes.CDLL(None).gpuheap_stack_stats
    except AttributeError:
        return None
    st = Stats()
    st.size = ctypes.sizeof(Stats)
    return {f: getattr(st, f) for f in fields} if fn(ctypes.byref(st)) == 0 else None


def category_truth(net, opt, saved):
    """Bytes by category as torch counts them (unique CUDA storages): parameters and buffers, gradients
    (alive after the last step), optimizer state tensors, and what autograd saved in step 2's
    forward that is not a parameter (weights saved for the input's gradient are parameters)."""
    def nbytes(ts):
        seen = {}
        for t in ts:
            if torch.is_tensor(t) and t.is_cuda:
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        return seen
    params = nbytes(list(net.parameters()) + list(net.buffers()))  # the category holds both
    grads = nbytes(p.grad for p in net.parameters() if p.grad is not None)
    state = nbytes(t for st in opt.state.values() for t in st.values())
    acts = {k: v for k, v in nbytes(saved).items() if k not in params}
    return {"parameter": sum(params.values()), "parameter_tensors": len(params),
            "gradient": sum(grads.values()), "optimizer_state": sum(state.values()),
            "optimizer_state_tensors": len(state), "saved_activations": sum(acts.values()),
            "saved_activation_storages": len(acts)}


if __name__ == "__main__":
    main()
