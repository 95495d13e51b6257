"""Deployed per-call time of a model with a conditional: torchcond vs torch.cond.

A model is deployed twice, written once with ``torchcond.cond`` and once with
``torch.cond`` (the same weights), the same way each time, in this same process:

* AOTInductor: ``torch.export.export`` (dynamic batch), ``aoti_compile_and_package``
  (default settings: what a user gets), ``aoti_load_package``; timed: ``package(x)``,
  the loaded package's Python call, and ``package.loader.run([x])``, the C++ runner
  underneath (without the Python wrapper's pytree handling);
* ``ep.module()``: the exported program run in Python, for torchcond's program, the
  same program after ``torchcond.passes.portable`` (torch's own ``cond``) and
  torch.cond's program; timed: ``module(x)``. Ratios against torch.cond's.
* ONNX: ``torch.onnx.export(model, (x,), dynamo=True)`` (dynamic batch), saved, run by
  ``onnxruntime.InferenceSession`` on ``CPUExecutionProvider`` with as many intra-op
  threads as torch uses; timed: ``session.run(None, {"x": x})`` on a NumPy array.
  Skipped, with a printed reason, where ``onnxruntime`` cannot be imported; a library
  whose export fails is reported as failing (no ratio).

The model (``Model``): ``h = lin_in(x)``; ``cond(h.mean() > 0, a, b, (h,))`` where
``a = relu -> Linear -> relu`` and ``b = tanh -> Linear -> tanh``; then ``lin_out``.
x is 64x256 float32 and every Linear 256x256 (quick: 8x32). The predicate is computed
from the data in the deployed program; two inputs, one per branch, are timed apart.
Every deployed program is first checked against the eager model (a Python ``if``) on
both inputs and two other batch sizes.

Reported: seconds per call (``common.measure``: ``blocked_autorange`` in interleaved
rounds, the order rotating, the fastest block; the medians are kept too) and the ratio
torchcond / torch.cond per runtime and branch. Target: at most 1.05x. Not a test: it
never fails on a slow result.

    python benchmarks/bench_deploy.py [--out deploy.json]   # full run (~1 min on 2 cores)
    python benchmarks/bench_deploy.py --quick               # smoke run (one small compile each)
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import torch
from torch.export import Dim

import torchcond

TARGET = 1.05
SHAPES = {"full": (64, 256), "quick": (8, 32)}
LIBRARIES = {"torchcond": torchcond.cond, "torch.cond": torch.cond}


class Model(torch.nn.Module):
    def __init__(self, width: int, cond):
        super().__init__()
        self.cond = cond
        self.lin_in = torch.nn.Linear(width, width)
        self.lin_a = torch.nn.Linear(width, width)
        self.lin_b = torch.nn.Linear(width, width)
        self.lin_out = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.lin_in(x)
        h = self.cond(
            h.mean() > 0,
            lambda h: self.lin_a(h.relu()).relu(),
            lambda h: self.lin_b(h.tanh()).tanh(),
            (h,),
        )
        return self.lin_out(h)


def python_if(pred, true_fn, false_fn, operands):
    return true_fn(*operands) if bool(pred) else false_fn(*operands)


def models(width: int) -> tuple[dict, Model]:
    """library -> its model (eval mode, the same weights), and the Python-``if`` reference."""
    torch.manual_seed(0)
    reference = Model(width, python_if).eval()
    out = {}
    for name, cond in LIBRARIES.items():
        model = Model(width, cond).eval()
        model.load_state_dict(reference.state_dict())
        out[name] = model
    return out, reference


def branch_inputs(reference: Model, rows: int, width: int) -> dict:
    """One input per branch: x pushed along the sign of lin_in's mean weight row."""
    torch.manual_seed(1)
    direction = reference.lin_in.weight.detach().mean(0).sign()
    noise = torch.randn(rows, width)
    inputs = {"true": noise + 2 * direction, "false": noise - 2 * direction}
    with torch.no_grad():
        for branch, x in inputs.items():
            taken = bool(reference.lin_in(x).mean() > 0)
            if taken != (branch == "true"):
                raise AssertionError(f"the {branch!r} input takes the other branch")
    return inputs


def check(run_fn, reference, inputs, rows: int, width: int, **tolerance) -> None:
    """The deployed program gives the eager result on both branches and at another batch
    (larger: Inductor may narrow the batch range to the example's side of a heuristic)."""
    samples = [*inputs.values(), torch.randn(rows + 3, width), -torch.randn(rows + 5, width)]
    with torch.no_grad():
        for x in samples:
            torch.testing.assert_close(run_fn(x), reference(x), **tolerance)


@contextlib.contextmanager
def quiet():
    """The exporters' progress lines, warnings and log records, off the benchmark's output."""
    sink = io.StringIO()
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)  # torch's handlers keep the real stderr
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
    ):
        warnings.simplefilter("ignore")
        try:
            yield sink
        finally:
            torch_logger.setLevel(level)


# --- AOTInductor ------------------------------------------------------------------------


def deploy_aoti(model, x, folder: str, quick: bool):
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=1024)},))
    # The smoke run only needs a working package: an unoptimised wrapper builds faster.
    configs = {"aot_inductor.compile_wrapper_opt_level": "O0"} if quick else {}
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=os.path.join(folder, "model.pt2"), inductor_configs=configs
    )
    return torch._inductor.aoti_load_package(path)


# --- ONNX -------------------------------------------------------------------------------


def deploy_onnx(model, x, folder: str, ort):
    program = torch.onnx.export(
        model, (x,), dynamo=True, dynamic_shapes=({0: Dim("batch", min=1, max=1024)},)
    )
    path = os.path.join(folder, "model.onnx")
    program.save(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session, program.model_proto


def graph_text(proto) -> str:
    """The model's text without its weights and node names (names differ by library)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    del model.graph.initializer[:]
    return re.sub(r"\[node_[^\]]*\] ", "", onnx.printer.to_text(model))


def onnx_runner(session):
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])


# --- timing -----------------------------------------------------------------------------


def time_runtime(run, runtime, deployed, inputs, stmts, rounds, min_run_time) -> list[dict]:
    """Per-call times of every deployed library on both inputs, interleaved; one row per
    (statement kind, branch) with its torchcond / torch.cond ratio."""
    timers = {}
    for lib, obj in deployed.items():
        for kind, stmt in stmts.items():
            for branch, x in inputs.items():
                name = obj.get_inputs()[0].name if hasattr(obj, "get_inputs") else None
                ns = {"obj": obj, "x": x, "xn": x.numpy(), "name": name}
                timers[(lib, kind, branch)] = common.timer(
                    stmt, ns, runtime, f"{kind}, {branch} branch", lib
                )
    ms = common.measure(timers, rounds, min_run_time)
    common.compare(list(ms.values()))
    rows = []
    for kind, stmt in stmts.items():
        for branch in inputs:
            if len(deployed) < 2:
                continue
            ours, theirs = ms[("torchcond", kind, branch)], ms[("torch.cond", kind, branch)]
            ratio = common.best(ours) / common.best(theirs)
            rows.append(
                {
                    **common.record(
                        f"{runtime}, {kind}, {branch} branch",
                        stmt,
                        "torchcond",
                        stmt,
                        theirs,
                        ours,
                        ratio=ratio,
                        median_ratio=ours.median / theirs.median,
                    ),
                    "runtime": runtime,
                    "call": kind,
                    "branch": branch,
                }
            )
    for r in rows:
        run.say(
            f"{runtime:<5} {r['call']:<8} {r['branch']:<5} torchcond "
            f"{r['result']['best_s'] * 1e6:9.1f} us  torch.cond {r['baseline']['best_s'] * 1e6:9.1f}"
            f" us  ratio {r['ratio']:.3f}x (medians {r['median_ratio']:.3f}x)"
        )
    return rows


def main(argv=None) -> int:
    args = common.standard_args(__doc__, "smoke run: small model, one compile each, short", argv)
    rows, width = SHAPES["quick" if args.quick else "full"]
    rounds, min_run_time = (2, 0.02) if args.quick else (7, 0.2)
    run = common.Run(
        "deploy",
        "Deployed model with a conditional (AOTInductor, ONNX Runtime): torchcond vs torch.cond",
        args.quick,
    )
    run.say(f"x {rows}x{width}, Linear {width}x{width}; {rounds} rounds of >= {min_run_time} s")
    libs, reference = models(width)
    inputs = branch_inputs(reference, rows, width)
    run.results["shape"] = [rows, width]
    with tempfile.TemporaryDirectory(prefix="torchcond_bench_deploy_") as tmp, torch.no_grad():
        run.results["module"] = module_part(run, libs, reference, inputs, rounds, min_run_time)
        run.results["aoti"] = aoti_part(
            run, libs, reference, inputs, tmp, args, rounds, min_run_time
        )
        run.results["onnx"] = onnx_part(run, libs, reference, inputs, tmp, rounds, min_run_time)
    run.finish(args.out)
    return 0


def claims(run, runtime: str, rows: list[dict]) -> None:
    for r in rows:
        if r["call"] in ("package", "session"):  # the call a user makes
            run.claim(
                f"{runtime}: torchcond / torch.cond per call, {r['branch']} branch",
                r["ratio"],
                f"<= {TARGET}",
                r["ratio"] <= TARGET,
            )


def module_part(run, libs, reference, inputs, rounds, min_run_time) -> dict:
    run.say()
    run.say("ep.module(): torch.export.export (dynamic batch), then the program in Python")
    x = inputs["true"]
    programs = {}
    for lib, model in libs.items():
        with quiet():
            ep = torch.export.export(
                model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=1024)},)
            )
            programs[lib] = ep.module()
            if lib == "torchcond":
                programs["portable"] = torchcond.passes.portable(ep).module()
    for module in programs.values():
        check(module, reference, inputs, *x.shape)
    timers = {
        (lib, branch): common.timer("obj(x)", {"obj": module, "x": xb}, "module", branch, lib)
        for lib, module in programs.items()
        for branch, xb in inputs.items()
    }
    ms = common.measure(timers, rounds, min_run_time)
    common.compare(list(ms.values()))
    rows = []
    for lib in ("torchcond", "portable"):
        for branch in inputs:
            ours, theirs = ms[(lib, branch)], ms[("torch.cond", branch)]
            ratio = common.best(ours) / common.best(theirs)
            rows.append(
                {
                    **common.record(
                        f"ep.module(), {lib}, {branch} branch",
                        "obj(x)",
                        lib,
                        "obj(x)",
                        theirs,
                        ours,
                        ratio=ratio,
                        median_ratio=ours.median / theirs.median,
                    ),
                    "program": lib,
                    "branch": branch,
                }
            )
            run.say(
                f"module {lib:<9} {branch:<5} {common.best(ours) * 1e6:9.1f} us  torch.cond "
                f"{common.best(theirs) * 1e6:9.1f} us  ratio {ratio:.3f}x"
            )
    return {"cases": rows}


def aoti_part(run, libs, reference, inputs, tmp, args, rounds, min_run_time) -> dict:
    run.say()
    run.say("AOTInductor: export (dynamic batch) -> aoti_compile_and_package -> aoti_load_package")
    x = inputs["true"]
    deployed, compile_s = {}, {}
    for lib, model in libs.items():
        folder = os.path.join(tmp, f"aoti-{lib}")
        os.makedirs(folder)
        t0 = time.perf_counter()
        try:
            with quiet():
                package = deploy_aoti(model, x, folder, args.quick)
            check(package, reference, inputs, x.shape[0], x.shape[1])
        except Exception as error:
            run.note(f"aoti, {lib}: fails ({type(error).__name__}: {str(error)[:300]})")
            continue
        compile_s[lib] = round(time.perf_counter() - t0, 2)
        deployed[lib] = package
        run.say(f"{lib}: exported, compiled and loaded in {compile_s[lib]:.1f} s; checked")
    stmts = {"package": "obj(x)", "runner": "obj.loader.run([x])"}
    rows = time_runtime(run, "aoti", deployed, inputs, stmts, rounds, min_run_time)
    claims(run, "aoti", rows)
    return {"compile_s": compile_s, "cases": rows, "deployed": sorted(deployed)}


def onnx_part(run, libs, reference, inputs, tmp, rounds, min_run_time) -> dict:
    run.say()
    try:
        import onnxruntime as ort
    except ImportError as error:
        reason = f"onnxruntime is not importable ({error}); pip install onnx onnxscript onnxruntime"
        run.say(f"ONNX: skipped: {reason}")
        return {"skipped": reason}
    run.say(
        f"ONNX: torch.onnx.export(dynamo=True, dynamic batch) -> onnxruntime {ort.__version__} "
        f"InferenceSession, CPUExecutionProvider, {torch.get_num_threads()} intra-op thread(s)"
    )
    x = inputs["true"]
    deployed, export_s, graphs = {}, {}, {}
    for lib, model in libs.items():
        folder = os.path.join(tmp, f"onnx-{lib}")
        os.makedirs(folder)
        t0 = time.perf_counter()
        try:
            with quiet():
                session, proto = deploy_onnx(model, x, folder, ort)
            check(onnx_runner(session), reference, inputs, *x.shape, rtol=1e-4, atol=1e-5)
        except Exception as error:
            run.note(f"onnx, {lib}: fails ({type(error).__name__}: {str(error)[:300]})")
            continue
        export_s[lib] = round(time.perf_counter() - t0, 2)
        deployed[lib] = session
        graphs[lib] = graph_text(proto)
        ops = sorted({node.op_type for node in proto.graph.node})
        run.say(
            f"{lib}: exported and loaded in {export_s[lib]:.1f} s; checked; ops {', '.join(ops)}"
        )
    same = len(graphs) == 2 and len(set(graphs.values())) == 1
    if len(graphs) == 2:
        run.say(
            "the two ONNX graphs are identical but for node names"
            if same
            else "the two ONNX graphs differ (beyond node names)"
        )
    stmts = {"session": "obj.run(None, {name: xn})"}
    rows = time_runtime(run, "onnx", deployed, inputs, stmts, rounds, min_run_time)
    claims(run, "onnx", rows)
    return {
        "onnxruntime": ort.__version__,
        "export_s": export_s,
        "graphs_identical": same if len(graphs) == 2 else None,
        "graphs": graphs,
        "cases": rows,
        "deployed": sorted(deployed),
    }


if __name__ == "__main__":
    sys.exit(main())
