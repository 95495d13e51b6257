"""Fused branch select on a CUDA device, against the limit (run it on a machine with a GPU).

Issue 27's table. For each selector shape, dtype and size, two ratios measured in one run:
* % of copy: a device-to-device copy of the same output bytes (``dst.copy_(src)``), its time
  over select's time. 100% is the speed of a copy (read the output's bytes once, write them).
* vs torch.where: one ``torch.where`` per output (what the fused select replaces), its time
  over select's time. Above 1 is faster than torch.where.

Selector shapes, values of shape (rows, cols) per output:
* 0-d: a device scalar;
* rows of 16 KB, 4 KB, 1 KB: one entry per row (cols = row bytes / itemsize);
* per element: shaped like the values (select reads both sides, as torch.where does).

Sizes: 16M elements per output (``--quick``: 1M), 1 and 8 outputs of float32; one output of
float16, bfloat16, float64, uint8 and complex64; one output of 4M float32 (``--quick``: 1M),
a small output that must still fill the GPU. Targets (issue 27), for outputs of 1M elements
or more: never slower than torch.where; at least 90% of the copy where the selector is constant
over runs of 1 KB or more (0-d, rows); per element, at least torch.where's speed.

Also: select_n with 3 branches against chained torch.where, and 16 small outputs (64 x 64,
launch-bound: one launch instead of 16, target 5x).

Timing: CUDA events around a loop of calls after warm-up; the median of several repeats.
Every result is compared with torch.where first. Not a test: it never fails on a slow result;
targets are printed next to results.

    python benchmarks/bench_select_gpu.py [--quick] [--out results.json]
"""

from __future__ import annotations

import argparse
import platform
import sys

import common  # benchmarks/common.py
import torch

import torchcond  # noqa: F401  (loads the extension)
from torchcond import select, select_n

COPY_TARGET = 0.90  # select / copy, selectors constant over runs of 1 KB or more
WHERE_TARGET = 1.0  # select vs torch.where, every case
SMALL_TARGET = 5.0  # select vs 16 torch.where calls, 16 small outputs

SELECTORS = ("0-d", "rows 16 KB", "rows 4 KB", "rows 1 KB", "per element")
ROW_BYTES = {"rows 16 KB": 16384, "rows 4 KB": 4096, "rows 1 KB": 1024}
OTHER_DTYPES = (torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.complex64)


def _warm(*fns, n: int = 3) -> None:
    for fn in fns:
        for _ in range(n):
            fn()
    torch.cuda.synchronize()


def _check(got, expected, what: str) -> None:
    if not all(torch.equal(a, b) for a, b in zip(got, expected)):
        raise SystemExit(f"bench_select_gpu: {what}: select differs from torch.where")


def _values(shape, dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, device="cuda", dtype=dtype)
    return torch.randint(0, 100, shape, device="cuda", dtype=dtype)


def _shape(kind: str, dtype, numel: int):
    """(rows, cols): rows of the selector's row length, else rows of 16 KB."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    cols = ROW_BYTES.get(kind, 16384) // itemsize
    return numel // cols, cols


def _selector(kind: str, rows: int, cols: int):
    """The selector for select, and its broadcast view for torch.where."""
    if kind == "0-d":
        pred = torch.rand((), device="cuda") > 0.5
        return pred, pred
    if kind == "per element":
        pred = torch.rand((rows, cols), device="cuda") > 0.5
        return pred, pred
    pred = torch.rand(rows, device="cuda") > 0.5
    return pred, pred[:, None]


def _meets(kind: str, of_copy: float, vs_where: float) -> bool:
    constant_runs = kind != "per element"  # 0-d and rows of 1 KB or more
    return vs_where >= WHERE_TARGET and (not constant_runs or of_copy >= COPY_TARGET)


def bench_case(kind: str, dtype, n_out: int, numel: int, quick: bool) -> dict:
    rows, cols = _shape(kind, dtype, numel)
    ts = [_values((rows, cols), dtype) for _ in range(n_out)]
    fs = [_values((rows, cols), dtype) for _ in range(n_out)]
    pred, wpred = _selector(kind, rows, cols)
    where_fn = lambda: [torch.where(wpred, t, f) for t, f in zip(ts, fs)]  # noqa: E731
    sel_fn = lambda: select(pred, ts, fs)  # noqa: E731
    _check(sel_fn(), where_fn(), f"{kind}, {dtype}, {n_out} outputs")
    out_bytes = n_out * ts[0].numel() * ts[0].element_size()
    src = torch.empty(out_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_fn = lambda: dst.copy_(src)  # noqa: E731
    calls, repeats = (3, 3) if quick else (10, 7)
    _warm(copy_fn, sel_fn, where_fn)
    t_copy = common.cuda_ms(copy_fn, calls, repeats)
    t_sel = common.cuda_ms(sel_fn, calls, repeats)
    t_where = common.cuda_ms(where_fn, calls, repeats)
    return {
        "selector": kind,
        "dtype": str(dtype).removeprefix("torch."),
        "outputs": n_out,
        "elements": rows * cols,
        "copy_ms": t_copy,
        "select_ms": t_sel,
        "where_ms": t_where,
        "of_copy": t_copy / t_sel,
        "vs_where": t_where / t_sel,
    }


def _row(r: dict) -> str:
    verdict = "ok" if _meets(r["selector"], r["of_copy"], r["vs_where"]) else "MISSES"
    size = f"{r['outputs']}x{r['elements'] / 2**20:g}M"
    return (
        f"{r['selector']:<12} {r['dtype']:<9} {size:>7} {r['copy_ms']:8.3f} {r['select_ms']:9.3f} "
        f"{r['where_ms']:8.3f} {r['of_copy'] * 100:6.1f}% {r['vs_where']:6.2f}x  {verdict}"
    )


def bench_table(run, quick: bool) -> list[dict]:
    big = 2**20 if quick else 2**24
    small = 2**20 if quick else 2**22
    cases = [(k, torch.float32, n, big) for n in (1, 8) for k in SELECTORS]
    cases += [(k, dtype, 1, big) for dtype in OTHER_DTYPES for k in SELECTORS]
    cases += [(k, torch.float32, 1, small) for k in SELECTORS]
    run.say(
        f"1. against the limit (% of copy >= {COPY_TARGET * 100:.0f}% for 0-d and rows; "
        f"vs torch.where >= {WHERE_TARGET:g}x everywhere)"
    )
    run.say(
        f"{'selector':<12} {'dtype':<9} {'size':>7} {'copy ms':>8} {'select ms':>9} "
        f"{'where ms':>8} {'copy':>7} {'where':>7}  target"
    )
    results = []
    for kind, dtype, n_out, numel in cases:
        r = bench_case(kind, dtype, n_out, numel, quick)
        run.say(_row(r))
        results.append(r)
        torch.cuda.empty_cache()
    constant = [r for r in results if r["selector"] != "per element"]
    per_element = [r for r in results if r["selector"] == "per element"]
    worst_copy = min(r["of_copy"] for r in constant)
    worst_where = min(r["vs_where"] for r in results)
    worst_element = min(r["vs_where"] for r in per_element)
    run.claim(
        "select / copy, worst 0-d or rows case",
        worst_copy,
        f">= {COPY_TARGET}",
        worst_copy >= COPY_TARGET,
    )
    run.claim("select vs torch.where, worst case", worst_where, ">= 1", worst_where >= 1.0)
    run.claim(
        "select vs torch.where, worst per-element case",
        worst_element,
        ">= 1",
        worst_element >= 1.0,
    )
    return results


def bench_select_n(run, quick: bool) -> None:
    n_out, rows, cols = 16, 4096, (1024 if quick else 4096)
    cases = [[_values((rows, cols), torch.float32) for _ in range(n_out)] for _ in range(3)]
    idx = torch.randint(-1, 4, (rows,), device="cuda")
    ic = idx.clamp(0, 2)[:, None]

    def where_n():
        return [torch.where(ic == 0, a, torch.where(ic == 1, b, c)) for a, b, c in zip(*cases)]

    def sel_n():
        return select_n(idx, cases)

    _check(sel_n(), where_n(), "select_n")
    calls, repeats = (3, 3) if quick else (10, 7)
    _warm(where_n, sel_n)
    t_where, t_sel = common.cuda_ms(where_n, calls, repeats), common.cuda_ms(sel_n, calls, repeats)
    run.say(f"2. select_n, 3 branches, {n_out} outputs of {rows}x{cols} float32, one index per row")
    run.say(
        f"   chained torch.where {t_where:8.3f} ms | select_n {t_sel:8.3f} ms | "
        f"{t_where / t_sel:5.2f}x faster"
    )


def bench_small(run, quick: bool) -> None:
    n_out = 16
    ts = [torch.randn(64, 64, device="cuda") for _ in range(n_out)]
    fs = [torch.randn(64, 64, device="cuda") for _ in range(n_out)]
    pred = torch.rand(64, device="cuda") > 0.5
    pc = pred[:, None]
    where_fn = lambda: [torch.where(pc, t, f) for t, f in zip(ts, fs)]  # noqa: E731
    sel_fn = lambda: select(pred, ts, fs)  # noqa: E731
    _check(sel_fn(), where_fn(), "small")
    calls, repeats = (20, 3) if quick else (200, 7)
    _warm(where_fn, sel_fn, n=10)
    t_where, t_sel = (
        common.cuda_ms(where_fn, calls, repeats),
        common.cuda_ms(sel_fn, calls, repeats),
    )
    run.say(f"3. small: {n_out} outputs of 64x64 float32, one entry per row (per call, host-bound)")
    run.say(
        f"   torch.where x{n_out} {t_where * 1e3:8.1f} us | select {t_sel * 1e3:8.1f} us | "
        f"{t_where / t_sel:5.2f}x faster"
    )
    ratio = t_where / t_sel
    run.claim("select vs 16 torch.where, 16 small outputs", ratio, ">= 5", ratio >= SMALL_TARGET)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller tensors, fewer iterations (smoke run)"
    )
    parser.add_argument("--out", help="write the header, the table and the claims to this JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"bench_select_gpu: skipped: no CUDA device (torch {torch.__version__})")
        return 0
    if not torch.ops.torchcond.built_with_cuda():
        print(
            "bench_select_gpu: torchcond was built without its CUDA kernels; rebuild it with "
            "TORCHCOND_CUDA=1 pip install --no-build-isolation -e . (needs nvcc)"
        )
        return 1
    run = common.Run("select_gpu", "bench_select_gpu: fused select on the device", args.quick)
    run.header["device"] = torch.cuda.get_device_name()
    run.header["cuda"] = torch.version.cuda
    run.say(
        f"device {run.header['device']}, cuda {torch.version.cuda}, "
        f"python {platform.python_version()}"
    )
    run.results["table"] = bench_table(run, args.quick)
    bench_select_n(run, args.quick)
    bench_small(run, args.quick)
    run.say("note: not a test; targets are informational, exit code is 0")
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
