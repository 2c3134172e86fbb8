#!/usr/bin/env python3
"""`gpuheap top` and `gpuheap run --live` beside a running job on the simulated CUDA runtime
(ctest Top.*). The job is prog_grow (one more allocation of N MiB at step N, inside a
"step" range).

  test_top.py BUILD_DIR growth|killed|run_live|tmux|categories|rolling|rolling_missed|rolling_compressed

growth:   top --interval 0.2 --json follows the job: the JSON lines show the growth in order,
          and the last one equals `gpuheap summary --json` of the finished trace.
killed:   the job is killed (SIGKILL: no end record); the view ends by itself with
          "process ended", the process "gone", within a bounded time.
run_live: run --live starts the job and the view together; the program's output goes to its
          file, shown at exit; the exit status is the program's; the trace is finished.
tmux:     the interactive view in a tmux pane: the current figure and the top site on the
          screen, keys sort, group and quit. Exits 77 (ctest SKIP_RETURN_CODE) without tmux.
rolling:  a job under a rolling window (GPUHEAP_AGGREGATE=64KiB, prog_roll) rolls its trace
          several times while top follows it, one step at a time (a go file per step: at most
          one roll between two refreshes): the lines show each step's growth across the rolls,
          the step number and per-step growth stay exact, and the last line equals
          `gpuheap summary --json` of the finished window (peak held, live by site).
rolling_missed: the same, with top stopped (SIGSTOP) while one step rolls the trace at least
          twice: top goes on from the newest segment's snapshot (current, peak held and live
          sites exact, a note, the step number unknown) and ends equal to the summary.
rolling_compressed: top (following the trace file) stopped (SIGSTOP) before the last step,
          which rolls the trace once, then (a second job) two or more times; the job exits and its trace is finished as
          `gpuheap run` finishes it (symbolized, compressed to TRACE.zst, TRACE removed) before
          top goes on: top ends "process ended" on the finished trace's figures (equal to its
          summary), never on the segment it had open (flagged incomplete). A third job's
          TRACE.zst is another process's finished trace: top leaves it alone (gone, incomplete).
categories: a job shaped like a PyTorch one (py/torch_shaped.py) followed with --json: the
          live bytes by category, provisional while it runs, final in the last line, where
          parameter and optimizer_state equal `summary --json`'s categories live at the end;
          the same on the shipped GPT trace (symbols stored at its end).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
SKIP = 77


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Env:
    def __init__(self, build):
        self.build = os.path.abspath(build)
        self.gpuheap = os.path.join(self.build, "gpuheap")
        self.prog = os.path.join(self.build, "tests", "preload", "prog_grow")
        self.dir = tempfile.mkdtemp(prefix="gpuheap-top-")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAP_", "LD_PRELOAD"))}

    def start_job(self, *args):
        """prog_grow ARGS under the preload, its trace in self.dir; stdout a pipe."""
        env = dict(self.env, LD_LIBRARY_PATH=os.path.join(self.build, "simcuda"),
                   LD_PRELOAD=os.path.join(self.build, "libgpuheap.so"),
                   GPUHEAP_OUTPUT=os.path.join(self.dir, "t.%p.trace"), GPUHEAP_QUIET="1")
        return subprocess.Popen([self.prog, *map(str, args)], env=env, stdout=subprocess.PIPE, text=True)

    def start_py(self, script, *args):
        """A Python script of tests/preload/py under the preload, as start_job runs prog_grow."""
        env = dict(self.env, LD_LIBRARY_PATH=os.path.join(self.build, "simcuda"),
                   LD_PRELOAD=os.path.join(self.build, "libgpuheap.so"),
                   GPUHEAP_OUTPUT=os.path.join(self.dir, "t.%p.trace"), GPUHEAP_QUIET="1")
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "py", script)
        return subprocess.Popen([sys.executable, path, *map(str, args)], env=env, stdout=subprocess.PIPE, text=True)

    def start_roll(self, *args):
        """prog_roll ARGS under the preload with a rolling window of 64 KiB segments."""
        env = dict(self.env, LD_LIBRARY_PATH=os.path.join(self.build, "simcuda"),
                   LD_PRELOAD=os.path.join(self.build, "libgpuheap.so"),
                   GPUHEAP_OUTPUT=os.path.join(self.dir, "t.%p.trace"), GPUHEAP_QUIET="1",
                   GPUHEAP_AGGREGATE="64KiB")
        prog = os.path.join(self.build, "tests", "preload", "prog_roll")
        return subprocess.Popen([prog, *map(str, args)], env=env, stdout=subprocess.PIPE, text=True)

    def top(self, *args, timeout=60):
        """gpuheap top ARGS to the end: (return code, stdout lines, stderr, seconds)."""
        t0 = time.monotonic()
        try:
            r = subprocess.run([self.gpuheap, "top", *map(str, args)], env=self.env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            fail(f"gpuheap top {' '.join(map(str, args))} did not end within {timeout} s (a hang)")
        return r.returncode, r.stdout.splitlines(), r.stderr, time.monotonic() - t0

    def traces(self):
        return sorted(os.path.join(self.dir, f) for f in os.listdir(self.dir) if ".trace" in f)


def wait_line(proc, want, timeout=30):
    """Reads the job's stdout until the line `want` (the job reached that step)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            fail(f"the job ended before printing {want!r}")
        if line.strip() == want:
            return
    fail(f"the job never printed {want!r}")


def device0(proc_json):
    devs = proc_json["devices"]
    if len(devs) != 1:
        fail(f"expected one device, got {devs}")
    return devs[0]


def check_final_equals_summary(e, last, trace):
    r = subprocess.run([e.gpuheap, "summary", "--json", trace], env=e.env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"summary failed: {r.stderr}")
    s = json.loads(r.stdout)
    got, want = device0(last["processes"][0]), s["devices"][0]
    for key in ("requested_bytes", "allocated_bytes", "reserved_bytes"):
        for fig in ("current", "peak"):
            if got[key][fig] != want[key][fig]:
                fail(f"final {key}.{fig} {got[key][fig]} != summary's {want[key][fig]}")
    for key in ("num_ooms", "num_alloc_retries", "total_memory"):
        if got[key] != want[key]:
            fail(f"final {key} {got[key]} != summary's {want[key]}")
    sites = last["processes"][0]["top_sites"]
    if sum(x["bytes"] for x in sites) != s["leaked_bytes"] or sum(x["count"] for x in sites) != s["leaked_count"]:
        fail(f"final live sites {sites} != summary's live at the end {s['leaked_bytes']} B x{s['leaked_count']}")
    if sites[0]["bytes"] != s["leaks"][0]["bytes"] or "prog_grow.cpp" not in sites[0]["label"]:
        fail(f"top site {sites[0]} != summary's {s['leaks'][0]['bytes']} B at prog_grow.cpp")


def case_growth(e):
    steps = 6
    job = e.start_job(steps, 400)
    rc, lines, err, _ = e.top("--interval", 0.2, "--json", e.dir)
    job.stdout.read()
    if job.wait() != 0:
        fail(f"the job exited {job.returncode}")
    if rc != 0 or "process ended" not in err:
        fail(f"top exited {rc}, stderr {err!r}")
    snaps = [json.loads(x) for x in lines]
    cumulative = [sum(range(1, i + 1)) * MIB for i in range(0, steps + 1)]
    seen = []
    for j in snaps:
        if j["schema"] != "gpuheap.top/1":
            fail(f"schema {j['schema']}")
        if not j["processes"] or not j["processes"][0]["devices"]:
            continue
        cur = device0(j["processes"][0])["requested_bytes"]["current"]
        if cur not in cumulative:
            fail(f"requested {cur} is no step's total ({cumulative})")
        if seen and cur < seen[-1]:
            fail(f"requested went down: {seen[-1]} then {cur}")
        if not seen or cur != seen[-1]:
            seen.append(cur)
    if len(seen) < 3 or seen[-1] != cumulative[-1]:
        fail(f"growth seen {seen}: fewer than 3 steps, or not ending at {cumulative[-1]}")
    last = snaps[-1]
    if last["state"] != "ended" or last.get("message") != "process ended" or any(j["state"] == "ended"
                                                                                  for j in snaps[:-1]):
        fail("only the last line may say ended, and it must")
    p = last["processes"][0]
    if p["state"] != "ended" or p["step"] != {"name": "step", "number": steps}:
        fail(f"last process state {p['state']}, step {p['step']}")
    growth = [x["growth"] for x in device0(p)["steps"]]
    if growth != [i * MIB for i in range(1, steps)] + [None]:  # the last step's growth is known at the next one
        fail(f"per-step growth {growth}")
    check_final_equals_summary(e, last, e.traces()[0])
    print(f"growth: {len(snaps)} lines, requested seen {[x // MIB for x in seen]} MiB, final = summary")


def case_killed(e):
    job = e.start_job(3, 50, "hang")
    wait_line(job, "step 3")
    top = subprocess.Popen([e.gpuheap, "top", "--interval", "0.2", "--json", str(job.pid)], env=e.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    if top.poll() is not None:
        fail(f"top ended while the job ran: {top.stderr.read()}")
    t0 = time.monotonic()
    job.send_signal(signal.SIGKILL)
    try:
        out, err = top.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        top.kill()
        fail("top did not end within 20 s of the job being killed (a hang)")
    took = time.monotonic() - t0
    job.wait()
    snaps = [json.loads(x) for x in out.splitlines()]
    last = snaps[-1]
    if top.returncode != 0 or "process ended" not in err or last.get("message") != "process ended":
        fail(f"top exited {top.returncode}, stderr {err!r}, last line {last}")
    if any(j["processes"][0]["state"] != "running" for j in snaps[:-1]):
        fail("a line before the kill said the process was not running")
    p = last["processes"][0]
    if p["state"] != "gone" or device0(p)["requested_bytes"]["current"] != 6 * MIB:
        fail(f"after the kill: state {p['state']}, {device0(p)['requested_bytes']}")
    if not any("without an end record" in n and "incomplete" in n for n in last["notes"]):
        fail(f"no note that the trace is incomplete: {last['notes']}")
    print(f"killed: top ended {took:.2f} s after SIGKILL, process gone at 6 MiB")


def case_run_live(e):
    out = os.path.join(e.dir, "out.txt")
    trace = os.path.join(e.dir, "r.trace")
    cmd = [e.gpuheap, "run", "--simulate", "--live", "--live-output", out, "-o", trace, "--no-compress",
           e.prog, "4", "200"]
    try:
        r = subprocess.run(cmd, env=e.env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail("run --live did not end within 60 s")
    if r.returncode != 0:
        fail(f"run --live exited {r.returncode}: {r.stderr}")
    if "step 4" in r.stdout.splitlines() or "step 4" not in open(out).read().splitlines():
        fail(f"the program's output is not kept apart: stdout {r.stdout!r}")
    if "requested 10.0 MiB" not in r.stdout or "prog_grow.cpp" not in r.stdout:
        fail(f"the view's lines lack the figures: {r.stdout!r}")
    if "process ended" not in r.stderr or "output is in " + out not in r.stderr or "  step 4" not in r.stderr:
        fail(f"stderr lacks the end, or the program's output at exit: {r.stderr!r}")
    s = subprocess.run([e.gpuheap, "summary", "--json", trace], env=e.env, capture_output=True, text=True)
    if s.returncode != 0 or json.loads(s.stdout)["devices"][0]["requested_bytes"]["current"] != 10 * MIB:
        fail(f"the trace was not finished: {s.stderr}")
    # The program's exit status is run's, as without --live (prog_grow exits 11 without args).
    out2 = os.path.join(e.dir, "out2.txt")
    r2 = subprocess.run([e.gpuheap, "run", "--simulate", "--live", "--live-output", out2, "-q", e.prog], env=e.env,
                        capture_output=True, text=True, timeout=60)
    if r2.returncode != 11 or "expectation" not in open(out2).read():
        fail(f"exit status {r2.returncode} (want 11), output {open(out2).read()!r}")
    # An existing output file is never replaced.
    r3 = subprocess.run([e.gpuheap, "run", "--simulate", "--live", "--live-output", out, e.prog, "1", "1"],
                        env=e.env, capture_output=True, text=True, timeout=60)
    if r3.returncode != 2 or "step 4" not in open(out).read():
        fail(f"run --live over an existing file: exit {r3.returncode}, {r3.stderr!r}")
    print("run_live: view lines on stdout, program output in its file and shown at exit, status kept")


def capture(tmux, target):
    return subprocess.run(tmux + ["capture-pane", "-p", "-t", target], capture_output=True, text=True).stdout


def wait_screen(tmux, target, want, timeout=20):
    end = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < end:
        screen = capture(tmux, target)
        if all(w in screen for w in want):
            return screen
        time.sleep(0.1)
    fail(f"the screen never showed {want}:\n{screen}")


def case_tmux(e):
    if not shutil.which("tmux"):
        print("tmux is not installed: skipped")
        sys.exit(SKIP)
    job = e.start_job(5, 50, "hang")
    wait_line(job, "step 5")
    tmux = ["tmux", "-L", f"gpuheap-top-{os.getpid()}", "-f", "/dev/null"]
    target = "top"
    env = dict(e.env, TERM="xterm", LANG="C.UTF-8")
    try:
        subprocess.run(tmux + ["new-session", "-d", "-s", target, "-x", "140", "-y", "30",
                               f"exec {e.gpuheap} top --interval 0.2 {job.pid}"], env=env, check=True)
        screen = wait_screen(tmux, target, ["step 5 (step)", "sorted by bytes"])
        rows = [ln for ln in screen.splitlines() if "requested" in ln]
        if not rows or "15.0 MiB" not in rows[0]:
            fail(f"the current requested figure is not 15.0 MiB:\n{screen}")
        if not any(bar in rows[0] for bar in "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"):
            fail(f"no sparkline bar (UTF-8) on the requested row:\n{screen}")
        sites = screen.split("SITE", 1)[1].splitlines()[1:]
        if not sites or "15.0 MiB" not in sites[0] or "main (prog_grow.cpp:" not in sites[0]:
            fail(f"the top site is not main (prog_grow.cpp) with 15.0 MiB:\n{screen}")
        subprocess.run(tmux + ["send-keys", "-t", target, "s"], check=True)
        wait_screen(tmux, target, ["sorted by growth"])
        subprocess.run(tmux + ["send-keys", "-t", target, "g"], check=True)
        wait_screen(tmux, target, ["by function", "main"])
        # A third grouping, by category: prog_grow has no training phase, so its memory is
        # `unknown` (docs/categories.md), under the device's rows as in the site list.
        subprocess.run(tmux + ["send-keys", "-t", target, "g"], check=True)
        screen = wait_screen(tmux, target, ["SITE (by category", "by category (provisional): unknown 15.0 MiB"])
        sites = screen.split("SITE", 1)[1].splitlines()[1:]
        if not sites or "15.0 MiB" not in sites[0] or not sites[0].rstrip().endswith("unknown"):
            fail(f"grouped by category, the top row is not unknown with 15.0 MiB:\n{screen}")
        subprocess.run(tmux + ["send-keys", "-t", target, "q"], check=True)
        end = time.monotonic() + 10
        while subprocess.run(tmux + ["has-session", "-t", target], capture_output=True).returncode == 0:
            if time.monotonic() > end:
                fail("q did not end the view")
            time.sleep(0.1)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
        job.kill()
        job.wait()
    print("tmux: current figure and top site on screen; s sorted by growth, g grouped by function, then by "
          "category, q quit")


def case_categories(e):
    steps = 5
    job = e.start_py("torch_shaped.py", "train", steps, 0.3)
    rc, lines, err, _ = e.top("--interval", 0.2, "--json", e.dir)
    job.stdout.read()
    if job.wait() != 0:
        fail(f"the job exited {job.returncode}")
    if rc != 0 or "process ended" not in err:
        fail(f"top exited {rc}, stderr {err!r}")
    snaps = [json.loads(x) for x in lines]
    live = [j["processes"][0] for j in snaps[:-1] if j["processes"] and j["processes"][0]["devices"]]
    if not live or any(p["categories_are"] != "provisional" for p in live if p["state"] == "running"):
        fail(f"no running line, or one whose categories are not provisional: {[p['categories_are'] for p in live]}")
    # While it runs: the optimizer state appears on the first step (2 x 4 x 1 MiB) and stays; a
    # refresh may fall between a step's 1 MiB temporary and its free (provisionally state).
    states = [device0(p)["categories"]["optimizer_state"]["bytes"] for p in live + [snaps[-1]["processes"][0]]]
    if 8 * MIB not in states or any(b not in (8 * MIB, 9 * MIB) for b in states[states.index(8 * MIB):]):
        fail(f"optimizer_state over the run: {states}")
    if not any(b >= 8 * MIB for b in states[:-1]):
        fail(f"the optimizer state never showed while the job ran: {states}")
    last = snaps[-1]["processes"][0]
    if last["categories_are"] != "final" or not last["training_found"]:
        fail(f"last line: categories {last['categories_are']}, training found {last['training_found']}")
    r = subprocess.run([e.gpuheap, "summary", "--json", e.traces()[0]], env=e.env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"summary failed: {r.stderr}")
    want = json.loads(r.stdout)["categories"]["leaked"]
    got = device0(last)["categories"]
    for cat, size in (("parameter", 4 * MIB), ("optimizer_state", 8 * MIB)):
        if got[cat] != want[cat] or got[cat]["bytes"] != size:
            fail(f"final {cat} {got[cat]} != summary's live at the end {want[cat]} (expected {size} B)")
    # Every category the summary decided for what is live at the end is the final line's.
    if got != want:
        fail(f"final categories {got} != summary's live at the end {want}")
    cats = {s["category"] for s in last["top_sites"]}
    if not {"parameter", "optimizer_state"} <= cats:
        fail(f"final top sites' categories {cats}")
    # A trace whose symbols come at its end (stored by `gpuheap run`'s finishing step, as in
    # the shipped GPT trace): the live read classifies before they arrive; the last line is
    # still the summary's (the ended trace is classified again, with them).
    gpt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "traces",
                       "h100-gpt-train.trace.zst")
    rc, lines, err, _ = e.top("--once", "--json", gpt)
    r = subprocess.run([e.gpuheap, "summary", "-q", "--json", gpt], env=e.env, capture_output=True, text=True)
    if rc != 0 or r.returncode != 0:
        fail(f"top --once {rc} / summary {r.returncode} on {gpt}: {err} {r.stderr}")
    p = json.loads(lines[-1])["processes"][0]
    got_gpt, want_gpt = device0(p)["categories"], json.loads(r.stdout)["categories"]["leaked"]
    if p["categories_are"] != "final" or got_gpt != want_gpt or got_gpt["library"]["bytes"] == 0:
        fail(f"GPT trace: top's final categories {got_gpt} != summary's live at the end {want_gpt}")
    print(f"categories: {len(snaps)} lines, optimizer_state seen {sorted(set(states))}, final = summary's {got}; "
          f"GPT trace final = summary's")


class TopLines:
    """gpuheap top ARGS running in the background, its JSON lines collected as they come."""

    def __init__(self, e, *args):
        self.proc = subprocess.Popen([e.gpuheap, "top", *map(str, args)], env=e.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines, self.cv = [], threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(json.loads(line))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # the end
            self.cv.notify_all()

    def wait(self, what, pred, timeout=30):
        """The first line from now on for which pred holds."""
        end = time.monotonic() + timeout
        with self.cv:
            at = len(self.lines)
            while True:
                while at < len(self.lines):
                    j = self.lines[at]
                    at += 1
                    if j is None:
                        fail(f"top ended before {what}: {self.lines[-2] if len(self.lines) > 1 else None}")
                    if pred(j):
                        return j
                left = end - time.monotonic()
                if left <= 0:
                    fail(f"top never showed {what} within {timeout} s; its last line: "
                         f"{self.lines[-1] if self.lines else None}")
                self.cv.wait(left)

    def finish(self, timeout=60):
        # stdout is the reader thread's: communicate() would read it too, taking the last lines.
        self.reader.join(timeout)
        if self.reader.is_alive():
            self.proc.kill()
            fail(f"top did not end within {timeout} s of the job's end (a hang)")
        err = self.proc.stderr.read()  # a line or two: never fills the pipe before the end
        self.proc.wait()
        return self.proc.returncode, err, [j for j in self.lines if j is not None]


def window_segment(e, trace):
    """The segment number of the rolling window's trace as written now (0: not rolled yet)."""
    r = subprocess.run([e.gpuheap, "summary", "--json", trace], env=e.env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"summary of {trace} failed: {r.stderr}")
    return json.loads(r.stdout)["trace"].get("window", {}).get("segment", 0)


def case_rolling(e, missed=False):
    steps, churn = 12, 800  # ~2,400 events a step: under half of a 64 KiB segment (~5,800)
    big = 6 if missed else 0  # with 8 x the churn: ~19,000 events, at least two rolls
    godir = os.path.join(e.dir, "go")
    os.mkdir(godir)
    go = lambda k: open(os.path.join(godir, f"go.{k}"), "w").close()  # noqa: E731
    job = e.start_roll(steps, churn, godir, *([big, 8 * churn] if missed else []))
    top = None
    try:
        go(1)
        wait_line(job, "step 1")
        top = TopLines(e, "--interval", 0.2, "--json", e.dir)
        follow_rolls(e, job, top, go, steps, big)
    finally:  # on a failure: neither may outlive the test (ctest waits for its output pipes)
        for proc in (job, top and top.proc):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()


def follow_rolls(e, job, top, go, steps, big):
    missed = big > 0
    cum = lambda k: sum(range(1, k + 1)) * MIB  # noqa: E731
    trace = e.traces()[0]

    def current(j):
        return j["processes"] and j["processes"][0]["devices"] and \
            device0(j["processes"][0])["requested_bytes"]["current"]

    top.wait("step 1's bytes", lambda j: current(j) == cum(1))
    first_segment = window_segment(e, trace)
    for k in range(2, steps + 1):
        if k == big:
            before = window_segment(e, trace)
            os.kill(top.proc.pid, signal.SIGSTOP)
        go(k)
        wait_line(job, f"step {k}")
        if k == big:
            after = window_segment(e, trace)
            os.kill(top.proc.pid, signal.SIGCONT)
            if after - before < 2:
                fail(f"step {k} rolled the trace {after - before} times while top was stopped (want 2 or more)")
        j = top.wait(f"step {k}'s bytes ({cum(k)})", lambda j: current(j) == cum(k))
        if len(j["processes"]) != 1:
            fail(f"one process expected (never TRACE.roll): {[p['trace'] for p in j['processes']]}")
        p = j["processes"][0]
        d = device0(p)
        if d["requested_bytes"]["peak"] != cum(k) or d["peak_held"]["bytes"] != cum(k):
            fail(f"step {k}: peak {d['requested_bytes']} / peak held {d['peak_held']} != {cum(k)}")
        live = {s["function"].split("::")[-1]: (s["bytes"], s["count"]) for s in p["top_sites"]}
        odd = [i for i in range(1, k + 1) if i % 2]
        even = [i for i in range(1, k + 1) if not i % 2]
        want = {"keep_odd": (sum(odd) * MIB, len(odd)), "keep_even": (sum(even) * MIB, len(even))}
        if live != want:
            fail(f"step {k}: live sites {live} != {want}")
        want_step = None if missed and k >= big else k
        if p["step"] != {"name": "step", "number": want_step}:
            fail(f"step {k}: step {p['step']} (want number {want_step})")
    if job.wait() != 0:
        fail(f"the job exited {job.returncode}")
    rc, err, snaps = top.finish()
    if rc != 0 or "process ended" not in err:
        fail(f"top exited {rc}, stderr {err!r}")
    last = snaps[-1]
    segments = window_segment(e, trace)
    if segments - first_segment < 3:
        fail(f"the trace rolled {segments - first_segment} times while top followed it (want 3 or more)")
    notes = [n for j in snaps for n in j["notes"]]
    missed_notes = [n for n in notes if "replaced before it could be read" in n]
    if (missed and not missed_notes) or len(notes) != len(missed_notes):
        fail(f"notes: {sorted(set(notes))}")
    if any(len(j["processes"]) > 1 for j in snaps):
        fail("a line with more than one process (TRACE.roll followed?)")
    p = last["processes"][0]
    if p["state"] != "ended" or last.get("message") != "process ended":
        fail(f"last line: state {p['state']}")
    growth = [x["growth"] for x in device0(p)["steps"]]
    want_growth = [i * MIB for i in range(1, steps)] + [None]
    if missed:  # the steps up to the missed segment (step `big` started in it) are forgotten
        want_growth = want_growth[big:]
    if growth != want_growth:
        fail(f"per-step growth {growth} != {want_growth}")
    check_window_final(e, p, trace)
    print(f"rolling{'_missed' if missed else ''}: {len(snaps)} lines over {segments - first_segment} rolls, each "
          f"step's growth shown, final = summary of the window")


def case_rolling_compressed(e):
    # The last step makes 3 x the churn (a segment's events or more: one roll or two) or 8 x
    # (two or more: the segment before the finished one never read).
    for big_churn in (3 * 800, 8 * 800):
        godir = os.path.join(e.dir, f"go{big_churn}")
        os.mkdir(godir)
        one_job_finished_unseen(e, godir, big_churn)
        for t in e.traces():
            os.unlink(t)
    # Another process's finished trace at TRACE.zst (an earlier run's), TRACE removed: not
    # this job's, so top must not take its figures: the job is gone, its trace incomplete.
    godir = os.path.join(e.dir, "go-foreign")
    os.mkdir(godir)
    one_job_finished_unseen(e, godir, 3 * 800, foreign=True)


def one_job_finished_unseen(e, godir, big_churn, foreign=False):
    steps, churn = 6, 800
    go = lambda k: open(os.path.join(godir, f"go.{k}"), "w").close()  # noqa: E731
    job = e.start_roll(steps, churn, godir, steps, big_churn)
    top = None
    try:
        go(1)
        wait_line(job, "step 1")
        trace = e.traces()[0]
        top = TopLines(e, "--interval", 0.2, "--json", trace)
        finish_then_refresh(e, job, top, go, steps, trace, foreign)
    finally:  # on a failure: neither may outlive the test (ctest waits for its output pipes)
        for proc in (job, top and top.proc):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()


def foreign_finished_trace(e, trace):
    """A second prog_roll job run to its end (every go file there first), its trace finished
    and moved to TRACE.zst; TRACE removed."""
    godir = os.path.join(e.dir, "go-other")
    os.mkdir(godir)
    for k in range(1, 4):
        open(os.path.join(godir, f"go.{k}"), "w").close()
    mine = set(e.traces())
    other = e.start_roll(3, 800, godir)
    other.stdout.read()
    if other.wait() != 0:
        fail(f"the second job exited {other.returncode}")
    new = [t for t in e.traces() if t not in mine]
    if len(new) != 1:
        fail(f"the second job's trace: {new}")
    r = subprocess.run([e.gpuheap, "compress", new[0]], env=e.env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"gpuheap compress failed: {r.stderr}")
    os.rename(new[0] + ".zst", trace + ".zst")
    os.unlink(trace)


def finish_then_refresh(e, job, top, go, steps, trace, foreign=False):
    cum = lambda k: sum(range(1, k + 1)) * MIB  # noqa: E731

    def current(j):
        return j["processes"] and j["processes"][0]["devices"] and \
            device0(j["processes"][0])["requested_bytes"]["current"]

    for k in range(2, steps):
        go(k)
        wait_line(job, f"step {k}")
        top.wait(f"step {k}'s bytes ({cum(k)})", lambda j: current(j) == cum(k))
    before = window_segment(e, trace)
    os.kill(top.proc.pid, signal.SIGSTOP)
    go(steps)
    job.stdout.read()
    if job.wait() != 0:
        fail(f"the job exited {job.returncode}")
    rolls = window_segment(e, trace) - before
    if rolls < 1:
        fail(f"the last step rolled the trace {rolls} times (want 1 or more)")
    if foreign:
        foreign_finished_trace(e, trace)
    for cmd in () if foreign else ("symbolize", "compress"):  # as `gpuheap run` finishes it
        r = subprocess.run([e.gpuheap, cmd, trace], env=e.env, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"gpuheap {cmd} failed: {r.stderr}")
    if os.path.exists(trace) or not os.path.exists(trace + ".zst"):
        fail(f"compress left {os.listdir(e.dir)}")
    os.kill(top.proc.pid, signal.SIGCONT)
    rc, err, snaps = top.finish()
    last = snaps[-1]
    p = last["processes"][0]
    if foreign:
        if p["state"] != "gone" or not any("incomplete" in n for n in last["notes"]):
            fail(f"top took another process's trace: state {p['state']}, notes {last['notes']}")
        return
    if rc != 0 or "process ended" not in err or last.get("message") != "process ended" or p["state"] != "ended":
        fail(f"top exited {rc}, state {p['state']}, notes {last['notes']}, stderr {err!r}")
    notes = last["notes"]
    missed = [n for n in notes if "replaced before it could be read" in n]
    if len(notes) != len(missed) or (rolls > 1) != bool(missed):
        fail(f"after {rolls} rolls: notes {notes}")
    want_step = steps if rolls == 1 else None  # two rolls unread: a segment's steps missed
    if p["step"] != {"name": "step", "number": want_step}:
        fail(f"after {rolls} rolls: step {p['step']} (want number {want_step})")
    growth = [x["growth"] for x in device0(p)["steps"]]
    if rolls == 1 and growth != [i * MIB for i in range(1, steps)] + [None]:
        fail(f"after one roll: per-step growth {growth}")
    check_window_final(e, p, trace + ".zst")
    print(f"rolling_compressed: {rolls} roll(s) then exit and compression while top was stopped; "
          f"final = summary of {os.path.basename(trace)}.zst")


def check_window_final(e, p, trace):
    """The last line against `gpuheap summary --json` of the finished window: what stays exact."""
    r = subprocess.run([e.gpuheap, "summary", "--json", trace], env=e.env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"summary failed: {r.stderr}")
    s = json.loads(r.stdout)
    if "window" not in s["trace"]:
        fail("the finished trace is no rolling window")
    got, want = device0(p), s["devices"][0]
    if got["peak_held"] != {k: want["peak_held"][k] for k in ("bytes", "allocated_bytes")}:
        fail(f"final peak held {got['peak_held']} != summary's {want['peak_held']}")
    if got["requested_bytes"]["current"] != want["requested_bytes"]["current"] or \
            got["requested_bytes"]["peak"] != want["peak_held"]["bytes"]:
        fail(f"final requested {got['requested_bytes']} != summary's current "
             f"{want['requested_bytes']['current']}, peak held {want['peak_held']['bytes']}")
    for key in ("num_ooms", "num_alloc_retries", "total_memory"):
        if got[key] != want[key]:
            fail(f"final {key} {got[key]} != summary's {want[key]}")
    live = sorted((x["function"], x["bytes"], x["count"]) for x in p["top_sites"])
    leaks = sorted((x["label"], x["bytes"], x["count"]) for x in s["leaks"])
    if live != leaks or sum(x[1] for x in live) != s["leaked_bytes"]:
        fail(f"final live sites {live} != summary's leaks {leaks} ({s['leaked_bytes']} B)")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    e = Env(sys.argv[1])
    try:
        {"growth": case_growth, "killed": case_killed, "run_live": case_run_live, "tmux": case_tmux,
         "categories": case_categories, "rolling": case_rolling,
         "rolling_missed": lambda e: case_rolling(e, missed=True), "rolling_compressed": case_rolling_compressed}[sys.argv[2]](e)
    finally:
        shutil.rmtree(e.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
