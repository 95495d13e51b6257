"""Fused branch select on the CPU: ``torchcond.select`` against ``torch.where`` per output.

Every number is a ratio against a baseline measured in this same process, in the same
rounds: the same selection written as one ``torch.where`` call per output (what the
select replaced). Speedup = baseline time / candidate time (higher is better).

Cases (float32 values, fresh outputs every call, as both sides allocate them):

* batched predicate, 16 outputs of 1M elements (1024 x 1024), ``pred`` of shape (1024,)
  (one choice per row, as under vmap): ``select(pred, ts, fs)`` against
  ``[torch.where(pred[:, None], t, f) for t, f in zip(ts, fs)]``. Target >= 1.3x.
* 0-d predicate, the same 16 x 1M outputs: ``select(p, ts, fs)`` against
  ``[torch.where(p, t, f) ...]``.
* select_n, 3 branches, batched index, 16 x 1M: ``select_n(i, cases)`` against
  ``torch.where(i == 0, a, torch.where(i == 1, b, c))`` per output (index clamped first).
* small tensors: 16 outputs of 8 x 16, batched predicate: per-call overhead.
* small tensors, one output of 8 x 16: per-call overhead of one select.

``select`` reads only the selected side: 2 bytes moved per output byte (read + write),
against 3 for ``torch.where`` (both sides + write); above the cache sizes the kernel
also writes with non-temporal stores. The effective bandwidth (bytes the candidate
must move / time) is printed for the large cases.

Method: ``timeit`` with the statement compiled inline, ``gc`` disabled while timing,
best-of-N rounds, the candidates interleaved within every round (the order rotates)
so drift hits all of them alike; the minimum per candidate is reported. The script
checks first that every candidate returns the same tensors.

Not a test: it never fails on a slow result. Targets are printed next to results.

    python benchmarks/bench_select.py            # full run (~30 s on 2 cores)
    python benchmarks/bench_select.py --quick    # smoke run for CI (a few seconds)
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
import timeit

import timing  # benchmarks/timing.py: the shared timing method
import torch

import torchcond
from torchcond import select, select_n

BATCHED_TARGET = 1.3  # fused select at least 1.3x faster than 16 torch.where calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (CI smoke run)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 3)"
    )
    args = ap.parse_args(argv)

    quick = args.quick
    rounds = args.rounds or (3 if quick else 7)
    target_s = 0.03 if quick else 0.25  # seconds per measurement
    n_out = 16
    rows, cols = (1024, 1024)

    torch.manual_seed(0)
    ts = [torch.randn(rows, cols) for _ in range(n_out)]
    fs = [torch.randn(rows, cols) for _ in range(n_out)]
    gs = [torch.randn(rows, cols) for _ in range(n_out)]
    pred = torch.rand(rows) > 0.5
    pred_col = pred[:, None]
    p0 = torch.tensor(True)
    idx = torch.randint(-1, 4, (rows,))
    idx_col = idx.clamp(0, 2)[:, None]
    small_t = [torch.randn(8, 16) for _ in range(n_out)]
    small_f = [torch.randn(8, 16) for _ in range(n_out)]
    small_p = torch.rand(8) > 0.5
    small_pc = small_p[:, None]

    ns = {
        "torch": torch,
        "select": select,
        "select_n": select_n,
        "op": torch.ops.torchcond.select,
        "ts": ts,
        "fs": fs,
        "gs": gs,
        "cases": [ts, fs, gs],
        "pred": pred,
        "pc": pred_col,
        "p0": p0,
        "idx": idx,
        "ic": idx_col,
        "st": small_t,
        "sf": small_f,
        "sp": small_p,
        "spc": small_pc,
        "st0": small_t[0],
        "sf0": small_f[0],
    }

    # (title, baseline stmt, {name: candidate stmt}, bytes the candidate moves or None, target)
    cases = [
        (
            f"batched pred, {n_out} x {rows}x{cols} f32",
            "[torch.where(pc, t, f) for t, f in zip(ts, fs)]",
            {"select": "select(pred, ts, fs)", "torch.ops.torchcond.select": "op(pred, ts, fs)"},
            2 * n_out * rows * cols * 4,
            BATCHED_TARGET,
        ),
        (
            f"0-d pred, {n_out} x {rows}x{cols} f32",
            "[torch.where(p0, t, f) for t, f in zip(ts, fs)]",
            {"select": "select(p0, ts, fs)"},
            2 * n_out * rows * cols * 4,
            None,
        ),
        (
            f"select_n 3 branches, batched index, {n_out} x {rows}x{cols} f32",
            "[torch.where(ic == 0, a, torch.where(ic == 1, b, c)) for a, b, c in zip(ts, fs, gs)]",
            {"select_n": "select_n(idx, cases)"},
            2 * n_out * rows * cols * 4,
            None,
        ),
        (
            f"small: batched pred, {n_out} x 8x16 f32",
            "[torch.where(spc, t, f) for t, f in zip(st, sf)]",
            {"select": "select(sp, st, sf)"},
            None,
            None,
        ),
        (
            "small: batched pred, 1 x 8x16 f32",
            "torch.where(spc, st0, sf0)",
            {"select": "select(sp, [st0], [sf0])"},
            None,
            None,
        ),
    ]

    # sanity: every candidate computes what its baseline computes
    for _, base, cands, _, _ in cases:
        expected = eval(base, ns)
        expected = expected if isinstance(expected, list) else [expected]
        for stmt in cands.values():
            got = eval(stmt, ns)
            assert len(got) == len(expected) and all(
                torch.equal(a, b) for a, b in zip(got, expected)
            ), stmt

    print(
        "bench_select: fused select vs one torch.where per output (speedups vs a baseline in this process)"
    )
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, torchcond {torchcond.__version__}, "
        f"{platform.machine()} ({timing.cpu_name()}), os.cpu_count()={os.cpu_count()}, "
        f"torch threads={torch.get_num_threads()}"
    )
    print(
        f"mode={'quick' if quick else 'full'}, rounds={rounds} (interleaved, min per candidate), "
        f"~{target_s * 1e3:.0f} ms per measurement"
    )

    rows_out = []
    gc.collect()
    t_start = time.perf_counter()
    for title, base, cands, nbytes, target in cases:
        timers = {"baseline": timeit.Timer(base, globals=ns)}
        timers.update({name: timeit.Timer(stmt, globals=ns) for name, stmt in cands.items()})
        best, _ = timing.measure(timers, rounds, target_s)
        for name in cands:
            rows_out.append((title, best["baseline"], name, best[name], nbytes, target))
    elapsed = time.perf_counter() - t_start

    w_case = max(len(r[0]) for r in rows_out)
    w_name = max(len(r[2]) for r in rows_out)
    head = (
        f"{'case':<{w_case}}  {'where ms':>9}  {'candidate':<{w_name}}  {'cand ms':>9}  "
        f"{'speedup':>8}  {'cand GB/s':>9}  target"
    )
    print()
    print(head)
    print("-" * len(head))
    for title, bt, name, ct, nbytes, target in rows_out:
        gbs = f"{nbytes / ct / 1e9:9.1f}" if nbytes else f"{'-':>9}"
        tgt = f">= {target}x" if target else "-"
        print(
            f"{title:<{w_case}}  {bt * 1e3:9.3f}  {name:<{w_name}}  {ct * 1e3:9.3f}  {bt / ct:7.2f}x  {gbs}  {tgt}"
        )
    print()
    main_row = rows_out[0]
    speedup = main_row[1] / main_row[3]
    verdict = "meets" if speedup >= BATCHED_TARGET else "MISSES"
    print(
        f"target    batched pred, {n_out} outputs of {rows * cols // 2**20}M float32: select {speedup:.2f}x "
        f"faster than {n_out} torch.where calls (target >= {BATCHED_TARGET}x: {verdict}; informational, exit code is 0)"
    )
    print(
        "note      select moves 2 bytes per output byte (reads the selected side only), torch.where 3; "
        "cand GB/s counts the 2"
    )
    print(f"note      timed rounds took {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
