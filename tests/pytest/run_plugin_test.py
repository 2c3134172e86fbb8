#!/usr/bin/env python3
"""ctest driver for pytest-gpuheap: runs gpu_sample.py in a child pytest (Debian's
python3-pytest) with the plugin, on the simulated CUDA runtime, and checks each test's outcome
and the failure messages (their allocation sites).

  run_plugin_test.py MODE GPUHEAP_BIN PLUGIN_DIR SIMCUDA_DIR
    MODE reexec: `python3 -m pytest --gpuheap` (the plugin re-executes under gpuheap run)
    MODE run:    `gpuheap run -- python3 -m pytest` (no --gpuheap)
    MODE pip:    `pip install` a copy of PLUGIN_DIR into a fresh directory, then `pytest
                 --gpuheap` without -p: the pytest11 entry point loads the plugin (exit 77,
                 skipped, when this python has no pip)
"""
import os
import atexit
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

mode, gpuheap, plugin_dir, simcuda = sys.argv[1:5]
here = os.path.dirname(os.path.abspath(__file__))
sample = os.path.join(here, "gpu_sample.py")
work = tempfile.mkdtemp(prefix="gpuheap-pytest-")
if not os.environ.get("GPUHEAP_TEST_KEEP"):  # GPUHEAP_TEST_KEEP=1 keeps it to look at after a failure
    atexit.register(shutil.rmtree, work, True)
junit = os.path.join(work, "junit.xml")

plugin_args = ["-p", "pytest_gpuheap"]
if mode == "pip":
    # A copy: pip's build leaves build/ and *.egg-info beside pyproject.toml.
    src = os.path.join(work, "src")
    shutil.copytree(plugin_dir, src)
    plugin_dir = os.path.join(work, "site")
    try:
        subprocess.run([sys.executable, "-m", "pip", "--version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print("no pip for", sys.executable)
        sys.exit(77)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--no-index", "--target", plugin_dir, src], check=True)
    plugin_args = []

env = dict(os.environ)
env["PYTHONPATH"] = plugin_dir + os.pathsep + env.get("PYTHONPATH", "")
env["LD_LIBRARY_PATH"] = simcuda + os.pathsep + env.get("LD_LIBRARY_PATH", "")
env["GPUHEAP_TEST_CUDART"] = os.path.join(simcuda, "libcudart.so.13")
env["GPUHEAP_OUTPUT"] = os.path.join(work, "t-%p.trace")
env["PYTEST_ADDOPTS"] = ""
env["COLUMNS"] = "400"  # the short summary lines (-rA) whole; CI unset: trimmed as on a terminal
for k in ("LD_PRELOAD", "GPUHEAP_PYTEST_REEXEC", "GPUHEAP_BIN", "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
          "CI", "BUILD_NUMBER"):
    env.pop(k, None)

pytest_cmd = [sys.executable, "-m", "pytest"] + plugin_args + ["-p", "no:cacheprovider",
              "-rA", f"--junitxml={junit}", sample]
if mode == "reexec":
    cmd = pytest_cmd + ["--gpuheap", f"--gpuheap-bin={gpuheap}"]
elif mode == "pip":
    env["GPUHEAP_BIN"] = gpuheap
    cmd = pytest_cmd + ["--gpuheap"]
elif mode == "run":
    cmd = [gpuheap, "run", "-o", env["GPUHEAP_OUTPUT"], "--"] + pytest_cmd
else:
    sys.exit(f"unknown mode {mode}")
print("+", " ".join(cmd), flush=True)
r = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=600)
print(r.stdout)
print(r.stderr, file=sys.stderr)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


check(r.returncode == 1, f"pytest exit status {r.returncode}, expected 1 (some tests fail)")
check("gpuheap: tracing" in r.stdout, "report header does not say gpuheap is tracing")
if mode in ("reexec", "pip"):
    check("tracing to" in r.stderr, "no 'tracing to' from gpuheap run: not re-executed?")
# The size parser (as the CLI's units.h parse_size, plus exponents).
sys.path.insert(0, plugin_dir)
import pytest_gpuheap  # noqa: E402

for text, want in [("2 GiB", 2 << 30), ("512MiB", 512 << 20), ("1e9B", 10**9), ("2GB", 2 * 10**9),
                   ("1.5G", 3 << 29), ("8K", 8192), ("123B", 123), (4096, 4096), ("7 b", 7), ("0", 0)]:
    got = pytest_gpuheap.parse_size(text)
    check(got == want, f"parse_size({text!r}) = {got}, expected {want}")
# A string needs a unit, as in the CLI and GPUHEAP_LIMIT (issue 35): "123" is refused.
for bad in ["", "GiB", "2 XB", "-1", "1 iB", "2 GiBs", "123", "1e9", "8"]:
    try:
        pytest_gpuheap.parse_size(bad)
        failures.append(f"parse_size({bad!r}) accepted")
    except ValueError:
        pass
outcomes, messages = {}, {}
try:
    for tc in ET.parse(junit).getroot().iter("testcase"):
        name = tc.get("name")
        f = tc.find("failure")
        e = tc.find("error")
        outcomes[name] = "failed" if f is not None else "error" if e is not None else \
            "skipped" if tc.find("skipped") is not None else "passed"
        if f is not None:
            messages[name] = (f.get("message") or "") + "\n" + (f.text or "")
except (OSError, ET.ParseError) as ex:
    failures.append(f"no junit xml: {ex}")

expected = {
    "test_small_peak_passes": "passed",
    "test_big_peak_fails": "failed",
    "test_leak_fails": "failed",
    "test_small_leak_passes": "passed",
    "test_peak_counts_only_this_test": "passed",
    "test_unmarked_passes": "passed",
    "test_gpuheap_is_loaded": "passed",
    "test_odd_leak_fails": "failed",
}
for name, want in expected.items():
    check(outcomes.get(name) == want, f"{name}: {outcomes.get(name)}, expected {want}")

big = messages.get("test_big_peak_fails", "")
# The first line, which pytest's short summary shows, says what went over and where.
first = "GPU memory peak 25.00 MiB > limit 16.00 MiB on device 0 at gpu_sample.py:45"
check(big.startswith(first + "\n"), "test_big_peak_fails: first line is not the peak, the limit and the line")
check(f"gpu_sample.py::test_big_peak_fails - {first}\n" in r.stdout,
      "test_big_peak_fails: the -rA summary line lacks the reason")
check("gpu_sample.py::test_leak_fails - GPU memory left allocated 6.00 MiB > limit 1.00 MiB at "
      "gpu_sample.py:52\n" in r.stdout, "test_leak_fails: the -rA summary line lacks the reason")
check("24.00 MiB in 1 allocation: cuda_malloc (gpu_sample.py:" in big and "allocate_big_buffer" in big,
      "test_big_peak_fails: top sites lack the 24 MiB allocate_big_buffer site")
check("gpu_sample.py:" in big, "test_big_peak_fails: top sites lack file:line")
leak = messages.get("test_leak_fails", "")
check(leak.startswith("GPU memory left allocated 6.00 MiB > limit 1.00 MiB at gpu_sample.py:52\n"),
      "test_leak_fails: message lacks the leaked bytes and the limit")
check("leak_some_memory" in leak, "test_leak_fails: top sites lack leak_some_memory")
check("allocate_big_buffer" not in leak, "test_leak_fails: lists another test's site")
# The leaked bytes of the message and of its site line are one figure (requested bytes).
odd = messages.get("test_odd_leak_fails", "")
said = re.search(r"^GPU memory left allocated (.+?) > limit 0 B", odd)
site = re.search(r"^  (.+?) in 1 allocation: cuda_malloc", odd, re.M)
check(said and site and said.group(1) == site.group(1) == "976.56 KiB",
      f"test_odd_leak_fails: message and site line disagree ({said and said.group(1)} vs "
      f"{site and site.group(1)})")
# The trace a message names exists once the run is over (`gpuheap run` compressed it), and
# the command it suggests works.
named = re.search(r"^trace: (\S+)  \(gpuheap summary --phase '([^']+)' (\S+)\)$", big, re.M)
check(named is not None, "test_big_peak_fails: no trace line")
if named:
    check(named.group(1).endswith(".trace.zst") and os.path.isfile(named.group(1)),
          f"the message names {named.group(1)}, which does not exist after the run")
    r3 = subprocess.run([gpuheap, "summary", "--phase", named.group(2), named.group(3)],
                        capture_output=True, text=True, timeout=300)
    check(r3.returncode == 0 and "24.0 MiB requested" in r3.stdout,
          f"the suggested command failed: exit {r3.returncode}: {r3.stderr.strip()[-200:]}")

if mode == "reexec":
    # No CLI anywhere: a usage error (exit 4) that says what to pass, not a silent no-op.
    env2 = dict(env, PATH="/usr/bin:/bin")
    r2 = subprocess.run(pytest_cmd[:-1] + ["--gpuheap", "--gpuheap-bin=/nonexistent/gpuheap", sample],
                        env=env2, cwd=work, capture_output=True, text=True, timeout=300)
    check(r2.returncode == 4 and "gpuheap CLI was not found" in r2.stderr,
          f"--gpuheap without a CLI: exit {r2.returncode}, stderr {r2.stderr.strip()[-200:]!r}")

for m in failures:
    print("FAIL:", m)
for name, msg in messages.items():
    print(f"--- message of {name}:\n{msg}")
sys.exit(1 if failures else 0)
