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
also writes with non-temporal stores.

Part 2, throughput sweeps (output GB/s = output bytes written / time, higher is better),
each point next to ``torch.where`` per output and a plain copy of the same bytes
(``dst.copy_(src)``: one contiguous buffer as large as all outputs together, into a
preallocated destination, the same read + write traffic with no allocation and no
choice to make: the reference, and the upper bound while the data fit in the caches;
above them select's non-temporal stores can beat ``copy_``'s regular ones):

* against output size: 16 outputs of 1 KiB .. 4 MiB each (float32), batched predicate
  (select and torch.where) and 0-d predicate (select);
* against output count: 1 .. 64 outputs of 64 x 64 float32 (16 KiB), batched predicate.

Method (``common.measure``): ``torch.utils.benchmark.Timer.blocked_autorange`` per
candidate with all of torch's threads, in interleaved rounds with the order rotating,
merged; the fastest block is reported (the median and IQR are in the JSON). The
script checks first that every candidate returns the same tensors as its baseline.

Not a test: it never fails on a slow result. Targets are printed next to results.

    python benchmarks/bench_select.py [--out results.json]   # full run (~1 min on 2 cores)
    python benchmarks/bench_select.py --quick                # smoke run (a few seconds)
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import common  # benchmarks/common.py
import torch

from torchcond import select, select_n

BATCHED_TARGET = 1.3  # fused select at least 1.3x faster than 16 torch.where calls
SIZE_SWEEP = [2**k for k in range(8, 21, 2)]  # elements per output: 1 KiB .. 4 MiB float32
SIZE_SWEEP_QUICK = [2**8, 2**14, 2**18]
COUNT_SWEEP = [1, 2, 4, 8, 16, 32, 64]
COUNT_SWEEP_QUICK = [1, 16]


def check(ns: dict, base: str, stmts) -> None:
    """Every candidate returns exactly what its baseline returns."""
    expected = eval(base, ns)
    expected = expected if isinstance(expected, list) else [expected]
    for stmt in stmts:
        got = eval(stmt, ns)
        assert len(got) == len(expected), stmt
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), stmt


def part1(run, quick: bool, rounds: int) -> None:
    min_run_time = 0.03 if quick else 0.25
    n_out, rows, cols = 16, 1024, 1024
    torch.manual_seed(0)
    ts = [torch.randn(rows, cols) for _ in range(n_out)]
    fs = [torch.randn(rows, cols) for _ in range(n_out)]
    gs = [torch.randn(rows, cols) for _ in range(n_out)]
    pred = torch.rand(rows) > 0.5
    idx = torch.randint(-1, 4, (rows,))
    small_t = [torch.randn(8, 16) for _ in range(n_out)]
    small_f = [torch.randn(8, 16) for _ in range(n_out)]
    small_p = torch.rand(8) > 0.5
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
        "pc": pred[:, None],
        "p0": torch.tensor(True),
        "idx": idx,
        "ic": idx.clamp(0, 2)[:, None],
        "st": small_t,
        "sf": small_f,
        "sp": small_p,
        "spc": small_p[:, None],
        "st0": small_t[0],
        "sf0": small_f[0],
    }
    big = f"{n_out} x {rows}x{cols}"
    out_bytes = n_out * rows * cols * 4
    # (title, baseline stmt, {name: candidate stmt}, output bytes or None, target)
    cases = [
        (
            f"batched pred, {big}",
            "[torch.where(pc, t, f) for t, f in zip(ts, fs)]",
            {"select": "select(pred, ts, fs)", "raw op": "op(pred, ts, fs)"},
            out_bytes,
            BATCHED_TARGET,
        ),
        (
            f"0-d pred, {big}",
            "[torch.where(p0, t, f) for t, f in zip(ts, fs)]",
            {"select": "select(p0, ts, fs)"},
            out_bytes,
            None,
        ),
        (
            f"select_n 3-way, {big}",
            "[torch.where(ic == 0, a, torch.where(ic == 1, b, c)) for a, b, c in zip(ts, fs, gs)]",
            {"select_n": "select_n(idx, cases)"},
            out_bytes,
            None,
        ),
        (
            f"small: {n_out} x 8x16",
            "[torch.where(spc, t, f) for t, f in zip(st, sf)]",
            {"select": "select(sp, st, sf)"},
            None,
            None,
        ),
        (
            "small: 1 x 8x16",
            "torch.where(spc, st0, sf0)",
            {"select": "select(sp, [st0], [sf0])"},
            None,
            None,
        ),
    ]
    for _, base, cands, _, _ in cases:
        check(ns, base, cands.values())

    rows_out, ms_all = [], []
    t0 = time.perf_counter()
    for title, base, cands, nbytes, target in cases:
        timers = {"torch.where": common.timer(base, ns, "select, f32", title, "torch.where")}
        for name, stmt in cands.items():
            timers[name] = common.timer(stmt, ns, "select, f32", title, name)
        ms = common.measure(timers, rounds, min_run_time)
        ms_all += ms.values()
        for name, stmt in cands.items():
            bt, ct = common.best(ms["torch.where"]), common.best(ms[name])
            rows_out.append(
                common.record(
                    title,
                    base,
                    name,
                    stmt,
                    ms["torch.where"],
                    ms[name],
                    speedup=bt / ct,
                    output_bytes=nbytes,
                    target=target,
                )
            )
    elapsed = time.perf_counter() - t0

    run.say()
    common.compare(ms_all, "Part 1: time per call (Compare, medians)")
    run.say()
    head = (
        f"{'case':<30} {'candidate':<9} {'where ms':>9} {'cand ms':>9} {'speedup':>8} "
        f"{'out GB/s':>8}  target"
    )
    run.say(head)
    run.say("-" * len(head))
    for r in rows_out:
        ct = r["result"]["best_s"]
        gbs = f"{r['output_bytes'] / ct / 1e9:8.1f}" if r["output_bytes"] else f"{'-':>8}"
        tgt = f">= {r['target']}x" if r["target"] else "-"
        run.say(
            f"{r['case']:<30} {r['candidate']:<9} {r['baseline']['best_s'] * 1e3:9.3f} "
            f"{ct * 1e3:9.3f} {r['speedup']:7.2f}x {gbs}  {tgt}"
        )
    main = rows_out[0]
    run.claim(
        f"select / {n_out} torch.where calls, batched pred, {big} f32 (speedup)",
        main["speedup"],
        f">= {BATCHED_TARGET}x",
        main["speedup"] >= BATCHED_TARGET,
    )
    run.note(
        "select moves 2 bytes per output byte (reads the selected side only), torch.where 3; "
        "'raw op' is torch.ops.torchcond.select, without the Python entry point"
    )
    run.note(f"part 1: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.1f} s")
    run.results["cases"] = rows_out


def sweep_point(n_out: int, numel: int, rounds: int, min_run_time: float, zero_d: bool) -> dict:
    rows = 2 ** ((numel.bit_length() - 1) // 2)
    cols = numel // rows
    torch.manual_seed(0)
    ts = [torch.randn(rows, cols) for _ in range(n_out)]
    fs = [torch.randn(rows, cols) for _ in range(n_out)]
    pred = torch.rand(rows) > 0.5
    src = torch.randn(n_out * numel)
    ns = {
        "torch": torch,
        "select": select,
        "ts": ts,
        "fs": fs,
        "pred": pred,
        "pc": pred[:, None],
        "p0": torch.tensor(False),
        "src": src,
        "dst": torch.empty_like(src),
    }
    stmts = {
        "torch.where": "[torch.where(pc, t, f) for t, f in zip(ts, fs)]",
        "select": "select(pred, ts, fs)",
        "copy_": "dst.copy_(src)",
    }
    check(ns, stmts["torch.where"], [stmts["select"]])
    if zero_d:
        stmts["select, 0-d pred"] = "select(p0, ts, fs)"
        check(ns, "fs", [stmts["select, 0-d pred"]])
    label = f"{n_out} x {rows}x{cols}"
    timers = {k: common.timer(v, ns, "sweep", label, k) for k, v in stmts.items()}
    ms = common.measure(timers, rounds, min_run_time)
    out_bytes = n_out * numel * 4
    return {
        "outputs": n_out,
        "shape": [rows, cols],
        "bytes_per_output": numel * 4,
        "output_bytes": out_bytes,
        "time": {k: common.stats(m) for k, m in ms.items()},
        "output_gbps": {k: out_bytes / common.best(m) / 1e9 for k, m in ms.items()},
        "speedup_vs_where": {
            k: common.best(ms["torch.where"]) / common.best(m) for k, m in ms.items()
        },
    }


def part2(run, quick: bool) -> None:
    rounds, min_run_time = (2, 0.01) if quick else (3, 0.06)
    t0 = time.perf_counter()
    sizes = [
        sweep_point(16, n, rounds, min_run_time, zero_d=True)
        for n in (SIZE_SWEEP_QUICK if quick else SIZE_SWEEP)
    ]
    counts = [
        sweep_point(c, 64 * 64, rounds, min_run_time, zero_d=False)
        for c in (COUNT_SWEEP_QUICK if quick else COUNT_SWEEP)
    ]
    elapsed = time.perf_counter() - t0

    def table(title, points, key, cands):
        run.say()
        run.say(title)
        head = f"{key[0]:>14}" + "".join(f" {c:>16}" for c in cands) + f" {'select/where':>13}"
        run.say(head)
        run.say("-" * len(head))
        for p in points:
            cells = "".join(f" {p['output_gbps'][c]:16.1f}" for c in cands)
            run.say(f"{key[1](p):>14}{cells} {p['speedup_vs_where']['select']:12.2f}x")

    table(
        "Part 2a: output GB/s against bytes per output (16 outputs)",
        sizes,
        ("bytes/output", lambda p: common.fmt_bytes(p["bytes_per_output"])),
        ["torch.where", "select", "select, 0-d pred", "copy_"],
    )
    table(
        "Part 2b: output GB/s against output count (64x64 float32 outputs)",
        counts,
        ("outputs", lambda p: str(p["outputs"])),
        ["torch.where", "select", "copy_"],
    )
    speedups = [p["speedup_vs_where"]["select"] for p in sizes]
    run.claim(
        "select / torch.where speedup over the size sweep (lowest)",
        min(speedups),
        "-",
        None,
        highest=max(speedups),
    )
    frac = [p["output_gbps"]["select"] / p["output_gbps"]["copy_"] for p in sizes]
    run.note(
        f"select reaches {min(frac) * 100:.0f}-{max(frac) * 100:.0f}% of the copy's output GB/s "
        "over the size sweep (above the caches select's streaming stores can beat copy_'s "
        "regular ones, which read each destination line first)"
    )
    run.note(f"part 2: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.1f} s")
    run.results["size_sweep"] = sizes
    run.results["count_sweep"] = counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (CI smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="part 1's rounds (default 7, quick 3)")
    ap.add_argument("--no-sweep", action="store_true", help="part 1 only")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args(argv)

    run = common.Run(
        "select", "bench_select: fused select vs one torch.where per output (CPU)", args.quick
    )
    gc.collect()
    part1(run, args.quick, args.rounds or (3 if args.quick else 7))
    if not args.no_sweep:
        gc.collect()
        part2(run, args.quick)
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
