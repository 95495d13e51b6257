"""Tracing a derivative through a conditional: time, and how many branch traces it takes.

A traced backward (``make_fx`` of a gradient, AOTAutograd) traces every branch's
forward, then every branch's vjp. Each trace of a branch is a make_fx sub-trace, so
the number of them is what tracing a derivative costs beyond the ops themselves.
This benchmark counts torchcond's sub-traces (every call into make_fx's tracer for a
branch or a derivative graph) and times the whole trace against ``torch.cond`` traced
the same way in the same run.

Program: ``x -> grad of cond(x.sum() > 0, f, g, (x,)).sum()``, where ``f`` and ``g``
close over a weight ``W`` (8x8, requires grad) and the gradient is taken with respect
to ``x`` and ``W``. Cases:

* ``make_fx`` of the gradient, fake and symbolic tracing;
* ``make_fx`` of the second derivative (the gradient of ``grad_x . 1`` w.r.t. ``x``), fake;
* ``aot_function`` (functionalized, joint forward and backward), nop compilers.

Timing: the fastest of ``repeats`` full traces (each one a fresh make_fx session);
ratio = torchcond / torch.cond. Not a test: it never fails on a slow result.

    python benchmarks/bench_traced_backward.py            # full run (~1 min on 2 cores)
    python benchmarks/bench_traced_backward.py --quick    # smoke run for CI
"""

from __future__ import annotations

import os
import sys
import time

import torch
from functorch.compile import aot_function, nop
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import torchcond
from torchcond import _compat

TARGET = 1.0  # torchcond traces a derivative no slower than torch.cond


class SubTraces:
    """Counts torchcond's make_fx sub-traces (branches and derivative graphs)."""

    def __init__(self):
        self.count = 0
        self._patched = {}

    def __enter__(self):
        for name in ("trace_inner", "make_fx_keeping_detach"):
            original = getattr(_compat, name)
            self._patched[name] = original

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(_compat, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(_compat, name, original)


def programs(cond):
    """The forward, its gradient and a second derivative, each a function of ``(x, w)``."""

    def out(x, w):
        return cond(x.sum() > 0, lambda a: (a @ w).sin(), lambda a: (a * w).cos(), (x,))

    def grad(x, w):
        return torch.autograd.grad(out(x, w).sum(), (x, w))

    def second(x, w):
        (gx,) = torch.autograd.grad(out(x, w).sum(), (x,), create_graph=True)
        return torch.autograd.grad(gx.sum(), (x,))

    return out, grad, second


def trace_once(case: str, cond, x, w):
    out, grad, second = programs(cond)
    if case == "make_fx grad, fake":
        make_fx(grad, tracing_mode="fake")(x, w)
    elif case == "make_fx grad, symbolic":
        make_fx(grad, tracing_mode="symbolic")(x, w)
    elif case == "make_fx second derivative, fake":
        make_fx(second, tracing_mode="fake")(x, w)
    elif case == "aot_function fwd+bwd":
        aot_function(out, nop, nop)(x, w).sum().backward()
    else:
        raise ValueError(case)


CASES = (
    "make_fx grad, fake",
    "make_fx grad, symbolic",
    "make_fx second derivative, fake",
    "aot_function fwd+bwd",
)


failures: dict[str, str] = {}


def best_time(case: str, cond, x, w, repeats: int) -> float | None:
    """The fastest of ``repeats`` fresh traces, or None (and the reason kept) if it fails."""
    best = float("inf")
    for _ in range(repeats):
        torch._dynamo.reset()
        start = time.perf_counter()
        try:
            trace_once(case, cond, x, w)
        except Exception as error:  # torch.cond's backward is not differentiable again
            failures[case] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            return None
        best = min(best, time.perf_counter() - start)
    return best


def fmt_ms(seconds: float | None) -> str:
    return "fails" if seconds is None else f"{seconds * 1e3:.1f} ms"


def main(argv=None) -> int:
    args = common.standard_args(__doc__, "smoke run: fewer repeats", argv)
    repeats = 2 if args.quick else 7
    torch._dynamo.config.recompile_limit = 64
    run = common.Run(
        "traced_backward",
        "Tracing a derivative through a conditional: sub-traces and time vs torch.cond",
        args.quick,
    )
    x = torch.randn(8, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    libraries = {"torchcond": torchcond.cond, "torch.cond": torch.cond}
    rows = []
    for case in CASES:
        times: dict[str, float | None] = {}
        for name, cond in libraries.items():
            times[name] = best_time(case, cond, x, w, repeats)
        with SubTraces() as counter:
            trace_once(case, torchcond.cond, x, w)
        ours, theirs = times["torchcond"], times["torch.cond"]
        ratio = None if ours is None or theirs is None else ours / theirs
        rows.append(
            {
                "case": case,
                "torchcond_s": ours,
                "torch_cond_s": theirs,
                "ratio": ratio,
                "torchcond_sub_traces": counter.count,
            }
        )
        run.say(
            f"{case}: torchcond {fmt_ms(ours)}, torch.cond {fmt_ms(theirs)}, "
            f"torchcond sub-traces {counter.count}"
        )
        if ratio is not None:
            run.claim(f"{case}: torchcond / torch.cond", ratio, f"<= {TARGET}", ratio <= TARGET)
        elif theirs is None:
            run.note(f"{case}: torch.cond cannot trace it ({failures[case]})")
    run.results["cases"] = rows
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
