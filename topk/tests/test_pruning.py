"""Exact candidate pruning of the PyTorch path (:mod:`topk._bounded_noise`): with noise bounded by Z_MAX, the classes
below ``s_[k] - 2 eps Z_MAX`` can never reach the perturbed top-k, so drawing noise for the others only changes
nothing. Checked given the noise (pruned against unpruned, bit for bit), and shown able to fail."""

import pytest
import torch

import topk
from topk import _bounded_noise, _ops

SCALES = (1.0, 5.0, 20.0)  # N(0, 1) scores, and a trained network's spread


def _scores(scale, shape=(4, 3, 300), dtype=torch.float64):
    generator = torch.Generator().manual_seed(int(scale))
    return scale * torch.randn(shape, dtype=dtype, generator=generator)


def _pruned_and_unpruned(s, k, epsilon, sum_top, samples_per_chunk=0, n_samples=6):
    generator = torch.Generator().manual_seed(1)
    noise = torch.randn((n_samples, *s.shape), dtype=s.dtype, generator=generator)

    def draw(start, stop, found):  # the full noise's draws at the candidates
        part = noise[start:stop].reshape(stop - start, -1)
        return part.clone() if found is None else part[:, found.flat]

    pruned = _ops.pruned_top_of_perturbed(s, k, epsilon, n_samples, sum_top, samples_per_chunk, draw)
    return pruned, _ops._top_of_perturbed(s, noise, k, epsilon, sum_top), noise


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("k, epsilon", [(1, 0.2), (6, 0.2), (6, 0.01), (51, 0.2), (6, 1.0)])
@pytest.mark.parametrize("sum_top", [False, True])
def test_pruned_equals_unpruned_given_the_noise(scale, k, epsilon, sum_top):
    (value, positions), (expected_value, expected_positions), _ = _pruned_and_unpruned(_scores(scale), k, epsilon, sum_top)
    assert torch.equal(value, expected_value)
    if sum_top:  # the same set of k columns, listed in the perturbed values' order
        assert torch.equal(positions.sort(-1).values, expected_positions.sort(-1).values)
    else:
        assert torch.equal(positions, expected_positions)


def test_pruned_equals_unpruned_when_the_samples_come_in_chunks():
    s = _scores(5.0)
    (value, positions), (expected_value, expected_positions), _ = _pruned_and_unpruned(s, 6, 0.2, False, samples_per_chunk=4)
    torch.testing.assert_close(value, expected_value, rtol=1e-15, atol=0)  # chunk means are recombined
    assert torch.equal(positions, expected_positions)


def test_a_threshold_set_too_tight_is_detected(monkeypatch):
    """With the bound wrongly taken as Z_MAX = 0.5, classes that can still reach the top are dropped: the comparison
    of the test above fails. (Real draws exceed 0.5 in 62% of cases.)"""
    monkeypatch.setattr(_bounded_noise, "Z_MAX", 0.5)
    (value, _), (expected_value, _), _ = _pruned_and_unpruned(_scores(5.0), 6, 0.2, False)
    assert not torch.equal(value, expected_value)


def test_trained_network_logits_leave_a_few_candidates():
    """N(0, 5^2) logits over 1,000 classes, k = K + 1 = 6, the paper's eps = 0.2 on CIFAR-100: a small fraction of the
    classes get noise, and every class left out is below the bound."""
    s = _scores(5.0, shape=(128, 1000), dtype=torch.float32)
    found = _bounded_noise.candidates(s, 6, 0.2)
    assert found is not None and found.width < 100 and found.flat.numel() < 128 * 50
    kth = torch.topk(s, 6, dim=-1).values[:, -1:]
    outside = torch.ones(s.numel(), dtype=torch.bool).index_fill_(0, found.flat, False).view(s.shape)
    assert (s[outside] < (kth - 2 * 0.2 * _bounded_noise.Z_MAX).expand_as(s)[outside]).all()


def test_candidates_fill_the_first_slots_of_their_row():
    s = torch.tensor([[0.0, 9.0, -9.0, 8.0, 7.0], [5.0, -9.0, -9.0, -9.0, -9.0]])
    found = _bounded_noise.candidates(s, 1, 0.1)  # bound 2 x 0.1 x 5.68 = 1.14 below each row's top
    assert found is not None and found.width == 2 and found.flat.tolist() == [1, 3, 5]
    assert found.columns().tolist() == [[1, 3], [0, 0]]  # row 1 has one candidate; its second slot is padding


def test_nan_scores_and_undefined_thresholds_are_candidates():
    s = torch.tensor([[float("nan"), 9.0, -9.0, -9.0, -9.0, -9.0], [float("inf"), float("inf"), 0.0, -9.0, -9.0, -9.0]])
    assert _bounded_noise.candidates(s, 2, 0.1) is None  # row 2's threshold is inf - inf: every class is a candidate
    found = _bounded_noise.candidates(s[:1], 2, 0.1)  # the second largest is 9: the bound is 7.86
    assert found is not None and found.flat.tolist() == [0, 1]  # the NaN and the 9


def test_no_pruning_where_most_classes_are_candidates():
    assert _bounded_noise.candidates(_scores(1.0).reshape(-1, 300), 6, 1.0) is None  # all within 2 eps Z_MAX


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_half_precision_scores_prune_with_their_rounding_slack(dtype):
    """``s + eps z`` rounded in a half dtype can move by more than float32's slack: the threshold widens with it, so
    the pruned estimate still equals the unpruned one given the noise. (Ties are frequent in 8 bits of mantissa: the
    two may pick different columns holding the same perturbed value.)"""
    s = _scores(5.0, dtype=dtype)
    (value, positions), (expected_value, expected_positions), noise = _pruned_and_unpruned(s, 6, 0.2, False)
    perturbed = (noise * 0.2).add_(s)
    assert torch.equal(value, expected_value)
    assert torch.equal(perturbed.gather(-1, positions), perturbed.gather(-1, expected_positions))


def test_the_default_cpu_path_draws_bounded_noise_reproducibly_from_the_generator():
    s = _scores(5.0, dtype=torch.float32)
    values = [topk.smooth_top_k(s, 6, 0.2, 10, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(*values)
    other = topk.smooth_top_k(s, 6, 0.2, 10, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(values[0], other)
    assert (values[0] - topk.top_k(s, 6)).abs().max() <= 0.2 * 6 * (2 * torch.log(torch.tensor(300.0))).sqrt()
