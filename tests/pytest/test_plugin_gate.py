"""pytest-gpuheap's CI-gate options, each checked with pytest's own `pytester` (a child
pytest per case) on the simulated CUDA runtime: the plugin turned on from the ini file, limits
made mandatory, --gpuheap-simulate, baselines and relative limits, a default limit.

Run by the ctest pytest_plugin_gate: `python3 -m pytest -p pytester tests/pytest/test_plugin_gate.py`
with PYTHONPATH=python/pytest_gpuheap, GPUHEAP_BIN=build/gpuheap, GPUHEAP_TEST_SIMCUDA=build/simcuda.
"""
import json
import os

import pytest

pytest_plugins = ["pytester"]

SIMCUDA = os.environ.get("GPUHEAP_TEST_SIMCUDA", "")

# The tests of the child pytest: sizes in MiB from the environment, so one file serves the
# run that writes a baseline and the runs that check against it. The CUDA runtime is found
# by its soname: on LD_LIBRARY_PATH, or put there by `gpuheap run --simulate`.
CHILD = """
import ctypes, os, pytest
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]

def use(mib):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), int(mib * (1 << 20))) == 0
    assert rt.cudaFree(p) == 0

@pytest.mark.limit_gpu_memory(os.environ.get("LIMIT", "+5%"))
def test_model():
    use(float(os.environ.get("SIZE_MIB", "40")))

def test_unmarked():
    use(4)
"""


@pytest.fixture
def child(pytester, monkeypatch):
    if not os.path.isfile(os.path.join(SIMCUDA, "libcudart.so.13")):
        pytest.fail(f"GPUHEAP_TEST_SIMCUDA={SIMCUDA!r} has no libcudart.so.13")
    for k in ("LD_PRELOAD", "GPUHEAP_PYTEST_REEXEC", "GPUHEAP_PATH_FILE", "LD_LIBRARY_PATH",
              "CI", "BUILD_NUMBER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    pytester.makepyfile(test_child=CHILD)
    return pytester


def run(pytester, *args, **env):
    for k, v in env.items():
        os.environ[k] = str(v)
    try:
        return pytester.runpytest_subprocess("-p", "pytest_gpuheap", "-rA", *args, timeout=300)
    finally:
        for k in env:
            del os.environ[k]


def test_ini_option_turns_the_plugin_on(child, monkeypatch):
    # `gpuheap = true` in the project's configuration instead of --gpuheap on the command line.
    monkeypatch.setenv("LD_LIBRARY_PATH", SIMCUDA)
    child.makeini("[pytest]\ngpuheap = true\n")
    r = run(child, LIMIT="16 MiB")
    r.stdout.fnmatch_lines(["gpuheap: tracing*"])
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["FAILED test_child.py::test_model - GPU memory peak 40.00 MiB > "
                            "limit 16.00 MiB on device 0 at test_child.py:13"])


def test_required_limits_without_gpuheap_are_an_error(child, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", SIMCUDA)
    for how in (["--gpuheap-required"], []):
        if not how:
            child.makeini("[pytest]\ngpuheap_required = true\n")
        r = run(child, *how, LIMIT="16 MiB")
        assert r.ret == pytest.ExitCode.USAGE_ERROR, (how, r.stdout.str(), r.stderr.str())
        r.stderr.fnmatch_lines(["*gpuheap_required: 1 test(s) have GPU memory limits (first: "
                                "test_child.py::test_model) but gpuheap is not loaded*"])
    # Without a limit in the run nothing is unchecked: it runs.
    r = run(child, "-k", "unmarked")
    r.assert_outcomes(passed=1, deselected=1)
    # And with gpuheap on, the limits are checked as usual.
    r = run(child, "--gpuheap-simulate", LIMIT="16 MiB")
    r.assert_outcomes(passed=1, failed=1)


def test_simulate_runs_on_the_simulated_runtime(child):
    # No CUDA runtime on LD_LIBRARY_PATH: --gpuheap-simulate runs `gpuheap run --simulate`.
    r = run(child, "--gpuheap-simulate", LIMIT="64 MiB")
    r.stdout.fnmatch_lines(["gpuheap: tracing on the simulated CUDA runtime*"])
    r.assert_outcomes(passed=2)
    child.makeini("[pytest]\ngpuheap_simulate = true\n")
    r = run(child, LIMIT="8 MiB")
    r.stdout.fnmatch_lines(["gpuheap: tracing on the simulated CUDA runtime*"])
    r.assert_outcomes(passed=1, failed=1)


def test_baseline_and_relative_limits(child):
    base = child.path / "base.json"
    # The run on main writes every test's figures; its relative limits are not checked.
    r = run(child, "--gpuheap-simulate", f"--gpuheap-write-baseline={base}", SIZE_MIB=40)
    r.assert_outcomes(passed=2)
    doc = json.loads(base.read_text())
    assert doc["schema"] == "gpuheap-pytest-baseline/1"
    assert doc["tests"]["test_child.py::test_model"] == {"peak": 40 << 20, "leaked": 0}
    assert doc["tests"]["test_child.py::test_unmarked"]["peak"] == 4 << 20
    assert sorted(p.name for p in child.path.iterdir() if "base" in p.name) == ["base.json"]
    # An existing baseline is replaced only with --gpuheap-force.
    r = run(child, "--gpuheap-simulate", f"--gpuheap-write-baseline={base}", SIZE_MIB=42)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--gpuheap-write-baseline*the file exists (pass --gpuheap-force*"])
    assert json.loads(base.read_text())["tests"]["test_child.py::test_model"]["peak"] == 40 << 20
    # +5% of 40 MiB is 42 MiB: 42 MiB passes, 44 MiB fails and says against what.
    r = run(child, "--gpuheap-simulate", f"--gpuheap-baseline={base}", SIZE_MIB=42)
    r.assert_outcomes(passed=2)
    r = run(child, "--gpuheap-simulate", f"--gpuheap-baseline={base}", SIZE_MIB=44)
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["FAILED test_child.py::test_model - GPU memory peak 44.00 MiB > limit "
                            "42.00 MiB (baseline 40.00 MiB +5%) on device 0 at test_child.py:13"])
    # "+SIZE": bytes above the baseline; the ini option names the baseline.
    child.makeini("[pytest]\ngpuheap_baseline = base.json\n")
    r = run(child, "--gpuheap-simulate", LIMIT="+2 MiB", SIZE_MIB=44)
    r.stdout.fnmatch_lines(["*GPU memory peak 44.00 MiB > limit 42.00 MiB (baseline 40.00 MiB "
                            "+2 MiB)*"])
    # --gpuheap-force replaces it (through a temporary: no other file is left beside it).
    child.makeini("[pytest]\n")
    r = run(child, "--gpuheap-simulate", f"--gpuheap-write-baseline={base}", "--gpuheap-force",
            SIZE_MIB=44)
    r.assert_outcomes(passed=2)
    assert json.loads(base.read_text())["tests"]["test_child.py::test_model"]["peak"] == 44 << 20
    assert sorted(p.name for p in child.path.iterdir() if "base" in p.name) == ["base.json"]
    # A baseline that cannot be written fails the run (exit 4), after the tests.
    r = run(child, "--gpuheap-simulate", "--gpuheap-write-baseline=no/such/dir/base.json")
    assert r.ret == pytest.ExitCode.USAGE_ERROR, (r.stdout.str(), r.stderr.str())
    r.stderr.fnmatch_lines(["*--gpuheap-write-baseline no/such/dir/base.json: *No such file*"])


def test_relative_limit_needs_the_test_in_a_baseline(child):
    base = child.path / "base.json"
    base.write_text(json.dumps({"schema": "gpuheap-pytest-baseline/1", "tests": {}}))
    r = run(child, "--gpuheap-simulate", f"--gpuheap-baseline={base}")
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["FAILED test_child.py::test_model - limit_gpu_memory('+5%'): "
                            "test_child.py::test_model is not in the baseline*"])
    r = run(child, "--gpuheap-simulate")
    r.stdout.fnmatch_lines(["FAILED test_child.py::test_model - limit_gpu_memory('+5%') is "
                            "relative to a baseline: pass --gpuheap-baseline FILE*"])
    base.write_text("{}")
    r = run(child, "--gpuheap-simulate", f"--gpuheap-baseline={base}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*not a baseline written by --gpuheap-write-baseline*"])


def test_default_limit(child):
    # Every test without a limit of its own gets gpuheap_default_limit.
    child.makeini("[pytest]\ngpuheap_default_limit = 2 MiB\n")
    r = run(child, "--gpuheap-simulate", LIMIT="64 MiB")
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["FAILED test_child.py::test_unmarked - GPU memory peak 4.00 MiB > "
                            "limit 2.00 MiB on device 0 at test_child.py:*"])
    # Relative, with a test missing from the baseline (a new one): a warning, not checked.
    base = child.path / "base.json"
    base.write_text(json.dumps({"schema": "gpuheap-pytest-baseline/1",
                                "tests": {"test_child.py::test_model": {"peak": 0, "leaked": 0}}}))
    child.makeini("[pytest]\ngpuheap_default_limit = +5%\ngpuheap_baseline = base.json\n")
    r = run(child, "--gpuheap-simulate", LIMIT="64 MiB")
    r.assert_outcomes(passed=2, warnings=1)
    r.stdout.fnmatch_lines(["*gpuheap_default_limit not checked: test_child.py::test_unmarked is "
                            "not in the baseline*"])


def test_trace_named_as_the_run_leaves_it(child, monkeypatch):
    # The failure names the trace file that exists once the run is over: TRACE.zst, or
    # TRACE under `gpuheap run --no-compress`; the command it suggests reads it.
    import re
    import subprocess
    import sys
    gpuheap = os.environ["GPUHEAP_BIN"]
    monkeypatch.setenv("LD_LIBRARY_PATH", SIMCUDA)
    monkeypatch.setenv("LIMIT", "16 MiB")
    for extra, suffix in ((["--no-compress"], ".trace"), ([], ".trace.zst")):
        r = child.run(gpuheap, "run", *extra, "--", sys.executable, "-m", "pytest", "-p",
                      "pytest_gpuheap", "-p", "no:cacheprovider", "-rA", timeout=300)
        named = re.search(r"^trace: (\S+)  \(gpuheap summary --phase '([^']+)' (\S+)\)$",
                          r.stdout.str(), re.M)
        assert named, r.stdout.str()
        assert named.group(1).endswith(suffix) and os.path.isfile(named.group(1)), named.group(1)
        s = subprocess.run([gpuheap, "summary", "--phase", named.group(2), named.group(3)],
                           capture_output=True, text=True, timeout=300)
        assert s.returncode == 0 and "40.0 MiB requested" in s.stdout, s.stderr
