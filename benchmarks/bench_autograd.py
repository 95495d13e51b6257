"""Autograd cost of ``torchcond.cond`` / ``torchcond.switch``: time and peak memory.

Every number is a ratio against a baseline measured in this same process, in the
same run: the same code written as a Python ``if`` (or Python list indexing for
``switch``). ``torch.cond`` is measured too, for reference.

Part 1, eager forward + backward time on small CPU tensors (``x``: an 8x8 float32
tensor with ``requires_grad=True``; branches ``(a.sin() * a).sum()`` /
``a.cos().sum()`` / ``(a * a).sum()``). The timed statement is
``torch.autograd.grad(<conditional>, (x,))``:

* cond, predicate inside: ``cond(x.sum() > 0, f, g, (x,))`` inside a function,
  versus the same function with a Python ``if`` (the "same code" comparison);
* cond, precomputed predicate: ``cond(p, f, g, (x,))`` versus ``f(x) if p else g(x)``
  with ``p`` a bool tensor computed once;
* switch, tensor index: ``switch(i, branches, (x,))`` versus ``branches[int(i)](x)``
  with 3 branches and ``i`` an int64 scalar tensor.

Method as in ``bench_eager.py`` (``common.measure``): ``torch.utils.benchmark.Timer``,
``blocked_autorange`` in interleaved rounds with the order rotating, merged; the fastest
block is reported. ``torch.cond`` (a dynamo compile-cache lookup per eager
call, and a compiled autograd.Function) is warmed up first; dynamo's recompile limits
are raised and the number of graphs compiled during the timed rounds is reported
(expected: 0).

Part 2, peak memory of one training step of a module whose branches are two MLPs
(``Linear(256, 256), ReLU, Linear(256, 256)`` each), batch 64, predicate
``x.sum() > 0`` (data-dependent), loss ``out.square().mean()``:

* module step: ``loss.backward()`` then an in-place SGD update under ``no_grad``
  (grads set to ``None`` before the step), Python ``if`` versus ``torchcond.cond``;
* functional step: ``functional_call`` + ``torch.autograd.grad`` + new parameters
  ``p - lr * g``, run eagerly (Python ``if``, ``torchcond.cond``) and as a graph
  traced once by ``make_fx(step, tracing_mode="fake")`` (the graph holds a forward
  and a backward ``torchcond_cond`` node), run on real tensors under ``no_grad``.
  The Python ``if`` cannot be traced (it reads a tensor value), so for context the
  same step with the taken branch only (``a(x)``, no conditional) is traced and run
  the same way: it separates what the traced conditional costs from what running a
  traced graph (which frees each value after its last use) changes.

There is no allocator-statistics API for CPU tensors, so peak memory is measured
with ``torch.profiler.profile(profile_memory=True)``: the raw ``[memory]`` events
(one per allocation, positive, and per free, negative) are summed in time order and
the maximum is kept. That is the peak of the bytes allocated during the step and
still live, above what was live when the step began. The method is checked at start
on a case with a known answer (12,000 bytes). Note: ``prof.events()`` folds
allocations made inside an operator into that operator's event, so summing only its
``[memory]`` events misses them; the raw events from ``prof.profiler.kineto_results``
are used instead. Frees of tensors allocated before profiling are not reported by
the profiler (it warns about them on stderr) and do not count.

Not a test: it never fails on a slow or large result. Targets are printed next to
results.

    python benchmarks/bench_autograd.py            # full run (~25 s on 2 cores)
    python benchmarks/bench_autograd.py --quick    # smoke run for CI (a few seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
import time

import common  # benchmarks/common.py
import torch
from torch import nn

import torchcond

TIME_TARGET = 1.3  # torchcond forward+backward at most 1.3x the Python `if`
MEM_TARGET = 1.1  # peak memory of a training step at most 1.1x the Python `if`
LR = 0.01


# --- part 1: the code under test (the baselines are in common.conditionals) -------------


def f_true(a):
    return (a.sin() * a).sum()


def f_false(a):
    return a.cos().sum()


def b2(a):
    return (a * a).sum()


BRANCHES = [f_true, f_false, b2]


# --- part 1: timing (same method as bench_eager.py) -------------------------------------


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def time_part(args) -> tuple[list, list[str]]:
    quick = args.quick
    rounds = args.rounds or (3 if quick else 7)
    min_run_time = 0.01 if quick else 0.2
    torch_cond_warmup = 2 if quick else 5

    torch.manual_seed(0)
    x = torch.randn(8, 8)
    if not bool(x.sum() > 0):
        x = -x  # the true branch is taken everywhere
    x.requires_grad_(True)
    p = (x.sum() > 0).detach()
    i = torch.tensor(1)

    ns = common.conditionals(f_true, f_false, BRANCHES)
    ns.update(grad=torch.autograd.grad, x=x, xs=(x,), p=p, i=i)
    py_if, tc_cond, torch_cond = ns["py_if"], ns["tc_cond"], ns["torch_cond"]

    # sanity: every candidate computes the same gradient
    (ref,) = torch.autograd.grad(f_true(x), (x,))
    assert torch.equal(torch.autograd.grad(py_if(x), (x,))[0], ref)
    assert torch.equal(torch.autograd.grad(tc_cond(x), (x,))[0], ref)
    assert torch.equal(torch.autograd.grad(torchcond.cond(p, f_true, f_false, (x,)), (x,))[0], ref)
    (ref_sw,) = torch.autograd.grad(BRANCHES[1](x), (x,))
    assert torch.equal(torch.autograd.grad(torchcond.switch(i, BRANCHES, (x,)), (x,))[0], ref_sw)

    notes = []
    run_torch_cond = not args.no_torch_cond
    compiled_before = 0
    if run_torch_cond:
        limits = common.raise_dynamo_limits()
        try:
            t0 = time.perf_counter()
            got = torch.autograd.grad(torch_cond(x), (x,))[0]
            first = time.perf_counter() - t0
            assert torch.allclose(got, ref), "torch.cond gradient differs"
            got = torch.autograd.grad(torch.cond(p, f_true, f_false, (x,)), (x,))[0]
            assert torch.allclose(got, ref), "torch.cond gradient differs"
            for _ in range(torch_cond_warmup):
                torch.autograd.grad(torch_cond(x), (x,))
                torch.autograd.grad(torch.cond(p, f_true, f_false, (x,)), (x,))
            compiled_before = common.dynamo_graphs_compiled()
            notes.append(
                f"torch.cond: dynamo {limits}; first forward+backward call {first * 1e3:.0f} ms "
                f"(imports dynamo, compiles); warm-up {torch_cond_warmup} calls per case"
            )
        except Exception as exc:  # report and go on without it
            run_torch_cond = False
            notes.append(f"torch.cond FAILED, not timed: {_short_error(exc)}")
    else:
        notes.append("torch.cond skipped")

    cases = []  # (title, baseline stmt, {candidate: stmt})
    gc.collect()
    t_start = time.perf_counter()
    cands = {"torchcond.cond": "grad(tc_cond(x), xs)"}
    if run_torch_cond:
        cands["torch.cond"] = "grad(torch_cond(x), xs)"
    cases.append(("cond, pred inside (x.sum() > 0)", "grad(py_if(x), xs)", cands))

    cands = {"torchcond.cond": "grad(cond(p, f, g, (x,)), xs)"}
    if run_torch_cond:
        cands["torch.cond"] = "grad(torch.cond(p, f, g, (x,)), xs)"
    cases.append(("cond, precomputed pred", "grad(f(x) if p else g(x), xs)", cands))

    cases.append(
        (
            "switch, 3 branches, tensor index",
            "grad(branches[int(i)](x), xs)",
            {"torchcond.switch": "grad(switch(i, branches, (x,)), xs)"},
        )
    )
    records, _ = common.against("python", "autograd", cases, ns, rounds, min_run_time)
    elapsed = time.perf_counter() - t_start
    if run_torch_cond:
        recompiles = common.dynamo_graphs_compiled() - compiled_before
        notes.append(
            f"dynamo graphs compiled during the timed rounds: {recompiles} (0 = no recompiles)"
        )
    notes.append(
        f"time: {rounds} interleaved rounds of blocked_autorange (~{min_run_time * 1e3:.0f} ms), "
        f"fastest block reported; timed rounds took {elapsed:.1f} s"
    )
    return records, notes


# --- part 2: peak memory of a training step ---------------------------------------------


@contextlib.contextmanager
def _quiet_kineto():
    """Drop kineto's ``USDT: ... profiler_start/stop`` lines (two per profile, on fd 2,
    not silenced by KINETO_LOG_LEVEL); anything else written to stderr is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines(keepends=True):
                if not (line.startswith("USDT:") and "ActivityProfiler" in line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def peak_bytes(fn) -> tuple[int, int]:
    """(peak, net) bytes allocated while ``fn()`` runs, above the live set at entry.

    Sums the profiler's raw ``[memory]`` events (allocations positive, frees
    negative) in time order. ``net`` is what is still live at the end (outputs).
    """
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with _quiet_kineto():
        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False
        ) as prof:
            out = fn()
            del out  # frees of the step's outputs fall inside the window, after the peak
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    cur = peak = 0
    for _, nbytes in events:
        cur += nbytes
        peak = max(peak, cur)
    return peak, cur


def _check_peak_method() -> int:
    def known():
        a = torch.empty(1000)  # +4000 bytes
        b = torch.empty(2000)  # +8000: peak 12000
        del a  # -4000
        c = torch.ones(500)  # +2000
        del b, c

    peak, net = peak_bytes(known)
    assert (peak, net) == (12000, 0), (
        f"peak-memory method broken: got {(peak, net)}, expected (12000, 0)"
    )
    return peak


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


class TwoBranchNet(nn.Module):
    """``a(x) if x.sum() > 0 else b(x)``, written with a Python if or torchcond.cond.

    ``kind="taken-only"`` is ``a(x)`` with no conditional (the branch the benchmark's
    input takes): the reference for a traced graph without a conditional, since the
    Python ``if`` cannot be traced (it reads a tensor value).
    """

    def __init__(self, kind: str):
        super().__init__()
        self.a = mlp()
        self.b = mlp()
        self.kind = kind

    def forward(self, x):
        if self.kind == "torchcond":
            return torchcond.cond(x.sum() > 0, self.a, self.b, (x,))
        if self.kind == "taken-only":
            return self.a(x)
        if x.sum() > 0:
            return self.a(x)
        return self.b(x)


def module_step(net: nn.Module, x: torch.Tensor):
    loss = net(x).square().mean()
    loss.backward()
    with torch.no_grad():
        for prm in net.parameters():
            if prm.grad is not None:
                prm.add_(prm.grad, alpha=-LR)
    return loss.detach()


def make_functional_step(net: nn.Module):
    from torch.func import functional_call

    def step(params: dict, x: torch.Tensor):
        out = functional_call(net, params, (x,))
        loss = out.square().mean()
        names = list(params)
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        new = {n: params[n] if g is None else params[n] - LR * g for n, g in zip(names, grads)}
        return loss.detach(), new

    return step


def memory_part(args):
    from torch.fx.experimental.proxy_tensor import make_fx

    checked = _check_peak_method()
    torch.manual_seed(0)
    nets = {kind: TwoBranchNet(kind) for kind in ("python-if", "torchcond", "taken-only")}
    for kind in ("torchcond", "taken-only"):
        nets[kind].load_state_dict(nets["python-if"].state_dict())
    x = torch.randn(64, 256)
    if not bool(x.sum() > 0):
        x = -x
    repeats = 1 if args.quick else 3

    rows = []  # (case, variant, peak, net, note)
    notes = [f"memory: peak-method self-check on a known case: {checked} bytes (expected 12000)"]

    # module step: loss.backward() + in-place SGD; grads None before the step
    # each case: (step, variant, prepare, call); prepare() runs before call(), unprofiled
    def module_case(name, variant):
        net = nets[name]
        title = "module step"
        return (
            title,
            variant,
            lambda: net.zero_grad(set_to_none=True),
            lambda: module_step(net, x),
        )

    # functional step, eager and traced; parameters passed in, new ones returned
    def fresh_params(net, requires_grad):
        return {
            k: v.detach().clone().requires_grad_(requires_grad) for k, v in net.named_parameters()
        }

    fsteps = {name: make_functional_step(net) for name, net in nets.items()}
    params_rg = fresh_params(nets["python-if"], True)
    params_plain = {k: v.detach() for k, v in params_rg.items()}

    functional = "functional step"

    def nothing():
        pass

    def functional_case(name, variant):
        return (functional, variant, nothing, lambda: fsteps[name](params_rg, x))

    cases = [
        module_case("python-if", "python-if"),
        module_case("torchcond", "torchcond.cond"),
        functional_case("python-if", "python-if"),
        functional_case("torchcond", "torchcond.cond"),
    ]

    ref_loss, ref_new = fsteps["python-if"](params_rg, x)
    traced_variants = [
        ("torchcond.cond, make_fx", "torchcond", "fake"),
        ("taken only, make_fx (info)", "taken-only", "fake"),
    ]
    for label, name, mode in traced_variants:
        try:
            t0 = time.perf_counter()
            gm = make_fx(fsteps[name], tracing_mode=mode)(fresh_params(nets[name], True), x)
            trace_s = time.perf_counter() - t0
            n_cond = sum(
                1
                for n in gm.graph.nodes
                if n.op == "call_function" and "torchcond" in str(n.target)
            )
            with torch.no_grad():
                loss, new = gm(params_plain, x)
            assert torch.allclose(loss, ref_loss), "traced loss differs"
            assert all(torch.allclose(new[k], ref_new[k].detach()) for k in ref_new), (
                "traced update differs"
            )
            notes.append(
                f"traced '{label}': traced in {trace_s * 1e3:.0f} ms, {n_cond} torchcond node(s) in the "
                "top-level graph, run under no_grad on real tensors; loss and update match eager"
            )

            def run_traced(gm=gm):
                with torch.no_grad():
                    return gm(params_plain, x)

            cases.append((functional, label, nothing, run_traced))
        except Exception as exc:  # report and go on
            notes.append(f"traced '{label}' FAILED: {_short_error(exc)}")

    # warm-up without the profiler (first-call allocations), then interleaved profiled
    # repeats; the peaks should agree (a spread is printed if they do not)
    for _, _, prepare, call in cases:
        prepare()
        call()
    results: dict[int, list] = {k: [] for k in range(len(cases))}
    for r in range(repeats):
        order = list(range(len(cases)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            cases[k][2]()
            results[k].append(peak_bytes(cases[k][3]))
    for k, (title, variant, _, _) in enumerate(cases):
        peaks = sorted(p for p, _ in results[k])
        nets_ = sorted(n for _, n in results[k])
        spread = "" if peaks[0] == peaks[-1] else f" (varied {peaks[0]}..{peaks[-1]})"
        rows.append((title, variant, peaks[-1], nets_[-1], spread))
    notes.append(
        f"memory: 1 unprofiled warm-up + {repeats} profiled run(s) per case, interleaved; max peak reported"
    )
    return rows, notes


# --- main ------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (CI smoke run)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds (default 7, quick 3)"
    )
    ap.add_argument("--no-torch-cond", action="store_true", help="skip torch.cond")
    ap.add_argument("--no-memory", action="store_true", help="skip part 2 (peak memory)")
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args(argv)

    run = common.Run(
        "autograd",
        "bench_autograd: forward+backward time and training-step peak memory (vs Python if)",
        args.quick,
    )
    say = run.say
    records, notes = time_part(args)
    run.results["time"] = records
    rows = [  # (case, baseline stmt, base s, candidate, candidate stmt, candidate s, target)
        (
            r["case"],
            r["baseline_stmt"],
            r["baseline"]["best_s"],
            r["candidate"],
            r["candidate_stmt"],
            r["result"]["best_s"],
            f"<= {TIME_TARGET}x" if r["candidate"].startswith("torchcond") else "-",
        )
        for r in records
    ]

    head = f"{'case':<32} {'candidate':<16} {'python us':>10} {'cand us':>10} {'ratio':>8}  target"
    say()
    say("Part 1: eager forward + backward, per call (x: 8x8 float32, requires_grad; fastest block)")
    say(head)
    say("-" * len(head))
    for title, _, bt, name, _, ct, target in rows:
        say(f"{title:<32} {name:<16} {bt * 1e6:10.3f} {ct * 1e6:10.3f} {ct / bt:7.2f}x  {target}")
    say()
    for title, bstmt, bt, name, cstmt, ct, _ in rows:
        if name.startswith("torchcond"):
            say(f"overhead: {title}: {cstmt} costs {(ct - bt) * 1e9:+.0f} ns per call over {bstmt}")
    worst = max(r[5] / r[2] for r in rows if r[3].startswith("torchcond"))
    run.claim(
        "torchcond forward+backward / Python if (worst case)",
        worst,
        f"<= {TIME_TARGET}x",
        worst <= TIME_TARGET,
    )
    for note in notes:
        run.note(note)

    if not args.no_memory:
        mrows, mnotes = memory_part(args)
        say()
        say("Part 2: peak memory of one training step (two MLP branches 256-256-256, batch 64)")
        w_t = max(len(r[0]) for r in mrows)
        w_v = max(len(r[1]) for r in mrows)
        head = (
            f"{'step':<{w_t}}  {'variant':<{w_v}}  {'peak KiB':>9}  {'ratio':>7}  "
            f"{'live after KiB':>14}  target"
        )
        say(head)
        say("-" * len(head))
        base = {}
        worst_mem = 0.0
        memory = []
        for title, variant, peak, net, spread in mrows:
            if variant == "python-if":
                base[title] = peak
            ratio = peak / base[title] if base.get(title) else float("nan")
            target = f"<= {MEM_TARGET}x" if variant.startswith("torchcond") else "-"
            if variant.startswith("torchcond"):
                worst_mem = max(worst_mem, ratio)
            say(
                f"{title:<{w_t}}  {variant:<{w_v}}  {peak / 1024:9.1f}  {ratio:6.3f}x  "
                f"{net / 1024:14.1f}  {target}{spread}"
            )
            memory.append(
                {"step": title, "variant": variant, "peak_bytes": peak, "live_after_bytes": net}
            )
        run.results["memory"] = memory
        say()
        run.claim(
            "torchcond training-step peak memory / Python if (worst)",
            worst_mem,
            f"<= {MEM_TARGET}x",
            worst_mem <= MEM_TARGET,
        )
        by_variant = {r[1]: r[2] for r in mrows}
        traced_tc = by_variant.get("torchcond.cond, make_fx")
        traced_ref = by_variant.get("taken only, make_fx (info)")
        if traced_tc and traced_ref:
            say(
                f"ratio: traced functional step, torchcond.cond / taken branch only: "
                f"{traced_tc / traced_ref:.3f}x ({(traced_tc - traced_ref) / 1024:+.1f} KiB)"
            )
        run.note(
            "peak = max over the step of bytes allocated in it and still live (raw profiler "
            "[memory] events, in time order); parameters, inputs and anything live before the "
            "step are not counted. 'live after' = bytes allocated in the step still live once its "
            "return value is dropped (the .grad tensors of the module step). module step: "
            "backward + in-place SGD; functional step: autograd.grad + new parameters; make_fx: "
            "the functional step traced with tracing_mode='fake', run on real tensors"
        )
        for note in mnotes:
            run.note(note)
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
