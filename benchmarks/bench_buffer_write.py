"""A branch that writes one row of a large buffer, compiled with Inductor.

A decoder writes its cache inside a prefill/decode conditional. Traced, the branch
graphs are functional and the written buffer's new value is an output of the
conditional, written back after it. Does a 1-row write cost O(row) or O(buffer)?

Program: a module with a ``rows x 64`` float32 buffer whose forward runs
``cond(x.sum() > 0, write, read, (x, pos))``; ``write`` does
``cache.index_copy_(0, pos, x)`` for one row and returns ``x * 2``, ``read`` returns
``x - 1``. ``torch.compile(fullgraph=True, backend="inductor")``, in inference
(``torch.no_grad()``: ``torch.cond`` refuses a write with grad on), inputs that take
the writing branch. Sizes: 1,024 and 262,144 rows (256 KiB and 64 MiB).

Reported, for torchcond and ``torch.cond`` measured the same way in this run: the
per-call time at each size (the fastest block of timings, as common.best) and the large/small ratio.
Target: the large-buffer call at most 1.3x the small-buffer call. Not a test: it
never fails on a slow result.

    python benchmarks/bench_buffer_write.py            # full run (~1 min on 2 cores)
    python benchmarks/bench_buffer_write.py --quick    # smoke run for CI
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

import torchcond

TARGET = 1.3  # large-buffer call time / small-buffer call time
SIZES = (1024, 262144)
WIDTH = 64


class Cache(torch.nn.Module):
    def __init__(self, rows: int, cond):
        super().__init__()
        self.register_buffer("cache", torch.zeros(rows, WIDTH))
        self.cond = cond

    def forward(self, x, pos):
        def write(x, pos):
            self.cache.index_copy_(0, pos, x)
            return x * 2

        def read(x, pos):
            return x - 1

        return self.cond(x.sum() > 0, write, read, (x, pos))


def compiled_call(cond, rows: int):
    """A compiled module and its inputs; the first call (the compile) done, and checked."""
    torch._dynamo.reset()
    model = Cache(rows, cond)
    fn = torch.compile(model, backend="inductor", fullgraph=True)
    x, pos = torch.ones(1, WIDTH), torch.tensor([rows // 2])
    fn(x, pos)
    if not torch.equal(model.cache[rows // 2], x[0]):
        raise AssertionError(f"{cond.__module__}: the compiled write did not land")
    return fn, x, pos


def main(argv=None) -> int:
    args = common.standard_args(__doc__, "smoke run: small sizes, short timings", argv)
    sizes = (64, 4096) if args.quick else SIZES
    min_run_time = 0.05 if args.quick else 0.5
    run = common.Run(
        "buffer_write",
        "One-row write into a buffer in a branch, Inductor: large vs small buffer",
        args.quick,
    )
    libraries = {"torchcond": torchcond.cond, "torch.cond": torch.cond}
    rows_out = []
    with torch.no_grad():
        measure_all(run, libraries, sizes, min_run_time, rows_out)
    run.results["sizes"] = list(sizes)
    run.results["cases"] = rows_out
    run.finish(args.out)
    return 0


def measure_all(run, libraries, sizes, min_run_time, rows_out) -> None:
    for name, cond in libraries.items():
        per_size = {}
        for rows in sizes:
            try:
                fn, x, pos = compiled_call(cond, rows)
            except Exception as error:
                run.note(f"{name}, {rows} rows: fails ({type(error).__name__}: {error})")
                per_size = None
                break
            timer = common.timer("fn(x, pos)", {"fn": fn, "x": x, "pos": pos}, label=name)
            per_size[rows] = common.best(timer.blocked_autorange(min_run_time=min_run_time))
            run.say(f"{name}, {rows} rows: {per_size[rows] * 1e6:.1f} us per call")
        if per_size is None:
            continue
        small, large = (per_size[r] for r in sizes)
        ratio = large / small
        rows_out.append({"library": name, "seconds": per_size, "large_over_small": ratio})
        run.claim(
            f"{name}: {sizes[1]}-row / {sizes[0]}-row call time",
            ratio,
            f"<= {TARGET}",
            ratio <= TARGET,
        )


if __name__ == "__main__":
    sys.exit(main())
