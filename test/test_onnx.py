"""torch.onnx.export(..., dynamo=True): cond is an ONNX ``If``, switch a chain of them,
run by onnxruntime on inputs that take every branch, against eager (a Python ``if``)."""

import warnings

import onnxruntime
import pytest
import torch
from torch.export import Dim

import torchcond
from torchcond import cond, switch
from torchcond.passes import lower_to_select

BATCH = Dim("batch", min=2, max=64)


def to_onnx(model, args, dynamic_shapes=None):
    with warnings.catch_warnings():
        # The exporter's own deprecation chatter, unrelated to the model.
        warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning))
        if isinstance(model, torch.nn.Module):
            model = model.eval()
        return torch.onnx.export(
            model, args, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False
        )


def ort_runner(program):
    """The model as deployed: an onnxruntime session over the serialized proto."""
    session = onnxruntime.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def run(*args):
        feeds = {name: a.numpy() for name, a in zip(names, args)}
        return [torch.from_numpy(o) for o in session.run(None, feeds)]

    return run


def top_level_ops(program):
    return [node.op_type for node in program.model_proto.graph.node]


def if_depth(graph) -> int:
    """How many ``If``s deep the graph's deepest ``If`` is."""
    depths = [0]
    for node in graph.node:
        if node.op_type == "If":
            branches = [a.g for a in node.attribute if a.name in ("then_branch", "else_branch")]
            depths.append(1 + max(if_depth(g) for g in branches))
    return max(depths)


def assert_all_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class LinearOrAffine(torch.nn.Module):
    """The issue's model: a cond over a Linear layer with a data-dependent predicate."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x * 2 - 1, (x,))


class TorchCondLinearOrAffine(LinearOrAffine):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x * 2 - 1, (x,))


def test_cond_is_an_onnx_if_that_takes_either_branch_at_any_batch():
    model = LinearOrAffine()
    program = to_onnx(model, (torch.randn(3, 4),), ({0: BATCH},))
    assert top_level_ops(program).count("If") == 1
    run = ort_runner(program)
    for x in (torch.randn(3, 4).abs(), -torch.randn(17, 4).abs(), torch.randn(64, 4)):
        assert_all_close(run(x), [model(x)])


def test_same_results_as_torch_cond_deployed_the_same_way():
    ours, theirs = LinearOrAffine(), TorchCondLinearOrAffine()
    theirs.load_state_dict(ours.state_dict())
    args, dims = (torch.randn(3, 4),), ({0: BATCH},)
    run_ours, run_theirs = (
        ort_runner(to_onnx(ours, args, dims)),
        ort_runner(to_onnx(theirs, args, dims)),
    )
    for x in (torch.randn(5, 4).abs(), -torch.randn(5, 4).abs()):
        assert_all_close(run_ours(x), run_theirs(x))


class ThreeWay(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, k):
        return switch(k, [lambda x: self.lin(x), torch.sin, lambda x: x * x], (x,))


def test_switch_is_a_chain_of_ifs_and_clamps_its_index():
    model = ThreeWay()
    program = to_onnx(model, (torch.randn(3, 4), torch.tensor(1)), ({0: BATCH}, None))
    assert if_depth(program.model_proto.graph) == 2  # b0 if k < 1 else (b1 if k < 2 else b2)
    run = ort_runner(program)
    x = torch.randn(6, 4)
    for k in (-3, 0, 1, 2, 9):
        index = torch.tensor(k)
        assert_all_close(run(x, index), [model(x, index)])


class Nested(torch.nn.Module):
    """A switch whose branch holds a cond on a shape predicate, and pytree outputs."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, k):
        def inner(x):
            small = cond(x.shape[0] > 4, lambda x: x.cos(), lambda x: self.lin(x), (x,))
            return {"y": small, "n": x.sum(0)}

        return switch(
            k,
            [inner, lambda x: {"y": x.tanh(), "n": x.amax(0)}, lambda x: {"y": -x, "n": x[0]}],
            (x,),
        )


def test_nested_conditionals_with_a_shape_predicate_and_pytree_outputs():
    model = Nested()
    program = to_onnx(model, (torch.randn(5, 4), torch.tensor(0)), ({0: BATCH}, None))
    run = ort_runner(program)
    for n in (2, 4, 5, 33):  # the inner shape predicate both ways
        x = torch.randn(n, 4)
        for k in (0, 1, 2):
            index = torch.tensor(k)
            want = model(x, index)
            assert_all_close(run(x, index), [want["y"], want["n"]])


class Ragged(torch.nn.Module):
    """Branches whose outputs differ in size: an unbacked size in the exported program."""

    def forward(self, x):
        return cond(x[0] > 0, lambda x: x[:2] * 3, lambda x: x.exp(), (x,))


def test_branches_may_return_different_sizes():
    program = to_onnx(Ragged(), (torch.randn(5),), ({0: BATCH},))
    run = ort_runner(program)
    for x in (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([-1.0, 2.0, 3.0])):
        (got,) = run(x)
        torch.testing.assert_close(got, Ragged()(x))


class Counter(torch.nn.Module):
    """A branch that writes a buffer in place, as plain code would with ``add_``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        def bump(x, count):
            count.add_(1)
            return x * count

        return cond(x.sum() > 0, bump, lambda x, count: x - count, (x, self.count))


def test_a_branch_writing_a_buffer_gives_the_value_plain_code_gives():
    # ONNX has no state: the exporter keeps a buffer's write within the call and drops
    # it afterwards, for plain code as here. torch.cond cannot export this model.
    run = ort_runner(to_onnx(Counter(), (torch.ones(3),), ({0: BATCH},)))
    for x in (torch.ones(4), -torch.ones(2)):
        for _ in range(2):  # the buffer starts from zero on every call
            (got,) = run(x)
            torch.testing.assert_close(got, Counter()(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_predicate_computed_in_the_model_in_another_dtype(dtype):
    class Model(torch.nn.Module):
        def forward(self, x, flag):
            # A non-bool predicate tensor reads with Python truthiness.
            return cond(flag, lambda x: x + 1, lambda x: x - 1, (x,))

    program = to_onnx(Model(), (torch.randn(3), torch.ones((), dtype=dtype)), ({0: BATCH}, None))
    run = ort_runner(program)
    x = torch.randn(4)
    for flag in (0, 1, 7):
        value = torch.tensor(flag, dtype=dtype)
        assert_all_close(run(x, value), [Model()(x, value)])


def test_lowered_to_select_the_model_has_no_control_flow():
    # For runtimes without ``If``: every branch runs and ``Where``s pick the outputs.
    model = ThreeWay()
    ep = torch.export.export(
        model, (torch.randn(3, 4), torch.tensor(1)), dynamic_shapes=({0: BATCH}, None)
    )
    program = to_onnx(lower_to_select(ep), ())
    assert if_depth(program.model_proto.graph) == 0
    assert "Where" in top_level_ops(program)
    run = ort_runner(program)
    x = torch.randn(5, 4)
    for k in (-1, 0, 1, 2, 3):
        index = torch.tensor(k)
        assert_all_close(run(x, index), [model(x, index)])


class PerRow(torch.nn.Module):
    """The select kernels with a selector per row, as vmap's lowering leaves them."""

    def forward(self, x, k):
        (picked,) = torchcond.select(x[:, 0] > 0, [x * 2], [x.sin()])
        (n_way,) = torchcond.select_n(k, [[x], [x.cos()], [-x]])
        return picked, n_way


def test_select_kernels_with_a_selector_per_row():
    program = to_onnx(
        PerRow(), (torch.randn(4, 3), torch.tensor([0, 1, 2, 3])), ({0: BATCH}, {0: BATCH})
    )
    run = ort_runner(program)
    x, k = torch.randn(6, 3), torch.tensor([-1, 0, 1, 2, 3, 1])
    assert_all_close(run(x, k), list(PerRow()(x, k)))


class ShapeIndex(torch.nn.Module):
    def forward(self, x):
        return switch(x.shape[0] - 3, [torch.sin, torch.cos, torch.neg], (x,))


def test_switch_on_an_index_computed_from_a_shape():
    program = to_onnx(ShapeIndex(), (torch.randn(4, 2),), ({0: Dim("rows", min=1, max=64)},))
    assert if_depth(program.model_proto.graph) == 2
    run = ort_runner(program)
    for n in (1, 3, 4, 5, 9):  # index -2 (clamped), 0, 1, 2, 6 (clamped)
        x = torch.randn(n, 2)
        assert_all_close(run(x), [ShapeIndex()(x)])
