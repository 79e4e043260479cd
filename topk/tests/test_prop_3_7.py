"""Proposition 3.7 (Garcin et al., ICML 2022): the gradient of the noised hinge loss is
1{1 + top_{K+1,eps}(s) >= s_y} (grad top_{K+1,eps}(s) - e_y); eps = 0 gives the calibrated hinge of
Yang & Koyejo (2020) exactly; gradient rows of the operator sum to 1 and of the loss to 0."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import topk
from topk.losses import calibrated_hinge, noised_hinge
from topk.tests.reference import ExactPerturbedRanks, loop_smooth_top

case = st.tuples(st.integers(2, 40), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))


def _inputs(n_classes, batch, seed, n_samples=4):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(batch, n_classes, generator=g, dtype=torch.float64) * 2).requires_grad_()
    y = torch.randint(0, n_classes, (batch,), generator=g)
    z = torch.randn(n_samples, batch, n_classes, generator=g, dtype=torch.float64)
    return s, y, z


@given(case, st.floats(0.01, 3.0))
def test_prop_3_7_noised_hinge_gradient_is_eq_12(params, epsilon):
    """Autograd gradient of Eq. 10 equals Eq. 12 built from the loop reference of the estimator."""
    n_classes, batch, n_samples, seed = params
    s, y, z = _inputs(n_classes, batch, seed, n_samples)
    k = min(3, n_classes - 1)
    noised_hinge(s, y, k, epsilon, n_samples, noise=z, reduction="sum").backward()
    smoothed, grad_smoothed = loop_smooth_top(s, k + 1, epsilon, z, kth_only=True)
    true_scores = s.detach().gather(1, y[:, None])[:, 0]
    active = (1 + smoothed > true_scores).double().unsqueeze(1)
    expected = active * (grad_smoothed - torch.nn.functional.one_hot(y, n_classes).double())
    torch.testing.assert_close(s.grad, expected, rtol=0, atol=1e-12)


@given(case)
def test_prop_3_7_eps_zero_is_the_calibrated_hinge(params):
    n_classes, batch, _, seed = params
    s, y, _ = _inputs(n_classes, batch, seed)
    s2 = s.detach().clone().requires_grad_()
    k = min(2, n_classes - 1)
    a = noised_hinge(s, y, k, 0.0, 3, reduction="none")
    b = calibrated_hinge(s2, y, k, reduction="none")
    assert torch.equal(a, b)
    a.sum().backward()
    b.sum().backward()
    assert torch.equal(s.grad, s2.grad)


@given(case, st.floats(0.01, 3.0))
def test_prop_3_7_gradient_rows_sum_to_one_for_the_operator_and_zero_for_the_loss(params, epsilon):
    n_classes, batch, n_samples, seed = params
    s, y, z = _inputs(n_classes, batch, seed, n_samples)
    k = min(3, n_classes - 1)
    topk.smooth_top_k(s, k, epsilon, n_samples, noise=z).sum().backward()
    torch.testing.assert_close(s.grad.sum(-1), torch.ones(batch, dtype=torch.float64))
    s.grad = None
    topk.smooth_top_sum_k(s, k, epsilon, n_samples, noise=z).sum().backward()
    torch.testing.assert_close(s.grad.sum(-1), torch.full((batch,), float(k), dtype=torch.float64))
    s.grad = None
    noised_hinge(s, y, k, epsilon, n_samples, noise=z, reduction="sum").backward()
    torch.testing.assert_close(s.grad.sum(-1), torch.zeros(batch, dtype=torch.float64), rtol=0, atol=1e-12)


def test_prop_3_7_expected_loss_gradient_matches_finite_differences():
    """For the exact (expected) loss (1 + top_{K+1,eps}(s) - s_y)_+, Eq. 9 against central differences."""
    g = torch.Generator().manual_seed(4)
    for n_classes, k, epsilon, y in [(4, 1, 0.5, 0), (6, 2, 1.0, 3), (8, 3, 0.3, 7)]:
        s = torch.randn(n_classes, generator=g, dtype=torch.float64)
        exact = ExactPerturbedRanks(s, epsilon)
        loss = lambda v: max(0.0, 1 + ExactPerturbedRanks(v, epsilon).top_k(k + 1) - v[y].item())  # noqa: E731
        active = float(1 + exact.top_k(k + 1) >= s[y].item())
        formula = active * (exact.grad_top_k(k + 1) - torch.nn.functional.one_hot(torch.tensor(y), n_classes).double())
        h = 1e-4
        for j in range(n_classes):
            step = torch.zeros(n_classes, dtype=torch.float64)
            step[j] = h
            assert abs((loss(s + step) - loss(s - step)) / (2 * h) - float(formula[j])) < 1e-6
