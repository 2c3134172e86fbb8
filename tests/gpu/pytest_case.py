"""Issue 14 on a real GPU: pytest-gpuheap (python/pytest_gpuheap) on PyTorch tests.

`python -m pytest --gpuheap` re-executes itself under `gpuheap run` (PyTorch's caching
allocator off, its default), runs four tests and must report: a 256 MiB tensor under
limit_gpu_memory("1 GiB") passes, a 2 GiB one fails naming make_big (file:line) among the top
sites, a 64 MiB tensor kept past the test under limit_gpu_leaks("1 MiB") fails naming
keep_tensor, and a test that frees what it made passes the leak limit. Needs pytest in the
Python that has torch. Written without a GPU at hand (the same plugin is tested on the
simulated runtime by the ctests pytest_plugin_*); registered in run_all.py as "torch_pytest".
"""
import os
import xml.etree.ElementTree as ET

import gh

SAMPLE = '''
import pytest
import torch

_kept = []

def make_big():
    return torch.empty(2 << 30, dtype=torch.uint8, device="cuda")

def keep_tensor():
    _kept.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))

@pytest.mark.limit_gpu_memory("1 GiB")
def test_fits():
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del x

@pytest.mark.limit_gpu_memory("1 GiB")
def test_over():
    x = make_big()
    torch.cuda.synchronize()
    del x

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_leak():
    keep_tensor()

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_no_leak():
    y = torch.ones(32 << 20, device="cuda") * 2
    assert float(y[0]) == 2.0
    del y
'''


def case_torch_pytest(ctx):
    rc, _, err, _ = gh.run([gh.PY, "-c", "import pytest, torch"])
    if rc != 0:
        raise RuntimeError(f"{gh.PY} cannot import pytest and torch: {err[-500:]}")
    d = os.path.join(ctx.work, "pytest_case")
    os.makedirs(d, exist_ok=True)
    test = os.path.join(d, "test_torch_limits.py")
    with open(test, "w") as f:
        f.write(SAMPLE)
    junit = os.path.join(d, "junit.xml")
    env = {"GPUHEAP_OUTPUT": os.path.join(d, "pytest-%p.trace")}
    load = []
    if gh.WHEEL is None:  # a build tree: the plugin of this checkout; the wheel registers its own (pytest11)
        env["PYTHONPATH"] = os.path.join(gh.ROOT, "python", "pytest_gpuheap")
        load = ["-p", "pytest_gpuheap"]
    rc, out, err, dt = gh.run([gh.PY, "-m", "pytest", *load, "-p", "no:cacheprovider", "-rA",
                               "--gpuheap", f"--gpuheap-bin={gh.CLI}", f"--junitxml={junit}", test],
                              env=env, timeout=600)
    outcomes, messages = {}, {}
    for tc in ET.parse(junit).getroot().iter("testcase"):
        f = tc.find("failure")
        outcomes[tc.get("name")] = "failed" if f is not None else "error" if tc.find("error") is not None else "passed"
        if f is not None:
            messages[tc.get("name")] = (f.get("message") or "") + "\n" + (f.text or "")
    want = {"test_fits": "passed", "test_over": "failed", "test_leak": "failed", "test_no_leak": "passed"}
    checks = {
        "exit_1": rc == 1,
        "reexecuted": "tracing to" in err,
        "outcomes": outcomes == want,
        "over_names_make_big": "make_big (test_torch_limits.py:" in messages.get("test_over", ""),
        "over_says_2gib": "GPU memory peak 2.00 GiB > limit 1.00 GiB" in messages.get("test_over", ""),
        "leak_names_keep_tensor": "keep_tensor (test_torch_limits.py:" in messages.get("test_leak", ""),
        "leak_says_left_allocated": "GPU memory left allocated 64.00 MiB > limit 1.00 MiB" in messages.get("test_leak", ""),
    }
    res = {"checks": checks, "outcomes": outcomes, "seconds": round(dt, 1),
           "messages": {k: v[:1200] for k, v in messages.items()}, "stdout_tail": out[-1500:]}
    return all(checks.values()), res
