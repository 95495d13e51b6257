"""torch.compile (Inductor) per-call time of a model with a conditional: torchcond vs torch.cond.

Every number is a ratio against the same model written with ``torch.cond`` and
compiled the same way (``backend="inductor", fullgraph=True``), measured in this
same process, in the same run. Target: torchcond at most 1.05x torch.cond.

The model: ``h = relu(lin_in(x))``; then a conditional on ``h.sum() > 0`` (a tensor
predicate computed from the data) between two MLP branches (``Linear, GELU, Linear``
and ``Linear, Tanh``); then ``lin_out``. Two sizes: "small" (x 4x16, width 16: the
per-call overhead dominates) and "large" (x 256x512, width 512: the kernels dominate).
Inputs alternate between the two branches (``x`` and ``-x``), so both are timed.

Cases, each at both sizes:

* inference: ``model(x)`` under ``torch.no_grad()``;
* training: ``model(x).square().mean().backward()`` (the backward is a compiled
  conditional too; parameter gradients accumulate, which costs both sides the same);
* switch: ``torchcond.switch(i, [b0, b1, b2], (h,))`` with an int64 tensor index,
  against the same three branches as nested ``torch.cond``s
  (``cond(i <= 0, b0, lambda h: cond(i <= 1, b1, b2, (h,)), (h,))``), inference.

The compile time of the first call (fresh dynamo cache, Inductor's on-disk caches as
they are) is reported for information; it is not a target.

Method: ``benchmarks/timing.py`` (timeit, gc off, best-of-N interleaved rounds with
the order rotating, loop counts calibrated to ~0.2 s per measurement). Dynamo graphs
compiled during the timed rounds are counted and printed (expected: 0).

Not a test: it never fails on a slow result.

    python benchmarks/bench_compile.py            # full run (~2 min on 2 cores)
    python benchmarks/bench_compile.py --quick    # smoke run for CI
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing

import torchcond

TARGET = 1.05
SIZES = {"small": (4, 16), "large": (256, 512)}


class _Model(torch.nn.Module):
    """lin_in -> conditional(h.sum() > 0, mlp_a, mlp_b) -> lin_out.

    One subclass per library, so that each has its own ``forward`` code object and
    dynamo cache: neither pays for checking the other's guards.
    """

    def __init__(self, width: int, n_branches: int = 2):
        super().__init__()
        self.lin_in = torch.nn.Linear(width, width)
        self.lin_out = torch.nn.Linear(width, width)
        mlps = [
            torch.nn.Sequential(
                torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)
            ),
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()),
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.SiLU()),
        ]
        self.branches = torch.nn.ModuleList(mlps[:n_branches])


class TorchcondModel(_Model):
    def forward(self, x, index=None):
        h = torch.relu(self.lin_in(x))
        a, b = self.branches[0], self.branches[1]
        if index is None:
            h = torchcond.cond(h.sum() > 0, lambda t: a(t), lambda t: b(t), (h,))
        else:
            c = self.branches[2]
            h = torchcond.switch(index, [lambda t: a(t), lambda t: b(t), lambda t: c(t)], (h,))
        return self.lin_out(h)


class TorchCondModel(_Model):
    def forward(self, x, index=None):
        h = torch.relu(self.lin_in(x))
        a, b = self.branches[0], self.branches[1]
        if index is None:
            h = torch.cond(h.sum() > 0, lambda t: a(t), lambda t: b(t), (h,))
        else:
            c = self.branches[2]
            h = torch.cond(
                index <= 0,
                lambda t: a(t),
                lambda t: torch.cond(index <= 1, lambda u: b(u), lambda u: c(u), (t,)),
                (h,),
            )
        return self.lin_out(h)


def twin_models(width: int, n_branches: int = 2):
    ours = TorchcondModel(width, n_branches)
    theirs = TorchCondModel(width, n_branches)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def compiled(model):
    return torch.compile(model, backend="inductor", fullgraph=True)


LABELS = {"torchcond": "torchcond", "torch_cond": "torch.cond"}


def run_case(name, size, make_stmt, n_branches, rounds, target_s, out):
    """Time ``make_stmt(fn)`` for both libraries' compiled models; print the ratio."""
    rows, width = SIZES[size]
    torch.manual_seed(0)
    models = dict(zip(LABELS, twin_models(width, n_branches)))
    x = torch.randn(rows, width)
    namespace = {"x": x, "nx": -x, "torch": torch, **{f"i{k}": torch.tensor(k) for k in range(3)}}
    compile_s = {}
    torch._dynamo.reset()  # first calls below trace and compile from scratch
    for fn, model in models.items():
        start = time.perf_counter()
        namespace[fn] = compiled(model)
        exec(make_stmt(fn), namespace)  # the first call compiles
        compile_s[fn] = time.perf_counter() - start
        exec(make_stmt(fn), namespace)
    before = timing.dynamo_frames_compiled()
    timers = {fn: timing.timer(make_stmt(fn), namespace) for fn in LABELS}
    best, _ = timing.measure(timers, rounds=rounds, target_s=target_s)
    recompiled = timing.dynamo_frames_compiled() - before
    ratio = best["torchcond"] / best["torch_cond"]
    verdict = "meets" if ratio <= TARGET else "MISSES"
    baseline = "nested torch.cond" if n_branches == 3 else "torch.cond"
    line = (
        f"{name:<10} {size:<6} torchcond {best['torchcond'] * 1e6:9.1f} us   "
        f"{baseline} {best['torch_cond'] * 1e6:9.1f} us   ratio {ratio:5.3f}x ({verdict} <= {TARGET}x)   "
        f"first call {compile_s['torchcond']:5.1f} s vs {compile_s['torch_cond']:5.1f} s   "
        f"recompiles while timing: {recompiled}"
    )
    print(line, flush=True)
    out.append(line)


def inference_stmt(fn):
    return f"with torch.no_grad():\n    {fn}(x); {fn}(nx)"


def training_stmt(fn):
    return f"{fn}(x).square().mean().backward(); {fn}(nx).square().mean().backward()"


def switch_stmt(fn):
    return f"with torch.no_grad():\n    {fn}(x, i0); {fn}(x, i1); {fn}(x, i2)"


def check_agreement():
    """Both libraries compute the same thing (a benchmark of wrong code is worthless)."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    for n_branches in (2, 3):
        ours, theirs = twin_models(16, n_branches)
        fo, ft = compiled(ours), compiled(theirs)
        with torch.no_grad():
            for sign in (1, -1):
                for index in [None] if n_branches == 2 else [torch.tensor(k) for k in range(3)]:
                    got = fo(sign * x, index)
                    torch.testing.assert_close(got, ft(sign * x, index))
                    torch.testing.assert_close(got, ours(sign * x, index))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small size, 2 short rounds"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="also write the results to this file")
    args = parser.parse_args()
    rounds, target_s = (2, 0.02) if args.quick else (args.rounds, 0.2)
    sizes = ["small"] if args.quick else list(SIZES)

    torch._dynamo.config.recompile_limit = 64
    out = [
        f"bench_compile: torch {torch.__version__}, {timing.cpu_name()}, "
        f"{torch.get_num_threads()} threads, Python {sys.version.split()[0]}",
        "time per timed statement (two calls: x and -x; switch: indices 0, 1, 2); "
        f"ratio = torchcond / baseline; target <= {TARGET}x",
    ]
    print("\n".join(out), flush=True)
    check_agreement()
    for size in sizes:
        run_case("inference", size, inference_stmt, 2, rounds, target_s, out)
        run_case("training", size, training_stmt, 2, rounds, target_s, out)
        run_case("switch", size, switch_stmt, 3, rounds, target_s, out)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
