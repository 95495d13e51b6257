"""`make gpu-check`: what a machine with a GPU should check, with the Python at hand.

Steps, in order (``--steps`` picks some):

* ``build``: torchcond._C with its CUDA kernels, in place (``TORCHCOND_CUDA=1``,
  ``TORCH_CUDA_ARCH_LIST`` from the environment, else the device's, else 9.0), then
  a check that the library loads and has them;
* ``suite``: the whole test suite on the GPU, the >2**31-element tests included
  (``TORCHCOND_BIG_TESTS=1``);
* ``memcheck``: compute-sanitizer's memcheck over the CUDA tests of
  test/test_select.py (the select kernels), torch's caching allocator off so that an
  access past a tensor's end lands outside any allocation, where memcheck sees it;
* ``bench``: ``python -m benchmarks --gpu``, JSON, text and plots into the results
  folder (benchmarks/results/), each file named after the device.

It installs nothing: no virtual environment, no pip, so it runs on a machine without
a package registry. A test module whose dependency is missing (expecttest, say) is
skipped with the package named (``TORCHCOND_SKIP_MISSING=1``, test/conftest.py);
without compute-sanitizer the memcheck step is skipped and says so. Without a GPU it
says so in one line and exits 0.

Each step's output goes to the terminal and to ``build/gpu-check/<step>.log``, and a
summary to ``build/gpu-check/summary.txt``. ``--out DIR`` also writes there
``gpu-check.txt`` (the summary) and ``gpu-check.tar.gz`` (the logs and the result
files this run wrote): two files, for a machine that returns only a few.

    python tools/gpu_check.py [--steps build,suite,memcheck,bench] [--results DIR]
                              [--out DIR] [--quick-bench] [--dry-run]

Exits 1 if a step failed (after running the others; a failed build stops it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("build", "suite", "memcheck", "bench")
DEFAULT_ARCH = "9.0"  # the H100/H200 this project's GPU machines have
LOGS = os.path.join(ROOT, "build", "gpu-check")
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra"]
# The select kernels run in these tests; the emulation tests run them on the CPU.
MEMCHECK_TESTS = ["test/test_select.py", "-k", "cuda and not emulated"]
BUILT_WITH_CUDA = (
    "import sys, torch, torchcond; "
    "sys.exit(0 if torch.ops.torchcond.built_with_cuda() else "
    '"gpu-check: torchcond._C was built without its CUDA kernels")'
)


def no_gpu_reason() -> str | None:
    """Why there is no GPU to check, or None when torch sees one."""
    try:
        import torch
    except ImportError as e:
        if os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi"):
            raise SystemExit(
                f"gpu-check: this machine has an NVIDIA GPU but {sys.executable} cannot "
                f"import torch ({e}); run it with the Python that has torch: "
                "make gpu-check PYTHON=/path/to/python"
            ) from None
        return f"no GPU here, and {sys.executable} has no torch"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)"
    return None


def cuda_arch() -> str:
    """TORCH_CUDA_ARCH_LIST: the environment's, else the visible device's, else 9.0."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"{major}.{minor}"
    except ImportError:
        pass
    return DEFAULT_ARCH


def compute_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else in the CUDA toolkit."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        path = os.path.join(home or "", "bin", "compute-sanitizer")
        if home and os.access(path, os.X_OK):
            return path
    return None


def plan(steps, results: str, quick_bench: bool) -> list[tuple[str, list, str | None]]:
    """(step, [(env, argv), ...], why skipped) for each step asked for."""
    base = {"PYTHONPATH": ROOT, "TORCHCOND_SKIP_MISSING": "1"}
    out = []
    for step in steps:
        skipped = None
        if step == "build":
            env = {"TORCHCOND_CUDA": "1", "TORCH_CUDA_ARCH_LIST": cuda_arch()}
            cmds = [
                (env, [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]),
                (base, [sys.executable, "-c", BUILT_WITH_CUDA]),
            ]
        elif step == "suite":
            cmds = [({**base, "TORCHCOND_BIG_TESTS": "1"}, PYTEST)]
        elif step == "memcheck":
            sanitizer = compute_sanitizer()
            if sanitizer is None:
                skipped = "compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"
            tool = [sanitizer or "compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1"]
            env = {**base, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
            cmds = [(env, [*tool, *PYTEST, *MEMCHECK_TESTS])]
        else:
            bench = [sys.executable, "-m", "benchmarks", "--gpu", "--out-dir", results]
            cmds = [(base, bench + (["--quick"] if quick_bench else []))]
        out.append((step, cmds, skipped))
    return out


def shown(env: dict, argv: list) -> str:
    """The command as one would type it in a shell, from the repository root."""
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    rel = [os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a for a in argv]
    return " ".join(words + [shlex.quote(a) for a in rel])


def run(step: str, cmds, log_path: str) -> int:
    """Run a step's commands one after the other, echoing to the terminal and the log."""
    with open(log_path, "w") as log:
        for env, argv in cmds:
            line = f"gpu-check: {step}: {shown(env, argv)}"
            print(line, flush=True)
            log.write(line + "\n")
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for text in proc.stdout:
                sys.stdout.write(text)
                log.write(text)
            if proc.wait() != 0:
                return proc.returncode
    return 0


def missing_packages() -> list[str]:
    """The test dependencies (requirements-dev.txt) that cannot be imported here."""
    sys.path.insert(0, os.path.join(ROOT, "test"))
    try:
        import conftest  # test/conftest.py: the rule the suite skips by
    finally:
        sys.path.pop(0)
    return [f"{n} ({why})" for n, why in conftest.unimportable(conftest.dev_requirements()).items()]


def archive(out: str, summary: list[str], since: float, results: str) -> None:
    """DIR/gpu-check.txt and DIR/gpu-check.tar.gz: the logs and this run's results."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu-check.txt"), "w") as fh:
        fh.write("\n".join(summary) + "\n")
    with tarfile.open(os.path.join(out, "gpu-check.tar.gz"), "w:gz") as tar:
        tar.add(LOGS, arcname="gpu-check")
        if os.path.isdir(results):
            for name in sorted(os.listdir(results)):
                path = os.path.join(results, name)
                if os.path.isfile(path) and os.path.getmtime(path) >= since:
                    tar.add(path, arcname=f"results/{name}")
    print(f"gpu-check: wrote {out}/gpu-check.txt and {out}/gpu-check.tar.gz")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python tools/gpu_check.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated, in order")
    ap.add_argument(
        "--results",
        default=os.path.join(ROOT, "benchmarks", "results"),
        help="where the benchmarks write (default: benchmarks/results)",
    )
    ap.add_argument("--out", help="also write the summary and a tarball of logs and results here")
    ap.add_argument("--quick-bench", action="store_true", help="the benchmarks' --quick runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    results = os.path.abspath(args.results)

    why = no_gpu_reason()
    if args.dry_run:
        for step, cmds, skipped in plan(steps, results, args.quick_bench):
            for env, cmd in cmds:
                note = f"  # skipped: {skipped}" if skipped else ""
                print(f"{step}: {shown(env, cmd)}{note}")
        print(f"gpu-check: dry run{f'; here it would stop: {why}' if why else ''}")
        return 0
    if why:
        print(f"gpu-check: skipped: {why}")
        return 0
    return check(steps, results, args)


def check(steps, results: str, args) -> int:
    os.makedirs(LOGS, exist_ok=True)
    since = time.time()
    summary = []
    missing = missing_packages()
    if missing:
        summary.append(
            "gpu-check: not installed, so the test modules importing them are skipped: "
            + ", ".join(missing)
        )
        print(summary[-1], flush=True)
    failed = []
    for step, cmds, skipped in plan(steps, results, args.quick_bench):
        if skipped:
            summary.append(f"gpu-check: {step}: skipped: {skipped}")
            print(summary[-1], flush=True)
            continue
        t0 = time.time()
        rc = run(step, cmds, os.path.join(LOGS, f"{step}.log"))
        verdict = "ok" if rc == 0 else f"FAILED (exit code {rc})"
        summary.append(f"gpu-check: {step}: {verdict} in {time.time() - t0:.0f} s")
        print(summary[-1], flush=True)
        if rc != 0:
            failed.append(step)
            if step == "build":
                break
    summary.append(f"gpu-check: {'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'}")
    print("\n".join(summary[-1:]))
    with open(os.path.join(LOGS, "summary.txt"), "w") as fh:
        fh.write("\n".join(summary) + "\n")
    if args.out:
        archive(args.out, summary, since, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
