"""What the benchmark scripts share: the run header, timing, JSON output, short lines.

* ``Run``: the header every result file and printout starts with (commit with
  ``-dirty``, torch and Python versions, CPU model, threads, load average before and
  after the run), ``Run.say`` (prints, wrapping at 100 characters) and ``Run.write``
  (the JSON file).
* ``measure``: ``torch.utils.benchmark.Timer.blocked_autorange`` for a group of
  candidates, repeated for a few interleaved rounds (the order rotates every round, so
  drift hits every candidate alike) and merged; the fastest block is the reported
  time (``best``), the median and IQR are kept too. ``Timer`` runs with
  ``torch.get_num_threads()`` threads (its default would be 1), and ``timeit``
  underneath compiles the statement inline and turns gc off.
* ``against``: each case's candidates timed beside its baseline, one row per candidate.
* ``conditionals``: the code under test for a cond and a switch over given branches,
  with its Python baselines (``bench_eager.py`` and ``bench_autograd.py``).
* ``cuda_ms``: CUDA-event timing for the GPU scripts.

Run the scripts from the repository root; each puts ``benchmarks/`` first on
``sys.path`` itself (it is the script's folder), so ``import common`` works there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import textwrap
import time

import torch
from torch.utils import benchmark

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
MAX_LINE = 100  # no printed line is longer (the entry point checks)


# --- header -----------------------------------------------------------------------------


def git_commit() -> str:
    """``git rev-parse --short HEAD``, plus ``-dirty`` when tracked files differ from HEAD."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def loadavg() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def header(benchmark_name: str, quick: bool) -> dict:
    import torchcond

    return {
        "benchmark": benchmark_name,
        "mode": "quick" if quick else "full",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "torchcond": torchcond.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_before": loadavg(),
        "argv": sys.argv[1:],
    }


def device_slug() -> str:
    """The CUDA device's name for file names: ``NVIDIA H100 80GB HBM3`` ->
    ``nvidia-h100-80gb-hbm3``, so results from different GPUs sit side by side."""
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def wrap(text: str, indent: str = "    ") -> list[str]:
    """``text`` cut into lines of at most MAX_LINE characters (continuations indented)."""
    lines = []
    for line in text.splitlines() or [""]:
        if len(line) <= MAX_LINE:
            lines.append(line)
        else:
            lines.extend(
                textwrap.wrap(
                    line,
                    MAX_LINE,
                    subsequent_indent=indent,
                    break_long_words=True,
                    break_on_hyphens=False,
                )
            )
    return lines


def standard_args(doc: str, quick_help: str, argv=None) -> argparse.Namespace:
    """``--quick`` and ``--out FILE.json``, the options every benchmark script takes."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", help="write the results to this JSON file")
    return parser.parse_args(argv)


class Run:
    """One benchmark run: its header, what it printed, and its results (a JSON file)."""

    def __init__(self, name: str, title: str, quick: bool):
        self.name = name
        self.header = header(name, quick)
        self.quick = quick
        self.results: dict = {}
        self.claims: list[dict] = []
        self.notes: list[str] = []
        self._t0 = time.perf_counter()
        self.say(title)
        h = self.header
        self.say(
            f"commit {h['commit']}, torch {h['torch']}, torchcond {h['torchcond']}, "
            f"python {h['python']}, {h['date_utc']}"
        )
        self.say(
            f"cpu {h['cpu']!r} ({h['machine']}), {h['cpu_count']} cpus, "
            f"torch threads {h['torch_threads']}, mode {h['mode']}"
        )
        self.say(f"load average before: {' '.join(map(str, h['load_before']))} (1, 5, 15 min)")

    def say(self, text: str = "") -> None:
        for line in wrap(text):
            print(line, flush=True)

    def note(self, text: str) -> None:
        """A note: printed with a ``note`` prefix and kept in the JSON."""
        self.notes.append(text)
        self.say(f"note: {text}")

    def claim(self, what: str, value: float, target: str, meets: bool | None, **extra) -> None:
        """A ratio against a baseline measured in this run, with its (informational) target."""
        self.claims.append(
            {"claim": what, "value": value, "target": target, "meets": meets, **extra}
        )
        if meets is None:
            self.say(f"claim: {what}: {value:.3g} (no target)")
        else:
            verdict = "meets" if meets else "MISSES"
            self.say(f"claim: {what}: {value:.3g} (target {target}: {verdict}; informational)")

    def finish(self, out: str | None) -> None:
        self.header["load_after"] = loadavg()
        self.header["elapsed_s"] = round(time.perf_counter() - self._t0, 2)
        self.say(
            f"load average after: {' '.join(map(str, self.header['load_after']))}; "
            f"{self.name} took {self.header['elapsed_s']:.1f} s"
        )
        if out:
            write_json(
                out,
                {
                    "header": self.header,
                    "claims": self.claims,
                    "notes": self.notes,
                    "results": self.results,
                },
            )
            self.say(f"wrote {os.path.relpath(out)}")


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")


# --- the code under test ----------------------------------------------------------------


def conditionals(f, g, branches) -> dict:
    """A ``timer`` namespace: a cond over ``f`` / ``g`` and a switch over ``branches``, and
    their baselines. ``py_if(x)`` is the Python ``if`` on ``x.sum() > 0``; ``tc_cond(x)``
    and ``torch_cond(x)`` are the same function written with ``torchcond.cond`` and
    ``torch.cond``. The other baselines are statements over these names:
    ``f(x) if p else g(x)`` (a precomputed predicate), ``branches[int(i)](x)`` (switch)."""
    import torchcond

    def py_if(x):
        if x.sum() > 0:
            return f(x)
        return g(x)

    def tc_cond(x):
        return torchcond.cond(x.sum() > 0, f, g, (x,))

    def torch_cond(x):
        return torch.cond(x.sum() > 0, f, g, (x,))

    return {
        "torch": torch,
        "cond": torchcond.cond,
        "switch": torchcond.switch,
        "f": f,
        "g": g,
        "branches": list(branches),
        "py_if": py_if,
        "tc_cond": tc_cond,
        "torch_cond": torch_cond,
    }


# --- timing -----------------------------------------------------------------------------


def fmt_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``: table cells and plot tick labels."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def timer(stmt: str, ns: dict, label: str = "", sub_label: str = "", description: str = ""):
    """A ``torch.utils.benchmark.Timer`` running ``stmt`` in namespace ``ns``."""
    return benchmark.Timer(
        stmt=stmt,
        globals=ns,
        label=label,
        sub_label=sub_label,
        description=description,
        num_threads=torch.get_num_threads(),
    )


def measure(timers: dict, rounds: int, min_run_time: float) -> dict:
    """name -> merged ``Measurement`` of ``rounds`` interleaved ``blocked_autorange`` runs."""
    runs: dict[str, list] = {name: [] for name in timers}
    names = list(timers)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(timers[name].blocked_autorange(min_run_time=min_run_time))
    return {name: benchmark.Measurement.merge(ms)[0] for name, ms in runs.items()}


def best(m) -> float:
    """The reported time: seconds per call of the fastest block. Each block averages many
    calls, and on a shared machine interference only ever adds time, so the fastest block
    is the steadiest estimate of the call itself (the median moves with the load)."""
    return min(m.times)


def stats(m) -> dict:
    """Seconds per call: the fastest block (reported), the median and IQR over blocks."""
    return {
        "best_s": best(m),
        "median_s": m.median,
        "iqr_s": m.iqr,
        "blocks": len(m.times),
    }


def record(case, baseline_stmt, candidate, candidate_stmt, baseline, result, **ratios) -> dict:
    """One JSON row: a candidate against the baseline timed beside it, with its ratios."""
    return {
        "case": case,
        "baseline_stmt": baseline_stmt,
        "candidate": candidate,
        "candidate_stmt": candidate_stmt,
        "baseline": stats(baseline),
        "result": stats(result),
        **ratios,
    }


def against(baseline: str, group: str, cases, ns, rounds, min_run_time, column=None):
    """Each case ``(title, baseline stmt, {candidate: stmt})`` timed in one ``measure`` run:
    a ``record`` per candidate with its ratio and overhead over the baseline, and every
    measurement. ``column(name)`` is the candidate's column in ``compare`` (default: name)."""
    rows, ms_all = [], []
    for title, base, cands in cases:
        timers = {baseline: timer(base, ns, group, title, baseline)}
        for name, stmt in cands.items():
            timers[name] = timer(stmt, ns, group, title, column(name) if column else name)
        ms = measure(timers, rounds, min_run_time)
        ms_all += ms.values()
        for name, stmt in cands.items():
            bt, ct = best(ms[baseline]), best(ms[name])
            rows.append(
                record(
                    title,
                    base,
                    name,
                    stmt,
                    ms[baseline],
                    ms[name],
                    ratio=ct / bt,
                    overhead_ns=(ct - bt) * 1e9,
                )
            )
    return rows, ms_all


def compare(measurements: list, title: str | None = None) -> None:
    """Print ``torch.utils.benchmark.Compare`` of the measurements (its cells are medians)."""
    if title:
        print(title)
    cmp = benchmark.Compare(measurements)
    for line in str(cmp).splitlines():
        print(line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "...")
    sys.stdout.flush()


def dynamo_graphs_compiled() -> int:
    """Graphs dynamo has compiled so far in this process (0 if dynamo never loaded)."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]  # +1 per (re)compile


def raise_dynamo_limits(limit: int = 64) -> str:
    """Raise dynamo's recompile limits (never pushed onto its fallback path while timing)."""
    import torch._dynamo.config as cfg

    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), limit))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)
    elif hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)
    return f"{name}={getattr(cfg, name)}"


def cuda_ms(fn, calls: int, repeats: int) -> float:
    """Median milliseconds per call of ``fn`` on the current CUDA stream (CUDA events around
    ``repeats`` loops of ``calls`` calls). ``torch.utils.benchmark`` times CUDA from the host
    with a sync per block; events keep the host out of the device time."""
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]
