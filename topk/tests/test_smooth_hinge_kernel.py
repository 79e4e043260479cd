"""The smoothed hinge's Triton kernels (:mod:`topk._esp_kernel`: ``topk::log_esp_pair``, and ``topk::smooth_hinge_rows``,
the whole loss of each row, its rows cut in chunks walked side by side): the tree's values and gradients in float64,
rows in many chunks, brute-force enumeration, float32 stability at the extremes of Berrada et al.'s Table 5, the
custom operators' contracts, the backend rule and one compiled graph. On CUDA when present, else under Triton's
interpreter on the CPU."""

import os

import pytest
import torch

from topk import _esp_launch, _ops
from topk.elementary_symmetric import absent_log, log_elementary_symmetric_pair
from topk.losses import SmoothHinge, smooth_hinge
from topk.tests.optional import require
from topk.tests.reference import enumerated_smooth_hinge

require("triton")


def _pair_and_gradient(x, k, backend, upstream):
    x = x.detach().requires_grad_()
    pair = log_elementary_symmetric_pair(x, k, backend=backend)
    (grad,) = torch.autograd.grad(pair, x, upstream)
    return pair.detach(), grad


@pytest.mark.parametrize("n", [1, 2, 7, 20])
def test_kernel_pair_and_gradient_equal_the_tree_in_float64(kernel_device, n):
    g = torch.Generator().manual_seed(n)
    x = (4 * torch.randn(3, 2, n, generator=g, dtype=torch.float64)).to(kernel_device)
    x[..., ::5] = absent_log(torch.float64)  # left-out entries, as the loss leaves out the label
    for k in sorted({1, 2, 5, n - 1, n} & set(range(1, n + 1))):
        expected = log_elementary_symmetric_pair(x, k)
        present = expected > -1e30  # sigma_j of fewer present entries than j: absent in both, at different levels
        # and d log sigma_j is a ratio of two absent numbers there, which neither computes: no gradient asked
        upstream = torch.randn(3, 2, 2, generator=g, dtype=torch.float64).to(kernel_device) * present
        pair, grad = _pair_and_gradient(x, k, "triton", upstream)
        expected, expected_grad = _pair_and_gradient(x, k, "torch", upstream)
        assert (pair[~present] < -1e30).all()
        torch.testing.assert_close(pair[present], expected[present], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


#: (tau, alpha) of the enumeration test: the default, a sharp tau, and a smooth one without margin.
TAU_ALPHA = [(1.0, 1.0), (0.1, 1.0), (3.0, 0.0)]


@pytest.mark.parametrize("n_classes", [3, 5, 8])
def test_triton_loss_equals_brute_force_enumeration(kernel_device, n_classes):
    """Every k from 2 to L - 1, each with one (tau, alpha) in turn, so that every (tau, alpha) meets several k (all
    three with L = 3, whose only k is 2): tau and alpha reach the kernels as scalars, their code is the same for
    every pair (k, a compile-time constant, sets the blocks)."""
    g = torch.Generator().manual_seed(n_classes)
    s = (2 * torch.randn(4, n_classes, generator=g, dtype=torch.float64)).to(kernel_device).requires_grad_()
    y = torch.randint(0, n_classes, (4,), generator=g).to(kernel_device)
    ks = list(range(2, n_classes))
    cases = [(2, *pair) for pair in TAU_ALPHA] if len(ks) == 1 else [
        (k, *TAU_ALPHA[i % len(TAU_ALPHA)]) for i, k in enumerate(ks)]
    for k, tau, alpha in cases:
        value = smooth_hinge(s, y, k, tau, alpha, reduction="none", backend="triton")
        expected = enumerated_smooth_hinge(s, y, k, tau, alpha)
        (grad,) = torch.autograd.grad(value.sum(), s)
        (expected_grad,) = torch.autograd.grad(expected.sum(), s)
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_float32_kernel_is_finite_and_close_to_float64_from_tau_1e3_to_100_with_scores_up_to_1e4(kernel_device):
    """The extremes of the tree's float32 test, at L = 100: the kernel's sequential roundings stay within 1e-5 of
    float64 in value (plus the rounding of the score differences), and in gradient.

    Where ``tau`` is small the top classes have ``d log sigma_K`` and ``d log sigma_{K-1}`` both near 1, and the
    hinge's gradient is their difference: each is computed from the side where it is small (before, the kernel was
    off by up to 2.4e-2 here at tau = 1e-3, its rows summing to 0 only because the label's entry took minus the others'
    sum)."""
    g = torch.Generator().manual_seed(0)  # two rows reaching -1e4 (and 9.4e3, 9.0e3), labels 85th and 48th of 100
    s64 = (torch.randn(3, 100, generator=g, dtype=torch.float64).clamp(-3, 3) * (1e4 / 3))[:2].to(kernel_device)
    s32 = s64.float()
    y = torch.randint(0, 100, (3,), generator=g)[:2].to(kernel_device)
    assert s64.abs().amax(1).eq(1e4).all()
    rounding = 8 * torch.finfo(torch.float32).eps * 1e4
    for tau, k in ((1e-3, 2), (1e-3, 5), (1.0, 5), (100.0, 5)):
        scores = s32.clone().requires_grad_()
        value = smooth_hinge(scores, y, k, tau, reduction="none", backend="triton")
        (grad,) = torch.autograd.grad(value.sum(), scores)
        exact = s32.double().requires_grad_()
        expected = smooth_hinge(exact, y, k, tau, reduction="none", backend="torch")
        (expected_grad,) = torch.autograd.grad(expected.sum(), exact)
        assert torch.isfinite(value).all() and torch.isfinite(grad).all(), (tau, k)
        assert ((value.double() - expected).abs() <= 1e-5 * expected.abs() + rounding).all(), (tau, k)
        assert (grad.double() - expected_grad).abs().max().item() <= 1e-5, (tau, k)
        torch.testing.assert_close(grad.sum(-1), torch.zeros_like(value), rtol=0, atol=1e-5)


@pytest.mark.parametrize("span", [1, 4, 7])
def test_rows_cut_in_chunks_equal_the_tree_in_float64(kernel_device, monkeypatch, span):
    """Chunks of ``span`` entries (one entry each: the label alone in its chunk; uneven last chunks), for the pair of
    polynomials and the whole loss, values and gradients; the chunks' products multiplied a quarter of the degrees at
    a time (as for K >= 32, where a whole product would not fit in registers). Two rows, whose labels are the last
    entry (in the uneven last chunk) and entry 14 (the start, the middle and the end of a chunk of 7, 4 and 1)."""
    monkeypatch.setattr(_esp_launch, "esp_span", lambda n: span)
    monkeypatch.setattr(_esp_launch, "combine_slice", lambda k: _esp_launch.esp_block(k) // 4)
    n = 30
    assert _esp_launch.esp_chunks(n) == -(-n // span)
    g = torch.Generator().manual_seed(span)
    s = (5 * torch.randn(2, n, generator=g, dtype=torch.float64)).to(kernel_device)
    y = torch.tensor([n - 1, 14], device=kernel_device)
    weights = torch.rand(2, 2, generator=g, dtype=torch.float64).to(kernel_device)

    def loss_pair_and_gradients(k, backend):
        x = s.clone().requires_grad_()
        loss = (weights[:, 0] * smooth_hinge(x, y, k, 0.5, reduction="none", backend=backend)).sum()
        pair = (weights * log_elementary_symmetric_pair(x, k, backend=backend)).sum()
        return loss, pair, *(torch.autograd.grad(out, x)[0] for out in (loss, pair))

    for k in (2, 9):
        for ours, theirs in zip(loss_pair_and_gradients(k, "triton"), loss_pair_and_gradients(k, "torch")):
            torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_float32_kernel_gradient_at_the_benchmark_size_is_within_1e4_of_float64(kernel_device):
    g = torch.Generator().manual_seed(1)
    s = (3 * torch.randn(1, 1000, generator=g, dtype=torch.float64)).to(kernel_device)
    y = torch.randint(0, 1000, (1,), generator=g).to(kernel_device)
    grads = []
    for scores, backend in ((s.float(), "triton"), (s, "torch")):
        scores = scores.clone().requires_grad_()
        (grad,) = torch.autograd.grad(smooth_hinge(scores, y, 5, 1.0, backend=backend), scores)
        grads.append(grad.double())
    assert ((grads[0] - grads[1]).abs().max() / grads[1].abs().max()).item() <= 1e-4


def test_half_precision_scores_go_through_the_kernel_in_float32(kernel_device):
    s = torch.randn(4, 50, generator=torch.Generator().manual_seed(2)).to(kernel_device)
    y = torch.tensor([0, 7, 49, 3], device=kernel_device)
    expected = smooth_hinge(s.bfloat16().float(), y, 5, 1.0, backend="torch")
    got = smooth_hinge(s.bfloat16(), y, 5, 1.0, backend="triton")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("k, tau, alpha, scale", [(2, 1.0, 1.0, 1.0), (5, 0.1, 1.0, 5.0), (9, 0.01, 0.5, 20.0),
                                                   (4, 30.0, 0.0, 1.0)])
def test_one_launch_loss_equals_the_tree_in_float64(kernel_device, k, tau, alpha, scale):
    """The loss of each row computed whole in the kernel (shift, left-out label, softplus, gradient at the label)
    against the PyTorch path, on a batch of two dimensions and with per-row weights in the backward."""
    g = torch.Generator().manual_seed(k)
    s = (scale * torch.randn(2, 3, 30, generator=g, dtype=torch.float64)).to(kernel_device)
    y = torch.randint(0, 30, (2, 3), generator=g).to(kernel_device)
    weights = torch.rand(2, 3, generator=g, dtype=torch.float64).to(kernel_device)
    results = []
    for backend in ("triton", "torch"):
        scores = s.clone().requires_grad_()
        value = smooth_hinge(scores, y, k, tau, alpha, reduction="none", backend=backend)
        (grad,) = torch.autograd.grad((weights * value).sum(), scores)
        results.append((value, grad))
    (value, grad), (expected, expected_grad) = results
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad.sum(-1), torch.zeros_like(value), rtol=0, atol=1e-12)  # the shift's invariance


def test_one_launch_loss_dispatches_about_as_many_operators_as_cross_entropy(kernel_device):
    """Forward and backward of the loss on the kernel: the two launches, the label check (4 operators, no host read)
    and the mean (the tree needs hundreds), counted at the dispatcher; views, which launch nothing, are not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += func.overloadpacket.__name__ not in ("view", "expand", "promote_types")
            return func(*args, **(kwargs or {}))

    s = torch.randn(2, 50, device=kernel_device, requires_grad=True)  # the counts do not depend on the rows
    y = torch.randint(0, 50, (2,), device=kernel_device)
    counts = {}
    for name, loss in {"kernel": lambda: smooth_hinge(s, y, 5, 1.0, backend="triton"),
                       "tree": lambda: smooth_hinge(s, y, 5, 1.0, backend="torch"),
                       "cross_entropy": lambda: torch.nn.functional.cross_entropy(s, y)}.items():
        Count.calls = 0
        with Count(), _ops.through_operators():
            torch.autograd.grad(loss(), s)
        counts[name] = Count.calls
    assert counts["kernel"] <= counts["cross_entropy"] + 4 and counts["tree"] > 30 * counts["kernel"], counts


def test_the_operators_pass_opcheck(kernel_device):
    x = torch.randn(3, 9, dtype=torch.float64, device=kernel_device, requires_grad=True)
    torch.library.opcheck(_ops.log_esp_pair, (x, 4), test_utils=("test_schema", "test_faketensor",
                                                                  "test_autograd_registration"))
    pair, prefix, complement = _ops.log_esp_pair(x.detach(), 4)
    torch.library.opcheck(_ops.log_esp_pair_backward, (x.detach(), prefix, complement, pair, torch.ones_like(pair), 4))
    y = torch.tensor([0, 4, 8], device=kernel_device)
    torch.library.opcheck(_ops.smooth_hinge_rows, (x, y, 4, 0.5, 1.0), test_utils=(
        "test_schema", "test_faketensor", "test_autograd_registration"))
    _, prefix, complement, pair, aux = _ops.smooth_hinge_rows(x.detach(), y, 4, 0.5, 1.0)
    torch.library.opcheck(_ops.smooth_hinge_rows_backward, (x.detach(), y, prefix, complement, pair, aux,
                                                            torch.ones(3, dtype=x.dtype, device=kernel_device), 4, 0.5))


def test_module_takes_the_backend_and_compiles_as_one_graph(kernel_device):
    torch._dynamo.reset()
    s = torch.randn(5, 20, dtype=torch.float64, device=kernel_device, requires_grad=True)
    y = torch.arange(5, device=kernel_device)
    loss = SmoothHinge(k=3, tau=0.5, backend="triton")
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    eager_value = loss(s, y)
    (eager_grad,) = torch.autograd.grad(eager_value, s)
    value = compiled(s, y)
    (grad,) = torch.autograd.grad(value, s)
    torch.testing.assert_close(value, eager_value, rtol=0, atol=0)
    torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)


def test_auto_backend_takes_the_kernel_only_for_cuda_scores(kernel_device, monkeypatch):
    """``auto`` on CPU scores is the tree even with the interpreter on; ``triton`` on CPU needs the interpreter."""
    calls = []
    monkeypatch.setattr(_esp_launch, "_launch_forward",
                        lambda *args, launch=_esp_launch._launch_forward: calls.append(1) or launch(*args))
    s = torch.randn(2, 10, device=kernel_device)
    smooth_hinge(s, torch.tensor([1, 2], device=kernel_device), 3, 1.0)
    assert len(calls) == (1 if kernel_device.type == "cuda" else 0)
    if kernel_device.type == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(ValueError, match="backend='triton' needs CUDA scores, got scores on cpu"):
            smooth_hinge(s, torch.tensor([1, 2]), 3, 1.0, backend="triton")
        assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_kernel_gives_the_tree_s_limits_at_infinite_scores_and_nan_for_a_nan_score(kernel_device, dtype, tolerance):
    """Rows with +inf in the true class (alone, beside another +inf, beside a NaN), -inf in it, every other class at
    -inf, every class, one to three other classes at +inf (below, at and above k = 2), a NaN score: the kernel's loss
    is the tree's, NaN where the tree's is, its gradient the tree's on every row whose loss is a number."""
    inf, nan = float("inf"), float("nan")
    g = torch.Generator().manual_seed(0)
    s = 2 * torch.randn(11, 7, generator=g, dtype=torch.float64)
    s[0, 2] = s[1, 2] = s[1, 0] = s[4, 2] = inf
    s[2, 2], s[3, [0, 1, 3, 4, 5, 6]], s[4, 0], s[8, 5], s[10] = -inf, -inf, nan, nan, -inf
    s[5, 0], s[6, [0, 1]], s[7, [0, 1, 3]] = inf, inf, inf
    y = torch.full((11,), 2)
    for k in (2, 3):
        results = {}
        for backend in ("torch", "triton"):
            scores = s.to(dtype).to(kernel_device).requires_grad_()
            loss = smooth_hinge(scores, y.to(kernel_device), k, 0.5, reduction="none", backend=backend)
            (grad,) = torch.autograd.grad(loss.sum(), scores)
            results[backend] = loss.detach().cpu(), grad.cpu()
        (loss, grad), (expected, expected_grad) = results["triton"], results["torch"]
        torch.testing.assert_close(loss, expected, equal_nan=True, rtol=tolerance, atol=tolerance)
        assert loss[[1, 4, 8, 10]].isnan().all() and loss[[0, 3]].eq(0).all() and loss[2] == inf
        number = ~expected.isnan()
        torch.testing.assert_close(grad[number], expected_grad[number], rtol=tolerance, atol=tolerance)


def test_kernel_loss_keeps_its_digits_where_z_is_far_below_zero(kernel_device):
    """softplus(z) for z down to -60: tau e^z, the tree's, not 0 (log(1 + e^z) rounds e^z away below z = -37)."""
    s = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 30.0], [0.0, 0.0, 60.0]], dtype=torch.float64, device=kernel_device)
    y = torch.full((3,), 2, device=kernel_device)
    loss = smooth_hinge(s, y, 2, 1.0, 0.0, reduction="none", backend="triton")
    torch.testing.assert_close(loss, smooth_hinge(s, y, 2, 1.0, 0.0, reduction="none", backend="torch"), rtol=1e-12,
                               atol=0)
    assert (loss > 0).all()
