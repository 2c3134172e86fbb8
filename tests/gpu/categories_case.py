"""Issue 34's truth on the GPU: gpuheap's memory by category (docs/categories.md) beside
torch's own numbers, for torch_job.py's GPT and MLP (AdamW) and CNN (resnet18, SGD with
momentum), run without any marker (no NVTX, no gpuheap_mark).

The traced run is PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor's exact request reaches
gpuheap); a native run of the same job with --category-truth gives torch's numbers (unique
CUDA storages). Checked, exactly (0 bytes of tolerance):
  - parameter at the peak == sum(p.numel() * p.element_size()) over net.parameters() and
    net.buffers() (resnet18's BatchNorm running stats: the category holds both);
  - optimizer_state at the peak == the CUDA tensors of opt.state (AdamW exp_avg/exp_avg_sq,
    SGD momentum_buffer);
  - gradient at the highest point of the last optimizer step found from frames == the bytes
    of every p.grad (the step runs with all gradients alive);
  - the steps found from frames == the steps run.
Reported beside, not gated: activation at the peak (the peak falls inside backward, after
some saved tensors were freed) and the storages autograd saved in step 2's forward
(saved_tensors_hooks, parameters excluded).

  scripts/gpu-test.sh --only torch_categories
"""
import gh

MODELS = ("gpt", "mlp", "cnn")


def _found(cats, phase):
    """The instance of `phase` found from frames with the largest step (None if none)."""
    best = None
    for p in cats.get("phases_found", []):
        if p["phase"] == phase and (best is None or p["step"] >= best["step"]):
            best = p
    return best


def one(ctx, model, steps):
    native, _ = ctx.torch(f"{model}_categories_native", model, traced=False, steps=steps, args=("--category-truth",))
    _, tr = ctx.torch(f"{model}_categories_nocache", model, steps=steps,
                      env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    truth = native["category_truth"]
    s = gh.summary_json(tr)
    dev = gh.gpu_device(s)["device"]
    cats = s.get("categories", {})
    peak = next((p for p in cats.get("at_peak", []) if p["device"] == dev), None)
    if peak is None:
        return False, {"error": "no categories.at_peak for the GPU in summary --json", "truth": truth}
    tot = {k: v["bytes"] for k, v in peak["totals"].items()}
    last_step = _found(cats, "optimizer_step")
    got_grad = last_step["peak_by_category"].get("gradient", 0) if last_step else None
    res = {"truth": truth, "gpuheap_at_peak": tot, "libraries": peak.get("libraries"),
           "steps_found": cats.get("steps_found"), "last_optimizer_step_found": last_step,
           "activation_at_peak_vs_saved": [tot.get("activation"), truth["saved_activations"]]}
    res["checks"] = {
        "parameter_exact": tot.get("parameter") == truth["parameter"],
        "optimizer_state_exact": tot.get("optimizer_state") == truth["optimizer_state"],
        "gradient_exact": got_grad == truth["gradient"],
        "steps_found": cats.get("steps_found") == steps,
    }
    return all(res["checks"].values()), res


def case_torch_categories(ctx, steps):
    res, ok = {}, True
    for model in MODELS:
        try:
            good, r = one(ctx, model, steps)
        except Exception as e:  # one model's failure is reported with the others'
            good, r = False, {"error": f"{type(e).__name__}: {e}"}
        ok = ok and good
        res[model] = r
        if not good:
            print(f"    torch_categories: {model} MISMATCH: {r.get('checks', r)}", flush=True)
    return ok, res
