"""``torch.func``'s transforms over every loss: ``vmap`` (the batching rules of :mod:`topk._batching`), ``jacrev``, and
forward mode (``jvp``, ``jacfwd``, Hessians by forward over reverse).

The reference for a vmapped call is the same function called on each element in turn. With ``randomness="same"``
every element draws the noise that one call draws from the same seed, so the noised losses are compared exactly as
well; ``randomness="different"`` gives each element its own noise.
"""

import pytest
import torch

import topk
from topk import elementary_symmetric, losses
from topk.losses import build_loss
from topk.tests.test_graph_capture import KERNEL_LOSSES, TABLE_1

LOSSES = sorted(TABLE_1)
DIFFERENTIABLE = sorted(set(TABLE_1) - {"zero_one"})
SEED = 11


def _data(device=torch.device("cpu"), elements=4, rows=3, n_classes=12):
    generator = torch.Generator().manual_seed(0)
    s = torch.randn(elements, rows, n_classes, generator=generator, dtype=torch.float64)
    y = torch.randint(0, n_classes, (elements, rows), generator=generator)
    return s.to(device), y.to(device)


def _element_by_element(function, *batched):
    """``function`` called on each element of the batched arguments, from the same seed each time."""
    outputs = []
    for v in range(batched[0].shape[0]):
        torch.manual_seed(SEED)
        outputs.append(function(*(argument[v] for argument in batched)))
    return torch.stack(outputs)


def _vmapped(function, *batched, randomness="same", **vmap_arguments):
    torch.manual_seed(SEED)
    return torch.func.vmap(function, randomness=randomness, **vmap_arguments)(*batched)


@pytest.mark.parametrize("name", LOSSES)
def test_vmap_equals_each_element_called_alone(name):
    s, y = _data()
    loss = build_loss(name, **TABLE_1[name], reduction="none")
    torch.testing.assert_close(_vmapped(loss, s, y), _element_by_element(loss, s, y), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_per_sample_gradients_by_vmap_of_grad_equal_autograds(name):
    """The per-sample gradients of a linear model's weights (``vmap(grad(f))``, one sample per element), against
    autograd on each sample."""
    s, y = _data(elements=5, rows=1)
    features = s[..., :6]  # [samples, 1, 6]
    weights = torch.randn(6, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss = build_loss(name, **TABLE_1[name])
    sample_loss = lambda w, x, label: loss(x @ w, label)  # noqa: E731
    expected = _element_by_element(lambda x, label: torch.autograd.grad(
        sample_loss(weights.requires_grad_(), x, label), weights)[0], features, y)
    per_sample = _vmapped(torch.func.grad(sample_loss), weights.detach(), features, y, in_dims=(None, 0, 0))
    torch.testing.assert_close(per_sample, expected)
    assert per_sample.abs().amax((1, 2)).min() > 0  # every sample has a gradient: the comparison is not of zeros


@pytest.mark.parametrize("name", LOSSES)
def test_an_ensemble_by_vmap_over_stacked_weights_equals_each_member_alone(name):
    """Three linear models' weights stacked and vmapped over, on one shared batch (its labels are not vmapped)."""
    s, y = _data(elements=1, rows=5)
    features, labels = s[0, :, :6], y[0]
    members = torch.randn(3, 6, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss = build_loss(name, **TABLE_1[name], reduction="none")
    member_loss = lambda w: loss(features @ w, labels)  # noqa: E731
    torch.testing.assert_close(_vmapped(member_loss, members), _element_by_element(member_loss, members))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_jacrev_holds_each_rows_gradient_on_its_diagonal(name):
    """``jacrev`` of the per-row losses (a vmap over the backward): row i's loss depends on row i's scores alone."""
    s, y = _data(elements=1, rows=4)
    s, y = s[0], y[0]
    loss = build_loss(name, **TABLE_1[name], reduction="none")
    torch.manual_seed(SEED)
    jacobian = torch.func.jacrev(lambda scores: loss(scores, y))(s)  # [rows, rows, L]
    torch.manual_seed(SEED)
    scores = s.clone().requires_grad_()
    row_gradients = torch.autograd.grad(loss(scores, y).sum(), scores)[0]
    torch.testing.assert_close(torch.einsum("iij->ij", jacobian), row_gradients)
    assert (jacobian * (1 - torch.eye(4, dtype=s.dtype))[..., None]).abs().max() == 0


def test_jacrev_of_jacrev_is_the_smoothed_hinges_hessian():
    s, y = _data(elements=1, rows=2, n_classes=7)
    s, y = s[0], y[0]
    loss = losses.SmoothHinge(3, 0.5)
    hessian = torch.func.jacrev(torch.func.jacrev(lambda scores: loss(scores, y)))(s)  # [2, 7, 2, 7]
    scores = s.clone().requires_grad_()
    gradient = torch.autograd.grad(loss(scores, y), scores, create_graph=True)[0].flatten()
    rows = [torch.autograd.grad(entry, scores, retain_graph=True)[0] for entry in gradient]
    torch.testing.assert_close(hessian.flatten(0, 1), torch.stack(rows))
    assert hessian.abs().max() > 1e-3


@KERNEL_LOSSES
def test_kernel_backends_under_vmap_of_grad_equal_each_element_alone(make_loss, kernel_device):
    s, y = _data(kernel_device, elements=3, rows=2)
    loss = make_loss("triton")
    gradient = torch.func.grad(lambda scores, labels: loss(scores, labels))
    torch.testing.assert_close(_vmapped(gradient, s, y), _element_by_element(gradient, s, y))


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_randomness_different_draws_noise_apart_and_same_shares_it(backend, request):
    """Four copies of one batch: with ``"same"`` they see one noise and agree; with ``"different"`` each draws its own,
    and the per-element gradients, each a mean of one-hots minus ``e_y`` (Eq. 12), still sum to 0 over the classes."""
    device = request.getfixturevalue("kernel_device") if backend == "kernel" else torch.device("cpu")
    s, y = _data(device, elements=1, rows=3)
    s, y = s.expand(4, -1, -1), y.expand(4, -1)
    loss = losses.NoisedHinge(2, 2.0, 3, margins=10.0, backend="triton" if backend == "kernel" else "torch")
    same = _vmapped(loss, s, y, randomness="same")
    assert (same == same[0]).all()
    different = _vmapped(torch.func.grad(loss), s, y, randomness="different")  # [4, rows, L]
    assert len({tuple(element.flatten().tolist()) for element in different}) == 4
    torch.testing.assert_close(different.sum(-1), torch.zeros(4, 3, dtype=s.dtype, device=device))


def test_vmaps_default_randomness_refuses_to_draw_the_noise():
    s, y = _data()
    with pytest.raises(RuntimeError, match="randomness"):
        torch.func.vmap(losses.NoisedHinge(2, 0.5, 4))(s, y)


@pytest.mark.parametrize("noise_dim", [0, None], ids=["noise-per-element", "noise-shared"])
@pytest.mark.parametrize("operator", [topk.smooth_top_k, topk.smooth_top_sum_k])
def test_explicit_noise_is_used_as_given_under_vmap(operator, noise_dim):
    """Explicit noise vmapped with the scores, or shared by every element (``in_dims=None``): the PyTorch path."""
    s, _ = _data()
    noise = torch.randn(4, 5, *s.shape[1:], generator=torch.Generator().manual_seed(3), dtype=s.dtype)
    shared = noise[0]
    call = lambda scores, z: operator(scores, 2, 0.5, 5, noise=z)  # noqa: E731
    given = noise if noise_dim == 0 else shared
    expected = _element_by_element(call, s, noise if noise_dim == 0 else shared.expand(4, *shared.shape))
    torch.testing.assert_close(torch.func.vmap(call, in_dims=(0, noise_dim))(s, given), expected)


def test_an_out_of_range_label_under_vmap_is_named():
    s, y = _data()
    y[2, 1] = 12
    with pytest.raises(ValueError, match=r"\[0, 11\], got 12"):
        torch.func.vmap(losses.CalibratedHinge(2))(s, y)


def _jvp_against_autograd(function, s):
    """The forward-mode derivative of ``function`` (per-row values) at ``s`` along a tangent, and the row gradients
    dotted with that tangent, both from the same seed."""
    tangent = torch.randn(s.shape, generator=torch.Generator().manual_seed(2), dtype=s.dtype).to(s.device)
    torch.manual_seed(SEED)
    _, forward = torch.func.jvp(function, (s,), (tangent,))
    torch.manual_seed(SEED)
    scores = s.clone().requires_grad_()
    return forward, (torch.autograd.grad(function(scores).sum(), scores)[0] * tangent).sum(-1)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_forward_mode_is_the_gradient_dotted_with_the_tangent(name):
    s, y = _data(elements=1, rows=3)
    loss = build_loss(name, **TABLE_1[name], reduction="none")
    torch.testing.assert_close(*_jvp_against_autograd(lambda scores: loss(scores, y[0]), s[0]))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_forward_over_reverse_hessian_equals_reverse_over_reverse(name):
    """``jacfwd(jacrev(f))``, ``torch.func.hessian``'s recipe (with the noise drawn once: ``randomness="same"``)."""
    s, y = _data(elements=1, rows=2, n_classes=7)
    loss = build_loss(name, **{**TABLE_1[name], **({"class_counts": list(range(1, 8))} if "class_counts" in
                                                  TABLE_1[name] else {})})
    total = lambda scores: loss(scores, y[0])  # noqa: E731
    torch.manual_seed(SEED)
    forward_over_reverse = torch.func.jacfwd(torch.func.jacrev(total), randomness="same")(s[0])
    torch.manual_seed(SEED)
    torch.testing.assert_close(forward_over_reverse, torch.func.jacrev(torch.func.jacrev(total))(s[0]))


@KERNEL_LOSSES
def test_kernel_backends_in_forward_mode(make_loss, kernel_device):
    s, y = _data(kernel_device, elements=1, rows=3)
    loss = make_loss("triton")
    loss.reduction = "none"
    torch.testing.assert_close(*_jvp_against_autograd(lambda scores: loss(scores, y[0]), s[0]))
    total = lambda scores: loss(scores, y[0]).sum()  # noqa: E731
    torch.manual_seed(SEED)
    forward_over_reverse = torch.func.jacfwd(torch.func.jacrev(total), randomness="same")(s[0])
    torch.manual_seed(SEED)
    torch.testing.assert_close(forward_over_reverse, torch.func.jacrev(torch.func.jacrev(total))(s[0]))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_elementary_symmetric_pair_in_forward_mode(backend, kernel_device):
    device = kernel_device if backend == "triton" else torch.device("cpu")
    x = torch.randn(3, 9, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(device)
    pair = lambda rows: elementary_symmetric.log_elementary_symmetric_pair(rows, 4, backend=backend)  # noqa: E731
    tangent = torch.randn_like(x)
    _, forward = torch.func.jvp(pair, (x,), (tangent,))
    reverse = torch.func.jacrev(pair)(x)  # [3, 2, 3, 9]
    torch.testing.assert_close(forward, torch.einsum("ijkl,kl->ij", reverse, tangent))
