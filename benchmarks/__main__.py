"""Run every CPU benchmark, then write their JSON results and PNG plots.

    python -m benchmarks                   # full run into benchmarks/results/ (~10 min)
    python -m benchmarks --quick           # smoke run into a temporary folder
    python -m benchmarks --quick --jobs 2  # the same, two benchmarks at a time
    python -m benchmarks --only eager,select --out-dir /tmp/bench
    python -m benchmarks --plots-only      # redraw the PNGs from the JSON files
    python -m benchmarks --threads 1       # one torch thread (a machine shared with others)
    python -m benchmarks --gpu             # the GPU benchmarks instead (a machine with a GPU)

Each benchmark runs as its own process (``benchmarks/bench_<name>.py --out
<dir>/<name>.json``), one after the other, so none inherits another's dynamo caches,
threads or memory. A smoke run may run N at a time (``--quick --jobs N``), each one's
output shown when it ends. What each one prints is kept in ``<dir>/<name>.txt``.
``<dir>/run.json`` records the run: the header (commit, torch, CPU model, threads,
load average before and after), each benchmark's time, exit code and files. Lines
longer than 100 characters in a benchmark's output are reported (there should be none).

``--gpu`` runs ``bench_select_gpu.py`` and ``bench_cond_gpu.py`` instead, and every
file it writes names the device: ``select_gpu-nvidia-h100-80gb-hbm3.json``, its
``.txt`` and ``.png``, and ``run-nvidia-h100-80gb-hbm3.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the scripts' own folder, as when they run on their own

import common  # noqa: E402  (benchmarks/common.py)

BENCHMARKS = (
    "eager",
    "select",
    "autograd",
    "traced_backward",
    "first_call",
    "compile",
    "buffer_write",
    "random",
    "deploy",
)
GPU_BENCHMARKS = ("select_gpu", "cond_gpu")


def run_one(
    name: str, out_dir: str, quick: bool, threads: int | None, suffix: str = "", show: bool = True
) -> dict:
    """Run one benchmark's script. Its output is shown as it comes with ``show``, or
    else printed whole when it ends (runs side by side)."""
    json_path = os.path.join(out_dir, f"{name}{suffix}.json")
    txt_path = os.path.join(out_dir, f"{name}{suffix}.txt")
    cmd = [sys.executable, os.path.join(HERE, f"bench_{name}.py"), "--out", json_path]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (common.REPO, env.get("PYTHONPATH")) if p)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    shown = ["python", *(os.path.relpath(c) if os.path.isabs(c) else c for c in cmd[1:])]
    out = sys.stdout if show else io.StringIO()
    for line in common.wrap(f"== {name}: {' '.join(shown)}"):
        print(line, file=out)
    out.flush()
    t0 = time.perf_counter()
    long_lines = 0
    with open(txt_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=common.REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            log.write(line)
            long_lines += len(line.rstrip("\n")) > common.MAX_LINE
        rc = proc.wait()
    elapsed = time.perf_counter() - t0
    print(
        f"== {name}: exit code {rc}, {elapsed:.1f} s, {long_lines} line(s) over 100 chars\n",
        file=out,
    )
    if not show:
        sys.stdout.write(out.getvalue())
        sys.stdout.flush()
    return {
        "benchmark": name,
        "rc": rc,
        "elapsed_s": round(elapsed, 2),
        "long_lines": long_lines,
        "files": [os.path.basename(p) for p in (json_path, txt_path) if os.path.exists(p)],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="smoke run (each script's --quick)")
    ap.add_argument(
        "--only", help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all)"
    )
    ap.add_argument(
        "--out-dir",
        help="where results go (default: benchmarks/results; with --quick a temp folder)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="torch threads in every benchmark (OMP_NUM_THREADS; default: torch's, one per core)",
    )
    ap.add_argument(
        "--gpu",
        action="store_true",
        help=f"the GPU benchmarks ({','.join(GPU_BENCHMARKS)}); file names name the device",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="benchmarks run side by side, only with --quick (their timings then share the cores)",
    )
    ap.add_argument("--no-plots", action="store_true", help="JSON only, no PNGs")
    ap.add_argument("--plots-only", action="store_true", help="redraw PNGs from existing JSON")
    args = ap.parse_args(argv)
    if args.jobs < 1 or (args.jobs > 1 and not args.quick):
        ap.error(
            "--jobs N runs N benchmarks side by side (N >= 1), more than one only with --quick"
        )

    out_dir = args.out_dir or (
        os.path.join(tempfile.gettempdir(), "torchcond-bench-quick")
        if args.quick
        else common.RESULTS
    )
    os.makedirs(out_dir, exist_ok=True)
    if args.plots_only:
        for path in make_plots(out_dir) + make_plots(out_dir, gpu=True):
            print(f"wrote {os.path.relpath(path)}")
        return 0

    known = GPU_BENCHMARKS if args.gpu else BENCHMARKS
    names = known if not args.only else tuple(args.only.split(","))
    unknown = sorted(set(names) - set(known))
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(known)}")

    import torch

    suffix = ""
    if args.gpu:
        if not torch.cuda.is_available():
            print(f"python -m benchmarks --gpu: no GPU visible to torch {torch.__version__}")
            return 0
        suffix = f"-{common.device_slug()}"
    if args.threads:
        torch.set_num_threads(args.threads)
    header = common.header("all", args.quick)
    if args.gpu:
        header["device"] = torch.cuda.get_device_name()
    print(f"python -m benchmarks: {', '.join(names)} -> {os.path.relpath(out_dir)}")
    print(f"commit {header['commit']}, torch {header['torch']}, cpu {header['cpu']!r}")
    if args.gpu:
        print(f"device {header['device']}, CUDA {torch.version.cuda}")
    print(
        f"{header['cpu_count']} cpus, torch threads {torch.get_num_threads()}, "
        f"load average before: {' '.join(map(str, header['load_before']))}"
    )
    print()
    t0 = time.perf_counter()

    def run(name: str) -> dict:
        return run_one(name, out_dir, args.quick, args.threads, suffix, show=args.jobs == 1)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(run, names))
    pngs = [] if args.no_plots else make_plots(out_dir, gpu=args.gpu)
    header["load_after"] = common.loadavg()
    header["elapsed_s"] = round(time.perf_counter() - t0, 2)
    summary = {
        "header": header,
        "benchmarks": runs,
        "plots": [os.path.basename(p) for p in pngs],
    }
    run_json = os.path.join(out_dir, f"run{suffix}.json")
    common.write_json(run_json, summary)

    print("== summary")
    for r in runs:
        print(
            f"{r['benchmark']:<11} exit {r['rc']}  {r['elapsed_s']:7.1f} s  "
            f"files: {', '.join(r['files'])}"
        )
    for path in pngs:
        print(f"plot        {os.path.relpath(path)} ({os.path.getsize(path) // 1024} KiB)")
    print(
        f"total {header['elapsed_s']:.0f} s; load average after: "
        f"{' '.join(map(str, header['load_after']))}; wrote {os.path.relpath(run_json)}"
    )
    failed = [r["benchmark"] for r in runs if r["rc"] != 0]
    long_ = [r["benchmark"] for r in runs if r["long_lines"]]
    if long_:
        print(f"warning: lines over 100 characters in the output of: {', '.join(long_)}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


def make_plots(out_dir: str, gpu: bool = False) -> list[str]:
    """The CPU benchmarks' plots, or with ``gpu`` one beside each GPU result."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install -r requirements-dev.txt)")
        return []
    import plots  # benchmarks/plots.py

    return plots.make_gpu_plots(out_dir) if gpu else plots.make_plots(out_dir)


if __name__ == "__main__":
    sys.exit(main())
