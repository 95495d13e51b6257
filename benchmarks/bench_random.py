"""Compiled training with dropout in a branch: torchcond vs torch.cond.

A traced backward recomputes a branch from its inputs. torchcond's forward conditional
also returns the branch's random draws (here, dropout's mask) and its backward replays
them; torch.cond's backward draws a new mask, so about half of its gradient entries
are wrong. This benchmark measures what saving the mask costs against torch.cond on
the same work, and counts the wrong gradient entries of each.

Model: ``x -> cond(x.sum() > 0, dropout(linear(x)) * 2, tanh(x))``, ``Linear(256, 256)``,
dropout p = 0.5, batch 64 (quick: 16), positive inputs (the dropout branch is taken).
One step is forward, ``out.sum().backward()``, compiled with ``fullgraph=True`` by
each backend. Wrong entries: the input's gradient against the one the forward's own
mask gives, ``((out != 0) * 2 / (1 - p)) @ W``.

Timing as in the other benchmarks (``common.measure``): interleaved rounds of
``blocked_autorange``, fastest block reported; ratio = torchcond / torch.cond.

    python benchmarks/bench_random.py            # full run (~30 s on 2 cores)
    python benchmarks/bench_random.py --quick    # smoke run for CI
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import torchcond

P = 0.5
TARGET = 1.1  # saving the mask may cost a little time over a backward that redraws
BACKENDS = ("aot_eager", "inductor")
LIBRARIES = {"torchcond": torchcond.cond, "torch.cond": torch.cond}


class DropoutHead(torch.nn.Module):
    def __init__(self, cond, width: int):
        super().__init__()
        self.cond = cond
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        def dropped(x):
            return torch.nn.functional.dropout(self.lin(x), P, training=True) * 2

        return self.cond(x.sum() > 0, dropped, torch.tanh, (x,))


def step(model, x):
    x.grad = None
    out = model(x)
    out.sum().backward()
    return out


def wrong_entries(model, compiled, x) -> int:
    out = step(compiled, x)
    kept = (out != 0).to(out.dtype) * 2 / (1 - P)
    want = kept @ model.lin.weight.detach()
    assert x.grad is not None
    return int((~torch.isclose(x.grad, want)).sum())


def main(argv=None) -> int:
    args = common.standard_args(__doc__, "smoke run: small size, short", argv)
    quick = args.quick
    rounds, min_run_time = (2, 0.02) if quick else (5, 0.2)
    batch, width = (16, 64) if quick else (64, 256)
    torch._dynamo.config.recompile_limit = 64
    run = common.Run(
        "random",
        "bench_random: compiled training, dropout in a branch, torchcond vs torch.cond",
        quick,
    )
    run.say(
        f"batch {batch}, Linear({width}, {width}), dropout p={P}; ratio = torchcond / torch.cond"
    )
    rows = []
    for backend in BACKENDS:
        torch.manual_seed(0)
        x = (torch.rand(batch, width) + 0.1).requires_grad_()
        timers, wrong = {}, {}
        for name, cond in LIBRARIES.items():
            torch._dynamo.reset()
            model = DropoutHead(cond, width)
            compiled = torch.compile(model, backend=backend, fullgraph=True)
            wrong[name] = wrong_entries(model, compiled, x)
            timers[name] = common.timer(
                "step(compiled, x)",
                {"step": step, "compiled": compiled, "x": x},
                label=backend,
                description=name,
            )
        ms = common.measure(timers, rounds, min_run_time)
        ratio = common.best(ms["torchcond"]) / common.best(ms["torch.cond"])
        rows.append(
            {
                **common.record(
                    f"{backend} training step",
                    "torch.cond",
                    "torchcond",
                    "torchcond.cond",
                    ms["torch.cond"],
                    ms["torchcond"],
                    ratio=ratio,
                ),
                "wrong_grad_entries": wrong,
                "grad_entries": batch * width,
            }
        )
        run.say(
            f"{backend:10s} step: torchcond {common.best(ms['torchcond']) * 1e6:9.1f} us, "
            f"torch.cond {common.best(ms['torch.cond']) * 1e6:9.1f} us, ratio {ratio:.2f}x; "
            f"wrong grad entries: torchcond {wrong['torchcond']}, "
            f"torch.cond {wrong['torch.cond']} of {batch * width}"
        )
        run.claim(
            f"{backend}: torchcond step / torch.cond step",
            ratio,
            f"<= {TARGET}x",
            ratio <= TARGET,
        )
    run.results["rows"] = rows
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
