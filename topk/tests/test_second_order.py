"""Second-order autograd: a gradient taken with ``create_graph=True`` is itself differentiable, on every backend.

Gradient penalties, Hessian-vector products and per-example weights learnt by meta-gradients (Ren et al., 2018,
"Learning to reweight examples") differentiate a loss's gradient again, with respect to the scores and to the
gradient flowing in. ``torch.autograd.gradgradcheck`` checks both against finite differences. The hinge losses and
the Monte Carlo estimator are piecewise linear in the scores for a fixed noise, so their second derivative in the
scores is 0 (as a ReLU's); the smoothed hinge's is not.
"""

import pytest
import torch

import topk
from topk import losses
from topk.losses import build_loss
from topk.tests.test_graph_capture import KERNEL_LOSSES, TABLE_1

DIFFERENTIABLE = sorted(set(TABLE_1) - {"zero_one"})
NOISED = {"noised_balanced", "noised_imbalanced"}


def _scores_and_labels(device=torch.device("cpu"), batch=3, n_classes=12):
    generator = torch.Generator().manual_seed(0)
    s = torch.randn(batch, n_classes, generator=generator, dtype=torch.float64)
    y = torch.randint(0, n_classes, (batch,), generator=generator)
    return s.to(device).requires_grad_(), y.to(device)


def _fixed_noise(name: str, device: torch.device) -> dict:
    """A generator seeded afresh at every call, so that finite differences compare losses of the same noise."""
    return {"generator": torch.Generator(device).manual_seed(5)} if name in NOISED else {}


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_every_loss_is_twice_differentiable(name):
    s, y = _scores_and_labels()
    parameters = {**TABLE_1[name], "reduction": "none"}
    assert torch.autograd.gradgradcheck(
        lambda scores: build_loss(name, **parameters, **_fixed_noise(name, s.device))(scores, y), (s,))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("n_classes", [6, 13])
def test_smooth_hinge_has_the_second_derivative_of_its_log_sum_exps(k, n_classes):
    """The tree's products of polynomials (odd numbers of them padded) differentiated twice, against finite
    differences; its Hessian is not 0, so the check would see a gradient treated as a constant."""
    s, y = _scores_and_labels(n_classes=n_classes)
    loss = losses.SmoothHinge(k, 0.5, reduction="none")
    assert torch.autograd.gradgradcheck(lambda scores: loss(scores, y), (s,))
    gradient = torch.autograd.grad(loss(s, y).sum(), s, create_graph=True)[0]
    assert torch.autograd.grad(gradient.square().sum(), s)[0].abs().max() > 1e-3


def _node_names(tensor: torch.Tensor) -> set[str]:
    """The names of the autograd nodes ``tensor`` was made by."""
    names, seen, stack = set(), set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            names.add(type(node).__name__)
            stack.extend(parent for parent, _ in node.next_functions)
    return names


def test_the_smooth_hinges_differentiable_gradient_adds_in_a_fixed_order():
    """An overlapping ``as_strided`` view's gradient is an ``index_add``, whose CUDA kernel adds with atomics: the
    second derivative changed in its last bits from one call to the next, and ``gradgradcheck`` failed on an H200
    (benchmarks/results/h200-2026-11-26b). The tree's windows are ``unfold``'s, whose gradient adds in order."""
    s, y = _scores_and_labels(batch=2, n_classes=8)
    gradient = torch.autograd.grad(losses.SmoothHinge(3, 1.0, backend="torch")(s, y), s, create_graph=True)[0]
    assert not {"AsStridedBackward0", "IndexAddBackward0"} & _node_names(gradient)


@KERNEL_LOSSES
def test_kernel_backends_are_twice_differentiable(make_loss, kernel_device):
    s, y = _scores_and_labels(kernel_device, batch=2, n_classes=8)

    def loss(scores):
        torch.manual_seed(5)  # the noised loss's seed, drawn from the default generator: the same noise at every call
        return make_loss("triton")(scores, y)

    assert torch.autograd.gradgradcheck(loss, (s,), atol=1e-5)


@pytest.mark.parametrize("operator", [topk.smooth_top_k, topk.smooth_top_sum_k])
def test_smoothed_operators_are_twice_differentiable(operator):
    s, _ = _scores_and_labels()
    assert torch.autograd.gradgradcheck(
        lambda scores: operator(scores, 2, 0.5, 4, generator=torch.Generator().manual_seed(5)), (s,))


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_a_meta_learnt_example_weight_receives_its_gradient(backend, request):
    """Per-example weights ``w`` of a noised loss, differentiated through the loss's gradient: d/dw_i of
    ``||d (sum_i w_i loss_i) / ds||^2`` is ``2 w_i ||d loss_i / ds_i||^2`` (row i of the gradient depends on w_i
    alone). On the fused kernel this gradient was treated as a constant (no graph), silently."""
    device = request.getfixturevalue("kernel_device") if backend == "kernel" else torch.device("cpu")
    s, y = _scores_and_labels(device, batch=4)
    weights = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64, device=device, requires_grad=True)
    loss = losses.NoisedHinge(2, 0.5, 4, backend="triton" if backend == "kernel" else "torch", reduction="none",
                              generator=torch.Generator(device).manual_seed(5))
    gradient = torch.autograd.grad((weights * loss(s, y)).sum(), s, create_graph=True)[0]
    penalty_gradient = torch.autograd.grad(gradient.square().sum(), weights)[0]
    per_example = (gradient.detach() / weights.detach().unsqueeze(-1)).square().sum(-1)
    torch.testing.assert_close(penalty_gradient, 2 * weights.detach() * per_example)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_torch_func_grad_equals_autograd(name):
    """``torch.func.grad`` takes every loss (its autograd functions set their context apart from the forward)."""
    s, y = _scores_and_labels()
    loss = build_loss(name, **TABLE_1[name])
    torch.manual_seed(2)
    expected = torch.autograd.grad(loss(s, y), s)[0]
    torch.manual_seed(2)
    torch.testing.assert_close(torch.func.grad(lambda scores: loss(scores, y))(s.detach()), expected)


def test_nested_torch_func_grad_equals_autograds_second_order():
    """The gradient of a gradient penalty, by ``torch.func.grad`` twice and by autograd (checked above)."""
    s, y = _scores_and_labels(batch=2, n_classes=7)
    loss = losses.SmoothHinge(3, 0.5)
    gradient = torch.autograd.grad(loss(s, y), s, create_graph=True)[0]
    expected = torch.autograd.grad(gradient.square().sum(), s)[0]
    penalty = lambda scores: torch.func.grad(lambda inner: loss(inner, y))(scores).square().sum()  # noqa: E731
    torch.testing.assert_close(torch.func.grad(penalty)(s.detach()), expected)
    assert expected.abs().max() > 1e-3
