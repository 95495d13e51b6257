"""Sync-free conditionals on a CUDA device (run it on a machine with a GPU).

1. A loop of 20 conds on 64 floats whose predicate lives on the GPU:
   ``torchcond.cond(..., strategy="select")`` (no host read) against ``torch.cond``
   eager and against a Python ``if`` (which syncs on every iteration to read the
   predicate). Targets: select at least 20x faster than ``torch.cond``, and faster
   than the syncing ``if``.
2. A CUDA graph captured around a cond (``strategy="auto"`` captures CUDA conditional
   nodes on torch >= 2.13, a select otherwise; the report says which): replayed with
   the predicate flipped on the device, the graph must take both branches correctly.
   Reported as a correctness line plus replay time.

Every time is measured in this process with CUDA events after warm-up; ratios are
against baselines from the same run. Not a test: it never fails on a slow result.

    python benchmarks/bench_cond_gpu.py [--quick] [--out results.json]
"""

from __future__ import annotations

import argparse
import platform
import sys

import common  # benchmarks/common.py
import torch

import torchcond

SELECT_VS_TORCH_COND_TARGET = 20.0
SELECT_VS_IF_TARGET = 1.0  # faster than an `if` that reads the predicate on the host
LOOP = 20  # conds per loop


def _step_select(x, p):
    return torchcond.cond(
        p, lambda a: a * 1.01 + 0.1, lambda a: a * 0.99 - 0.1, (x,), strategy="select"
    )


def _step_torch_cond(x, p):
    return torch.cond(p, lambda a: a * 1.01 + 0.1, lambda a: a * 0.99 - 0.1, (x,))


def _step_if(x, p):
    return x * 1.01 + 0.1 if p else x * 0.99 - 0.1


def _loop(step, x, n):
    for _ in range(n):
        x = step(x, x.sum() > 0)  # the predicate is computed on the device every step
    return x


def bench_loop(run, lines, quick: bool):
    n = LOOP
    x = torch.randn(64, device="cuda")
    results = {}
    for name, step in (
        ("python if (host read)", _step_if),
        ("torch.cond", _step_torch_cond),
        ("torchcond select", _step_select),
    ):
        for _ in range(2):
            _loop(step, x, n)  # warm-up (torch.cond compiles on first use)
        torch.cuda.synchronize()
        results[name] = common.cuda_ms(lambda step=step: _loop(step, x, n), 1, 3 if quick else 10)
    same = torch.allclose(_loop(_step_select, x, n), _loop(_step_if, x, n))
    lines.append(f"loop of {n} conds, 64 float32, predicate on the device (median ms per loop)")
    for name, ms in results.items():
        lines.append(f"  {name:<24} {ms:9.3f} ms")
    ratio = results["torch.cond"] / results["torchcond select"]
    verdict = "meets" if ratio >= SELECT_VS_TORCH_COND_TARGET else "MISSES"
    run.claim(
        f"loop of {n} conds: select vs torch.cond",
        ratio,
        f">= {SELECT_VS_TORCH_COND_TARGET}",
        ratio >= SELECT_VS_TORCH_COND_TARGET,
        ms=results,
    )
    vs_if = results["python if (host read)"] / results["torchcond select"]
    run.claim(
        f"loop of {n} conds: select vs python if (speedup)",
        vs_if,
        f">= {SELECT_VS_IF_TARGET}",
        vs_if >= SELECT_VS_IF_TARGET,
    )
    lines.append(
        f"  select vs torch.cond: {ratio:.1f}x faster (target >= {SELECT_VS_TORCH_COND_TARGET:.0f}x, {verdict}); "
        f"vs python if: {results['python if (host read)'] / results['torchcond select']:.2f}x; results equal: {same}"
    )


def bench_cuda_graph(run, lines):
    x = torch.arange(4.0, device="cuda")
    pred = torch.zeros((), dtype=torch.bool, device="cuda")

    def step():
        return torchcond.cond(pred, lambda a: a + 1, lambda a: a - 1, (x,))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for value in (True, False):  # both branches warmed up before capture
            pred.fill_(value)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    correct = True
    for value in (True, False, True, False):
        pred.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        correct &= torch.equal(out, x + 1 if value else x - 1)
    ms = common.cuda_ms(graph.replay, 1, 20)
    how = "conditional nodes" if torchcond._compat.cuda_graph_if_body() else "select"
    run.results["cuda_graph"] = {"how": how, "correct": correct, "replay_us": ms * 1000}
    lines.append(
        f"cuda graph with a cond ({how}): both branches correct on replay: {correct}; "
        f"replay {ms * 1000:.1f} us"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    parser.add_argument("--out", help="write the header and the report to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cond_gpu: no CUDA device here; run it on a machine with a GPU")
        return 0
    lines = [
        "bench_cond_gpu: sync-free conditionals on the device (ratios vs baselines in this process)",
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"cuda {torch.version.cuda}, python {platform.python_version()}, "
        f"select kernel built: {torch.ops.torchcond.built_with_cuda()}",
    ]
    run = common.Run("cond_gpu", lines[0], args.quick)
    run.header["device"] = torch.cuda.get_device_name()
    run.header["cuda"] = torch.version.cuda
    bench_loop(run, lines, args.quick)
    bench_cuda_graph(run, lines)
    for line in lines[1:]:
        run.say(line)
    run.results["report"] = lines
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
