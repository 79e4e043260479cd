"""Berrada et al.'s smoothed top-k hinge (ICLR 2018): against brute-force enumeration, its limits and closed-form
gradient, float32 stability (their Table 5 as a test), the reference code's optional hard switch, devices and compile."""

import math

import pytest
import torch
import torch.nn.functional as F

from topk.losses import cross_entropy, smooth_hinge
from topk.elementary_symmetric import log_elementary_symmetric
from topk.tests.reference import enumerated_smooth_hinge, linear_space_elementary_symmetric


def _scores(batch, n_classes, scale=2.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = (scale * torch.randn(batch, n_classes, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    y = torch.randint(0, n_classes, (batch,), generator=g)
    return s, y


def _loss_and_grad(loss_fn, s):
    value = loss_fn(s)
    (grad,) = torch.autograd.grad(value.sum(), s)
    return value.detach(), grad


@pytest.mark.parametrize("n_classes", [2, 3, 5, 8])
def test_equals_brute_force_enumeration_of_subsets_for_every_k(n_classes):
    s, y = _scores(6, n_classes)
    for k in range(1, n_classes):
        for tau, alpha in [(1.0, 1.0), (0.1, 1.0), (3.0, 0.0), (0.5, 2.0)]:
            value, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, tau, alpha, reduction="none"), s)
            expected, expected_grad = _loss_and_grad(lambda a: enumerated_smooth_hinge(a, y, k, tau, alpha), s)
            torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_log_elementary_symmetric_matches_linear_space_where_that_does_not_overflow():
    x = torch.randn(4, 37, dtype=torch.float64)
    for k in (1, 2, 5, 36, 37, 40):
        expected = linear_space_elementary_symmetric(x.exp(), min(k, 37)).log()
        got = log_elementary_symmetric(x, k)
        torch.testing.assert_close(got[..., : expected.shape[-1]], expected, rtol=1e-12, atol=1e-12)
        assert (got[..., expected.shape[-1]:] < -1e300).all()  # degree above n: absent


def test_saved_weights_backward_equals_autograd_through_the_recursion():
    x = torch.randn(3, 4, 301, dtype=torch.float64).mul(5).requires_grad_()
    x.data[..., ::7] = -1e300  # absent entries
    upstream = torch.randn(3, 4, 9, dtype=torch.float64)
    fast, slow = (log_elementary_symmetric(x, 8, backward=b) for b in ("saved_weights", "autograd"))
    torch.testing.assert_close(fast, slow)
    (fast_grad,) = torch.autograd.grad(fast, x, upstream)
    (slow_grad,) = torch.autograd.grad(slow, x, upstream)
    torch.testing.assert_close(fast_grad, slow_grad, rtol=1e-12, atol=1e-14)
    assert fast_grad[..., ::7].abs().max() < 1e-290  # absent entries: negligible weight


def test_k1_tau1_alpha0_is_cross_entropy():
    s, y = _scores(10, 7)
    torch.testing.assert_close(smooth_hinge(s, y, 1, 1.0, 0.0), cross_entropy(s, y))
    torch.testing.assert_close(smooth_hinge(s, y, 1, 1.0, 0.0), F.cross_entropy(s, y))


def test_k1_log_sum_exp_form_equals_the_polynomial_form():
    s, y = _scores(10, 7)
    x = ((s - s.gather(1, y[:, None])) / 0.3).masked_fill(F.one_hot(y, 7).bool(), float("-inf"))
    z = 1.0 / 0.3 + torch.logsumexp(x, dim=-1)  # log sigma_1 - log sigma_0
    torch.testing.assert_close(smooth_hinge(s, y, 1, 0.3, reduction="none"), 0.3 * F.softplus(z))


def test_converges_to_the_hard_tuple_hinge_as_tau_goes_to_zero():
    """|L_tau - L_hard| <= tau ln C(L, k): each log-sum-exp over subsets is within tau ln(#subsets) of its max."""
    n_classes, k, alpha = 8, 3, 1.0
    s, y = _scores(20, n_classes)
    others = s.detach().scatter(1, y[:, None], float("-inf"))
    hard = F.relu(alpha + (others.topk(k, dim=1).values[:, -1] - s.detach().gather(1, y[:, None])[:, 0]) / k)
    for tau in (1.0, 0.1, 0.01, 1e-3, 1e-4):
        gap = (smooth_hinge(s, y, k, tau, alpha, reduction="none").detach() - hard).abs().max().item()
        assert gap <= tau * math.log(math.comb(n_classes, k)) + 1e-12
    assert gap < 1e-3


def test_gradient_matches_the_closed_form():
    """dL/ds_y = -sigmoid(z)/k and dL/ds_j = sigmoid(z)/k (pi_k(j) - pi_{k-1}(j)), pi_m(j) = e_j sigma_{m-1}(e without j) / sigma_m(e)."""
    n_classes, k, tau, alpha = 6, 3, 0.7, 1.0
    s, y = _scores(5, n_classes)
    _, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, tau, alpha, reduction="none"), s)
    for row in range(s.shape[0]):
        label = int(y[row])
        e = {j: math.exp((s[row, j].item() - s[row, label].item()) / (k * tau)) for j in range(n_classes) if j != label}

        def sigma(m, without=None):
            items = [v for j, v in e.items() if j != without]
            return linear_space_elementary_symmetric(torch.tensor(items, dtype=torch.float64), m)[m].item()

        z = alpha / tau + math.log(sigma(k)) - math.log(sigma(k - 1))
        weight = 1 / (1 + math.exp(-z)) / k
        assert grad[row, label].item() == pytest.approx(-weight, rel=1e-12)
        for j, e_j in e.items():
            pi_k, pi_k_minus_1 = e_j * sigma(k - 1, j) / sigma(k), e_j * sigma(k - 2, j) / sigma(k - 1)
            assert grad[row, j].item() == pytest.approx(weight * (pi_k - pi_k_minus_1), rel=1e-10, abs=1e-14)
    torch.testing.assert_close(grad.sum(1), torch.zeros(5, dtype=torch.float64), atol=1e-15, rtol=0)
    assert grad.abs().max() <= 1 / k


@pytest.mark.parametrize("n_classes,batch", [(10, 64), (1000, 16), (100_000, 2)])
def test_float32_is_finite_and_accurate_for_tau_from_1e3_to_100_and_scores_up_to_1e4(n_classes, batch):
    """Values: exact to the rounding of float32 score differences. Gradients: rows sum to 0 and stay within 1/k; they
    are compared with float64 within what the rounding of the score differences (about eps * 2e4) does to the logits
    (s_j - s_y) / (k tau), where that is below 1e-2; no float32 code can do better than this conditioning."""
    s, y = _scores(batch, n_classes, scale=1.0)
    s32 = (s.detach().clamp(-3, 3) * (1e4 / 3)).float().requires_grad_()  # scores in [-1e4, 1e4], the extremes reached
    s64 = s32.detach().double().requires_grad_()  # the same numbers
    rounding = 8 * torch.finfo(torch.float32).eps * 1e4  # float32 differences of scores of size 1e4 are this exact
    for tau in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0):
        for k in (1, 5):
            value, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, tau, reduction="none"), s32)
            expected, expected_grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, tau, reduction="none"), s64)
            assert torch.isfinite(value).all() and torch.isfinite(grad).all(), (tau, k)
            assert ((value.double() - expected).abs() <= 1e-6 * expected.abs() + rounding).all(), (tau, k)
            torch.testing.assert_close(grad.sum(-1), torch.zeros(batch), rtol=0, atol=1e-5)
            assert grad.abs().max() <= 1 / k + 1e-5
            logit_rounding = torch.finfo(torch.float32).eps * 2e4 / (k * tau)
            if logit_rounding <= 1e-2:
                error = (grad.double() - expected_grad).abs().max() / expected_grad.abs().max()
                assert error <= 1e-4 + 10 * logit_rounding, (tau, k)


def test_log_space_is_stable_where_linear_space_summation_overflows():
    """Berrada et al.'s Table 5: in float32, the summation algorithm in linear space overflows for tau <= 0.1."""
    k = 5
    s, y = _scores(8, 100, scale=5.0)
    s32 = s.detach().float()
    for tau in (1e-3, 1e-2, 1e-1, 1.0, 10.0):
        e = torch.exp(s32 / (k * tau)).masked_fill(F.one_hot(y, 100).bool(), 0.0)
        sigma = linear_space_elementary_symmetric(e, k)
        linear = tau * F.softplus(1 / tau + sigma[:, k].log() - sigma[:, k - 1].log() - s32.gather(1, y[:, None])[:, 0] / (k * tau))
        ours = smooth_hinge(s32, y, k, tau, reduction="none")
        expected = smooth_hinge(s.detach(), y, k, tau, reduction="none")
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-5)
        if tau <= 0.1:
            assert not torch.isfinite(linear).all(), tau
        else:
            torch.testing.assert_close(linear.double(), expected, rtol=1e-4, atol=1e-4)


def test_gradient_error_in_float32_is_below_1e4_of_float64_at_the_benchmark_size():
    s, y = _scores(128, 1000, scale=3.0)
    _, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, 5, 1.0), s.detach().float().requires_grad_())
    _, expected = _loss_and_grad(lambda a: smooth_hinge(a, y, 5, 1.0), s)
    assert ((grad.double() - expected).abs().max() / expected.abs().max()).item() <= 1e-4


def test_hard_switch_is_off_by_default_and_reproduces_the_reference_when_on():
    """Scores (a, a, 0, 0, 0), y = 2, k = 2: the gap top_2 - top_3 = a crosses the switch k tau ln 1000 at a = 2 tau ln 1000."""
    k, tau = 2, 0.5
    threshold = k * tau * math.log(1000.0)
    a = torch.tensor([threshold - 1e-6, threshold + 1e-6], dtype=torch.float64)
    s = torch.zeros(2, 5, dtype=torch.float64)
    s[:, 0], s[:, 1] = a, a
    y = torch.tensor([2, 2])
    smooth = smooth_hinge(s, y, k, tau, reduction="none")
    switched = smooth_hinge(s, y, k, tau, hard_switch=True, reduction="none")
    assert abs(smooth[1] - smooth[0]) < 1e-5  # continuous
    torch.testing.assert_close(switched[0], smooth[0])  # below the threshold: the smooth loss
    torch.testing.assert_close(switched[1], torch.tensor(1.0 + threshold / k, dtype=torch.float64))  # the hard loss
    assert abs(switched[1] - switched[0]) > 0.1 * tau  # the documented jump


def test_any_leading_batch_shape_and_reductions():
    s, y = _scores(12, 9)
    flat = smooth_hinge(s, y, 4, 0.5, reduction="none")
    shaped = smooth_hinge(s.reshape(3, 4, 9), y.reshape(3, 4), 4, 0.5, reduction="none")
    torch.testing.assert_close(shaped, flat.reshape(3, 4))
    torch.testing.assert_close(smooth_hinge(s, y, 4, 0.5, reduction="sum"), flat.sum())
    torch.testing.assert_close(smooth_hinge(s, y, 4, 0.5), flat.mean())


def test_half_precision_scores_are_computed_in_float32():
    s, y = _scores(6, 50, dtype=torch.bfloat16)
    value = smooth_hinge(s, y, 5, 0.01, reduction="none")
    assert value.dtype == torch.bfloat16 and torch.isfinite(value).all()
    torch.testing.assert_close(value, smooth_hinge(s.detach().float(), y, 5, 0.01, reduction="none").bfloat16())


def test_same_values_and_gradients_on_every_device(device):
    s, y = _scores(32, 300, scale=3.0)
    for k in (1, 5):
        value, grad = _loss_and_grad(lambda a: smooth_hinge(a, y.to(device), k, 0.2, reduction="none"),
                                     s.detach().to(device).requires_grad_())
        expected, expected_grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, 0.2, reduction="none"), s)
        torch.testing.assert_close(value.cpu(), expected)
        torch.testing.assert_close(grad.cpu(), expected_grad)


def test_usable_under_torch_compile():
    s, y = _scores(4, 30)
    eager, eager_grad = _loss_and_grad(lambda a: smooth_hinge(a, y, 5, 0.5), s)
    compiled = torch.compile(lambda a: smooth_hinge(a, y, 5, 0.5), backend="aot_eager")
    value, grad = _loss_and_grad(compiled, s)
    torch.testing.assert_close(value, eager)
    torch.testing.assert_close(grad, eager_grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_infinite_other_scores_give_the_limit_of_large_ones(dtype):
    """Fewer than k other scores at +inf: the loss and its gradient are those of the scores with each of them at a
    value whose exp(-gap / (k tau)) is 0 in float64, where the loss has reached its limit; k or more: +inf, with a
    finite gradient (0 at the infinite scores, the true class's -1/k as the hard loss's)."""
    tau = 0.5
    s, y = _scores(6, 9, dtype=dtype)
    others = [(i, (int(y[i]) + 1 + i) % 9) for i in range(6)]  # one other class per row
    for k in (1, 2, 4):
        for n_infinite in (1, 2):
            infinite, large = s.detach().clone(), s.detach().clone()
            for row, j in others:
                for step in range(n_infinite):
                    column = (j + step) % 9 if (j + step) % 9 != int(y[row]) else (j + step + 1) % 9
                    infinite[row, column], large[row, column] = float("inf"), 1e4
            value, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, tau, reduction="none"),
                                         infinite.requires_grad_())
            assert torch.isfinite(grad).all()
            if n_infinite >= k:
                assert (value == float("inf")).all() and (grad[infinite.isinf()] == 0).all()
                torch.testing.assert_close(grad.gather(1, y[:, None]), torch.full((6, 1), -1 / k, dtype=dtype))
                continue
            expected, expected_grad = _loss_and_grad(lambda a: smooth_hinge(a.double(), y, k, tau, reduction="none"),
                                                     large.requires_grad_())
            torch.testing.assert_close(value, expected.to(dtype))
            torch.testing.assert_close(grad, expected_grad.to(dtype))


def test_an_infinite_true_score_gives_the_limit_and_undefined_limits_nan():
    """s_y = +inf: 0, gradient 0 (with another score at +inf: NaN); s_y = -inf: +inf with a finite gradient; every
    other score at -inf (classes left out): 0, every score: NaN; a NaN score: NaN, whatever else is infinite. A row of
    finite scores beside them: Berrada et al.'s sum over subsets, value and gradient."""
    inf, nan = float("inf"), float("nan")
    s = torch.tensor([[0.3, 0.5, inf, 0.1], [inf, 0.5, inf, 0.1], [0.3, 0.5, -inf, 0.1], [-inf, -inf, 0.2, -inf],
                      [nan, 0.5, inf, 0.1], [nan, inf, 0.2, 0.1], [-inf, -inf, -inf, -inf], [0.3, 0.5, 0.2, 0.1]],
                     dtype=torch.float64)
    y = torch.full((8,), 2)
    for k in (1, 2):
        value, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, k, 0.5, reduction="none"), s.requires_grad_())
        assert value[0] == 0 and value[1].isnan() and value[2] == inf and value[3] == 0 and value[4:7].isnan().all()
        assert (grad[0] == 0).all() and torch.isfinite(grad[[0, 2, 3, 7]]).all() and grad[2, 2] == -1 / k
        expected, expected_grad = _loss_and_grad(lambda a: enumerated_smooth_hinge(a, y[-1:], k, 0.5, 1.0), s[-1:])
        torch.testing.assert_close(value[-1:], expected)
        torch.testing.assert_close(grad[-1:], expected_grad)


def test_gradient_at_z_zero_is_half_sigmoid_as_cross_entropy_s():
    """z = 0 exactly: (k, tau, alpha) = (1, 1, 0), two classes, zero scores (a zero-initialised last layer): the
    gradient of softplus there is 1/2, cross-entropy's."""
    s = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 1])
    _, grad = _loss_and_grad(lambda a: smooth_hinge(a, y, 1, 1.0, 0.0), s)
    _, expected = _loss_and_grad(lambda a: F.cross_entropy(a, y), s)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)
