"""The fast operators against the loop reference and the published pytopk; dtypes, shapes, devices,
chunking, reproducibility, NaN propagation and torch.compile."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import topk
from topk.losses import class_margins, noised_hinge
from topk.tests.optional import require
from topk.tests.reference import loop_smooth_top

shapes = st.tuples(st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(1, 12))


@given(shapes, st.integers(1, 6), st.floats(0.0, 2.0), st.booleans(), st.integers(0, 2**31 - 1))
def test_fast_estimator_matches_the_loop_reference(shape, n_samples, epsilon, kth_only, seed):
    batch_shape, n_classes = shape
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*batch_shape, n_classes, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(n_samples, *batch_shape, n_classes, generator=g, dtype=torch.float64)
    k = 1 + seed % n_classes
    operator = topk.smooth_top_k if kth_only else topk.smooth_top_sum_k
    value = operator(s, k, epsilon, n_samples, noise=z)
    value.sum().backward()
    expected_value, expected_grad = loop_smooth_top(s, k, epsilon, z, kth_only)
    torch.testing.assert_close(value, expected_value, rtol=0, atol=1e-12)
    torch.testing.assert_close(s.grad, expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_noised_losses_agree_with_published_pytopk_given_the_same_noise(dtype):
    """pytopk (the authors' package) takes noise of shape (batch, L, B); ours (B, batch, L)."""
    pytopk_functional = require("pytopk.functional")
    pytopk_operator = require("pytopk.noised_topk")._noised_topk
    g = torch.Generator().manual_seed(0)
    batch, n_classes, n_samples, k, epsilon = 16, 50, 10, 5, 0.3
    s_theirs = torch.randn(batch, n_classes, generator=g, dtype=dtype, requires_grad=True)
    s_ours = s_theirs.detach().clone().requires_grad_()
    y = torch.randint(0, n_classes, (batch,), generator=g)
    z_theirs = torch.randn(batch, n_classes, n_samples, generator=g, dtype=dtype)
    z_ours = z_theirs.permute(2, 0, 1).contiguous()  # [batch, L, B] -> [B, batch, L]

    theirs = pytopk_functional.bal_noised_topk_loss(s_theirs, y, k, epsilon, pytopk_operator, z_theirs)
    ours = noised_hinge(s_ours, y, k, epsilon, n_samples, noise=z_ours)
    theirs.backward(), ours.backward()
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(s_ours.grad, s_theirs.grad.to(dtype))

    counts = [500, 100, 20, 5, 1] * 10
    margins = class_margins(torch.tensor(counts), 0.5).to(dtype)
    s_theirs.grad, s_ours.grad = None, None
    theirs = pytopk_functional.imbal_noised_topk_loss(s_theirs, y, k, margins, epsilon, pytopk_operator, z_theirs, 50.0)
    ours = noised_hinge(s_ours, y, k, epsilon, n_samples, margins=margins, scale=50.0, noise=z_ours)  # their default
    theirs.backward(), ours.backward()
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(s_ours.grad, s_theirs.grad.to(dtype))


def test_margins_match_pytopk_imbalanced_loss():
    pytopk = require("pytopk")
    counts = [1000, 300, 40, 7, 1]
    theirs = pytopk.ImbalNoisedTopK(k=1, epsilon=1.0, max_m=0.4, cls_num_list=counts).m_list
    torch.testing.assert_close(class_margins(counts, 0.4), theirs.to(torch.get_default_dtype()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_floating_dtype_and_batch_shape(dtype, device):
    g = torch.Generator(device=device).manual_seed(0)
    for shape in [(7,), (3, 7), (2, 3, 7)]:
        s = torch.randn(shape, device=device, generator=g).to(dtype).requires_grad_()
        for operator in (topk.smooth_top_k, topk.smooth_top_sum_k):
            value = operator(s, 2, 0.5, 5, generator=g)
            assert value.shape == shape[:-1] and value.dtype == dtype and value.device == s.device
            value.sum().backward()
            assert s.grad.dtype == dtype and torch.isfinite(s.grad).all()
            s.grad = None


def test_chunking_over_samples_gives_the_same_result(device):
    g = torch.Generator(device=device).manual_seed(0)
    s = torch.randn(4, 100, device=device, dtype=torch.float64, generator=g)
    z = torch.randn(9, 4, 100, device=device, dtype=torch.float64, generator=g)
    results = []
    for chunk in (1, 2, 4, 9, None):
        x = s.clone().requires_grad_()
        value = topk.smooth_top_k(x, 3, 0.7, 9, noise=z, samples_per_chunk=chunk)
        value.sum().backward()
        results.append((value, x.grad))
    for value, grad in results[1:]:
        torch.testing.assert_close(value, results[0][0], rtol=0, atol=1e-12)
        assert torch.equal(grad, results[0][1])


def test_large_l_runs_one_sample_at_a_time():
    """L = 100,000: the automatic chunk holds one sample of 8 x 100,000 scores (O(batch x L) memory)."""
    s = torch.randn(8, 100_000, requires_grad=True)
    value = topk.smooth_top_k(s, 6, 1.0, 10, generator=torch.Generator().manual_seed(0))
    value.sum().backward()
    assert torch.allclose(s.grad.sum(-1), torch.ones(8))
    assert s.numel() * 10 > topk.operators.CHUNK_ELEMENTS  # the chunking path was taken


def test_same_generator_seed_same_noise_different_seed_different_noise(device):
    s = torch.randn(4, 30, device=device)
    draw = lambda seed: topk.smooth_top_k(s, 2, 1.0, 5, generator=torch.Generator(device=device).manual_seed(seed))  # noqa: E731
    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))


def test_global_rng_is_used_without_generator():
    s = torch.randn(4, 30)
    torch.manual_seed(5)
    a = topk.smooth_top_k(s, 2, 1.0, 5)
    torch.manual_seed(5)
    assert torch.equal(a, topk.smooth_top_k(s, 2, 1.0, 5))


def test_nan_score_gives_nan_for_its_row_only():
    s = torch.randn(3, 10)
    s[1, 4] = float("nan")
    y = torch.tensor([0, 1, 2])
    for value in (topk.top_k(s, 3), topk.top_sum_k(s, 3), topk.smooth_top_k(s, 3, 0.5, 4),
                  topk.smooth_top_sum_k(s, 3, 0.5, 4), noised_hinge(s, y, 2, 0.5, 4, reduction="none")):
        assert torch.isnan(value[1]) and torch.isfinite(value[[0, 2]]).all()


def test_usable_under_torch_compile():
    s = torch.randn(4, 20, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 20, (4,))
    z = torch.randn(3, 4, 20, dtype=torch.float64)
    eager = noised_hinge(s, y, 2, 0.5, 3, noise=z)
    (eager_grad,) = torch.autograd.grad(eager, s)
    compiled = torch.compile(lambda a: noised_hinge(a, y, 2, 0.5, 3, noise=z), backend="aot_eager", fullgraph=False)
    value = compiled(s)
    (grad,) = torch.autograd.grad(value, s)
    torch.testing.assert_close(value, eager)
    torch.testing.assert_close(grad, eager_grad)
    drawn = torch.compile(lambda a: topk.smooth_top_k(a, 2, 0.5, 3), backend="aot_eager")(s)
    assert drawn.shape == (4,)
