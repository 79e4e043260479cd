"""Proposition 3.3 (Garcin et al., ICML 2022): topSigma_{K,eps} is convex, sqrt(K)-Lipschitz, its gradient is
E[arg topSigma_K(s + eps Z)], that gradient is sqrt(KL)/eps-Lipschitz, and topSigma_{K,eps} -> topSigma_K as eps -> 0.

Per-sample statements are exact for the Monte Carlo estimate with common noise (it is an average of
convex, sqrt(K)-Lipschitz functions). Statements about the expectation use the exact quadrature of
:mod:`topk.tests.reference` (no Monte Carlo error), and the Monte Carlo gradient is compared with it at
5 standard errors per coordinate (false-alarm probability below 1e-4 for the whole test).
"""

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

import topk
from topk.tests.reference import ExactPerturbedRanks

problem = st.tuples(st.integers(2, 9), st.integers(0, 2**31 - 1)).flatmap(
    lambda lv: st.tuples(st.just(lv[0]), st.integers(1, lv[0]), st.floats(0.05, 3.0), st.just(lv[1]))
)


def _draw(n_classes, seed, n_samples=8, batch=3):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, n_classes, generator=g, dtype=torch.float64) * 2
    b = torch.randn(batch, n_classes, generator=g, dtype=torch.float64) * 2
    z = torch.randn(n_samples, batch, n_classes, generator=g, dtype=torch.float64)
    return a, b, z


@given(problem, st.floats(0.0, 1.0))
def test_prop_3_3_smoothed_top_sum_is_convex_with_common_noise(params, weight):
    n_classes, k, epsilon, seed = params
    a, b, z = _draw(n_classes, seed)
    f = lambda s: topk.smooth_top_sum_k(s, k, epsilon, z.shape[0], noise=z)  # noqa: E731
    mixed = f(weight * a + (1 - weight) * b)
    assert bool((mixed <= weight * f(a) + (1 - weight) * f(b) + 1e-12).all())


@given(problem)
def test_prop_3_3_smoothed_top_sum_is_sqrt_k_lipschitz(params):
    n_classes, k, epsilon, seed = params
    a, b, z = _draw(n_classes, seed)
    f = lambda s: topk.smooth_top_sum_k(s, k, epsilon, z.shape[0], noise=z)  # noqa: E731
    assert bool(((f(a) - f(b)).abs() <= math.sqrt(k) * (a - b).norm(dim=-1) + 1e-12).all())


def test_prop_3_3_gradient_formula_matches_finite_differences_of_the_expectation():
    """d/ds_j E[topSigma_K(s + eps Z)] = P(j among the K largest of s + eps Z), both sides exact."""
    g = torch.Generator().manual_seed(0)
    for n_classes, k, epsilon in [(3, 1, 0.5), (5, 2, 0.3), (6, 4, 1.0), (8, 3, 0.2)]:
        s = torch.randn(n_classes, generator=g, dtype=torch.float64)
        formula = ExactPerturbedRanks(s, epsilon).grad_top_sum_k(k)
        h = 1e-4
        for j in range(n_classes):
            step = torch.zeros(n_classes, dtype=torch.float64)
            step[j] = h
            difference = (ExactPerturbedRanks(s + step, epsilon).top_sum_k(k)
                          - ExactPerturbedRanks(s - step, epsilon).top_sum_k(k)) / (2 * h)
            assert abs(difference - float(formula[j])) < 1e-6, (n_classes, k, epsilon, j)


def test_prop_3_3_monte_carlo_gradient_estimates_the_expected_arg_top_sum():
    """The autograd gradient (mean of arg topSigma_K one-hots) is within 5 standard errors of the exact gradient."""
    g = torch.Generator().manual_seed(1)
    n_samples = 40000
    for n_classes, k, epsilon in [(4, 2, 0.5), (7, 3, 1.0), (9, 1, 0.3)]:
        s = torch.randn(n_classes, generator=g, dtype=torch.float64).requires_grad_()
        topk.smooth_top_sum_k(s, k, epsilon, n_samples, generator=g).backward()
        exact = ExactPerturbedRanks(s.detach(), epsilon).grad_top_sum_k(k)
        standard_error = (exact * (1 - exact) / n_samples).sqrt()
        assert bool(((s.grad - exact).abs() <= 5 * standard_error + 1e-9).all()), (s.grad, exact)


@given(problem)
def test_prop_3_3_gradient_is_sqrt_kl_over_eps_lipschitz(params):
    n_classes, k, epsilon, seed = params
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n_classes, generator=g, dtype=torch.float64)
    for distance in (1e-2, 0.3, 2.0):
        direction = torch.randn(n_classes, generator=g, dtype=torch.float64)
        b = a + distance * direction / direction.norm()
        ga = ExactPerturbedRanks(a, epsilon, n_grid=4001).grad_top_sum_k(k)
        gb = ExactPerturbedRanks(b, epsilon, n_grid=4001).grad_top_sum_k(k)
        assert (ga - gb).norm() <= math.sqrt(k * n_classes) / epsilon * distance + 1e-6


def test_prop_3_3_smoothed_top_sum_is_strictly_convex_in_expectation():
    g = torch.Generator().manual_seed(2)
    for _ in range(10):
        a, b = torch.randn(2, 5, generator=g, dtype=torch.float64)
        f = lambda s: ExactPerturbedRanks(s, 0.5).top_sum_k(2)  # noqa: E731
        assert f((a + b) / 2) < (f(a) + f(b)) / 2 - 1e-6


def test_prop_3_3_smoothed_top_sum_converges_to_top_sum_as_epsilon_vanishes():
    """With common noise the error is at most eps * sum_j |Z_j| per sample, so it vanishes linearly in eps;
    in expectation 0 <= topSigma_{K,eps} - topSigma_K <= eps K sqrt(2 log L) (Jensen, then the max bound)."""
    g = torch.Generator().manual_seed(3)
    s = torch.randn(4, 50, generator=g, dtype=torch.float64)
    z = torch.randn(16, 4, 50, generator=g, dtype=torch.float64)
    errors = []
    for epsilon in (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-6):
        error = (topk.smooth_top_sum_k(s, 5, epsilon, 16, noise=z) - topk.top_sum_k(s, 5)).abs().max().item()
        assert error <= epsilon * z.abs().sum(-1).max().item() + 1e-12
        errors.append(error)
    assert errors[-1] < 1e-4 and errors == sorted(errors, reverse=True)
    for epsilon in (1.0, 0.3, 0.1):
        s_small = torch.randn(6, generator=g, dtype=torch.float64)
        gap = ExactPerturbedRanks(s_small, epsilon).top_sum_k(3) - topk.top_sum_k(s_small, 3).item()
        assert 0 <= gap <= epsilon * 3 * math.sqrt(2 * math.log(6))
