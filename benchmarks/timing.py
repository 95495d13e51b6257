"""Timing helpers shared by the CPU benchmarks (same method everywhere).

``timeit`` with the statement compiled inline, ``gc`` disabled while timing,
best-of-N rounds with the candidates interleaved (the order rotates every round) so
drift hits all of them alike; the minimum per candidate is reported.
"""

from __future__ import annotations

import platform
import sys
import timeit


def timer(stmt: str, namespace: dict) -> timeit.Timer:
    return timeit.Timer(stmt, globals=namespace)


def calibrate(t: timeit.Timer, target_s: float, max_number: int) -> int:
    """Loop count so that one measurement takes about ``target_s``."""
    number = 1
    while number < max_number:
        if t.timeit(number) >= target_s / 4:
            break
        number *= 4
    per_call = t.timeit(number) / number
    return max(1, min(max_number, int(target_s / per_call)))


def measure(
    candidates: dict,
    rounds: int,
    target_s: float,
    numbers: dict | None = None,
    max_number: int = 10_000_000,
):
    """Best-of-``rounds`` seconds per call for every candidate, interleaved.

    ``candidates``: name -> timeit.Timer. ``numbers``: optional fixed loop counts
    (used for torch.cond); the others are calibrated to ``target_s`` per measurement.
    """
    numbers = dict(numbers or {})
    for name, t in candidates.items():
        if name not in numbers:
            numbers[name] = calibrate(t, target_s, max_number)
    best = {name: float("inf") for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            best[name] = min(best[name], candidates[name].timeit(numbers[name]) / numbers[name])
    return best, numbers


def dynamo_frames_compiled() -> int:
    """Graphs dynamo has compiled so far in this process (0 if dynamo never loaded)."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]  # +1 per (re)compile


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cuda_ms(fn, calls: int, repeats: int) -> float:
    """Median milliseconds per call of ``fn`` on the current CUDA stream (CUDA events),
    over ``repeats`` loops of ``calls`` calls."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]
