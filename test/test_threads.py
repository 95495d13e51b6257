"""make_fx in several threads at once: torchcond raises, it never aborts the process.

torch's make_fx keeps its current tracer in a process-wide variable, so concurrent
traces are not supported by torch itself (it raises, for example "CURRENT_PATCHER is
None"). Branch tracing used to enter the other thread's fake mode from that variable,
and the C++ error it threw ended the process with SIGABRT.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import cond

STRESS = textwrap.dedent(
    """
    import sys, threading, torch
    from torch.fx.experimental.proxy_tensor import make_fx

    if sys.argv[1] == "torchcond":
        from torchcond import cond, switch

        def f(x, w):
            return cond(x.sum() > 0, lambda x: (x @ w).sin(), lambda x: (x - w.sum()).cos(), (x,))

        def g(x):
            return switch(x.shape[0] - 3, [lambda a: a + 1, lambda a: a * 2, lambda a: -a], (x,))

    else:  # the same work without torchcond: what torch's make_fx does on its own
        def f(x, w):
            return torch.where(x.sum() > 0, (x @ w).sin(), (x - w.sum()).cos())

        def g(x):
            return x[: x.shape[0] - 1] * 2

    def work(k):
        for i in range(20):
            mode = ["fake", "symbolic", "real"][(i + k) % 3]
            try:
                if i % 2:
                    make_fx(f, tracing_mode=mode)(torch.randn(3, 3), torch.randn(3, 3))
                else:
                    make_fx(g, tracing_mode=mode)(torch.randn(4))
            except Exception:
                pass  # torch's make_fx is not thread-safe: errors are expected

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done")
    """
)


def _stress(which: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", STRESS, which],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_concurrent_make_fx_does_not_crash_where_torch_does_not():
    ours = _stress("torchcond")
    if ours.returncode == 0:
        assert ours.stdout.strip() == "done"
        return
    # torch 2.11's own make_fx crashes (SIGSEGV) under concurrent traces, with no
    # torchcond involved; 2.13 and later raise. torchcond may not crash where torch alone
    # survives the same work. The crash is a race: torch alone gets a few tries (on a
    # loaded machine one run of it can miss the window).
    for _ in range(3):
        if _stress("torch").returncode != 0:
            return
    raise AssertionError(
        f"torchcond exits with {ours.returncode} where torch alone survives 3 runs: "
        f"{ours.stderr[-2000:]}"
    )


def test_foreign_make_fx_tracer_is_refused_with_a_clear_error():
    class Foreign:  # what another thread's make_fx leaves in the process-wide variable
        fx_tracer = object()

    def f(x):
        saved = proxy_tensor._CURRENT_MAKE_FX_TRACER
        proxy_tensor._CURRENT_MAKE_FX_TRACER = Foreign()
        try:
            return cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))
        finally:
            proxy_tensor._CURRENT_MAKE_FX_TRACER = saved

    with pytest.raises(RuntimeError, match="belongs to another thread"):
        make_fx(f, tracing_mode="fake")(torch.randn(3))
    # The same function traces once no other session is current.
    gm = make_fx(lambda x: cond(x.sum() > 0, torch.sin, torch.cos, (x,)))(torch.randn(3))
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), x.sin() if x.sum() > 0 else x.cos())
