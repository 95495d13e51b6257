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

Part 2, compile time: the first call of a freshly compiled model (dynamo trace,
AOTAutograd, Inductor codegen and the C++ compile of its kernels), small size, each
measured in a fresh process (``sys.executable bench_compile.py --child CASE LIB``) with
a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` per process, so that no measurement reads
what another compiled, and in alternating order (torchcond, torch.cond, torchcond, ...).
The child times the first execution of the case's statement (the compile included) and
the second; ``import torch``/``torchcond`` and building the model are not timed.

Method for the per-call times (``common.measure``): ``torch.utils.benchmark.Timer``,
``blocked_autorange`` in interleaved rounds with the order rotating, merged; the fastest
block is reported. Dynamo graphs compiled during the timed rounds are counted
(expected: 0).

Not a test: it never fails on a slow result.

    python benchmarks/bench_compile.py [--out results.json]   # full run (~6 min on 2 cores)
    python benchmarks/bench_compile.py --quick                # smoke run (about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when imported
import common  # benchmarks/common.py
import torch

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
CASES = ("inference", "training", "switch")


def inference_stmt(fn):
    return f"with torch.no_grad():\n    {fn}(x); {fn}(nx)"


def training_stmt(fn):
    return f"{fn}(x).square().mean().backward(); {fn}(nx).square().mean().backward()"


def switch_stmt(fn):
    return f"with torch.no_grad():\n    {fn}(x, i0); {fn}(x, i1); {fn}(x, i2)"


STMTS = {"inference": inference_stmt, "training": training_stmt, "switch": switch_stmt}
N_BRANCHES = {"inference": 2, "training": 2, "switch": 3}


def namespace(size: str, n_branches: int) -> dict:
    rows, width = SIZES[size]
    torch.manual_seed(0)
    models = dict(zip(LABELS, twin_models(width, n_branches)))
    x = torch.randn(rows, width)
    ns = {"x": x, "nx": -x, "torch": torch, **{f"i{k}": torch.tensor(k) for k in range(3)}}
    return {**ns, "_models": models}


def run_case(case, size, rounds, min_run_time) -> dict:
    """Per-call time of both libraries' compiled models (part 1)."""
    ns = namespace(size, N_BRANCHES[case])
    torch._dynamo.reset()
    for fn, model in ns.pop("_models").items():
        ns[fn] = compiled(model)
        exec(STMTS[case](fn), ns)  # compiles
        exec(STMTS[case](fn), ns)
    before = common.dynamo_graphs_compiled()
    baseline = "nested torch.cond" if case == "switch" else "torch.cond"
    timers = {
        fn: common.timer(STMTS[case](fn), ns, "compiled", f"{case}, {size}", label)
        for fn, label in (("torchcond", "torchcond"), ("torch_cond", baseline))
    }
    ms = common.measure(timers, rounds, min_run_time)
    return {
        "case": case,
        "size": size,
        "shape": list(SIZES[size]),
        "baseline": baseline,
        "torchcond": common.stats(ms["torchcond"]),
        "torch_cond": common.stats(ms["torch_cond"]),
        "ratio": common.best(ms["torchcond"]) / common.best(ms["torch_cond"]),
        "recompiles": common.dynamo_graphs_compiled() - before,
        "_measurements": list(ms.values()),
    }


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


# --- part 2: first call in a fresh process ----------------------------------------------


def child(case: str, lib: str) -> int:
    """Runs in a fresh process: time the first and the second execution of ``case``."""
    ns = namespace("small", N_BRANCHES[case])
    model = ns.pop("_models")[lib]
    ns[lib] = compiled(model)
    code = compile(STMTS[case](lib), "<case>", "exec")
    t0 = time.perf_counter()
    exec(code, ns)
    t1 = time.perf_counter()
    exec(code, ns)
    t2 = time.perf_counter()
    res = {
        "case": case,
        "lib": lib,
        "first_s": t1 - t0,
        "second_s": t2 - t1,
        "graphs": common.dynamo_graphs_compiled(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    print("RESULT " + json.dumps(res))
    return 0


def run_child(case: str, lib: str) -> dict:
    cache = tempfile.mkdtemp(prefix="torchcond_bench_inductor_")
    try:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", case, lib],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for line in proc.stdout.splitlines():
        if proc.returncode == 0 and line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"child {case} {lib} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def first_calls(run, cases, pairs: int) -> list[dict]:
    samples: list[dict] = []
    failed: list[str] = []
    t0 = time.perf_counter()
    for _ in range(pairs):
        for case in cases:
            for lib in LABELS:  # torchcond, then torch.cond: alternating
                try:
                    samples.append(run_child(case, lib))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failed.append(f"{case} {lib}: {str(exc).splitlines()[-1][:200]}")
    elapsed = time.perf_counter() - t0
    rows = []
    for case in cases:
        first = {
            lib: [s["first_s"] for s in samples if (s["case"], s["lib"]) == (case, lib)]
            for lib in LABELS
        }
        second = {
            lib: [s["second_s"] for s in samples if (s["case"], s["lib"]) == (case, lib)]
            for lib in LABELS
        }
        if not all(first.values()):
            continue  # every process of this case failed for one library
        med = {lib: statistics.median(v) for lib, v in first.items()}
        rows.append(
            {
                "case": case,
                "size": "small",
                "first_s": first,
                "second_s": second,
                "median_first_s": med,
                "ratio": med["torchcond"] / med["torch_cond"],
            }
        )
    run.say()
    run.say(
        f"Part 2: first call (compile included) in a fresh process, small size; median of {pairs}"
    )
    head = f"{'case':<10} {'torchcond s':>12} {'torch.cond s':>13} {'ratio':>7}  samples (s)"
    run.say(head)
    run.say("-" * len(head))
    for r in rows:
        spread = " | ".join(",".join(f"{v:.1f}" for v in r["first_s"][lib]) for lib in LABELS)
        run.say(
            f"{r['case']:<10} {r['median_first_s']['torchcond']:12.2f} "
            f"{r['median_first_s']['torch_cond']:13.2f} {r['ratio']:6.3f}x  {spread}"
        )
    for line in failed:
        run.note(f"part 2: FAILED: {line}")
    run.results["first_call_failed"] = failed
    run.note(
        f"part 2: {len(samples)} processes in {elapsed:.0f} s, order torchcond, torch.cond, "
        "torchcond, ...; a fresh empty TORCHINDUCTOR_CACHE_DIR per process (removed after)"
    )
    return rows


# --- main -------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small size, short")
    parser.add_argument("--rounds", type=int, default=None, help="part 1 rounds (default 5)")
    parser.add_argument(
        "--pairs", type=int, default=None, help="part 2: processes per library and case (3)"
    )
    parser.add_argument("--no-first-call", action="store_true", help="part 1 only")
    parser.add_argument("--out", help="write the results to this JSON file")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "LIB"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)

    quick = args.quick
    rounds, min_run_time = (2, 0.02) if quick else (args.rounds or 5, 0.2)
    sizes = ["small"] if quick else list(SIZES)
    torch._dynamo.config.recompile_limit = 64
    run = common.Run(
        "compile", "bench_compile: torch.compile (Inductor), torchcond vs torch.cond", quick
    )
    run.say(
        "per call: one timed statement is two calls (x and -x; switch: indices 0, 1, 2); "
        f"ratio = torchcond / baseline; target <= {TARGET}x"
    )
    check_agreement()
    rows, ms_all = [], []
    t0 = time.perf_counter()
    for size in sizes:
        for case in CASES:
            row = run_case(case, size, rounds, min_run_time)
            ms_all += row.pop("_measurements")
            rows.append(row)
    elapsed = time.perf_counter() - t0
    run.say()
    common.compare(ms_all, "Part 1: per call, compiled (Compare, medians)")
    run.say()
    head = (
        f"{'case':<10} {'size':<6} {'torchcond us':>12} {'baseline us':>12} {'ratio':>7}  baseline"
    )
    run.say(head)
    run.say("-" * len(head))
    for r in rows:
        run.say(
            f"{r['case']:<10} {r['size']:<6} {r['torchcond']['best_s'] * 1e6:12.1f} "
            f"{r['torch_cond']['best_s'] * 1e6:12.1f} {r['ratio']:6.3f}x  {r['baseline']}"
        )
    worst = max(r["ratio"] for r in rows if r["case"] != "switch")
    run.claim(
        "compiled cond per call, torchcond / torch.cond (worst)",
        worst,
        f"<= {TARGET}x",
        worst <= TARGET,
    )
    recompiles = sum(r["recompiles"] for r in rows)
    run.note(
        f"part 1: {rounds} rounds of ~{min_run_time * 1e3:.0f} ms each, took {elapsed:.0f} s; "
        f"dynamo graphs compiled while timing: {recompiles} (expected 0)"
    )
    run.results["per_call"] = rows

    if not args.no_first_call:
        pairs = args.pairs or (1 if quick else 3)
        cases = ("inference",) if quick else CASES
        first = first_calls(run, cases, pairs)
        ratios = [r["ratio"] for r in first] or [float("nan")]
        run.claim(
            "first call (compile), torchcond / torch.cond, fresh processes (worst case)",
            max(ratios),
            "-",
            None,
            best=min(ratios),
        )
        run.results["first_call"] = first
    run.finish(args.out)
    return 1 if run.results.get("first_call_failed") else 0


if __name__ == "__main__":
    sys.exit(main())
