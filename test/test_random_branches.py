"""Branches that draw random numbers: a traced derivative replays the forward's draws.

A traced derivative recomputes the branch from its inputs. Before torchcond saved the
draws, dropout in a branch got a new mask in the backward (about half of the gradient
entries wrong under make_fx and torch.compile); ``torch.cond`` on 2.13 still does.
The reference is eager code with the same seed: a Python ``if`` under ordinary
autograd, which draws once.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import TimesThree
from torch.fx.experimental.proxy_tensor import make_fx

import torchcond
from torchcond import cond, switch

P = 0.4


def dropout(x):
    return F.dropout(x, P, training=True) * 2


def alpha_dropout(x):  # an in-place draw (bernoulli_) that the branch then writes to
    return F.alpha_dropout(x, P, training=True)


def times_uniform_noise(x):
    return x * torch.rand_like(x)


def bernoulli_gate(x):
    return torch.bernoulli(x.sigmoid()) * x.cos()


def dropout_of_a_flattened_matrix(x):  # a draw sized s0*s1 in symbolic tracing
    return F.dropout(x.reshape(-1), P, training=True).reshape(x.shape) + x


RANDOM_BRANCHES = [dropout, alpha_dropout, times_uniform_noise, bernoulli_gate]


def loss_and_grad(pred, branch, other, x):
    out = cond(pred, branch, other, (x,))
    return out, torch.autograd.grad((out * out).sum(), x)[0]


def reference(pred, branch, other, x):
    """Eager: a Python if (what cond is in eager mode), differentiated by autograd."""
    out = branch(x) if pred else other(x)
    return out, torch.autograd.grad((out * out).sum(), x)[0]


def leaf(shape=(6, 5)):
    return (torch.rand(shape) + 0.5).requires_grad_()


def seeded(fn, *args, seed=7):
    torch.manual_seed(seed)
    return fn(*args)


def assert_same(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("branch", RANDOM_BRANCHES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize("random_side", ["true_fn", "false_fn"])
def test_make_fx_gradient_uses_the_forward_draw(branch, mode, random_side):
    fns = (branch, torch.sin) if random_side == "true_fn" else (torch.sin, branch)
    x = leaf()
    gm = make_fx(lambda p, x: loss_and_grad(p, *fns, x), tracing_mode=mode)(torch.tensor(True), x)
    for pred in (True, False):
        got = seeded(gm, torch.tensor(pred), x)
        assert_same(got, seeded(reference, pred, *fns, x))


def test_symbolic_gradient_of_a_draw_sized_by_an_expression_of_input_sizes():
    # The untaken branch returns zeros shaped like the other's draw: s0*s1 is rebuilt
    # from its own inputs' sizes.
    x = leaf()
    fns = (torch.cos, dropout_of_a_flattened_matrix)
    gm = make_fx(lambda p, x: loss_and_grad(p, *fns, x), tracing_mode="symbolic")(
        torch.tensor(True), x
    )
    for shape in [(6, 5), (3, 7)]:
        y = leaf(shape)
        for pred in (True, False):
            assert_same(seeded(gm, torch.tensor(pred), y), seeded(reference, pred, *fns, y))


def test_switch_with_a_draw_in_two_branches():
    branches = [dropout, torch.sin, times_uniform_noise]

    def f(i, x):
        out = switch(i, branches, (x,))
        return out, torch.autograd.grad((out * out).sum(), x)[0]

    def ref(i, x):
        out = branches[i](x)
        return out, torch.autograd.grad((out * out).sum(), x)[0]

    x = leaf()
    gm = make_fx(f, tracing_mode="symbolic")(torch.tensor(0), x)
    for i in range(3):
        assert_same(seeded(gm, torch.tensor(i), x), seeded(ref, i, x))


def test_second_derivative_uses_the_forward_draw():
    def f(pred, x):
        out = cond(pred, times_uniform_noise, torch.sin, (x,))
        (g,) = torch.autograd.grad((out**3).sum(), x, create_graph=True)
        return out, g, torch.autograd.grad(g.sum(), x)[0]

    def ref(pred, x):
        out = times_uniform_noise(x) if pred else torch.sin(x)
        (g,) = torch.autograd.grad((out**3).sum(), x, create_graph=True)
        return out, g, torch.autograd.grad(g.sum(), x)[0]

    x = leaf()
    gm = make_fx(f, tracing_mode="fake")(torch.tensor(True), x)
    for pred in (True, False):
        assert_same(seeded(gm, torch.tensor(pred), x), seeded(ref, pred, x))


class DropoutHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 5)
        self.drop = torch.nn.Dropout(P)

    def forward(self, x):
        return cond(x.sum() > 0, lambda x: self.drop(self.lin(x)), lambda x: x.tanh(), (x,))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_training_gradient_uses_the_forward_mask(backend):
    torch._dynamo.reset()
    model = DropoutHead()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = leaf((64, 5))
    out = compiled(x)
    out.sum().backward()
    # d out / d lin(x) is mask * scale: each kept entry's gradient reaches the weight
    # exactly through the kept positions of the forward's output.
    kept = (out != 0).to(out.dtype) / (1 - P)
    weight_grad = kept.t() @ x.detach()
    torch.testing.assert_close(model.lin.weight.grad, weight_grad)
    torch.testing.assert_close(x.grad, kept @ model.lin.weight.detach())


def grads_of_square(model, x, weight):
    return torch.autograd.grad(model(x).pow(2).sum(), [x, weight], allow_unused=True)


def test_aot_eager_training_equals_eager_with_the_same_seed():
    torch._dynamo.reset()
    model = DropoutHead()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for x in (leaf((8, 5)), -leaf((8, 5)).detach().requires_grad_()):
        got = seeded(grads_of_square, compiled, x, model.lin.weight)
        want = seeded(grads_of_square, model, x, model.lin.weight)
        torch.testing.assert_close(got[0], want[0])
        # The compiled backward is a cond: the untaken branch's parameter gets zeros.
        torch.testing.assert_close(got[1], torch.zeros_like(got[1]) if want[1] is None else want[1])


def inner_cond(x):
    return cond(x.sum() > 5, dropout, lambda a: a * torch.rand_like(a).cos(), (x,))


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_a_draw_inside_a_nested_conditional_is_replayed(mode):
    # The inner node returns its draws; the outer one returns them on.
    x = leaf()
    gm = make_fx(lambda p, x: loss_and_grad(p, inner_cond, torch.sin, x), tracing_mode=mode)(
        torch.tensor(True), x
    )
    for pred in (True, False):
        for y in (x, (x * 0.1).detach().requires_grad_()):  # inner: either branch
            assert_same(
                seeded(gm, torch.tensor(pred), y), seeded(reference, pred, inner_cond, torch.sin, y)
            )


def test_a_draw_inside_a_nested_conditional_is_replayed_in_compiled_training():
    torch._dynamo.reset()

    def f(x):
        return cond(x.sum() > 0, inner_cond, torch.tanh, (x,))

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for x in (leaf(), (leaf() * 0.1).detach().requires_grad_()):
        got = seeded(lambda x: torch.autograd.grad(compiled(x).pow(2).sum(), x), x)
        want = seeded(lambda x: torch.autograd.grad(inner_cond(x).pow(2).sum(), x), x)
        assert_same(got, want)


def noisy(x):
    # A reparameterized sample: its gradient reads the draw, which cannot be replayed.
    return torch.distributions.Gamma(x, torch.ones_like(x), validate_args=False).rsample()


def test_a_draw_the_derivative_cannot_replay_is_refused_not_wrong():
    with pytest.raises(torchcond.UnsupportedCondError, match=r"standard_gamma.*randn_like"):
        make_fx(lambda p, x: loss_and_grad(p, noisy, torch.sin, x), tracing_mode="fake")(
            torch.tensor(True), leaf()
        )


def test_a_custom_function_beside_a_draw_is_refused_not_wrong():
    # The derivative replays the draw from the branch's graph, which has the
    # Function's forward ops but not its backward.
    with pytest.raises(
        torchcond.UnsupportedCondError, match=r"custom torch.autograd.Function.*draws"
    ):
        make_fx(
            lambda p, x: loss_and_grad(p, lambda a: dropout(TimesThree.apply(a)), torch.sin, x),
            tracing_mode="fake",
        )(torch.tensor(True), leaf())


def test_a_draw_no_derivative_reads_is_not_refused():
    # The forward alone reads the sample; only a derivative would read it again.
    x = leaf()
    forward = make_fx(lambda p, x: cond(p, noisy, torch.sin, (x,)), tracing_mode="fake")(
        torch.tensor(True), x
    )
    assert forward(torch.tensor(False), x).equal(x.sin())
    torch.testing.assert_close(seeded(forward, torch.tensor(True), x), seeded(noisy, x))


def test_normal_is_replayed_with_its_zero_gradient():
    # Autograd gives torch.normal's mean and std zero gradients; the draw is saved.
    def shifted(x):
        return torch.normal(x, 2.0) + x

    x = leaf()
    gm = make_fx(lambda p, x: loss_and_grad(p, shifted, torch.sin, x), tracing_mode="fake")(
        torch.tensor(True), x
    )
    for pred in (True, False):
        assert_same(
            seeded(gm, torch.tensor(pred), x), seeded(reference, pred, shifted, torch.sin, x)
        )


def test_inference_traces_keep_the_random_op_and_save_nothing():
    gm = make_fx(lambda p, x: cond(p, dropout, torch.sin, (x,)), tracing_mode="fake")(
        torch.tensor(True), torch.rand(4)
    )
    (node,) = [n for n in gm.graph.nodes if n.target is torchcond._src.ops.cond_op]
    assert len(node.meta["val"]) == 1


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_a_torch_func_derivative_that_would_draw_again_is_refused_not_wrong(mode):
    # torch.func.grad differentiates the Python branch, which draws anew when traced.
    def loss(x):
        return cond(x.sum() > 0, dropout, torch.sin, (x,)).pow(2).sum()

    with pytest.raises(torchcond.UnsupportedCondError, match="draw new random numbers"):
        make_fx(torch.func.grad(loss), tracing_mode=mode)(torch.rand(8) + 0.5)


def test_a_torch_func_derivative_of_an_unread_draw_is_traced():
    def loss(x):
        return cond(
            x.sum() > 0, lambda a: (a.sin(), torch.rand(3)), lambda a: (a.cos(), a[:3]), (x,)
        )[0].sum()

    x = torch.rand(8) + 0.5
    gm = make_fx(torch.func.grad(loss), tracing_mode="fake")(x)
    torch.testing.assert_close(gm(x), x.cos())
