"""Fused branch select on a CUDA device (run it on a machine with a GPU, e.g. an H100).

1. Bandwidth. ``select`` moves, per output byte, one byte read from the selected side
   and one written: its effective bandwidth is (bytes read + bytes written) / time.
   The reference is a device-to-device copy of the same bytes (``dst.copy_(src)`` on
   one buffer as large as all outputs together, i.e. the same read + write traffic),
   measured in the same run. Target: select reaches >= 85% of the copy's bandwidth.
   Cases: 0-d device predicate, and a batched predicate (one choice per row).
2. Against ``torch.where`` (one call per output, what the fused select replaces):
   * large tensors: 16 outputs of 16M float32 (4096 x 4096), batched predicate.
     torch.where reads both sides (3 bytes per output byte instead of 2).
     Target: select >= 1.4x faster.
   * small tensors: 16 outputs of 64 x 64 float32, batched predicate. Launch-bound:
     one launch instead of 16. Target: select >= 5x faster (timed from the host, as
     a user calling both sees it: CUDA events around a loop of calls).
   Also shown: select_n with 3 branches against chained torch.where.

Timing: CUDA events around a loop of calls after warm-up; the median of several
repeats is reported. Results are checked against torch.where first. Not a test: it
never fails on a slow result; targets are printed next to results.

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

BANDWIDTH_TARGET = 0.85  # select bandwidth / device-to-device copy bandwidth
LARGE_TARGET = 1.4  # select vs torch.where, large tensors
SMALL_TARGET = 5.0  # select vs torch.where, 16 small outputs


def _warm(*fns, n: int = 3) -> None:
    for fn in fns:
        for _ in range(n):
            fn()
    torch.cuda.synchronize()


def _check(got, expected, what: str) -> None:
    if not all(torch.equal(a, b) for a, b in zip(got, expected)):
        raise SystemExit(f"bench_select_gpu: {what}: select differs from torch.where")


def bench_bandwidth(run, lines, quick: bool):
    n_out, rows, cols = 8, 4096, (4096 if quick else 16384)  # 8 x 64 MiB (quick: 16 MiB)
    ts = [torch.randn(rows, cols, device="cuda") for _ in range(n_out)]
    fs = [torch.randn(rows, cols, device="cuda") for _ in range(n_out)]
    out_bytes = n_out * rows * cols * 4
    src = torch.empty(out_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    pred0 = ts[0].sum() > 0  # device scalar
    rows_pred = torch.rand(rows, device="cuda") > 0.5
    _check(
        select(rows_pred, ts, fs),
        [torch.where(rows_pred[:, None], t, f) for t, f in zip(ts, fs)],
        "batched",
    )
    calls, repeats = (3, 3) if quick else (10, 7)
    copy_fn = lambda: dst.copy_(src)  # noqa: E731
    sel0 = lambda: select(pred0, ts, fs)  # noqa: E731
    selb = lambda: select(rows_pred, ts, fs)  # noqa: E731
    _warm(copy_fn, sel0, selb)
    t_copy = common.cuda_ms(copy_fn, calls, repeats)
    t_sel0 = common.cuda_ms(sel0, calls, repeats)
    t_selb = common.cuda_ms(selb, calls, repeats)
    moved = 2 * out_bytes  # read + write
    bw = lambda ms: moved / (ms * 1e-3) / 1e9  # noqa: E731
    lines.append(
        f"1. bandwidth: {n_out} outputs of {rows}x{cols} float32 ({out_bytes / 2**30:.2f} GiB written, as much read)"
    )
    lines.append(
        f"   device-to-device copy of the same bytes  {t_copy:8.3f} ms  {bw(t_copy):7.0f} GB/s (reference)"
    )
    for name, ms in (
        ("select, 0-d device predicate", t_sel0),
        ("select, batched predicate (rows)", t_selb),
    ):
        frac = bw(ms) / bw(t_copy)
        verdict = "meets" if frac >= BANDWIDTH_TARGET else "MISSES"
        run.claim(
            f"{name}: bandwidth / copy's",
            frac,
            f">= {BANDWIDTH_TARGET}",
            frac >= BANDWIDTH_TARGET,
            ms=ms,
            copy_ms=t_copy,
        )
        lines.append(
            f"   {name:<40} {ms:8.3f} ms  {bw(ms):7.0f} GB/s  {frac * 100:5.1f}% of copy "
            f"(target >= {BANDWIDTH_TARGET * 100:.0f}%, {verdict})"
        )


def bench_vs_where(run, lines, quick: bool):
    # large
    n_out, rows, cols = 16, 4096, (1024 if quick else 4096)
    ts = [torch.randn(rows, cols, device="cuda") for _ in range(n_out)]
    fs = [torch.randn(rows, cols, device="cuda") for _ in range(n_out)]
    gs = [torch.randn(rows, cols, device="cuda") for _ in range(n_out)]
    pred = torch.rand(rows, device="cuda") > 0.5
    pc = pred[:, None]
    idx = torch.randint(-1, 4, (rows,), device="cuda")
    ic = idx.clamp(0, 2)[:, None]

    def where_fn():
        return [torch.where(pc, t, f) for t, f in zip(ts, fs)]

    def sel_fn():
        return select(pred, ts, fs)

    def where_n():
        return [torch.where(ic == 0, a, torch.where(ic == 1, b, c)) for a, b, c in zip(ts, fs, gs)]

    def sel_n():
        return select_n(idx, [ts, fs, gs])

    _check(sel_fn(), where_fn(), "large")
    _check(sel_n(), where_n(), "large select_n")
    calls, repeats = (3, 3) if quick else (10, 7)
    _warm(where_fn, sel_fn, where_n, sel_n)
    t_where, t_sel = (
        common.cuda_ms(where_fn, calls, repeats),
        common.cuda_ms(sel_fn, calls, repeats),
    )
    t_where_n, t_sel_n = (
        common.cuda_ms(where_n, calls, repeats),
        common.cuda_ms(sel_n, calls, repeats),
    )
    ratio = t_where / t_sel
    verdict = "meets" if ratio >= LARGE_TARGET else "MISSES"
    run.claim(
        f"large: select vs torch.where x{n_out}",
        ratio,
        f">= {LARGE_TARGET}",
        ratio >= LARGE_TARGET,
        ms=t_sel,
        where_ms=t_where,
    )
    run.claim(
        "large: select_n, 3 branches, vs chained torch.where",
        t_where_n / t_sel_n,
        "",
        None,
        ms=t_sel_n,
        where_ms=t_where_n,
    )
    lines.append(f"2a. large: {n_out} outputs of {rows}x{cols} float32, batched predicate")
    lines.append(
        f"   torch.where x{n_out}  {t_where:8.3f} ms | select {t_sel:8.3f} ms |"
        f" {ratio:5.2f}x faster (target >= {LARGE_TARGET}x, {verdict})"
    )
    lines.append(
        f"   select_n, 3 branches: chained torch.where {t_where_n:8.3f} ms | select_n {t_sel_n:8.3f} ms | "
        f"{t_where_n / t_sel_n:5.2f}x faster"
    )
    ts = fs = gs = None  # frees the device memory; the closures above hold cells

    # small
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
    ratio = t_where / t_sel
    verdict = "meets" if ratio >= SMALL_TARGET else "MISSES"
    run.claim(
        f"small: select vs torch.where x{n_out}",
        ratio,
        f">= {SMALL_TARGET}",
        ratio >= SMALL_TARGET,
        ms=t_sel,
        where_ms=t_where,
    )
    lines.append(
        f"2b. small: {n_out} outputs of 64x64 float32, batched predicate (host-bound: per call, loop of {calls})"
    )
    lines.append(
        f"   torch.where x{n_out}  {t_where * 1e3:8.1f} us | select {t_sel * 1e3:8.1f} us | {ratio:5.2f}x faster "
        f"(target >= {SMALL_TARGET}x, {verdict})"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller tensors, fewer iterations (smoke run)"
    )
    parser.add_argument("--out", help="write the header and the report to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench_select_gpu: no CUDA device here (torch.cuda.is_available() is False, torch "
            f"{torch.__version__});\nrun it on a machine with a GPU and a CUDA build of torch"
        )
        return 0
    if not torch.ops.torchcond.built_with_cuda():
        print(
            "bench_select_gpu: torchcond was built without its CUDA kernels; rebuild it with "
            "TORCHCOND_CUDA=1 pip install --no-build-isolation -e . (needs nvcc)"
        )
        return 1
    lines = [
        "bench_select_gpu: fused select on the device (ratios vs baselines in this process)",
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
        f"python {platform.python_version()}, mode={'quick' if args.quick else 'full'}",
    ]
    run = common.Run("select_gpu", lines[0], args.quick)
    run.header["device"] = torch.cuda.get_device_name()
    run.header["cuda"] = torch.version.cuda
    bench_bandwidth(run, lines, args.quick)
    bench_vs_where(run, lines, args.quick)
    lines.append("note: not a test; targets are informational, exit code is 0")
    for line in lines[1:]:
        run.say(line)
    run.results["report"] = lines
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
