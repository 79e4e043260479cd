"""Proposition 3.5 (Garcin et al., ICML 2022): |top_{K,eps}(s) - top_K(s)| <= eps K sqrt(2 log L), and
top_{K,eps} is 4 sqrt(KL)/eps-smooth.

For L <= 9 the expectation is computed exactly by quadrature; for L in {100, 1000} it is estimated by
Monte Carlo and the bound is checked on the estimate minus 5 standard errors (one-sided false-alarm
probability 3e-7 per case).
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import topk
from topk.tests.reference import ExactPerturbedRanks

small_problem = st.tuples(st.integers(1, 9), st.integers(0, 2**31 - 1)).flatmap(
    lambda lv: st.tuples(st.just(lv[0]), st.integers(1, lv[0]), st.floats(0.05, 5.0), st.just(lv[1]),
                         st.sampled_from(["spread", "tied", "tight"]))
)


def _scores(n_classes, seed, layout):
    g = torch.Generator().manual_seed(seed)
    if layout == "tied":  # all equal: where smoothing moves top_K the most
        return torch.zeros(n_classes, dtype=torch.float64)
    scale = 3.0 if layout == "spread" else 0.01
    return scale * torch.randn(n_classes, generator=g, dtype=torch.float64)


@given(small_problem)
def test_prop_3_5_approximation_bound_exact_expectation(params):
    n_classes, k, epsilon, seed, layout = params
    s = _scores(n_classes, seed, layout)
    exact = ExactPerturbedRanks(s, epsilon, n_grid=8001).top_k(k)
    bound = epsilon * k * math.sqrt(2 * math.log(n_classes))
    assert abs(exact - topk.top_k(s, k).item()) <= bound + 1e-7


@pytest.mark.slow
def test_prop_3_5_approximation_bound_large_l_monte_carlo():
    g = torch.Generator().manual_seed(0)
    n_samples = 2000
    for n_classes in (100, 1000):
        for k in (1, 5, 50):
            for epsilon in (0.1, 1.0, 10.0):
                s = torch.randn(4, n_classes, generator=g, dtype=torch.float64)
                noise = torch.randn(n_samples, 4, n_classes, generator=g, dtype=torch.float64)
                per_sample = torch.topk(s + epsilon * noise, k, dim=-1).values[..., -1] - topk.top_k(s, k)
                mean, standard_error = per_sample.mean(0), per_sample.std(0) / math.sqrt(n_samples)
                torch.testing.assert_close(mean, topk.smooth_top_k(s, k, epsilon, n_samples, noise=noise) - topk.top_k(s, k))
                bound = epsilon * k * math.sqrt(2 * math.log(n_classes))
                assert bool((mean.abs() - 5 * standard_error <= bound).all()), (n_classes, k, epsilon)


@given(small_problem)
def test_prop_3_5_smoothed_top_k_is_4_sqrt_kl_over_eps_smooth(params):
    n_classes, k, epsilon, seed, layout = params
    a = _scores(n_classes, seed, layout)
    g = torch.Generator().manual_seed(seed + 1)
    for distance in (1e-2, 0.5):
        direction = torch.randn(n_classes, generator=g, dtype=torch.float64)
        b = a + distance * direction / direction.norm()
        ga = ExactPerturbedRanks(a, epsilon, n_grid=4001).grad_top_k(k)
        gb = ExactPerturbedRanks(b, epsilon, n_grid=4001).grad_top_k(k)
        assert (ga - gb).norm() <= 4 * math.sqrt(k * n_classes) / epsilon * distance + 1e-6


def test_definition_3_4_smoothed_top_k_is_the_difference_of_smoothed_sums_with_common_noise():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(5, 30, generator=g, dtype=torch.float64)
    z = torch.randn(7, 5, 30, generator=g, dtype=torch.float64)
    for k in (1, 2, 10, 30):
        previous = topk.smooth_top_sum_k(s, k - 1, 0.5, 7, noise=z) if k > 1 else torch.zeros(5, dtype=torch.float64)
        torch.testing.assert_close(topk.smooth_top_k(s, k, 0.5, 7, noise=z),
                                   topk.smooth_top_sum_k(s, k, 0.5, 7, noise=z) - previous)
