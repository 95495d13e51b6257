"""Eager overhead of ``torchcond.cond`` / ``torchcond.switch`` against a Python ``if`` (CPU).

Every number is a ratio against a baseline measured in this same process, in the
same rounds: the same code written as a Python ``if`` (or Python list indexing for
``switch``). ``torch.cond`` is measured too, for reference.

Part 1, the headline cases (operand: one 4x3 float32 tensor, branches ``x.sin()`` /
``x.cos()`` / ``x.tanh()``: dispatch overhead as large a fraction of the call as it gets):

* cond, predicate inside: ``cond(x.sum() > 0, f, g, (x,))`` inside a function, versus
  the same function with ``f(x) if x.sum() > 0 else g(x)`` (the "same code" a user sees);
* cond, precomputed predicate: ``cond(p, f, g, (x,))`` versus ``f(x) if p else g(x)``
  with ``p`` a bool tensor computed once: pure dispatch overhead. Target <= 1.2x;
* switch, tensor index: ``switch(i, branches, (x,))`` versus ``branches[int(i)](x)``
  with 3 branches and ``i`` an int64 scalar tensor. Target <= 1.2x.

Part 2, the sweep: the same "predicate inside" cond and the switch against tensor size
(4x3 up to 1024x1024 float32) and branch cost (1 or 8 elementwise ops per branch), with
``torch.cond`` for the 1-op branches (it costs ~0.2 ms per call, so it is cheap to time
only where the sweep is short). The overhead is a fixed cost per call, so the ratio
falls towards 1 as the branches get dearer.

Part 3, every branch runs (``torch.no_grad()``; the branches are ``Linear(16, 16)``
then ``relu`` and another ``Linear(16, 16)`` then ``tanh``): what torchcond adds around
the branches' own work and the select:

* ``cond(p, tf, ff, (x,), strategy="select")`` with ``x`` of 8x16, versus
  ``torch.where(p, tf(x), ff(x))`` by hand. Target: at most 15 us more;
* ``torch.vmap`` over 32 examples of 8x16 of ``cond(p, tf, ff, (x,))`` with one bool per
  example, versus the same vmap of ``torch.where(p, tf(x), ff(x))``. Target <= 1.2x.
  The batched code without vmap is timed too, for scale.

Method (``common.measure``): ``torch.utils.benchmark.Timer.blocked_autorange`` per
candidate, in interleaved rounds with the order rotating, merged; the fastest block
is reported (``common.best``; the median and IQR are in the JSON). ``torch.cond`` runs
``torch.compile(..., backend=<eager>)`` on every eager call (a dynamo cache lookup and
guards): it is warmed up, dynamo's recompile limit is raised, and the graphs dynamo
compiled during the timed rounds are counted (expected: 0).

Not a test: it never fails on a slow result. Targets are printed next to results.

    python benchmarks/bench_eager.py [--out results.json]   # full run (~1 min)
    python benchmarks/bench_eager.py --quick                # smoke run (a few seconds)
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import common  # benchmarks/common.py
import torch

import torchcond

COND_TARGET = 1.2  # cond and switch at most 1.2x a Python `if` (issue 28)
SELECT_TARGET_US = 15.0  # strategy="select" at most 15 us over both branches + torch.where
VMAP_TARGET = 1.2  # a per-example cond under vmap at most 1.2x the vmapped torch.where
SWEEP_SHAPES = [(4, 3), (32, 32), (128, 128), (512, 512), (1024, 1024)]
SWEEP_SHAPES_QUICK = [(4, 3), (128, 128)]
SWEEP_OPS = (1, 8)


# --- the code under test (part 1; the baselines are in common.conditionals) ------------


def f_true(x):
    return x.sin()


def f_false(x):
    return x.cos()


def b2(x):
    return x.tanh()


BRANCHES = [f_true, f_false, b2]


# --- the code under test (part 2): branches of k elementwise ops ------------------------


def chain(op, k):
    def branch(x):
        for _ in range(k):
            x = op(x)
        return x

    branch.__name__ = f"{op.__name__}_x{k}"
    return branch


def sweep_namespace(k: int) -> dict:
    t, f = chain(torch.sin, k), chain(torch.cos, k)
    return common.conditionals(t, f, [t, f, chain(torch.tanh, k)])


# --- main -------------------------------------------------------------------------------


def part1(run, quick: bool, rounds: int, run_torch_cond: bool) -> None:
    min_run_time = 0.01 if quick else 0.2
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    if not bool(x.sum() > 0):
        x = -x  # the true branch is taken everywhere; which one does not matter here
    p = x.sum() > 0
    i = torch.tensor(1)  # int64 scalar: branch f_false
    ns = common.conditionals(f_true, f_false, BRANCHES)
    ns.update(x=x, p=p, i=i)
    py_if, tc_cond, torch_cond = ns["py_if"], ns["tc_cond"], ns["torch_cond"]
    ref = f_true(x)
    assert torch.equal(py_if(x), ref) and torch.equal(tc_cond(x), ref)
    assert torch.equal(torchcond.cond(p, f_true, f_false, (x,)), ref)
    assert torch.equal(torchcond.switch(i, BRANCHES, (x,)), BRANCHES[int(i)](x))
    if run_torch_cond:
        assert torch.equal(torch_cond(x), ref)
        for _ in range(3 if quick else 20):
            torch_cond(x)
            torch.cond(p, f_true, f_false, (x,))

    cases = [
        (
            "cond, pred inside",
            "py_if(x)",
            {"torchcond.cond": "tc_cond(x)", "torch.cond": "torch_cond(x)"},
        ),
        (
            "cond, precomputed pred",
            "f(x) if p else g(x)",
            {"torchcond.cond": "cond(p, f, g, (x,))", "torch.cond": "torch.cond(p, f, g, (x,))"},
        ),
        (
            "switch, 3 branches",
            "branches[int(i)](x)",
            {
                "torchcond.switch": "switch(i, branches, (x,))",
                # informative: the clamping torchcond.switch does, written in Python
                "python clamp": "branches[min(max(int(i), 0), 2)](x)",
            },
        ),
    ]
    before = common.dynamo_graphs_compiled()
    t0 = time.perf_counter()
    if not run_torch_cond:
        cases = [(t, b, {k: v for k, v in c.items() if k != "torch.cond"}) for t, b, c in cases]
    rows, ms_all = common.against(
        "python",
        "eager, 4x3 f32",
        cases,
        ns,
        rounds,
        min_run_time,
        column=lambda name: "torchcond" if name.startswith("torchcond.") else name,
    )
    elapsed = time.perf_counter() - t0
    recompiles = common.dynamo_graphs_compiled() - before

    run.say()
    common.compare(ms_all, "Part 1: per-call time (Compare, medians)")
    run.say()
    head = f"{'case':<24} {'candidate':<17} {'python us':>10} {'cand us':>10} {'ratio':>8}"
    run.say(head)
    run.say("-" * len(head))
    for r in rows:
        run.say(
            f"{r['case']:<24} {r['candidate']:<17} {r['baseline']['best_s'] * 1e6:10.3f} "
            f"{r['result']['best_s'] * 1e6:10.3f} {r['ratio']:7.2f}x"
        )
    run.say()
    for r in rows:
        if r["candidate"].startswith("torchcond"):
            run.say(
                f"overhead: {r['case']}: {r['candidate_stmt']} costs "
                f"{r['overhead_ns']:+.0f} ns per call over {r['baseline_stmt']}"
            )
    worst = max(r["ratio"] for r in rows if r["candidate"] == "torchcond.cond")
    run.claim(
        "torchcond.cond / Python if, 4x3 tensor (worst of the two cond cases)",
        worst,
        f"<= {COND_TARGET}x",
        worst <= COND_TARGET,
    )
    switch = next(r["ratio"] for r in rows if r["candidate"] == "torchcond.switch")
    run.claim(
        "torchcond.switch / Python list index, 4x3 tensor",
        switch,
        f"<= {COND_TARGET}x",
        switch <= COND_TARGET,
    )
    if run_torch_cond:
        run.note(f"dynamo graphs compiled during part 1's timed rounds: {recompiles} (expected 0)")
    run.note(f"part 1: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.1f} s")
    run.results["cases"] = rows
    run.results["cases_recompiles"] = recompiles


def part2(run, quick: bool, run_torch_cond: bool) -> None:
    rounds, min_run_time = (2, 0.005) if quick else (3, 0.05)
    shapes = SWEEP_SHAPES_QUICK if quick else SWEEP_SHAPES
    points = []
    recompiles = 0
    t0 = time.perf_counter()
    for k in SWEEP_OPS:
        ns = sweep_namespace(k)
        for shape in shapes:
            torch.manual_seed(0)
            x = torch.randn(*shape)
            if not bool(x.sum() > 0):
                x = -x
            ns.update(x=x, i=torch.tensor(1))
            ref = ns["py_if"](x)
            assert torch.equal(ns["tc_cond"](x), ref)
            assert torch.equal(
                torchcond.switch(ns["i"], ns["branches"], (x,)), ns["branches"][1](x)
            )
            stmts = {
                ("cond", "python"): "py_if(x)",
                ("cond", "torchcond.cond"): "tc_cond(x)",
                ("switch", "python"): "branches[int(i)](x)",
                ("switch", "torchcond.switch"): "switch(i, branches, (x,))",
            }
            with_torch_cond = run_torch_cond and k == 1
            if with_torch_cond:
                assert torch.equal(ns["torch_cond"](x), ref)  # compiles for this shape
                for _ in range(3):
                    ns["torch_cond"](x)
                stmts[("cond", "torch.cond")] = "torch_cond(x)"
            label = f"{shape[0]}x{shape[1]}, {k} op"
            timers = {
                key: common.timer(stmt, ns, "sweep", label, f"{key[0]}: {key[1]}")
                for key, stmt in stmts.items()
            }
            before = common.dynamo_graphs_compiled()
            ms = common.measure(timers, rounds, min_run_time)
            recompiles += common.dynamo_graphs_compiled() - before
            for kind in ("cond", "switch"):
                base = ms[(kind, "python")]
                for (kd, name), m in ms.items():
                    if kd != kind or name == "python":
                        continue
                    points.append(
                        {
                            "shape": list(shape),
                            "numel": x.numel(),
                            "ops": k,
                            "kind": kind,
                            "candidate": name,
                            "baseline": common.stats(base),
                            "result": common.stats(m),
                            "ratio": common.best(m) / common.best(base),
                            "overhead_ns": (common.best(m) - common.best(base)) * 1e9,
                        }
                    )
    elapsed = time.perf_counter() - t0

    run.say()
    run.say("Part 2: overhead against tensor size and branch cost (ratio = candidate / Python)")
    head = (
        f"{'shape':>9} {'ops':>3}  {'python if us':>12} {'cond':>7} {'torch.cond':>10}  "
        f"{'py index us':>11} {'switch':>7}  {'cond +ns':>8} {'switch +ns':>10}"
    )
    run.say(head)
    run.say("-" * len(head))
    by = {(tuple(p["shape"]), p["ops"], p["candidate"]): p for p in points}
    for k in SWEEP_OPS:
        for shape in shapes:
            c = by[(shape, k, "torchcond.cond")]
            s = by[(shape, k, "torchcond.switch")]
            tcc = by.get((shape, k, "torch.cond"))
            tcc_s = f"{tcc['ratio']:9.1f}x" if tcc else f"{'-':>10}"
            run.say(
                f"{shape[0]:>4}x{shape[1]:<4} {k:>3}  {c['baseline']['best_s'] * 1e6:12.2f} "
                f"{c['ratio']:6.2f}x {tcc_s}  {s['baseline']['best_s'] * 1e6:11.2f} "
                f"{s['ratio']:6.2f}x  {c['overhead_ns']:8.0f} {s['overhead_ns']:10.0f}"
            )
    cond_ratios = [p["ratio"] for p in points if p["candidate"] == "torchcond.cond"]
    run.claim(
        "torchcond.cond / Python if, worst over the sweep",
        max(cond_ratios),
        f"<= {COND_TARGET}x",
        max(cond_ratios) <= COND_TARGET,
        best=min(cond_ratios),
    )
    run.note(
        f"part 2: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.1f} s; "
        f"dynamo graphs compiled while timing: {recompiles} (torch.cond compiles once per "
        "shape before its timing, so expected 0)"
    )
    run.results["sweep"] = points
    run.results["sweep_recompiles"] = recompiles


def part3(run, quick: bool, rounds: int) -> None:
    """Every branch runs: select against torch.where by hand, vmap against vmapped where."""
    min_run_time = 0.01 if quick else 0.2
    torch.manual_seed(0)
    lt, lf = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def tf(x):
        return torch.relu(lt(x))

    def ff(x):
        return torch.tanh(lf(x))

    def by_hand(p, x):
        return torch.where(p, tf(x), ff(x))

    def tc_cond(p, x):
        return torchcond.cond(p, tf, ff, (x,))

    x, p = torch.randn(8, 16), torch.tensor(True)
    xs, ps = torch.randn(32, 8, 16), torch.rand(32) > 0.5
    ns = {
        "torch": torch,
        "cond": torchcond.cond,
        "tf": tf,
        "ff": ff,
        "x": x,
        "p": p,
        "xs": xs,
        "ps": ps,
        "psc": ps[:, None, None],
        "vmap_where": torch.vmap(by_hand),
        "vmap_cond": torch.vmap(tc_cond),
    }
    cases = [
        (
            "select, 8x16",
            "torch.where(p, tf(x), ff(x))",
            {"torchcond select": 'cond(p, tf, ff, (x,), strategy="select")'},
        ),
        (
            "vmap, 32 x 8x16",
            "vmap_where(ps, xs)",
            {"torchcond vmap": "vmap_cond(ps, xs)", "batched, no vmap": "by_hand(psc, xs)"},
        ),
    ]
    ns["by_hand"] = by_hand
    t0 = time.perf_counter()
    with torch.no_grad():
        for _, base, cands in cases:
            expected = eval(base, ns)
            for stmt in cands.values():
                torch.testing.assert_close(eval(stmt, ns), expected)
        rows, ms_all = common.against(
            "by hand", "every branch runs", cases, ns, rounds, min_run_time
        )
    elapsed = time.perf_counter() - t0

    run.say()
    common.compare(ms_all, "Part 3: every branch runs, no_grad (Compare, medians)")
    run.say()
    head = (
        f"{'case':<18} {'candidate':<17} {'by hand us':>10} {'cand us':>10} {'ratio':>8} {'+us':>7}"
    )
    run.say(head)
    run.say("-" * len(head))
    for r in rows:
        run.say(
            f"{r['case']:<18} {r['candidate']:<17} {r['baseline']['best_s'] * 1e6:10.2f} "
            f"{r['result']['best_s'] * 1e6:10.2f} {r['ratio']:7.2f}x {r['overhead_ns'] / 1e3:7.2f}"
        )
    select = next(r for r in rows if r["candidate"] == "torchcond select")
    run.claim(
        "strategy='select': us over torch.where(p, tf(x), ff(x)) by hand",
        select["overhead_ns"] / 1e3,
        f"<= {SELECT_TARGET_US:g}",
        select["overhead_ns"] / 1e3 <= SELECT_TARGET_US,
        ratio=select["ratio"],
    )
    vmap = next(r for r in rows if r["candidate"] == "torchcond vmap")
    run.claim(
        "vmap of a per-example cond / vmap of torch.where by hand",
        vmap["ratio"],
        f"<= {VMAP_TARGET}x",
        vmap["ratio"] <= VMAP_TARGET,
    )
    run.note(f"part 3: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.1f} s")
    run.results["every_branch"] = rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (CI smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="part 1's rounds (default 7, quick 3)")
    ap.add_argument("--no-torch-cond", action="store_true", help="skip torch.cond")
    ap.add_argument("--no-sweep", action="store_true", help="part 1 only")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args(argv)

    run = common.Run(
        "eager",
        "bench_eager: torchcond eager overhead (ratios vs Python in this process)",
        args.quick,
    )
    run_torch_cond = not args.no_torch_cond
    if run_torch_cond:
        run.note(f"torch.cond: dynamo {common.raise_dynamo_limits()}")
    gc.collect()
    part1(run, args.quick, args.rounds or (3 if args.quick else 7), run_torch_cond)
    gc.collect()
    part3(run, args.quick, args.rounds or (3 if args.quick else 7))
    if not args.no_sweep:
        part2(run, args.quick, run_torch_cond)
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
