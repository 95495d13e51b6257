"""First-call cost of a conditional in a fresh Python process.

Each measurement is a new ``sys.executable -c <child>`` process. The child imports
torch and builds its inputs (not timed: every mode pays that alike), then times one of:

* ``python-if``  (baseline): the first ``f(x) if p else g(x)``;
* ``torchcond``: ``import torchcond`` + the first ``torchcond.cond(p, f, g, (x,))``,
  with the interpreter's bytecode settings as they are (in this project's CI and
  dev containers ``PYTHONDONTWRITEBYTECODE=1`` and the package is installed
  editable, so there is no ``.pyc`` and torchcond is compiled from source on import);
* ``torchcond-pyc``: the same, with a bytecode cache (``sys.pycache_prefix`` set to
  a private temp folder after torch is imported, filled by a discarded warm-up
  process), as after a regular ``pip install``;
* ``torch.cond``: the first ``torch.cond(p, f, g, (x,))`` (imports dynamo and
  compiles on that call).

``x`` is a 4x3 float32 CPU tensor and ``p = x.sum() > 0``, computed before the timer
so the reduction kernel is warm in every mode; the branch kernel (``sin``) runs for
the first time inside the timed call in every mode, so all of them pay it alike. The
child also reports the second call, for context.

Modes are interleaved (one process of each per round) so machine drift hits them
alike; medians are reported, with ratios against the ``python-if`` baseline measured
in the same run. The ``torchcond`` target (first call, import included, under 20 ms)
is printed next to the result; nothing here fails on a slow number.

    python benchmarks/bench_first_call.py [--out results.json]  # 5 per mode (~1 min)
    python benchmarks/bench_first_call.py --quick    # 1 process per mode (~10 s)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common  # benchmarks/common.py

TORCHCOND_TARGET_MS = 20.0

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
mode = sys.argv[1]

def f(x):
    return x.sin()

def g(x):
    return x.cos()

torch.manual_seed(0)
x = torch.randn(4, 3)
p = x.sum() > 0
res = {"mode": mode, "torch_import_s": t_torch}

if mode == "python-if":
    t0 = time.perf_counter()
    out = f(x) if p else g(x)
    t1 = time.perf_counter()
    out2 = f(x) if p else g(x)
    t2 = time.perf_counter()
    res.update(first_s=t1 - t0, second_s=t2 - t1)
elif mode in ("torchcond", "torchcond-pyc"):
    if mode == "torchcond-pyc":
        # bytecode cache for everything imported from here on (torchcond, the torch
        # submodules it pulls in), in a private folder; torch itself was imported above
        # from its installed .pyc files as usual
        sys.pycache_prefix = sys.argv[2]
        sys.dont_write_bytecode = False
    import importlib.util
    # is there a bytecode cache for torchcond/__init__.py to read? (looked up untimed)
    origin = importlib.util.find_spec("torchcond").origin
    res["torchcond_pyc_cached"] = os.path.exists(importlib.util.cache_from_source(origin))
    t0 = time.perf_counter()
    import torchcond
    ti = time.perf_counter()
    out = torchcond.cond(p, f, g, (x,))
    t1 = time.perf_counter()
    out2 = torchcond.cond(p, f, g, (x,))
    t2 = time.perf_counter()
    res.update(first_s=t1 - t0, import_s=ti - t0, call_s=t1 - ti, second_s=t2 - t1)
    res["dynamo_loaded"] = "torch._dynamo" in sys.modules
elif mode == "torch.cond":
    t0 = time.perf_counter()
    out = torch.cond(p, f, g, (x,))
    t1 = time.perf_counter()
    out2 = torch.cond(p, f, g, (x,))
    t2 = time.perf_counter()
    res.update(first_s=t1 - t0, second_s=t2 - t1)
else:
    raise SystemExit("unknown mode " + mode)

assert torch.equal(out, f(x) if p else g(x)) and torch.equal(out2, out)
print("RESULT " + json.dumps(res))
"""

MODES = ("python-if", "torchcond", "torchcond-pyc", "torch.cond")


def run_child(mode: str, pycache: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, pycache],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode!r} failed (rc {proc.returncode}):\n{proc.stderr}")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"child {mode!r} printed no result:\n{proc.stdout}\n{proc.stderr}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="1 process per mode, fewer warm-ups (CI smoke run)"
    )
    ap.add_argument(
        "--procs", type=int, default=None, help="processes per mode (default 5, quick 1)"
    )
    ap.add_argument("--out", help="write the results to this JSON file")
    args = ap.parse_args(argv)
    procs = args.procs or (1 if args.quick else 5)
    # full: one discarded process per mode first (file cache). quick: only the one
    # that fills the private bytecode cache of "torchcond-pyc" (it would else measure
    # a compile from source, like "torchcond" without a cache).
    warm_modes = ("torchcond-pyc",) if args.quick else MODES

    run = common.Run(
        "first_call",
        "bench_first_call: first conditional call in a fresh process (medians, vs python-if)",
        args.quick,
    )
    say = run.say
    say(
        f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}; "
        f"{procs} process(es) per mode, interleaved; discarded warm-up processes: "
        f"{', '.join(warm_modes)}"
    )

    t_start = time.perf_counter()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="torchcond_bench_pyc_") as pycache:
        for mode in warm_modes:
            run_child(mode, pycache)
        for r in range(procs):
            order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in order:
                results[mode].append(run_child(mode, pycache))
    elapsed = time.perf_counter() - t_start

    def med(mode, key):
        vals = [res[key] for res in results[mode] if key in res]
        return statistics.median(vals) if vals else float("nan")

    def spread(mode, key):
        vals = [res[key] * 1e3 for res in results[mode]]
        return f"{min(vals):.3f}..{max(vals):.3f}"

    base = med("python-if", "first_s")
    say()
    head = (
        f"{'mode':<13}  {'first call ms':>13}  {'min..max ms':>19}  {'vs python-if':>12}  "
        f"{'2nd call ms':>11}  target"
    )
    say(head)
    say("-" * len(head))
    modes = []
    for mode in MODES:
        first = med(mode, "first_s")
        target = f"< {TORCHCOND_TARGET_MS:.0f} ms" if mode.startswith("torchcond") else "-"
        say(
            f"{mode:<13}  {first * 1e3:13.3f}  {spread(mode, 'first_s'):>19}  "
            f"{first / base:11.0f}x  {med(mode, 'second_s') * 1e3:11.3f}  {target}"
        )
        modes.append(
            {
                "mode": mode,
                "median_first_s": first,
                "median_second_s": med(mode, "second_s"),
                "ratio_vs_python_if": first / base,
                "samples": results[mode],
            }
        )
    run.results["modes"] = modes
    say()
    tcc = med("torch.cond", "first_s")
    for mode in ("torchcond", "torchcond-pyc"):
        rs = results[mode]
        say(
            f"{mode}: import torchcond {med(mode, 'import_s') * 1e3:.3f} ms + first cond call "
            f"{med(mode, 'call_s') * 1e3:.3f} ms (medians); torchcond .pyc present before "
            f"import: {sorted({r['torchcond_pyc_cached'] for r in rs})}; dynamo imported: "
            f"{any(r['dynamo_loaded'] for r in rs)}"
        )
    for mode in ("torchcond", "torchcond-pyc"):
        tc = med(mode, "first_s")
        run.claim(
            f"{mode} import + first call, ms",
            tc * 1e3,
            f"< {TORCHCOND_TARGET_MS:.0f} ms",
            tc * 1e3 < TORCHCOND_TARGET_MS,
            torch_cond_ratio=tcc / tc,
        )
        say(f"ratio: torch.cond / {mode} first call: {tcc / tc:.0f}x")
    run.note(
        "import torch in the children (not timed): median "
        f"{med('python-if', 'torch_import_s') * 1e3:.0f} ms"
    )
    n = sum(len(v) for v in results.values()) + len(warm_modes)
    run.note(f"{n} processes in {elapsed:.1f} s")
    run.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
