"""The CPU kernel (:mod:`topk._cpu_kernel`): its exact pruning, checked against the unpruned PyTorch path given the
very draws the kernel makes (bit for bit), and shown able to fail; its noise, checked to be standard normal."""

import math

import numba
import numpy as np
import pytest
import torch

import topk
from topk import _bounded_noise, _cpu_kernel, _ops

SCALES = (1.0, 5.0, 20.0)  # N(0, 1) scores, and a trained network's spread
SEED = 11


def _scores(scale, shape=(4, 3, 300), dtype=torch.float64):
    generator = torch.Generator().manual_seed(int(scale))
    return scale * torch.randn(shape, dtype=dtype, generator=generator)


def _kernel_and_unpruned(s, k, epsilon, sum_top, n_samples=6):
    """The kernel's estimate (through its operator), and the PyTorch path's on every class with the kernel's draws."""
    kernel = _ops.pruned_perturbed_top(s, torch.tensor([SEED]), k, epsilon, n_samples, sum_top, None)
    noise = _cpu_kernel.normals(SEED, (n_samples, *s.shape), s.dtype)
    return kernel, _ops.perturbed_top(s, noise, k, epsilon, sum_top, None), noise


def _assert_same_selection(kernel, unpruned, sum_top, perturbed):
    (value, positions), (expected_value, expected_positions) = kernel, unpruned
    if sum_top:  # the same set of k columns; the kernel sums them in float64, PyTorch in the scores' dtype
        assert torch.equal(positions.sort(-1).values, expected_positions.sort(-1).values)
        n_samples, k = positions.shape[0], positions.shape[-1]  # a sum's rounding: (terms) eps (sum of |terms|)
        rounding = (k + n_samples) * torch.finfo(value.dtype).eps * k * perturbed.abs().max()
        torch.testing.assert_close(value, expected_value, rtol=0, atol=rounding)
    else:
        assert torch.equal(value, expected_value) and torch.equal(positions, expected_positions)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("k, epsilon", [(1, 0.2), (6, 0.2), (6, 0.01), (51, 0.2), (6, 1.0), (300, 0.2)])
@pytest.mark.parametrize("sum_top", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_kernel_equals_the_unpruned_estimate_given_its_draws(scale, k, epsilon, sum_top, dtype):
    s = _scores(scale, dtype=dtype)
    kernel, unpruned, noise = _kernel_and_unpruned(s, k, epsilon, sum_top)
    _assert_same_selection(kernel, unpruned, sum_top, (noise * epsilon).add_(s))


def test_a_pruning_bound_set_too_tight_is_detected(monkeypatch):
    """With the bound wrongly taken as Z_MAX = 0.5 (the draws themselves unchanged), classes that can still reach the
    top get no draw: the comparison of the test above fails. (Real draws exceed 0.5 in 62% of cases.)"""
    monkeypatch.setattr(_cpu_kernel, "Z_MAX", 0.5)
    (value, _), (expected_value, _), _ = _kernel_and_unpruned(_scores(5.0), 6, 0.2, False)
    assert not torch.equal(value, expected_value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores_are_computed_in_float32(dtype):
    s = _scores(5.0, dtype=dtype)
    (value, positions), _, _ = _kernel_and_unpruned(s, 6, 0.2, False)
    (expected_value, expected_positions), _, _ = _kernel_and_unpruned(s.float(), 6, 0.2, False)
    assert value.dtype == dtype and torch.equal(value, expected_value.to(dtype))
    assert torch.equal(positions, expected_positions)


def test_rows_split_over_threads_give_the_same_result(monkeypatch):
    s = _scores(5.0, shape=(37, 300), dtype=torch.float32)
    alone = _cpu_kernel.perturbed_top(s, SEED, 6, 0.2, 5, True)
    monkeypatch.setattr(_cpu_kernel, "MIN_WORK_PER_THREAD", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = _cpu_kernel.perturbed_top(s, SEED, 6, 0.2, 5, True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone[0], split[0]) and torch.equal(alone[1], split[1])


def test_a_nan_row_gives_nan_and_infinite_scores_are_ranked():
    s = _scores(5.0, shape=(4, 300), dtype=torch.float32)
    s[1, 7] = float("nan")
    s[2, 3] = float("inf")
    s[3] = float("-inf")
    s[3, 5] = 2.0
    value, positions = _ops.pruned_perturbed_top(s, torch.tensor([SEED]), 1, 0.2, 4, False, None)
    assert value[0].isfinite() and value[1].isnan()
    assert value[2] == float("inf") and (positions[:, 2] == 3).all()
    assert abs(value[3] - 2.0) <= 0.2 * _bounded_noise.Z_MAX and (positions[:, 3] == 5).all()


def test_the_noise_is_standard_normal_and_bounded():
    """One million draws: the Kolmogorov-Smirnov distance to N(0, 1) below its 0.1% critical value (1.95 / sqrt(n)),
    and the tail beyond the Ziggurat's edge (drawn by another method) as frequent as it should be, within 5 sigma."""
    z = _cpu_kernel.normals(3, (1_000_000,), torch.float64)
    n = z.numel()
    cdf = torch.special.ndtr(z.sort().values)
    rank = torch.arange(1, n + 1, dtype=torch.float64)
    assert torch.maximum(rank / n - cdf, cdf - (rank - 1) / n).max() < 1.95 / math.sqrt(n)
    tail = 2 * torch.special.ndtr(torch.tensor(-_cpu_kernel._TAIL_EDGE, dtype=torch.float64)).item()
    assert abs((z.abs() > _cpu_kernel._TAIL_EDGE).sum().item() - n * tail) < 5 * math.sqrt(n * tail)
    assert z.abs().max() <= _bounded_noise.Z_MAX


def test_a_draw_depends_on_its_seed_and_position_only():
    draws = _cpu_kernel.normals(5, (2, 3, 4))
    assert torch.equal(draws.reshape(-1)[:10], _cpu_kernel.normals(5, (10,)))
    assert not torch.equal(draws, _cpu_kernel.normals(6, (2, 3, 4)))
    assert draws.reshape(-1).unique().numel() == draws.numel()


def test_the_kernel_compiles_where_no_cache_can_be_written(monkeypatch):
    """A read-only installation without a writable home: Numba finds no cache location, and the kernel is compiled
    without one instead of failing at import."""
    caching = pytest.importorskip("numba.core.caching")
    if not hasattr(caching.CacheImpl, "_locator_classes"):
        pytest.skip("this Numba lists its cache locations elsewhere")
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    with pytest.raises(RuntimeError, match="no locator"):
        numba.njit(cache=True)(_cpu_kernel._fill_normals.py_func)
    fill = _cpu_kernel._compiled(_cpu_kernel._fill_normals.py_func)
    out = np.empty(5)
    fill(_cpu_kernel._key(SEED), out)
    assert torch.equal(torch.from_numpy(out), _cpu_kernel.normals(SEED, (5,), torch.float64))


def test_the_default_cpu_path_draws_bounded_noise_reproducibly_from_the_generator():
    s = _scores(5.0, dtype=torch.float32)
    values = [topk.smooth_top_k(s, 6, 0.2, 10, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(*values)
    other = topk.smooth_top_k(s, 6, 0.2, 10, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(values[0], other)
    assert (values[0] - topk.top_k(s, 6)).abs().max() <= 0.2 * 6 * (2 * torch.log(torch.tensor(300.0))).sqrt()
