"""The fused select operators: torchcond.select / select_n and their C++/CUDA kernels.

Every result is compared with a torch.where reference. CUDA tests run only where
torch.cuda.is_available(); on CPU-only machines the CUDA kernel and its launcher are
still exercised through ``torch.ops.torchcond_testing.select_cuda_emulated``, a test
extension (``cuda_emulation.py``) that runs the same kernel code on the CPU one
(block, thread) at a time.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from cuda_emulation import emulation_ops

import torchcond
from torchcond import CondArgumentError, UnsupportedCondError, select, select_n
from torchcond._src.api import _ONE_CALL as ONE_CALL

OPS = torch.ops.torchcond
CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)"
)
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
INDEX_DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
]


# --- helpers -----------------------------------------------------------------------------


def rand(shape, dtype=torch.float32, device="cpu", seed=None):
    g = torch.Generator().manual_seed(
        seed if seed is not None else hash((tuple(shape), str(dtype))) % 2**31
    )
    if dtype is torch.bool:
        x = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_complex:
        x = torch.randn(shape, generator=g, dtype=dtype)
    elif dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
    else:
        x = torch.randint(0, 100, shape, generator=g).to(dtype)
    return x.to(device)


def broadcast_sel(sel, value):
    return sel.reshape(tuple(sel.shape) + (1,) * (value.dim() - sel.dim()))


def ref_select(pred, ts, fs):
    return [torch.where(broadcast_sel(pred, t).to(t.device), t, f) for t, f in zip(ts, fs)]


def ref_select_n(index, cases):
    nb = len(cases)
    clamped = torch.tensor(
        [min(max(int(v), 0), nb - 1) for v in index.flatten().tolist()], dtype=torch.int64
    ).reshape(index.shape)
    outs = []
    for i in range(len(cases[0])):
        out = cases[-1][i]
        for k in range(nb - 2, -1, -1):
            out = torch.where(broadcast_sel(clamped == k, out).to(out.device), cases[k][i], out)
        outs.append(out)
    return outs


def ref_select_n_on(device, index, cases):
    """ref_select_n computed on the CPU, moved to ``device``."""
    refs = ref_select_n(index.cpu(), [[v.cpu() for v in c] for c in cases])
    return [r.to(device) for r in refs]


def assert_same(outs, refs):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype and o.device == r.device
        assert o.is_contiguous()
        # equal bit for bit (NaN and -0.0 included): compare the raw bytes
        as_bytes = lambda x: x.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        assert torch.equal(as_bytes(o), as_bytes(r))


# The CUDA kernel's plans (select_kernel.cuh's Mode), as the emulation reports them.
LINE, ELEMENT, ROWS, VECTOR = 0, 1, 2, 3


class Plan:
    """One output descriptor of an emulated launch (test/csrc/select_cuda_emulation.cpp)."""

    def __init__(self, row):
        self.mode, self.access, self.tile_size, self.sel_vector, self.grid = (int(v) for v in row)

    def __repr__(self):
        return f"Plan(mode={self.mode}, access={self.access}, tile_size={self.tile_size}, sel_vector={self.sel_vector}, grid={self.grid})"


def emulate(selector, cases, is_bool, sm_count=2):
    """The CUDA path run on the CPU: (outputs, launches, plans of every descriptor)."""
    flat = [v for c in cases for v in c]
    *outs, launches, plans = emulation_ops().select_cuda_emulated(
        selector, flat, len(cases), is_bool, sm_count
    )
    return outs, int(launches), [Plan(row) for row in plans.tolist()]


def emulated_select(pred, ts, fs):
    outs, launches, _ = emulate(pred, [ts, fs], True)
    return outs, launches


def emulated_select_n(index, cases):
    outs, launches, _ = emulate(index, cases, False)
    return outs, launches


# --- correctness -------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("pred_kind", ["0d-true", "0d-false", "prefix", "full"])
def test_select_matches_where(device, dtype, pred_kind):
    shape = (6, 5, 7)
    t, f = rand(shape, dtype, device, 1), rand(shape, dtype, device, 2)
    pred = {
        "0d-true": torch.tensor(True),
        "0d-false": torch.tensor(False),
        "prefix": torch.tensor([True, False, False, True, True, False]),
        "full": rand(shape, torch.bool, seed=3),
    }[pred_kind].to(device)
    assert_same(select(pred, [t], [f]), ref_select(pred, [t], [f]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_select_n_clamps_the_index(device, index_dtype):
    signed = index_dtype.is_signed
    values = [-7, -1, 0, 1, 2, 3, 9, 200] if signed else [0, 1, 2, 3, 9, 200, 0, 1]
    if index_dtype is torch.int8 or index_dtype is torch.uint8:
        values = [v for v in values if -128 <= v < 128]
    index = torch.tensor(values, dtype=index_dtype, device=device)
    cases = [
        [
            rand((len(values), 3), torch.float32, device, k),
            rand((len(values),), torch.int64, device, 10 + k),
        ]
        for k in range(3)
    ]
    assert_same(select_n(index, cases), ref_select_n_on(device, index, cases))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [-3, 0, 1, 2, 5])
def test_select_n_scalar_index(device, value):
    index = torch.tensor(value, device=device)
    cases = [[rand((4, 5), torch.float64, device, k)] for k in range(3)]
    (out,) = select_n(index, cases)
    assert torch.equal(out, cases[min(max(value, 0), 2)][0])


@pytest.mark.parametrize("device", DEVICES)
def test_select_n_one_branch_copies(device):
    x = rand((3, 4), torch.float32, device).T
    (out,) = select_n(torch.tensor(5, device=device), [[x]])
    assert torch.equal(out, x) and out.is_contiguous() and out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.complex128, torch.int8, torch.bfloat16], ids=str
)
def test_non_contiguous_inputs(device, dtype):
    base_t = rand((8, 12, 10), dtype, device, 1)
    base_f = rand((10, 12, 8), dtype, device, 2)
    t = base_t[:, ::2, 1:9]  # sliced: (8, 6, 8)
    f = base_f.permute(2, 1, 0)[:, 3:9, :8]  # transposed + sliced: (8, 6, 8)
    e = rand((1, 6, 1), dtype, device, 3).expand(8, 6, 8)  # stride 0
    pred_base = rand((16,), torch.bool, device, 4)
    pred = pred_base[::2]  # non-contiguous prefix selector
    for tv, fv in [(t, f), (f, t), (t, e), (e, f), (e, e)]:
        assert_same(select(pred, [tv], [fv]), ref_select(pred, [tv], [fv]))
    full_pred = rand((8, 12), torch.bool, device, 5)[:, ::2]  # (8, 6), strided
    assert_same(select(full_pred, [t, e], [f, t]), ref_select(full_pred, [t, e], [f, t]))
    expanded_pred = torch.tensor([True, False], device=device)[:1].expand(8)  # stride 0 selector
    assert_same(select(expanded_pred, [t], [f]), ref_select(expanded_pred, [t], [f]))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_tensors(device):
    t, f = rand((3, 0, 2), torch.float32, device), rand((3, 0, 2), torch.float32, device)
    pred = torch.tensor([True, False, True], device=device)
    (out,) = select(pred, [t], [f])
    assert out.shape == (3, 0, 2) and out.device.type == device
    empty_pred = torch.zeros((0,), dtype=torch.bool, device=device)
    outs = select(
        empty_pred,
        [torch.ones(0, 4, device=device), torch.ones(0, device=device)],
        [torch.zeros(0, 4, device=device), torch.zeros(0, device=device)],
    )
    assert [o.shape for o in outs] == [(0, 4), (0,)]
    # an empty output next to a non-empty one
    a, b = rand((3, 4), torch.float32, device, 1), rand((3, 4), torch.float32, device, 2)
    outs = select(pred, [t, a], [f, b])
    assert outs[0].shape == (3, 0, 2)
    assert torch.equal(outs[1], ref_select(pred, [a], [b])[0])
    assert select(pred, [], []) == []
    assert select_n(torch.tensor(1, device=device), [[], []]) == []


@pytest.mark.parametrize("device", DEVICES)
def test_rank_0_values(device):
    t, f = torch.tensor(1.5, device=device), torch.tensor(-2.5, device=device)
    assert select(torch.tensor(True, device=device), [t], [f])[0].item() == 1.5
    assert select(torch.tensor(False, device=device), [t], [f])[0].item() == -2.5
    (out,) = select_n(torch.tensor(7, device=device), [[t], [f]])
    assert out.item() == -2.5 and out.shape == ()


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_shapes_and_dtypes_across_outputs(device):
    pred = torch.tensor([True, False, True, False], device=device)
    shapes = [(4,), (4, 3), (4, 1, 5), (4, 2, 3, 2), (4, 1000)]
    dtypes = [torch.float32, torch.int64, torch.complex64, torch.bool, torch.float16]
    ts = [rand(s, d, device, i) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    fs = [rand(s, d, device, 50 + i) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    assert_same(select(pred, ts, fs), ref_select(pred, ts, fs))


@pytest.mark.parametrize("device", DEVICES)
def test_many_outputs_in_one_call(device):
    n = 40
    pred = rand((5,), torch.bool, device, 0)
    ts = [rand((5, 3 + i), torch.float32, device, i) for i in range(n)]
    fs = [rand((5, 3 + i), torch.float32, device, 100 + i) for i in range(n)]
    assert_same(select(pred, ts, fs), ref_select(pred, ts, fs))
    index = torch.tensor([0, 2, 1, 2, 0], device=device)
    cases = [ts[:20], fs[:20], [t + 1 for t in ts[:20]]]
    assert_same(select_n(index, cases), ref_select_n_on(device, index, cases))


def test_large_rows_and_threads_cover_every_element():
    # big enough for several threads and the streaming-store path (>= 16 MiB written)
    pred = rand((64,), torch.bool, seed=7)
    ts = [rand((64, 25000), torch.float32, seed=i) for i in range(3)]
    fs = [rand((64, 25000), torch.float32, seed=10 + i) for i in range(3)]
    assert_same(select(pred, ts, fs), ref_select(pred, ts, fs))
    # an odd itemsize boundary inside the range split between threads
    t = rand((3, 1_000_003), torch.complex128, seed=1)
    f = rand((3, 1_000_003), torch.complex128, seed=2)
    assert_same(
        select(torch.tensor([False, True, False]), [t], [f]),
        ref_select(torch.tensor([False, True, False]), [t], [f]),
    )


def test_misaligned_data_pointers():
    buf_t, buf_f = bytearray(4 * 1001), bytearray(4 * 1001)
    t = torch.frombuffer(buf_t, dtype=torch.float32, offset=1, count=1000)
    f = torch.frombuffer(buf_f, dtype=torch.float32, offset=3, count=1000)
    t.copy_(torch.arange(1000.0))
    f.copy_(-torch.arange(1000.0))
    t2, f2 = t.view(10, 100), f.view(10, 100)
    pred = rand((10,), torch.bool, seed=3)
    assert_same(select(pred, [t2], [f2]), ref_select(pred, [t2], [f2]))
    outs, _ = emulated_select(pred, [t2], [f2])
    assert_same(outs, ref_select(pred, [t2], [f2]))


# --- reads only the selected side ----------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_unselected_side_is_never_seen(device):
    pred = torch.tensor([True, False, True, False, True], device=device)
    good = rand((5, 300), torch.float32, device, 1)
    bad = torch.full((5, 300), float("nan"), device=device)
    bad[:, ::2] = float("inf")
    t = torch.where(broadcast_sel(pred, good), good, bad)  # garbage where not selected
    f = torch.where(broadcast_sel(pred, good), bad, good)
    (out,) = select(pred, [t], [f])
    assert torch.equal(out, good)
    assert torch.isfinite(out).all()
    (out,) = select(torch.tensor(True, device=device), [good], [bad])
    assert torch.isfinite(out).all()
    index = torch.tensor([2, 0, 1, 0, 2], device=device)
    cases = [[torch.where(broadcast_sel(index == k, good), good, bad)] for k in range(3)]
    (out,) = select_n(index, cases)
    assert torch.equal(out, good)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_gives_exact_zeros_to_the_unselected_side(device):
    pred = torch.tensor([True, False, True], device=device)
    t = rand((3, 4), torch.float64, device, 1).requires_grad_()
    f = rand((3, 4), torch.float64, device, 2).requires_grad_()
    (out,) = select(pred, [t], [f])
    cot = torch.full((3, 4), float("inf"), dtype=torch.float64, device=device)
    cot[1] = float("nan")
    gt, gf = torch.autograd.grad(out, (t, f), cot)
    mask = broadcast_sel(pred, t)
    assert (gt[~mask.expand_as(gt)] == 0).all() and (gf[mask.expand_as(gf)] == 0).all()
    assert torch.equal(gt[mask.expand_as(gt)], cot[mask.expand_as(cot)])
    assert gf[~mask.expand_as(gf)].isnan().all()
    # select_n: every branch but the chosen one gets exact zeros
    index = torch.tensor([2, -1, 9], device=device)
    cases = [[rand((3, 4), torch.float64, device, 10 + k).requires_grad_()] for k in range(3)]
    (out,) = select_n(index, cases)
    grads = torch.autograd.grad(out, [c[0] for c in cases], cot)
    chosen = [2, 0, 2]
    for k, g in enumerate(grads):
        for row in range(3):
            if chosen[row] == k:
                assert_same([g[row]], [cot[row]])  # inf and nan passed through unchanged
            else:
                assert (g[row] == 0).all()


def test_log_trap_gradient_is_finite_with_masked_inputs():
    # where(x > 0, log(x), 0): the taken side only ever sees the cotangent of its own elements
    x = torch.tensor([[2.0], [-1.0], [4.0]], dtype=torch.float64, requires_grad=True)
    pred = (x > 0).reshape(3)
    safe = select(pred, [x], [torch.ones_like(x)])[0]  # mask the input, as batching.py does
    (out,) = select(pred, [safe.log()], [torch.zeros_like(x)])
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all() and g[1].item() == 0.0


# --- argument errors -----------------------------------------------------------------------


def test_errors_name_the_argument():
    t, f = torch.zeros(3, 4), torch.ones(3, 4)
    pred = torch.tensor([True, False, True])
    with pytest.raises(CondArgumentError, match=r"true_values has 2 tensors, false_values has 1"):
        select(pred, [t, t], [f])
    with pytest.raises(
        CondArgumentError,
        match=r"false_values\[0\]: expected shape \(3, 4\), torch.float32 on cpu \(as true_values\[0\]\), found shape \(3, 5\)",
    ):
        select(pred, [t], [torch.ones(3, 5)])
    with pytest.raises(
        CondArgumentError,
        match=r"false_values\[0\]: expected .* found shape \(3, 4\), torch.float64",
    ):
        select(pred, [t], [f.double()])
    with pytest.raises(
        CondArgumentError, match=r"pred: expected dtype torch.bool, found torch.int64"
    ):
        select(torch.tensor([1, 0, 1]), [t], [f])
    with pytest.raises(
        CondArgumentError,
        match=r"pred: expected a 0-d tensor or one whose shape is a prefix .* \(4,\) is not a prefix of true_values\[0\]'s shape \(3, 4\)",
    ):
        select(torch.tensor([True, False, True, True]), [t], [f])
    with pytest.raises(CondArgumentError, match=r"pred: expected a tensor, found bool"):
        select(True, [t], [f])
    with pytest.raises(CondArgumentError, match=r"true_values\[0\]: expected a tensor, found list"):
        select(pred, [[1.0]], [f])
    with pytest.raises(
        CondArgumentError,
        match=r"pred: expected a tensor on meta .* or a 0-d CPU tensor, found shape \(3,\) on cpu",
    ):
        select(pred, [t.to("meta")], [f.to("meta")])
    with pytest.raises(
        CondArgumentError, match=r"index: expected an integer dtype, found torch.float32"
    ):
        select_n(torch.tensor(1.0), [[t], [f]])
    with pytest.raises(
        CondArgumentError, match=r"index: expected an integer dtype, found torch.bool"
    ):
        select_n(torch.tensor(True), [[t], [f]])
    with pytest.raises(CondArgumentError, match=r"cases: expected at least one branch's outputs"):
        select_n(torch.tensor(1), [])
    with pytest.raises(CondArgumentError, match=r"cases\[1\] has 2 tensors, cases\[0\] has 1"):
        select_n(torch.tensor(1), [[t], [f, f]])
    with pytest.raises(CondArgumentError, match=r"cases\[2\]\[0\]: expected shape \(3, 4\)"):
        select_n(torch.tensor(1), [[t], [f], [torch.ones(4, 3)]])


def test_a_lone_tensor_or_none_where_a_list_belongs_is_refused():
    # Iterating a tensor would treat its rows as outputs and select along columns.
    t, f = torch.zeros(3, 4), torch.ones(3, 4)
    pred = torch.tensor([True, False, True])
    with pytest.raises(
        CondArgumentError,
        match=r"select: argument 'true_values' must be a list or tuple of tensors .* found a tensor of shape \(3, 4\)\. Pass \[tensor\]",
    ):
        select(pred, t, f)
    with pytest.raises(
        CondArgumentError,
        match=r"select: argument 'false_values' must be a list or tuple .* found a tensor",
    ):
        select(pred, [t], f)
    with pytest.raises(
        CondArgumentError,
        match=r"select: argument 'true_values' must be a list or tuple .* found NoneType",
    ):
        select(pred, None, [f])
    with pytest.raises(
        CondArgumentError,
        match=r"select_n: argument 'cases' must be a list with one list of tensors per branch; found a tensor of shape \(3, 4\)",
    ):
        select_n(torch.tensor(0), t)
    with pytest.raises(
        CondArgumentError,
        match=r"select_n: argument 'cases\[1\]' must be a list or tuple .* found a tensor",
    ):
        select_n(torch.tensor(0), [[t], f])
    with pytest.raises(
        CondArgumentError,
        match=r"select_n: argument 'cases\[0\]' must be a list or tuple .* found NoneType",
    ):
        select_n(torch.tensor(0), [None, [f]])


def test_sparse_values_and_selectors_get_a_torchcond_message():
    t = torch.eye(3)
    with pytest.raises(
        CondArgumentError,
        match=r"true_values\[0\]: expected a dense \(torch.strided\) tensor, found layout torch.sparse_coo",
    ):
        select(torch.tensor(True), [t.to_sparse()], [t.to_sparse()])
    with pytest.raises(
        CondArgumentError, match=r"pred: expected a dense .* found layout torch.sparse_coo"
    ):
        select(torch.tensor([True, False, True]).to_sparse(), [t], [t])
    with pytest.raises(
        CondArgumentError,
        match=r"cases\[0\]\[0\]: expected a dense .* found layout torch.sparse_coo",
    ):
        select_n(torch.tensor(1), [[t.to_sparse()], [t.to_sparse()]])


def test_operator_errors_name_the_argument():
    t, f = torch.zeros(3, 4), torch.ones(3, 4)
    pred = torch.tensor([True, False, True])
    with pytest.raises(
        ValueError, match=r"torchcond::select: true_values has 1 tensors, false_values has 2"
    ):
        OPS.select(pred, [t], [f, f])
    with pytest.raises(
        TypeError, match=r"torchcond::select: pred: expected dtype torch.bool, found torch.int32"
    ):
        OPS.select(pred.int(), [t], [f])
    with pytest.raises(
        ValueError,
        match=r"false_values\[0\]: expected shape \(3, 4\), torch.float32 on cpu \(as true_values\[0\]\), found shape \(3, 4\), torch.float64 on cpu",
    ):
        OPS.select(pred, [t], [f.double()])
    with pytest.raises(
        ValueError,
        match=r"pred: expected a 0-d tensor or one whose shape is a prefix .* \(3,\) is not a prefix of true_values\[0\]'s shape \(4, 3\)",
    ):
        OPS.select(pred, [t.T], [f.T])
    with pytest.raises(ValueError, match=r"num_branches: expected at least 1, found 0"):
        OPS.select_n(torch.tensor(0), [], 0)
    with pytest.raises(
        ValueError, match=r"cases: expected a multiple of num_branches \(2\) tensors.* found 3"
    ):
        OPS.select_n(torch.tensor(0), [t, f, t], 2)
    with pytest.raises(TypeError, match=r"index: expected an integer dtype, found torch.float32"):
        OPS.select_n(torch.tensor(0.0), [t, f], 2)
    with pytest.raises(ValueError, match=r"cases\[1\]\[1\]: expected shape \(3,\)"):
        OPS.select_n(torch.tensor(0), [t, torch.ones(3), f, torch.ones(4)], 2)
    # mixed with meta tensors, the call reaches the fake kernel, which checks devices too
    with pytest.raises(
        (ValueError, TypeError),
        match=r"true_values\[1\]: expected a tensor on cpu \(the device of true_values\[0\]; every value must be on one device\), found one on meta",
    ):
        OPS.select(torch.tensor(True), [t, t.to("meta")], [f, f.to("meta")])
    with pytest.raises(
        (ValueError, TypeError),
        match=r"index: expected a tensor on meta .* or a 0-d CPU tensor, found shape \(3,\) on cpu",
    ):
        OPS.select_n(torch.tensor([0, 1, 0]), [t.to("meta"), f.to("meta")], 2)


def _bad_calls():
    """Calls with one mistake each, ``(p, i, t, f) -> outputs``."""
    return [
        lambda p, i, t, f: select(p, [t, t], [f]),
        lambda p, i, t, f: select(p, [t], [f[:, :3]]),
        lambda p, i, t, f: select(p, [t], [f.double()]),
        lambda p, i, t, f: select(i, [t], [f]),
        lambda p, i, t, f: select(p[:2], [t], [f]),
        lambda p, i, t, f: select_n(p, [[t], [f]]),
        lambda p, i, t, f: select_n(i, [[t], [f], [f.T]]),
        lambda p, i, t, f: select_n(i.float(), [[t], [f]]),
        lambda p, i, t, f: select_n(i[:, None].expand(3, 2), [[t], [f]]),
    ]


@pytest.mark.parametrize("call", range(len(_bad_calls())))
def test_traced_calls_raise_the_eager_errors(call):
    # The fake kernels run the kernels' own C++ checks: make_fx, fake tensors and
    # meta tensors raise the CondArgumentError an eager call does, word for word.
    from torch.fx.experimental.proxy_tensor import make_fx

    fn = _bad_calls()[call]
    args = (
        torch.tensor([True, False, True]),
        torch.tensor([0, 1, 1]),
        torch.zeros(3, 4),
        torch.ones(3, 4),
    )
    with pytest.raises(CondArgumentError) as eager:
        fn(*args)
    with pytest.raises(CondArgumentError) as traced:
        make_fx(fn, tracing_mode="fake")(*args)
    assert str(traced.value) == str(eager.value)
    with pytest.raises(CondArgumentError) as meta:
        fn(*(a.to("meta") for a in args))
    assert str(meta.value) == str(eager.value).replace(" on cpu", " on meta")


def test_symbolic_tracing_checks_shapes():
    from torch.fx.experimental.proxy_tensor import make_fx

    t, f = torch.zeros(3, 4), torch.ones(3, 5)
    with pytest.raises(
        CondArgumentError,
        match=r"^false_values\[0\]: expected shape \(s\d+, s\d+\), torch.float32 on cpu \(as true_values\[0\]\), found shape \(s\d+, s\d+\)",
    ):
        make_fx(lambda p, t, f: select(p, [t], [f]), tracing_mode="symbolic")(
            torch.tensor(True), t, f
        )
    # equal sizes are equal symbols: no error, and the graph holds the operator
    gm = make_fx(lambda p, t, f: select(p, [t], [f]), tracing_mode="symbolic")(
        torch.tensor([True, False, True]), t, torch.ones(3, 4)
    )
    assert OPS.select.default in {n.target for n in gm.graph.nodes}


def test_fake_kernels_raise_the_operator_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    t, f = torch.zeros(3, 4), torch.ones(3, 4)
    pred = torch.tensor([True, False, True])
    calls = [
        lambda: OPS.select(pred, [t], [f, f]),
        lambda: OPS.select(pred.int(), [t], [f]),
        lambda: OPS.select(pred, [t], [f.double()]),
        lambda: OPS.select_n(pred.long(), [t, f, t], 2),
        lambda: OPS.select_n(pred.long(), [t, f.T], 2),
    ]
    for call in calls:
        with pytest.raises((ValueError, TypeError)) as eager:
            call()
        with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(type(eager.value)) as fake:
            call()
        assert str(fake.value) == str(eager.value)


# --- registrations: opcheck, fake tensors, autograd, vmap, torch.func ---------------------


def _opcheck_samples():
    p = torch.tensor([True, False, True])
    t = torch.randn(3, 4, requires_grad=True)
    f = torch.randn(3, 4, requires_grad=True)
    u = torch.randn(3, dtype=torch.float64)
    v = torch.randn(3, dtype=torch.float64, requires_grad=True)
    i = torch.randint(0, 5, (3, 2))
    yield OPS.select.default, (p, [t, u], [f, v])
    yield OPS.select.default, (torch.tensor(False), [t, i], [f, i + 1])
    yield OPS.select.default, (p, [t.detach().T.contiguous().T], [torch.zeros(()).expand(3, 4)])
    w = (t * 2).detach().requires_grad_()
    yield OPS.select_n.default, (torch.tensor([0, 5, -1]), [t, u, f, v, w, u], 3)
    yield OPS.select_n.default, (torch.tensor(1, dtype=torch.int32), [t, f], 2)


@pytest.mark.parametrize("sample", list(range(5)))
def test_opcheck(sample):
    op, args = list(_opcheck_samples())[sample]
    torch.library.opcheck(op, args)


def test_fake_and_meta_outputs_are_contiguous_and_shaped_like_the_values():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(5, 3).T
        outs = OPS.select(
            torch.empty(3, dtype=torch.bool),
            [t, torch.empty(3, 2, dtype=torch.int8)],
            [t, torch.empty(3, 2, dtype=torch.int8)],
        )
    assert [tuple(o.shape) for o in outs] == [(3, 5), (3, 2)]
    assert all(o.is_contiguous() for o in outs) and outs[1].dtype is torch.int8
    m = torch.empty(4, 2, device="meta")
    (out,) = OPS.select_n(torch.empty((), dtype=torch.int64, device="meta"), [m, m, m], 3)
    assert out.device.type == "meta" and out.shape == (4, 2)


def test_traced_graph_holds_the_operators():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(p, i, x, y):
        a = select(p, [x], [y])[0]
        b = select_n(i, [[x], [y], [a]])[0]
        return a + b

    gm = make_fx(f, tracing_mode="symbolic")(
        torch.tensor([True, False]), torch.tensor(2), torch.randn(2, 3), torch.randn(2, 3)
    )
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert OPS.select.default in targets and OPS.select_n.default in targets
    args = (torch.tensor([False, True]), torch.tensor(1), torch.randn(2, 3), torch.randn(2, 3))
    assert torch.equal(gm(*args), f(*args))


def test_torch_compile_fullgraph_and_export():
    def f(p, i, x, y):
        a = select(p, [x], [y])[0]
        return select_n(i, [[a], [y], [x]])[0] * 2

    args = (torch.tensor([True, False]), torch.tensor(1), torch.randn(2, 3), torch.randn(2, 3))
    assert torch.equal(torch.compile(f, backend="eager", fullgraph=True)(*args), f(*args))
    x = torch.randn(2, 3, requires_grad=True)
    g = torch.compile(
        lambda p, x, y: select(p, [x], [y])[0].sum(), backend="aot_eager", fullgraph=True
    )
    g(args[0], x, args[3]).backward()
    assert torch.equal(x.grad, torch.tensor([[1.0] * 3, [0.0] * 3]))

    class M(torch.nn.Module):
        def forward(self, p, x, y):
            return select(p, [x], [y])[0]

    ep = torch.export.export(M(), (args[0], args[2], args[3]))
    assert OPS.select.default in {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert torch.equal(
        ep.module()(args[0], args[2], args[3]), torch.where(args[0][:, None], args[2], args[3])
    )


def test_gradcheck_select():
    pred = torch.tensor([True, False, True])
    t = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    f = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    s = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fn = lambda t, f, s: tuple(select(pred, [t, s, t * 2], [f, s.exp(), f]))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (t, f, s))
    assert torch.autograd.gradgradcheck(fn, (t, f, s))
    fn0 = lambda t, f: tuple(select(torch.tensor(False), [t], [f]))  # noqa: E731
    assert torch.autograd.gradcheck(fn0, (t, f))


def test_gradcheck_select_n():
    index = torch.tensor([3, -1, 1])
    cases = [torch.randn(3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    fn = lambda a, b, c: tuple(select_n(index, [[a, a.sum(1)], [b, b[:, 0]], [c * c, c[:, 1]]]))  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(cases))
    assert torch.autograd.gradgradcheck(fn, tuple(cases))


def _select_program(p, t, f, s):
    return tuple(select(p, [t, s, t * 2], [f, s.exp(), f]))


def _select_n_program(index, a, b, c):
    return tuple(select_n(index, [[a, a.sum(1)], [b, b[:, 0]], [c * c, c[:, 1]]]))


def _second_order(fn, selector, *leaves):
    """The gradient of (the sum of the first-order gradients) of fn's outputs."""
    out = fn(selector, *leaves)
    first = torch.autograd.grad(sum(o.sum() for o in out), leaves, create_graph=True)
    return torch.autograd.grad(sum(g.sum() for g in first), leaves, allow_unused=True)


def _double_backward_args():
    torch.manual_seed(0)
    sel = [
        (
            _select_program,
            torch.tensor([True, False, True]),
            (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)),
            torch.randn(3, dtype=torch.float64),
        ),
        (
            _select_n_program,
            torch.tensor([3, -1, 1]),
            tuple(torch.randn(3, 2, dtype=torch.float64) for _ in range(2)),
            torch.randn(3, 2, dtype=torch.float64),
        ),
    ]
    return [(fn, s, (*vals, last)) for fn, s, vals, last in sel]


def _leaves(values):
    return tuple(v.detach().requires_grad_() for v in values)


@pytest.mark.parametrize("which", ["select", "select_n"])
def test_double_backward_traced_and_compiled_eager_match_eager(which):
    # The second-order gradient through the select operators traced by make_fx and
    # compiled without AOTAutograd: the ops' backward is itself differentiable there.
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, selector, values = _double_backward_args()[which == "select_n"]
    expected = _second_order(fn, selector, *_leaves(values))
    assert any(e is not None and e.abs().sum() > 0 for e in expected)

    def traced(selector, *values):
        return _second_order(fn, selector, *_leaves(values))

    got = make_fx(traced)(selector, *values)(selector, *values)
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    for actual in (got, _second_order(compiled, selector, *_leaves(values))):
        for a, e in zip(actual, expected):
            assert (a is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(a, e)
    torch.autograd.gradgradcheck(
        lambda *v: compiled(selector, *v), _leaves(values), check_fwd_over_rev=True
    )


def test_outputs_without_gradient_and_integer_outputs():
    pred = torch.tensor([True, False])
    t = torch.randn(2, 3, requires_grad=True)
    ints = torch.arange(6).reshape(2, 3)
    a, b, _c = select(pred, [t, ints, t], [t.detach(), ints, t * 3])
    assert b.dtype is torch.int64 and not b.requires_grad
    (g,) = torch.autograd.grad(a.sum(), t)  # c gets no gradient
    assert torch.equal(g, torch.tensor([[1.0] * 3, [0.0] * 3]))


def test_forward_mode_ad_and_torch_func():
    pred = torch.tensor([True, False, True])
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    dx, dy = torch.randn_like(x), torch.randn_like(y)
    _, tangent = torch.func.jvp(lambda a, b: select(pred, [a], [b])[0], (x, y), (dx, dy))
    assert torch.equal(tangent, torch.where(pred[:, None], dx, dy))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        xd = fwAD.make_dual(x, dx)
        out = select_n(torch.tensor([1, 0, 2]), [[xd], [y], [xd * 2]])[0]
        tangent = fwAD.unpack_dual(out).tangent
    assert torch.equal(
        tangent, torch.stack([torch.zeros(4, dtype=torch.float64), dx[1], 2 * dx[2]])
    )
    g = torch.func.grad(lambda a: select(pred, [a**2], [a * 3])[0].sum())(x)
    assert torch.allclose(g, torch.where(pred[:, None], 2 * x, torch.full_like(x, 3.0)))
    h = torch.func.hessian(
        lambda a: select_n(torch.tensor([0, 1, 2]), [[a**2], [a**3], [a]])[0].sum()
    )(torch.ones(3, dtype=torch.float64))
    assert torch.equal(h, torch.diag(torch.tensor([2.0, 6.0, 0.0], dtype=torch.float64)))


def _bare(op, p, a, b):
    """The operator itself, as compiled and traced code calls it."""
    if op == "select":
        return OPS.select(p, [a.sin()], [b.cos()])[0]
    return OPS.select_n((~p).long(), [a.sin(), b.cos(), a * b], 3)[0]  # sin where p


def _bare_reference(op, p, a, b):
    return torch.where(p, a.sin(), b.cos())


@pytest.mark.parametrize("op", ["select", "select_n"])
def test_the_operator_itself_under_torch_func_and_forward_ad(op):
    # torch.library.register_autograd would give these C++ operators an old-style
    # autograd.Function: torch.func.grad refused it and forward AD got a zero tangent.
    p = torch.tensor([True, False, True])
    a, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    da, db = torch.randn_like(a), torch.randn_like(b)
    for p_ in (p, torch.tensor(False)):
        got = torch.func.jvp(lambda a, b, p_=p_: _bare(op, p_, a, b), (a, b), (da, db))
        want = torch.func.jvp(lambda a, b, p_=p_: _bare_reference(op, p_, a, b), (a, b), (da, db))
        torch.testing.assert_close(got, want)
    grad = torch.func.grad(lambda a, b: _bare(op, p, a, b).sum(), argnums=(0, 1))
    want = torch.func.grad(lambda a, b: _bare_reference(op, p, a, b).sum(), argnums=(0, 1))
    torch.testing.assert_close(grad(a, b), want(a, b))
    per_example = torch.vmap(torch.func.grad(lambda a, p, b: _bare(op, p, a, b)))
    torch.testing.assert_close(per_example(a, p, b), want(a, b)[0])
    hessian = torch.func.hessian(lambda a: _bare(op, p, a, b).sum())(a)
    torch.testing.assert_close(hessian, torch.diag(torch.where(p, -a.sin(), 0.0)))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = _bare(op, p, fwAD.make_dual(a, da), fwAD.make_dual(b, db))
        tangent = fwAD.unpack_dual(out).tangent
    torch.testing.assert_close(tangent, torch.where(p, a.cos() * da, -b.sin() * db))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_forward_ad_through_the_operator(backend):
    # A compiled graph enters its forward-AD level without forward_ad's Python level
    # counter: the operator still sees the tangent.
    import torch.autograd.forward_ad as fwAD

    def f(p, a, b):
        with fwAD.dual_level():
            dual = fwAD.make_dual(a, torch.ones_like(a))
            return fwAD.unpack_dual(_bare("select", p, dual, b)).tangent

    p = torch.tensor([True, False, True])
    a, b = torch.randn(3), torch.randn(3)
    got = torch.compile(f, backend=backend, fullgraph=True)(p, a, b)
    torch.testing.assert_close(got, torch.where(p, a.cos(), 0.0))


def test_vmap_batched_and_unbatched_mixtures():
    B = 4
    preds = rand((B, 3), torch.bool, seed=1)
    xs, ys = rand((B, 3, 5), seed=2), rand((B, 3, 5), seed=3)
    x1, y1 = rand((3, 5), seed=4), rand((3, 5), seed=5)
    p1 = torch.tensor([True, False, True])
    fn = lambda p, a, b: tuple(select(p, [a, b], [b, a]))  # noqa: E731
    cases = [
        ((preds, xs, ys), (0, 0, 0)),
        ((preds, x1, ys), (0, None, 0)),
        ((preds, x1, y1), (0, None, None)),
        ((p1, xs, y1), (None, 0, None)),
        ((p1, xs.movedim(0, 2), ys.movedim(0, 1)), (None, 2, 1)),
        ((preds.T, xs, ys), (1, 0, 0)),
        ((torch.tensor(True), xs, y1), (None, 0, None)),
    ]
    for args, in_dims in cases:
        out = torch.vmap(fn, in_dims=in_dims)(*args)
        per_example = []
        for b in range(B):
            ex = [a if d is None else a.select(d, b) for a, d in zip(args, in_dims)]
            per_example.append(ref_select(ex[0], [ex[1], ex[2]], [ex[2], ex[1]]))
        for k in range(2):
            assert torch.equal(out[k], torch.stack([r[k] for r in per_example])), (in_dims, k)


def test_vmap_unbatched_outputs_stay_unbatched_and_select_n():
    B = 3
    p1 = torch.tensor([True, False])
    xs, a, b = rand((B, 2, 4), seed=1), rand((2, 4), seed=2), rand((2, 4), seed=3)
    out_batched, out_plain = torch.vmap(lambda x: tuple(select(p1, [x, a], [x * 0, b])), in_dims=0)(
        xs
    )
    assert out_batched.shape == (B, 2, 4) and out_plain.shape == (B, 2, 4)
    assert torch.equal(out_plain[1], ref_select(p1, [a], [b])[0])
    idx = torch.tensor([[0, 2], [1, 9], [-4, 1]])
    out = torch.vmap(lambda i, x: select_n(i, [[x], [x * 2], [a]])[0])(idx, xs)
    for e in range(B):
        assert torch.equal(out[e], ref_select_n(idx[e], [[xs[e]], [xs[e] * 2], [a]])[0])


def test_vmap_refuses_unpaired_values_as_eager_calls_do():
    # The vmap rule pairs values up by position: values left unpaired are an error, not dropped.
    xs, y = rand((3, 2, 4), seed=1), rand((2, 4), seed=2)
    p = torch.tensor([True, False])
    with pytest.raises(CondArgumentError) as eager:
        select(p, [y, y], [y])
    with pytest.raises(CondArgumentError) as batched:
        torch.vmap(lambda x: select(p, [x, x], [y]))(xs)
    assert str(batched.value) == str(eager.value)
    with pytest.raises(ValueError, match=r"cases: expected a multiple of num_branches \(2\)"):
        torch.vmap(lambda x: OPS.select_n(torch.tensor(0), [x, y, x], 2))(xs)


def test_nested_vmap():
    preds = rand((2, 3, 4), torch.bool, seed=1)
    xs, ys = rand((2, 3, 4, 5), seed=2), rand((3, 2, 4, 5), seed=3)
    inner = torch.vmap(lambda p, x, y: select(p, [x], [y])[0], in_dims=(0, 0, 0))
    out = torch.vmap(inner, in_dims=(0, 0, 1))(preds, xs, ys)  # ys batched along dim 1 outside
    expected = torch.where(preds[..., None], xs, ys.movedim(1, 0))
    assert torch.equal(out, expected)
    # the outer level batches only the predicate, the inner level only the values
    p_outer = rand((2, 4), torch.bool, seed=4)
    out = torch.vmap(lambda p: torch.vmap(lambda x: select(p, [x], [-x])[0])(xs[0]))(p_outer)
    expected = torch.where(p_outer[:, None, :, None], xs[0][None], -xs[0][None])
    assert torch.equal(out, expected)
    idx = torch.randint(-1, 4, (2, 3))
    out = torch.vmap(torch.vmap(lambda i, x: select_n(i, [[x], [-x], [x + 1]])[0]))(idx, xs)
    stack = torch.stack([xs, -xs, xs + 1])
    c = idx.clamp(0, 2)
    assert torch.equal(
        out, torch.gather(stack, 0, c[None, :, :, None, None].expand(1, 2, 3, 4, 5))[0]
    )


def test_vmap_of_grad_is_per_example():
    xs = torch.tensor([[1.0, 2.0], [-1.0, -3.0], [4.0, 0.5]])

    def loss(x):
        return select(x.sum() > 0, [x**2], [x * 3])[0].sum()

    g = torch.vmap(torch.func.grad(loss))(xs)
    expected = torch.stack([2 * xs[0], torch.full((2,), 3.0), 2 * xs[2]])
    assert torch.equal(g, expected)


# --- the CUDA kernel, emulated on the CPU ---------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, pred_shape",
    [
        ((7, 300), (7,)),  # line mode, rows of 1200 B (float32)
        ((5, 40), (5,)),  # short rows: element mode
        ((3, 4, 5), (3, 4, 5)),  # selector varies along the innermost dim
        ((9000,), ()),  # 0-d selector, several tiles
        ((2, 5000), (2,)),  # long lines split into tiles
    ],
)
def test_emulated_cuda_kernel_matches_where(dtype, shape, pred_shape):
    t, f = rand(shape, dtype, seed=1), rand(shape, dtype, seed=2)
    pred = rand(pred_shape, torch.bool, seed=3) if pred_shape else torch.tensor(False)
    outs, launches = emulated_select(pred, [t, t.flip(0)], [f, f])
    assert launches == 1
    assert_same(outs, ref_select(pred, [t, t.flip(0)], [f, f]))


def test_emulated_cuda_kernel_strided_and_expanded():
    base = rand((40, 30, 3), torch.float64, seed=1)
    t = base[:, ::2, 1]  # (40, 15), strided
    f = rand((15, 40), torch.float64, seed=2).T  # transposed
    e = torch.tensor(7.0, dtype=torch.float64).expand(40, 15)
    for pred in [
        rand((40,), torch.bool, seed=3),
        rand((80,), torch.bool, seed=4)[::2],
        torch.tensor(True),
        rand((40, 15), torch.bool, seed=5),
    ]:
        outs, _ = emulated_select(pred, [t, e, f], [f, t, e])
        assert_same(outs, ref_select(pred, [t, e, f], [f, t, e]))
    long_t = rand((4, 2000, 3), seed=6)[:, :, 0]  # long strided lines (line mode, strided copy)
    long_f = rand((4, 2000), seed=7)
    pred = torch.tensor([True, False, False, True])
    outs, _ = emulated_select(pred, [long_t, long_f], [long_f, long_t])
    assert_same(outs, ref_select(pred, [long_t, long_f], [long_f, long_t]))


def test_emulated_cuda_kernel_splits_launches_and_branch_windows():
    # 40 outputs of rank 2 need 10 pool words each and 24 descriptors fit a launch: 2 launches
    pred = rand((3,), torch.bool, seed=1)
    ts = [rand((3, 5 + i), seed=i) for i in range(40)]
    fs = [rand((3, 5 + i), seed=50 + i) for i in range(40)]
    outs, launches = emulated_select(pred, ts, fs)
    assert launches == 2
    assert_same(outs, ref_select(pred, ts, fs))
    # 100 strided branches at rank 2 do not fit one pool: windows of branches
    nb = 100
    cases = [[rand((5, 4), seed=k).T] for k in range(nb)]
    index = torch.tensor([-3, 0, 57, 99, 250])[None].expand(4, 5)  # shaped like the values
    outs, launches = emulated_select_n(index, cases)
    assert launches == 2
    assert_same(outs, ref_select_n(index, cases))


def test_emulated_cuda_kernel_index_dtypes_and_cpu_scalar_selector():
    cases = [[rand((6, 200), seed=k)] for k in range(3)]
    for dtype in INDEX_DTYPES:
        index = torch.tensor([0, 1, 2, 5, 0, 1], dtype=dtype)
        outs, _ = emulated_select_n(index, cases)
        assert_same(outs, ref_select_n(index, cases))
        outs, _ = emulated_select_n(torch.tensor(2, dtype=dtype), cases)  # 0-d: read on the host
        assert torch.equal(outs[0], cases[2][0])


def test_emulated_cuda_kernel_misaligned_and_zero_size():
    buf = bytearray(8 * 3001)
    t = torch.frombuffer(buf, dtype=torch.float64, offset=4, count=3000).view(
        3, 1000
    )  # 4-byte aligned
    t.copy_(torch.arange(3000.0, dtype=torch.float64).view(3, 1000))
    f = rand((3, 1000), torch.float64, seed=1)
    pred = torch.tensor([True, False, True])
    outs, _ = emulated_select(pred, [t, f[:, 1:]], [f, t[:, :-1]])
    assert_same(outs, ref_select(pred, [t, f[:, 1:]], [f, t[:, :-1]]))
    outs, launches = emulated_select(pred, [torch.ones(3, 0)], [torch.zeros(3, 0)])
    assert launches == 0 and outs[0].shape == (3, 0)


# --- the CUDA kernel's plans, emulated on the CPU ----------------------------------------
# select_kernel.cuh picks one plan per output (rows, line, vector, element); each test
# checks that the case reaches the plan it is about (the emulation reports the plans),
# then that the result equals torch.where and the CPU kernel bit for bit.


def itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def shifted(t, elements=1):
    """A copy of ``t`` that starts ``elements`` items into a fresh buffer (its address is
    aligned to the itemsize only, when the itemsize is below 16)."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype)
    view = flat[elements:].view(t.shape)
    view.copy_(t)
    return view


def check_select(pred, ts, fs, sm_count=2):
    """Emulated select against torch.where and the CPU kernel; returns the plans."""
    outs, _, plans = emulate(pred, [ts, fs], True, sm_count)
    refs = ref_select(pred, ts, fs)
    assert_same(outs, refs)
    assert_same(select(pred, ts, fs), refs)
    return plans


def check_select_n(index, cases, sm_count=2):
    outs, _, plans = emulate(index, cases, False, sm_count)
    refs = ref_select_n(index, cases)
    assert_same(outs, refs)
    assert_same(select_n(index, cases), refs)
    return plans


def tile_bytes(total_bytes, sm_count=2):
    """Output bytes per tile of a call writing ``total_bytes`` (select_kernel.cuh's
    tile_bytes_for with one block per emulated multiprocessor): 16 KB, or 8 KB when that
    gives fewer tiles than two waves of blocks."""
    return 16384 if total_bytes >= 2 * sm_count * 16384 else 8192


def alignment_of(nbytes):
    """The largest power of two up to 16 dividing ``nbytes``."""
    return next(a for a in (16, 8, 4, 2, 1) if nbytes % a == 0)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("row_bytes", [32, 48, 1024, 4096, 16384])
def test_emulated_rows_plan(dtype, row_bytes):
    # one selector entry per row, rows short enough that a tile holds whole rows
    cols = row_bytes // itemsize(dtype)
    rows = max(3, min(200, 65536 // row_bytes))
    t, f = rand((rows, cols), dtype, seed=1), rand((rows, cols), dtype, seed=2)
    pred = rand((rows,), torch.bool, seed=3)
    (plan,) = check_select(pred, [t], [f])
    assert (plan.mode, plan.access) == (ROWS, alignment_of(row_bytes))
    assert plan.tile_size == tile_bytes(t.numel() * t.element_size()) // row_bytes  # rows per tile


@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.float16, torch.float32, torch.complex128], ids=str
)
def test_emulated_rows_plan_odd_rows_and_prefix_shapes(dtype):
    size = itemsize(dtype)
    # rows of an odd number of items: narrower accesses, same result
    t, f = rand((50, 37), dtype, seed=1), rand((50, 37), dtype, seed=2)
    pred = rand((50,), torch.bool, seed=3)
    (plan,) = check_select(pred, [t], [f])
    assert (plan.mode, plan.access) == (ROWS, alignment_of(37 * size))
    # a two-dim prefix selector over three-dim values; a branch expanded along the rows
    t3, f3 = rand((4, 6, 9), dtype, seed=4), rand((9,), dtype, seed=5).expand(4, 6, 9)
    pred2 = rand((4, 6), torch.bool, seed=6)
    assert check_select(pred2, [t3], [f3])[0].mode == ROWS
    # a non-contiguous prefix selector: three coalesced dims, so lines' offsets need div/mod
    pred3 = rand((4, 12), torch.bool, seed=7)[:, ::2]
    assert check_select(pred3, [t3], [f3])[0].mode == ROWS
    # branches misaligned against each other: the access shrinks to what all allow
    t_shift, f_base = shifted(t, 1), rand((50, 37), dtype, seed=8)
    (plan,) = check_select(pred, [t_shift], [f_base])
    assert (plan.mode, plan.access) == (ROWS, alignment_of(size))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_emulated_line_plan(dtype):
    size = itemsize(dtype)
    # rows longer than a tile: segments of one line each, the last one partial
    cols = 20000 // size
    t, f = rand((3, cols), dtype, seed=1), rand((3, cols), dtype, seed=2)
    pred = torch.tensor([True, False, True])
    (plan,) = check_select(pred, [t], [f])
    assert plan.mode == LINE
    # a 0-d selector read from (device) memory: a stride-0 selector has its layout
    # (a CPU 0-d selector is read on the host instead)
    n = 40000 // size
    flat_t, flat_f = rand((n,), dtype, seed=3), rand((n,), dtype, seed=4)
    for value in (True, False):
        assert check_select(torch.tensor(value).expand(n), [flat_t], [flat_f])[0].mode == LINE
        assert check_select(torch.tensor(value).expand(3), [t], [f])[0].mode == LINE
    # and misaligned by one item against the output
    assert check_select(pred, [shifted(t)], [f])[0].mode == LINE


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize(
    "layout", ["aligned", "values shifted", "selector shifted", "shorter than a vector"]
)
def test_emulated_vector_plan(dtype, layout):
    size = itemsize(dtype)
    n = 3 if layout == "shorter than a vector" else (40000 // size) | 1  # a partial last vector
    t, f = rand((n,), dtype, seed=1), rand((n,), dtype, seed=2)
    pred = rand((n,), torch.bool, seed=3)
    if layout == "values shifted":
        t = shifted(t)
    if layout == "selector shifted":
        pred = shifted(pred)
    (plan,) = check_select(pred, [t], [f])
    vector_bytes = size if layout == "values shifted" else 16
    per_vector = vector_bytes // size
    assert (plan.mode, plan.access) == (VECTOR, vector_bytes)
    assert plan.sel_vector == (layout != "selector shifted" or per_vector == 1)
    if n >= 5:  # shaped like the values, two dims: coalesced into one
        m = n - n % 5
        t2, f2, pred2 = t[:m].view(5, -1), f[:m].view(5, -1), pred[:m].view(5, -1)
        assert check_select(pred2, [t2], [f2])[0].mode == VECTOR


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.complex128], ids=str)
def test_emulated_vector_plan_index_dtypes(index_dtype, dtype):
    # select_n over two cases, one index per element, out-of-range values included
    n = 2051
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(-3, 6, (n,), generator=g)
    if not index_dtype.is_signed:
        raw = raw.abs() + (raw < 0) * 250  # 0..5 and values far above the range
    index = raw.to(index_dtype)
    cases = [[rand((n,), dtype, seed=1)], [rand((n,), dtype, seed=2)]]
    (plan,) = check_select_n(index, cases)
    assert plan.mode == VECTOR
    assert plan.sel_vector == (itemsize(index_dtype) == 1)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_emulated_element_plan(dtype):
    # select_n over three branches with one index per element: only the picked branch
    # is read
    n = 3001
    cases = [[rand((n,), dtype, seed=k)] for k in range(3)]
    index = torch.randint(-1, 4, (n,), generator=torch.Generator().manual_seed(4))
    assert check_select_n(index, cases)[0].mode == ELEMENT
    # non-contiguous values with a per-element selector
    t = rand((40, 30), dtype, seed=5).T
    f = rand((30, 80), dtype, seed=6)[:, ::2]
    pred = rand((30, 40), torch.bool, seed=7)
    assert check_select(pred, [t], [f])[0].mode == ELEMENT
    # strided rows with one selector entry per row: the line plan from 512 bytes on
    pred_rows = rand((30,), torch.bool, seed=8)
    expected = LINE if 40 * itemsize(dtype) >= 512 else ELEMENT
    assert check_select(pred_rows, [t], [f])[0].mode == expected


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_emulated_element_plan_index_dtypes(index_dtype):
    # three branches, one index per element, out-of-range values of every index dtype
    n = 1500
    raw = torch.randint(-3, 7, (n,), generator=torch.Generator().manual_seed(6))
    if not index_dtype.is_signed:
        raw = raw.abs() + (raw < 0) * 200
    cases = [[rand((n,), torch.float16, seed=k)] for k in range(3)]
    assert check_select_n(raw.to(index_dtype), cases)[0].mode == ELEMENT


def test_emulated_element_plan_unaligned_items():
    # float64 at an address that is a multiple of 4 only: accesses of 4 bytes
    buf = bytearray(8 * 2001)
    t = torch.frombuffer(buf, dtype=torch.float64, offset=4, count=2000)
    t.copy_(torch.arange(2000.0, dtype=torch.float64))
    f = rand((2000,), torch.float64, seed=1)
    pred = rand((2000,), torch.bool, seed=2)
    assert check_select(pred, [t], [f])[0].mode == ELEMENT
    # the same rows with one selector entry per row: rows of 4-byte accesses
    rows_pred = rand((40,), torch.bool, seed=3)
    (plan,) = check_select(rows_pred, [t.view(40, 50)], [f.view(40, 50)])
    assert (plan.mode, plan.access) == (ROWS, 4)


def test_emulated_rows_plan_branch_windows():
    # 100 branches at rank 2 do not fit one pool: two windows, two launches, rows plan
    nb = 100
    cases = [[rand((6, 40), seed=k)] for k in range(nb)]
    index = torch.tensor([-3, 0, 57, 99, 250, 83])
    outs, launches, plans = emulate(index, cases, False)
    assert launches == 2 and [p.mode for p in plans] == [ROWS, ROWS]
    assert_same(outs, ref_select_n(index, cases))


def test_emulated_grid_and_tiles_on_a_larger_device():
    # 16 emulated multiprocessors: a call of 256 KB has fewer 16 KB tiles than two waves
    # of blocks, so tiles shrink to 8 KB, and each tile gets its own block
    pred = rand((256,), torch.bool, seed=1)
    t, f = rand((256, 256), seed=2), rand((256, 256), seed=3)
    (plan,) = check_select(pred, [t], [f], sm_count=16)
    assert (plan.mode, plan.tile_size, plan.grid) == (ROWS, 8, 32)
    # a call of 2 MB keeps 16 KB tiles and a grid of four waves; blocks take several tiles
    ts = [rand((256, 256), seed=10 + i) for i in range(8)]
    fs = [rand((256, 256), seed=20 + i) for i in range(8)]
    plans = check_select(pred, ts, fs, sm_count=16)
    assert all((p.tile_size, p.grid) == (16, 64) for p in plans)
    # per element, the same sizing
    flat_pred = rand((65536,), torch.bool, seed=4)
    (plan,) = check_select(flat_pred, [t.view(-1)], [f.view(-1)], sm_count=16)
    assert (plan.mode, plan.tile_size, plan.grid) == (VECTOR, 512, 32)  # 512 vectors of 16 bytes


# --- more than 2^31 elements ----------------------------------------------------------------


def _available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


BIG_NUMEL = 2**31 + 64
BIG_CHUNK = 2**27  # compare in chunks: no full-size temporaries


def assert_chunks_equal(out, expected_fn):
    """``out`` (flattened) equals ``expected_fn(start, stop)`` on every chunk."""
    flat = out.view(-1)
    for start in range(0, flat.numel(), BIG_CHUNK):
        stop = min(start + BIG_CHUNK, flat.numel())
        assert torch.equal(flat[start:stop], expected_fn(start, stop)), (start, stop)


@pytest.mark.skipif(
    os.environ.get("TORCHCOND_BIG_TESTS") != "1",
    reason="allocates ~6.5 GB (>2^31-element tensors); set TORCHCOND_BIG_TESTS=1 to run",
)
@pytest.mark.parametrize("device", DEVICES)
def test_more_than_2_31_elements(device):
    need = 3 * BIG_NUMEL + (1 << 30)  # true, false, output (int8) + slack
    if device == "cpu" and _available_memory_bytes() < need:
        pytest.skip(
            f"needs {need / 2**30:.1f} GiB of free memory, {_available_memory_bytes() / 2**30:.1f} GiB available"
        )
    if device == "cuda" and torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    rows = 4
    cols = BIG_NUMEL // rows
    t = torch.ones((rows, cols), dtype=torch.int8, device=device)
    f = torch.full((rows, cols), 2, dtype=torch.int8, device=device)
    pred = torch.tensor([True, False, False, True], device=device)
    row_value = torch.tensor([1, 2, 2, 1], dtype=torch.int8, device=device)

    def expected_rows(start, stop):  # row r holds row_value[r]
        return row_value[torch.arange(start, stop, device=device) // cols]

    (out,) = select(pred, [t], [f])
    assert out.numel() > 2**31
    assert_chunks_equal(out, expected_rows)
    del out
    (out,) = select(torch.tensor(False, device=device), [t.view(-1)], [f.view(-1)])
    assert_chunks_equal(out, lambda a, b: f.view(-1)[a:b])
    del out
    index = torch.tensor([1, 0, 1, 0], device=device)
    (out,) = select_n(index, [[t], [f]])
    picked = torch.tensor([2, 1, 2, 1], dtype=torch.int8, device=device)
    assert_chunks_equal(out, lambda a, b: picked[torch.arange(a, b, device=device) // cols])
    del out
    if device == "cpu":
        # the CUDA kernel's line mode, emulated on the CPU: 64-bit tile and byte offsets
        outs, _ = emulated_select(pred, [t], [f])
        assert_chunks_equal(outs[0], expected_rows)
        del outs


@pytest.mark.skipif(
    os.environ.get("TORCHCOND_BIG_TESTS") != "1",
    reason="allocates ~9 GB (>2^31-element tensors); set TORCHCOND_BIG_TESTS=1 to run",
)
@pytest.mark.parametrize("device", DEVICES)
def test_more_than_2_31_elements_with_an_elementwise_index(device):
    need = 4 * BIG_NUMEL + (1 << 30)  # index, two cases, output (one byte each) + slack
    if device == "cpu" and _available_memory_bytes() < need:
        pytest.skip(
            f"needs {need / 2**30:.1f} GiB of free memory, {_available_memory_bytes() / 2**30:.1f} GiB available"
        )
    if device == "cuda" and torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    a = torch.ones(BIG_NUMEL, dtype=torch.int8, device=device)
    b = torch.full((BIG_NUMEL,), 2, dtype=torch.int8, device=device)
    index = torch.zeros(BIG_NUMEL, dtype=torch.int8, device=device)
    index[2**31 + 7 :: 3] = 1  # the selector varies along the (only) dimension
    (out,) = select_n(index, [[a], [b]])
    assert_chunks_equal(out, lambda s, e: index[s:e] + 1)
    assert out[2**31 + 7].item() == 2 and out[2**31 + 8].item() == 1


# --- CUDA ----------------------------------------------------------------------------------


@requires_cuda
def test_cuda_select_with_device_predicate_does_not_sync():
    x = torch.randn(1000, 64, device="cuda")
    y = torch.randn(1000, 64, device="cuda")
    pred = x.sum() > 0  # a 0-d CUDA tensor
    batched = x[:, 0] > 0
    index = (x[:, 0] * 3).long()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out0 = select(pred, [x, y], [y, x])
        out1 = select(batched, [x], [y])
        out2 = select_n(index, [[x], [y], [x * 2]])
        out3 = select_n(index.sum(), [[x], [y]])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(out0[0], torch.where(pred, x, y))
    assert torch.equal(out1[0], torch.where(batched[:, None], x, y))
    assert torch.equal(out2[0], ref_select_n_on("cuda", index, [[x], [y], [x * 2]])[0])
    assert torch.equal(out3[0], x if int(index.sum()) <= 0 else y)


@requires_cuda
def test_cuda_cpu_scalar_predicate_with_cuda_values():
    x, y = torch.randn(300, 7, device="cuda"), torch.randn(300, 7, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        (out,) = select(torch.tensor(False), [x], [y])
        (out_n,) = select_n(torch.tensor(0), [[x], [y]])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(out, y) and torch.equal(out_n, x)


@requires_cuda
def test_cuda_graph_capture_and_replay():
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    pred = torch.zeros((), dtype=torch.bool, device="cuda")
    rows = torch.zeros(64, dtype=torch.bool, device="cuda")
    select(pred, [x], [y])  # warm up
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        select(rows, [x], [y])
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        (out,) = select(pred, [x], [y])
        (out_rows,) = select(rows, [x], [y])
    for value in (True, False, True):
        pred.fill_(value)
        rows.copy_(torch.rand(64, device="cuda") > 0.5)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x if value else y)
        assert torch.equal(out_rows, torch.where(rows[:, None], x, y))


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_cuda_many_outputs_and_layouts(dtype):
    pred = rand((8,), torch.bool, "cuda", 1)
    ts = [rand((8, 3 + 97 * i), dtype, "cuda", i) for i in range(30)]
    fs = [rand((8, 3 + 97 * i), dtype, "cuda", 100 + i).T.contiguous().T for i in range(30)]
    assert_same(select(pred, ts, fs), ref_select(pred, ts, fs))
    t = rand((8, 50, 3), dtype, "cuda", 2)[:, :, 1]
    assert_same(select(pred, [t], [fs[3][:, :50]]), ref_select(pred, [t], [fs[3][:, :50]]))


@requires_cuda
def test_cuda_gradients_and_opcheck():
    pred = torch.tensor([True, False, True], device="cuda")
    t = torch.randn(3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    f = torch.randn(3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, f: tuple(select(pred, [t], [f])), (t, f))
    torch.library.opcheck(OPS.select.default, (pred, [t], [f]))
    torch.library.opcheck(
        OPS.select_n.default, (torch.tensor([2, 0, 1], device="cuda"), [t, f, t], 3)
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda p, a: select(p, [a * 2], [a.sin()])[0],
        lambda p, a: select(p, [a], [a])[0],  # one input on both sides
        lambda p, a: select_n(p.long(), [[a * 2], [a.sin()]])[0],
        lambda p, a: select_n(p.long(), [[a], [a], [a.exp()]])[0],
    ],
    ids=["select", "select-same-input", "select_n", "select_n-same-input"],
)
def test_forward_over_reverse(fn):
    # The backward is itself a select; differentiating it in forward mode needs the
    # select's jvp, which only the autograd.Function path has.
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    p = torch.tensor([True, False, True])
    assert torch.autograd.gradgradcheck(lambda a: fn(p, a), (a,), check_fwd_over_rev=True)
    assert torch.autograd.gradcheck(
        lambda a: fn(p, a), (a,), check_forward_ad=True, check_backward_ad=True
    )


# --- without a gradient, one C call ------------------------------------------------------


def test_without_a_gradient_strategy_select_is_one_c_call():
    # The call api.cond makes; None would mean the general path.
    x = torch.tensor([1.0, -2.0, 3.0])

    def t(x):
        return x.sin(), x

    def f(x):
        return x.cos() * 2, x

    with torch.no_grad():
        for taken in (True, False):
            got = torchcond._C.select_cond(ONE_CALL, torch.tensor(taken), t, f, (x,))
            assert got[1] is x  # every branch returns it: not selected
            torch.testing.assert_close(got[0], (t if taken else f)(x)[0])
        # A predicate with a shape, a builtin branch, and under vmap: the general path.
        assert torchcond._C.select_cond(ONE_CALL, torch.tensor([True]), t, f, (x,)) is None
        assert torchcond._C.select_cond(ONE_CALL, torch.tensor(True), torch.sin, f, (x,)) is None
        answers = []

        def under_vmap(x):
            answers.append(torchcond._C.select_cond(ONE_CALL, torch.tensor(True), t, f, (x,)))
            return x

        torch.vmap(under_vmap)(x)
        assert answers == [None]
    assert torchcond._C.select_cond(ONE_CALL, torch.tensor(True), t, f, (x,)) is None  # a gradient


class _PassingDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _PassingFunctionMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _in(context):
    """Run ``call(x)`` under ``context``, under no_grad unless the context says otherwise."""

    def run(call, x):
        with context():
            call(x)

    return run


def _through(transform):
    """Run ``call(x)`` inside ``transform`` (a torch.func transform of a function of x)."""

    def run(call, x):
        transform(lambda x: (call(x), x.sum())[1])(x)

    return run


# Where a call may find itself. Each one-call path must take it exactly where
# torchcond._compat sees plain eager code (csrc/batching.cpp restates that rule in C).
_CALL_CONTEXTS = {
    "plain": _in(contextlib.nullcontext),
    "grad mode": _in(torch.enable_grad),
    "forward-AD level": _in(torch.autograd.forward_ad.dual_level),
    "dispatch mode": _in(_PassingDispatchMode),
    "torch-function mode": _in(_PassingFunctionMode),
    "profiler": _in(torch.autograd.profiler.profile),
    "torch.func.grad": _through(torch.func.grad),
    "torch.func.jvp": _through(lambda f: lambda x: torch.func.jvp(f, (x,), (x,))[1]),
    "functionalize": _through(torch.func.functionalize),
    "torch.jit.trace": _through(lambda f: lambda x: torch.jit.trace(f, (x,))),
}


def _plain_eager_for_compat(per_example: bool, pred) -> bool:
    """Whether torchcond._compat sees plain eager code with no gradient: for
    ``per_example``, the only torch.func level is a vmap that batches ``pred``."""
    from torchcond import _compat

    if per_example:
        levels = _compat.eager_vmap_level(pred)
        if levels is None or levels[0] != 1 or _compat.differentiating_transforms_active():
            return False
    elif _compat.transforms_active():
        return False
    return not (
        torch.is_grad_enabled()
        or _compat.tracing_active()
        or _compat.len_function_stack()
        or _compat.profiler_enabled()
        or torch.jit.is_tracing()
    )


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("per_example", [False, True], ids=["select_cond", "per_example_cond"])
@pytest.mark.parametrize("where", list(_CALL_CONTEXTS))
def test_the_one_call_paths_take_a_call_exactly_where_compat_sees_plain_eager_code(
    where, per_example
):
    def t(x):
        return x.sin()

    def f(x):
        return x.cos()

    seen = []

    def call(x):
        if per_example:
            pred = x > 0
            took = torchcond._C.per_example_cond(ONE_CALL, pred, t, f, (x,)) is not None
        else:
            pred = torch.tensor(True)
            took = torchcond._C.select_cond(ONE_CALL, pred, t, f, (x,)) is not None
        seen.append((took, _plain_eager_for_compat(per_example, pred)))
        return x

    x = torch.tensor([1.0, -2.0, 3.0])
    run = _CALL_CONTEXTS[where]
    with torch.no_grad():
        if per_example:
            run(lambda x: torch.vmap(call)(x), x)
        else:
            run(call, x)
    assert seen, "the call was not made"
    for took, plain in seen:
        assert took == plain, f"under {where}: C took the call: {took}; _compat: {plain}"
    if where == "plain":
        assert seen[0][0]


# --- other higher-order operators in a branch that runs untaken -------------------------


def _with_torch_cond(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos() + 1, (x,))


def _checked_inner(x):
    return torchcond.cond(x.sum() > 0, torch.sin, torch.cos, (x,), check_branches=True)


def _doubled(x):
    return x * 2


# torch.cond where a gradient may be taken is refused (the test below).
_INNER_OPERATORS = [
    pytest.param(_with_torch_cond, False, id="torch.cond-no_grad"),
    pytest.param(_checked_inner, False, id="cond-no_grad"),
    pytest.param(_checked_inner, True, id="cond-grad_mode"),
]


@pytest.mark.parametrize("inner, grad", _INNER_OPERATORS)
@pytest.mark.parametrize("path", ["select", "per_example"])
def test_a_higher_order_operator_in_a_branch_that_runs_untaken(path, inner, grad):
    # While the write recorder observes a branch, its dispatch key is in the thread's
    # set. torch.cond and a conditional that reaches its operator found no kernel for
    # that key.
    x = torch.tensor([[1.0, -2.0, 3.0], [-1.0, -2.0, -3.0]])
    with torch.set_grad_enabled(grad):
        if path == "select":
            for taken in (True, False):
                got = torchcond.cond(torch.tensor(taken), inner, _doubled, (x,), strategy="select")
                torch.testing.assert_close(got, inner(x) if taken else _doubled(x))
        else:
            preds = torch.tensor([True, False])
            got = torch.vmap(lambda p, x: torchcond.cond(p, inner, _doubled, (x,)))(preds, x)
            want = torch.stack([inner(x[0]), _doubled(x[1])])
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("compiled", [False, True], ids=["torch.cond", "compiled_function"])
def test_compiled_code_in_an_untaken_branch_with_a_gradient_is_refused(compiled):
    # The grad path reads a tensor that needs a gradient through a stand-in that keeps
    # the other branch's examples out of its gradient, which torch.compile (torch.cond
    # compiles itself) cannot trace: torch.cond's branches would read w unmasked.
    w = torch.tensor([0.5, 2.0, -1.0], requires_grad=True)
    x = torch.tensor([1.0, -2.0, 3.0])
    scaled = torch.compile(lambda x: x * w, backend="eager", fullgraph=True)

    def reads_w(x):
        if compiled:
            return scaled(x)
        return torch.cond(x.sum() > 0, lambda x: x * w, lambda x: x - w, (x,))

    with pytest.raises(
        torchcond.UnsupportedCondError, match=r"calls code that torch\.compile traces"
    ):
        torchcond.cond(torch.tensor(True), reads_w, _doubled, (x,), strategy="select")
    with torch.no_grad():  # nothing to mask: the same call runs
        got = torchcond.cond(torch.tensor(True), reads_w, _doubled, (x,), strategy="select")
    torch.testing.assert_close(got, x * w.detach())

    # torchcond.cond in its place masks the gradient as the outer branch does.
    def reads_w_with_cond(x):
        return torchcond.cond(x.sum() > 0, lambda x: x * w, lambda x: x - w, (x,))

    out = torchcond.cond(torch.tensor(True), reads_w_with_cond, _doubled, (x,), strategy="select")
    (grad,) = torch.autograd.grad(out.sum(), w)
    torch.testing.assert_close(grad, x)


def test_a_branch_that_runs_untaken_is_refused_where_the_recorder_key_is_taken(monkeypatch):
    # Another library may have registered the recorder's dispatch key first.
    from torchcond._src import write_guard

    monkeypatch.setattr(write_guard, "_KEY_FREE", False)
    x = torch.tensor([1.0, -2.0])
    with pytest.raises(torchcond.UnsupportedCondError, match="true_fn runs whether or not"):
        torchcond.cond(torch.tensor(True), torch.sin, torch.cos, (x,), strategy="select")


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("where", ["select", "per_example_vmap"])
def test_every_branch_under_torch_func_functionalize_is_refused_as_docs_select_says(
    where, grad_mode
):
    """docs/select.rst: where every branch runs, torch.func.functionalize is refused,
    and nothing is written. The recorder does not see a branch's writes through
    functionalize's wrappers: run there, the branches' writes were lost."""

    def t(x, y):
        y.add_(1)
        return x * 2

    def f(x, y):
        y.add_(2)
        return x * 3

    if where == "select":
        x, y = torch.ones(2), torch.zeros(2)

        def prog(x, y):
            return torchcond.cond(x.sum() > 0, t, f, (x, y), strategy="select")

    else:
        x, y = torch.tensor([[1.0], [-1.0]]), torch.zeros(2, 1)
        prog = torch.vmap(lambda x, y: torchcond.cond(x.sum() > 0, t, f, (x, y)))
    with torch.set_grad_enabled(grad_mode):
        with pytest.raises(
            UnsupportedCondError, match=r"cannot run under torch\.func\.functionalize"
        ):
            torch.func.functionalize(prog)(x, y)
    assert y.eq(0).all()


def test_torchcond_select_under_torch_func_functionalize_is_refused():
    pred, a, b = torch.tensor([True, False]), torch.ones(2), torch.zeros(2)
    with pytest.raises(UnsupportedCondError, match=r"cannot run under torch\.func\.functionalize"):
        torch.func.functionalize(lambda a, b: select(pred, [a], [b]))(a, b)
    assert select(pred, [a], [b])[0].tolist() == [1.0, 0.0]
