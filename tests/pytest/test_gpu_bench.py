"""bench/gpu_bench.py's bookkeeping, without a GPU: the ratios and stack-cache shares it reports
from its runs' records, and the gpuheap_base configuration (an earlier build's CLI in the same
rounds). The runs themselves need a GPU (scripts/gpu-test.sh --bench-only)."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(ROOT, "bench", "gpu_bench.py")


def load():
    spec = importlib.util.spec_from_file_location("gpu_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(cfg, r, ms, hits=None):
    rec = {"round": r, "job": "gpt2", "config": cfg, "step_ms_median": ms}
    if hits is not None:
        rec["gpuheap_stack_stats"] = {"captures": 1000, "cache_hits": hits}
    return rec


def test_ratios_and_stack_cache_share_per_round():
    gb = load()
    records = [run("native_caching", 0, 20.0), run("gpuheap_default", 0, 21.0, 990),
               run("gpuheap_base", 0, 24.0, 400), run("native_caching", 1, 25.0),
               run("gpuheap_default", 1, 25.5, 980), run("gpuheap_base", 1, 30.0, 500)]
    out = gb.per_job(records, "gpt2", ["native_caching", "gpuheap_default", "gpuheap_base"])
    assert out["ratio_per_round"]["gpuheap_default"] == [21.0 / 20.0, 25.5 / 25.0]
    assert out["ratio"]["gpuheap_base"]["median"] == (24.0 / 20.0 + 30.0 / 25.0) / 2
    share = out["stack_cache_hit_share"]
    assert share["gpuheap_default"]["median"] == 0.985 and share["gpuheap_default"]["n"] == 2
    assert share["gpuheap_base"]["min"] == 0.4 and share["gpuheap_base"]["max"] == 0.5
    assert "native_caching" not in share  # no gpuheap, no counters


def test_base_configuration_runs_the_base_cli():
    gb = load()
    base = "/opt/old/gpuheap/bin/gpuheap"
    cmd = gb.command("gpuheap_base", "gpt2", 3, 5, "/tmp/t.trace", base)
    assert cmd[0] == base and cmd[1] == "run" and "--" in cmd
    assert gb.command("gpuheap_default", "gpt2", 3, 5, "/tmp/t.trace", base)[0] != base
    assert gb.command("native_caching", "gpt2", 3, 5, None, base)[0] == gb.gh.PY


def test_base_configuration_needs_an_executable_cli(tmp_path):
    args = [sys.executable, BENCH, "--dry-run", "--rounds", "1", "--jobs", "gpt2",
            "--configs", "native_caching,gpuheap_base"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--base-cli" in r.stderr
    not_exec = tmp_path / "gpuheap"
    not_exec.write_text("")
    r = subprocess.run(args + ["--base-cli", str(not_exec)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    cli = tmp_path / "bin-gpuheap"
    cli.write_text("#!/bin/sh\necho 0.1.0\n")
    cli.chmod(0o755)
    r = subprocess.run(args + ["--base-cli", str(cli)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = [line for line in r.stdout.splitlines() if " gpuheap_base " in line]
    assert len(plan) == 1 and f"{cli} run " in plan[0]
