"""`make gpu-check` (tools/gpu_check.py) in the parts that need no GPU: the one line and
exit 0 without one, the commands it runs, the skip of test modules whose dependency
is missing, its logs and tarball, and the plots of the GPU benchmarks' results."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

# Every check here runs as on a machine without a GPU, also on one with a GPU.
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _run(argv, env=NO_GPU, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    proc = _run([sys.executable, "tools/gpu_check.py"])
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("gpu-check: skipped: torch ")
    assert line.endswith(
        ("is a CPU-only build", "sees no GPU (torch.cuda.is_available() is False)")
    )
    assert proc.stderr == ""


def test_make_gpu_check_uses_the_python_given_and_installs_nothing():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # --no-print-directory: run under a parent make (make test), make prints
    # "Entering directory" lines otherwise.
    proc = _run(
        [
            "make",
            "--no-print-directory",
            "gpu-check",
            f"PYTHON={sys.executable}",
            "VENV=/nonexistent",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [proc.stdout.strip()]
    assert proc.stdout.startswith("gpu-check: skipped: torch ")
    assert not os.path.exists("/nonexistent")


def _dry_run(*args, env=NO_GPU) -> dict[str, list[list[str]]]:
    """step -> the commands it would run, split as a shell would."""
    proc = _run([sys.executable, "tools/gpu_check.py", "--dry-run", *args], env=env)
    assert proc.returncode == 0, proc.stderr
    *lines, last = proc.stdout.splitlines()
    assert last.startswith("gpu-check: dry run; here it would stop: ")
    steps: dict[str, list[list[str]]] = {}
    for line in lines:
        step, command = line.split(": ", 1)
        steps.setdefault(step, []).append(shlex.split(command.split("  # skipped:")[0]))
    return steps


def test_the_dry_run_lists_each_steps_commands():
    env = {k: v for k, v in NO_GPU.items() if k != "TORCH_CUDA_ARCH_LIST"}
    steps = _dry_run(env=env)
    assert list(steps) == ["build", "suite", "memcheck", "bench"]
    build, loads = steps["build"]
    assert build[:2] == ["TORCHCOND_CUDA=1", "TORCH_CUDA_ARCH_LIST=9.0"]  # no device: 9.0
    assert build[2:] == [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    assert "built_with_cuda()" in loads[-1]
    (suite,) = steps["suite"]
    assert {"TORCHCOND_BIG_TESTS=1", "TORCHCOND_SKIP_MISSING=1"} <= set(suite)
    assert suite[suite.index(sys.executable) :][:3] == [sys.executable, "-m", "pytest"]
    (memcheck,) = steps["memcheck"]
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in memcheck
    sanitizer = next(w for w in memcheck if w.endswith("compute-sanitizer"))
    tool = memcheck[memcheck.index(sanitizer) :]
    assert tool[1:5] == ["--tool", "memcheck", "--error-exitcode", "1"]
    assert tool[-3:] == ["test/test_select.py", "-k", "cuda and not emulated"]
    (bench,) = steps["bench"]
    results = str(ROOT / "benchmarks" / "results")
    assert bench[-5:] == ["-m", "benchmarks", "--gpu", "--out-dir", os.path.relpath(results, ROOT)]


def test_the_dry_run_takes_the_arch_steps_and_results_asked_for(tmp_path):
    env = {**NO_GPU, "TORCH_CUDA_ARCH_LIST": "8.0;9.0"}
    steps = _dry_run("--steps", "build,bench", "--results", str(tmp_path), "--quick-bench", env=env)
    assert list(steps) == ["build", "bench"]
    assert steps["build"][0][1] == "TORCH_CUDA_ARCH_LIST=8.0;9.0"
    assert steps["bench"][0][-3:] == ["--out-dir", str(tmp_path), "--quick"]
    proc = _run([sys.executable, "tools/gpu_check.py", "--steps", "build,tests"])
    assert proc.returncode == 2 and "unknown step(s) tests" in proc.stderr


def test_the_memcheck_selection_is_the_select_kernels_cuda_tests():
    proc = _run(
        [*gpu_check.PYTEST, "--collect-only", *gpu_check.MEMCHECK_TESTS],
        env={**NO_GPU, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    ids = [line for line in proc.stdout.splitlines() if line.startswith("test/test_select.py::")]
    assert len(ids) > 20
    assert all("cuda" in i and "emulated" not in i for i in ids)
    assert "test/test_select.py::test_cuda_graph_capture_and_replay" in ids


def test_the_gpu_benchmarks_without_a_gpu_say_so_and_exit_0(tmp_path):
    env = {**NO_GPU, "PYTHONPATH": str(ROOT)}
    proc = _run([sys.executable, "-m", "benchmarks", "--gpu", "--out-dir", str(tmp_path)], env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("python -m benchmarks --gpu: no GPU visible to torch")
    assert list(tmp_path.iterdir()) == []


# A plugin that makes expecttest unimportable, as on a machine where it is not installed.
HIDE = 'import sys\nsys.modules["expecttest"] = None\n'


@pytest.mark.parametrize("allowed", [True, False])
def test_a_module_needing_a_missing_package_is_skipped_only_when_allowed(tmp_path, allowed):
    (tmp_path / "hide_expecttest.py").write_text(HIDE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("TORCHCOND_SKIP_MISSING", None)
    if allowed:
        env["TORCHCOND_SKIP_MISSING"] = "1"
    other = "test/test_extension.py::test_library_is_registered_with_the_current_abi"
    argv = [*gpu_check.PYTEST, "-p", "hide_expecttest", "test/test_tracing.py", other]
    proc = _run(argv, env=env)
    if allowed:  # the rest of the run goes on
        assert proc.returncode == 0, proc.stdout[-2000:]
        assert "1 passed, 1 skipped" in proc.stdout
        (skip,) = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
        assert skip.startswith("SKIPPED [1] test/conftest.py:")
        assert skip.endswith(
            ": test_tracing.py needs expecttest (not installed); skipped as "
            "TORCHCOND_SKIP_MISSING=1"
        )
    else:  # CI installs requirements-dev.txt: a missing package there is an error
        assert proc.returncode != 0
        assert "ModuleNotFoundError" in proc.stdout and "expecttest" in proc.stdout


def test_the_missing_packages_are_named_from_requirements_dev(monkeypatch):
    spec = importlib.util.spec_from_file_location("the_conftest", ROOT / "test" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert {"expecttest", "hypothesis", "onnxruntime", "matplotlib"} <= conftest.dev_requirements()
    monkeypatch.setitem(sys.modules, "expecttest", None)
    assert conftest.unimportable({"expecttest", "json"}) == {"expecttest": "not installed"}
    assert "expecttest" in conftest.top_level_imports(ROOT / "test" / "test_tracing.py")


def test_each_step_is_logged_and_the_out_folder_gets_two_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "LOGS", str(tmp_path / "logs"))
    os.makedirs(gpu_check.LOGS)
    ok = [
        ({"GREETING": "hello"}, [sys.executable, "-c", "import os; print(os.environ['GREETING'])"])
    ]
    assert gpu_check.run("demo", ok, os.path.join(gpu_check.LOGS, "demo.log")) == 0
    log = (tmp_path / "logs" / "demo.log").read_text()
    assert log.startswith("gpu-check: demo: GREETING=hello ") and log.endswith("hello\n")
    assert "hello" in capsys.readouterr().out
    failing = [({}, [sys.executable, "-c", "raise SystemExit(3)"]), *ok]
    assert gpu_check.run("demo", failing, os.path.join(gpu_check.LOGS, "bad.log")) == 3
    assert "hello" not in (tmp_path / "logs" / "bad.log").read_text()  # stops at a failure

    results = tmp_path / "results"
    results.mkdir()
    (results / "old.json").write_text("{}")
    os.utime(results / "old.json", (0, 0))
    (results / "select_gpu-some-gpu.json").write_text("{}")
    gpu_check.archive(str(tmp_path / "out"), ["gpu-check: demo: ok"], 1000.0, str(results))
    assert sorted(os.listdir(tmp_path / "out")) == ["gpu-check.tar.gz", "gpu-check.txt"]
    with tarfile.open(tmp_path / "out" / "gpu-check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu-check/demo.log", "results/select_gpu-some-gpu.json"} <= names
    assert "results/old.json" not in names


def test_a_gpu_result_gets_a_plot_named_after_the_device(tmp_path):
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plots
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    header = {
        "benchmark": "select_gpu",
        "device": "Some GPU",
        "mode": "quick",
        "commit": "0000000",
        "torch": "2.11.0",
        "cuda": "13.0",
        "date_utc": "2026-01-01T00:00:00Z",
    }
    claims = [
        {"claim": "a ratio", "value": 1.2, "target": ">= 1.4", "meets": False},
        {"claim": "another", "value": 3.0, "target": "", "meets": None},
    ]
    data = {"header": header, "claims": claims, "notes": [], "results": {}}
    (tmp_path / "select_gpu-some-gpu.json").write_text(json.dumps(data))
    (tmp_path / "select.json").write_text(json.dumps(data))  # a CPU result: not this plot
    assert plots._target_value(">= 1.4") == 1.4 and plots._target_value("") is None
    (png,) = plots.make_gpu_plots(str(tmp_path))
    assert png == str(tmp_path / "select_gpu-some-gpu.png")
    assert (tmp_path / "select_gpu-some-gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
