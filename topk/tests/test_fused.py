"""The fused Triton kernel (:mod:`topk.fused`) against the PyTorch path, exactly given the noise, and in
distribution when the noise is drawn in the kernel.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (same kernel source, NumPy arithmetic,
the same Philox generator); with one, on CUDA.
"""

import math
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import topk
from topk import _perturbed_top, _triton_support, fused, losses
from topk._validation import NOISED_TORCH_FASTER, choose_backend
from topk.tests.optional import require
from topk.tests.reference import kth_largest_cdf

require("triton")


def _reference_kth(s, k, epsilon, noise):
    """The k-th largest of ``s + epsilon Z_b`` and its position by ``torch.topk`` on the materialised scores."""
    values, positions = torch.topk(s + epsilon * noise, k, dim=-1)
    return values[..., -1], positions[..., -1]


SHAPES = [  # rows, L, n_samples, k, n_chunks
    (5, 37, 3, 4, None),
    (3, 300, 10, 6, 3),  # a row split into 3 programs, merged on the host
    (4, 100, 20, 1, None),  # two sample blocks, the second one partial
    (2, 50, 3, 50, None),  # k = L
    (2, 2100, 2, 51, 2),  # k = 51: a 64-slot buffer; chunks of 2048 and 52 classes (tile multiples)
]


@pytest.mark.parametrize("rows, n_classes, n_samples, k, n_chunks", SHAPES)
def test_kernel_equals_topk_of_the_perturbed_scores_given_the_noise(kernel_device, rows, n_classes, n_samples, k,
                                                                  n_chunks):
    """Float64, explicit noise: the same K-th largest value (bit for bit) and the same position as ``torch.topk``."""
    generator = torch.Generator().manual_seed(rows * n_classes + k)
    s = torch.randn(rows, n_classes, dtype=torch.float64, generator=generator).to(kernel_device)
    noise = torch.randn(n_samples, rows, n_classes, dtype=torch.float64, generator=generator).to(kernel_device)
    values, positions = fused.perturbed_kth_largest(s, k, 0.7, n_samples, noise=noise, n_chunks=n_chunks)
    expected_values, expected_positions = _reference_kth(s, k, 0.7, noise)
    assert positions.dtype == torch.int32 and positions.shape == (n_samples, rows)
    assert torch.equal(values, expected_values)
    assert torch.equal(positions.long(), expected_positions)


@given(rows=st.integers(1, 4), n_classes=st.integers(2, 70), n_samples=st.integers(1, 12), data=st.data())
def test_kernel_equals_topk_on_random_shapes(kernel_device, rows, n_classes, n_samples, data):
    """Property: any shape, k, epsilon and chunking gives ``torch.topk``'s K-th largest value and position."""
    device = kernel_device
    k = data.draw(st.integers(1, n_classes))
    n_chunks = data.draw(st.integers(1, max(1, n_classes // k)))
    epsilon = data.draw(st.floats(1e-3, 10.0))
    seed = data.draw(st.integers(0, 2**31))
    generator = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, n_classes, dtype=torch.float64, generator=generator).to(device)
    noise = torch.randn(n_samples, rows, n_classes, dtype=torch.float64, generator=generator).to(device)
    values, positions = fused.perturbed_kth_largest(s, k, epsilon, n_samples, noise=noise, n_chunks=n_chunks)
    expected_values, expected_positions = _reference_kth(s, k, epsilon, noise)
    assert torch.equal(values, expected_values)
    assert torch.equal(positions.long(), expected_positions)


@pytest.mark.parametrize("margins", ["balanced", "imbalanced"])
def test_fused_loss_and_gradient_equal_the_torch_path_given_the_noise(kernel_device, margins):
    """Eq. 10 and 13 and their gradient (Eq. 12) in float64, with leading batch dimensions: the same loss and the
    same gradient, bit for bit (both round ``s + eps z`` twice and sum the samples in the same order)."""
    generator = torch.Generator().manual_seed(3)
    s = torch.randn(6, 2, 40, dtype=torch.float64, generator=generator).to(kernel_device)
    y = torch.randint(0, 40, (6, 2), generator=generator).to(kernel_device)
    noise = torch.randn(5, 6, 2, 40, dtype=torch.float64, generator=generator).to(kernel_device)
    m = (torch.rand(40, dtype=torch.float64, generator=generator) + 0.5).to(kernel_device) if margins == "imbalanced" else 1.0
    results = {}
    for backend in ("torch", "triton"):
        scores = s.clone().requires_grad_()
        loss = losses.noised_hinge(scores, y, 3, 0.5, 5, margins=m, noise=noise, backend=backend, reduction="none")
        loss.backward(torch.linspace(0.5, 2.0, loss.numel(), dtype=loss.dtype, device=loss.device).view(loss.shape))
        results[backend] = (loss.detach(), scores.grad)
    assert (results["torch"][0] > 0).sum() >= 6, "too few active samples for the gradient to be compared"
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert torch.equal(results["torch"][1], results["triton"][1])


def test_fused_operator_and_gradient_equal_the_torch_path_given_the_noise(kernel_device):
    """``smooth_top_k`` (Definition 3.4, gradient of Prop. 3.3) on the kernel, float64, leading batch dimensions."""
    generator = torch.Generator().manual_seed(9)
    s = torch.randn(3, 4, 70, dtype=torch.float64, generator=generator).to(kernel_device)
    noise = torch.randn(6, 3, 4, 70, dtype=torch.float64, generator=generator).to(kernel_device)
    results = {}
    for backend in ("torch", "triton"):
        scores = s.clone().requires_grad_()
        value = topk.smooth_top_k(scores, 5, 0.8, 6, noise=noise, backend=backend)
        value.backward(torch.linspace(-1.0, 2.0, 12, dtype=value.dtype, device=value.device).view(3, 4))
        results[backend] = (value.detach(), scores.grad)
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert torch.equal(results["torch"][1], results["triton"][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_labels", [False, True, "strided"])
def test_gradient_kernel_equals_the_scatter_bit_for_bit(kernel_device, dtype, with_labels):
    """The one-launch gradient (:func:`topk.fused.kth_gradient`) against the PyTorch path's scatter: three tiles of
    classes (the first without any position), more samples than one block of its check, several samples on one class
    and labels on a selected class; labels that are a strided view too (a column of stacked runs' labels)."""
    generator = torch.Generator().manual_seed(12)
    n_samples, n_rows, n_classes = 70, 4, 2 * fused.GRADIENT_BLOCK_L + 37
    positions = torch.randint(fused.GRADIENT_BLOCK_L, n_classes, (n_samples, n_rows), generator=generator)
    positions[:5] = 1500  # five samples on one class
    labels = torch.tensor([1500, 0, n_classes - 1, 1200]) if with_labels else None
    if with_labels == "strided":
        labels = torch.stack([labels, torch.full_like(labels, 7)], dim=1)[:, 0]  # stride 2: another run's between
        assert not labels.is_contiguous()
    grad = torch.randn(n_rows, generator=generator, dtype=dtype)
    expected = _perturbed_top.perturbed_top_backward(grad, positions.unsqueeze(-1), labels, n_classes)
    device = lambda t: t.to(kernel_device) if t is not None else None  # noqa: E731
    got = fused.kth_gradient(device(grad), device(positions).int(), device(labels), n_classes)
    assert torch.equal(got.cpu(), expected)
    assert bool((got[:, :fused.GRADIENT_BLOCK_L].cpu() == 0).all()) != with_labels  # the label of row 1 is class 0


def test_fused_operator_gradient_rows_sum_to_one(kernel_device):
    """Prop. 3.3 with in-kernel noise: the gradient of ``top_{K,eps,B}`` is a mean of B one-hots (rows sum to 1)."""
    s = torch.randn(16, 300, device=kernel_device, requires_grad=True)
    topk.smooth_top_k(s, 5, 1.0, 4, backend="triton").sum().backward()
    assert torch.allclose(s.grad.sum(-1), torch.ones(16, device=kernel_device))
    assert int((s.grad != 0).sum(-1).max()) <= 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_loss_in_low_precision_agrees_with_float64(kernel_device, dtype):
    """Half precision scores: the kernel perturbs and selects in float32, so it stays within the scores' rounding
    of the float64 loss computed from the same (rounded) scores and noise."""
    if dtype == torch.bfloat16 and kernel_device.type == "cpu":
        pytest.skip("refused under Triton's interpreter: test_bfloat16_is_refused_by_the_interpreter")
    generator = torch.Generator().manual_seed(4)
    s = torch.randn(32, 60, generator=generator).to(dtype)
    noise = torch.randn(4, 32, 60, generator=generator).to(dtype)
    y = torch.randint(0, 60, (32,), generator=generator)
    exact = losses.noised_hinge(s.double(), y, 2, 0.3, 4, noise=noise.double(), backend="torch", reduction="none")
    fast = losses.noised_hinge(s.to(kernel_device), y.to(kernel_device), 2, 0.3, 4, noise=noise.to(kernel_device),
                               backend="triton", reduction="none")
    assert fast.dtype == dtype
    tolerance = 4 * torch.finfo(dtype).eps * (exact.abs() + 1)
    assert bool(((fast.double().cpu() - exact).abs() <= tolerance).all())


def test_half_precision_is_perturbed_in_float32_on_both_paths_alike(kernel_device):
    """The PyTorch path perturbs float16 scores in float32 as the kernel does: one estimator, the same loss and
    gradient bit for bit on the same draws (bfloat16 is refused by the interpreter, so float16 here). Scores near 100,
    where float16's spacing (1/16) is wider than the noise: perturbed in float16 they would tie and round."""
    generator = torch.Generator().manual_seed(7)
    s = (100 + 0.03 * torch.randn(16, 80, generator=generator)).half().to(kernel_device)
    noise = torch.randn(5, 16, 80, generator=generator).half().to(kernel_device)
    y = torch.randint(0, 80, (16,), generator=generator).to(kernel_device)
    results = []
    for backend in ("torch", "triton"):
        scores = s.clone().requires_grad_()
        loss = losses.noised_hinge(scores, y, 3, 0.05, 5, noise=noise, backend=backend, reduction="sum")
        loss.backward()
        results.append((loss, scores.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_bfloat16_is_refused_by_the_interpreter(kernel_device, monkeypatch):
    """Triton's interpreter computes bfloat16 on its raw bits, so its gradients would come back wrong: refused."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if _triton_support.interpreter_problem():
        pytest.skip(_triton_support.interpreter_problem())
    s, y = torch.randn(4, 10).bfloat16(), torch.zeros(4, dtype=torch.long)
    for call in (lambda: losses.noised_hinge(s, y, 2, 0.5, 3, backend="triton"),
                 lambda: topk.smooth_top_k(s, 2, 0.5, 3, backend="triton"),
                 lambda: fused.perturbed_kth_largest(s, 2, 0.5, 3, seed=torch.zeros(1, dtype=torch.long))):
        with pytest.raises(TypeError, match="cannot take bfloat16 scores in Triton's interpreter"):
            call()
    if kernel_device.type == "cpu":  # where the kernels are already compiled for CUDA, the interpreter cannot launch
        # the smoothed hinge hands its kernel float32 scores, which the interpreter computes right
        assert losses.smooth_hinge(s, y, 2, 0.5, backend="triton").dtype == torch.bfloat16


def test_fused_loss_with_epsilon_zero_is_the_calibrated_hinge(kernel_device):
    """eps = 0 (Prop. 3.7): the kernel returns the calibrated hinge (Eq. 5) and its gradient exactly."""
    generator = torch.Generator().manual_seed(5)
    s = torch.randn(16, 30, dtype=torch.float64, generator=generator).to(kernel_device)
    y = torch.randint(0, 30, (16,), generator=generator).to(kernel_device)
    fast, exact = s.clone().requires_grad_(), s.clone().requires_grad_()
    losses.noised_hinge(fast, y, 4, 0.0, 3, backend="triton", reduction="sum").backward()
    losses.calibrated_hinge(exact, y, 4, reduction="sum").backward()
    assert torch.equal(fast.grad, exact.grad)
    assert torch.allclose(losses.noised_hinge(s, y, 4, 0.0, 3, backend="triton"), losses.calibrated_hinge(s, y, 4),
                          rtol=0, atol=1e-15)


def test_fused_gradient_rows_sum_to_zero_with_at_most_b_plus_one_nonzeros(kernel_device):
    """Prop. 3.7 with in-kernel noise: each gradient row sums to 0 and has at most B + 1 non-zero entries."""
    torch.manual_seed(6)
    s = torch.randn(16, 200, device=kernel_device, requires_grad=True)
    y = torch.randint(0, 200, (16,), device=kernel_device)
    losses.noised_hinge(s, y, 5, 1.0, 3, backend="triton", reduction="sum").backward()
    assert torch.allclose(s.grad.sum(-1), torch.zeros(16, device=kernel_device), atol=1e-6)
    assert int((s.grad != 0).sum(-1).max()) <= 3 + 1
    assert int((s.grad != 0).any(-1).sum()) > 8, "most samples should be active at initialisation"


def _ks_statistic(draws: torch.Tensor, cdf) -> float:
    """One-sample Kolmogorov-Smirnov statistic: the largest gap between the draws' empirical distribution function and
    the distribution function ``cdf``."""
    x = draws.double().flatten().sort().values
    n, at = x.numel(), cdf(x)
    rank = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(rank / n - at, at - (rank - 1) / n).max())


def _ks_critical(n: int, alpha: float) -> float:
    """Asymptotic critical value of the one-sample KS statistic of ``n`` draws at false-alarm rate ``alpha``."""
    return math.sqrt(-math.log(alpha / 2) / 2) / math.sqrt(n)


#: False-alarm rate of each statistical test below: a correct kernel fails one in 10,000 runs.
ALPHA = 1e-4
#: The in-kernel draws of Z shared by the noise tests: rows of one class, samples per row (4,096 draws).
NOISE_ROWS, NOISE_SAMPLES = 64, 64


@pytest.fixture(scope="module")
def kernel_noise(kernel_device):
    """4,096 in-kernel draws of Z, ``[samples, rows]``: with L = 1 and k = 1 the kernel returns ``s + eps Z`` itself.

    With one class, a draw is the first normal of the Philox counter ``b * rows + row``, whatever the tile's shape,
    so the launch takes all 64 samples of a row in one program (``MAX_BLOCK_SAMPLES`` raised from 8 to 64): 64
    programs under the interpreter instead of 512, the same numbers. That is checked here, bit for bit, against the
    default launch (8 samples per program) on 2 rows."""
    seed = torch.tensor([2022], dtype=torch.int64, device=kernel_device)

    def draw(rows):
        s = torch.zeros(rows, 1, device=kernel_device)
        return fused.perturbed_kth_largest(s, 1, 1.0, NOISE_SAMPLES, seed=seed)[0]

    default = draw(2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused, "MAX_BLOCK_SAMPLES", NOISE_SAMPLES)
        plan = fused.launch_plan(NOISE_ROWS, 1, NOISE_SAMPLES, 1, torch.float32, kernel_device)
        assert plan.block_samples == NOISE_SAMPLES
        assert torch.equal(draw(2), default)
        return draw(NOISE_ROWS).cpu().double()


@pytest.mark.slow
def test_in_kernel_noise_is_standard_normal_and_independent(kernel_noise):
    """The 4,096 draws of Z pass a one-sample KS test against N(0, 1) (false alarm ``ALPHA``); their mean and variance
    are within 4.4 standard errors of 0 and 1, and neighbouring samples and rows are uncorrelated (|r| < 4.4 /
    sqrt(n)), each a two-sided false alarm of about 1e-5. A noise scale off by 8% fails the variance bound (99.8% of
    seeds; by 5%, 58%), a mean off by 0.1 the mean bound (97%)."""
    z = kernel_noise
    n = z.numel()
    assert _ks_statistic(z, torch.special.ndtr) < _ks_critical(n, ALPHA)
    assert abs(float(z.mean())) < 4.4 / math.sqrt(n)
    assert abs(float(z.var()) - 1) < 4.4 * math.sqrt(2 / (n - 1))
    for a, b in ((z[1:].flatten(), z[:-1].flatten()), (z[:, 1:].flatten(), z[:, :-1].flatten())):
        r = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        assert abs(r) < 4.4 / math.sqrt(len(a))


@pytest.mark.slow
def test_in_kernel_noise_gives_the_torch_estimator_in_distribution(kernel_device):
    """The K-th largest of ``s + eps Z_b`` with in-kernel Philox noise follows the law of the PyTorch path's estimator
    (``torch.randn`` noise), on a fixed score vector: that law is known exactly (:func:`kth_largest_cdf`; torch's draws
    pass the same test), so a one-sample KS test at ``ALPHA`` on 2,048 kernel draws (128 rows of 16 samples: two
    sample blocks per row, the default launch) is as strong as the two-sample test of 4,096 kernel draws against
    4,096 torch draws it replaces (the same critical gap, 0.049). A noise scale off by 10% fails 80% of seeds, by 15%
    every seed (simulated on torch draws)."""
    rows, n_samples, k, epsilon = 128, 16, 6, 0.5
    scores = torch.linspace(-2, 2, 50, dtype=torch.float64)
    s = scores.float().to(kernel_device).expand(rows, 50).contiguous()
    seed = torch.tensor([7], dtype=torch.int64, device=kernel_device)
    kernel_values, _ = fused.perturbed_kth_largest(s, k, epsilon, n_samples, seed=seed)
    noise = torch.randn(n_samples, rows, 50, generator=torch.Generator().manual_seed(8)).to(kernel_device)
    torch_values, _ = _reference_kth(s, k, epsilon, noise)
    law = lambda x: kth_largest_cdf(scores, k, epsilon, x)  # noqa: E731
    critical = _ks_critical(rows * n_samples, ALPHA)
    assert _ks_statistic(torch_values.cpu(), law) < critical
    assert _ks_statistic(kernel_values.cpu(), law) < critical


def test_in_kernel_noise_is_reproducible_from_the_generator(kernel_device):
    """The Philox seed is drawn from ``generator``: the same state gives the same loss, another state another one
    (4 rows of 10 samples: two sample blocks per row)."""
    s = torch.randn(4, 100, device=kernel_device)
    y = torch.randint(0, 100, (4,), device=kernel_device)

    def loss(seed):
        generator = torch.Generator(kernel_device).manual_seed(seed)
        return losses.noised_hinge(s, y, 5, 1.0, 10, generator=generator, backend="triton", reduction="none")

    assert torch.equal(loss(1), loss(1))
    assert not torch.equal(loss(1), loss(2))


@pytest.mark.parametrize("n_chunks", [1, 3])
def test_a_nan_score_gives_a_nan_loss_for_its_row_only(kernel_device, n_chunks):
    s = torch.randn(4, 90, device=kernel_device)
    s[2, 50] = float("nan")
    seed = torch.tensor([1], dtype=torch.int64, device=kernel_device)
    values, _ = fused.perturbed_kth_largest(s, 3, 0.5, 5, seed=seed, n_chunks=n_chunks)
    assert bool(values[:, 2].isnan().all()) and bool(values[:, [0, 1, 3]].isfinite().all())


def test_auto_backend_chooses_the_kernel_only_on_cuda_with_noise(kernel_device):
    """The one backend rule: ``"auto"`` is Triton for CUDA scores with eps > 0 and a rank <= MAX_K, PyTorch otherwise;
    an explicit choice is kept where it can run."""
    s = torch.randn(8, 200, device=kernel_device)
    on_cuda = "triton" if kernel_device.type == "cuda" else "torch"
    assert choose_backend("auto", s, 3, 0.5) == on_cuda
    assert choose_backend("auto", s, 3, 0.0) == "torch"
    assert choose_backend("auto", s, fused.MAX_K + 1, 0.5) == "torch"
    assert choose_backend("torch", s, 3, 0.5) == "torch"
    assert choose_backend("triton", s, 3, 0.0) == "triton"


def test_auto_backend_keeps_pytorch_where_it_was_measured_faster(kernel_device):
    """At a high rank over many rows of few classes (:data:`topk._validation.NOISED_TORCH_FASTER`) the PyTorch path
    was faster than the kernel; around that corner the kernel was, and an explicit choice is kept."""
    corner = NOISED_TORCH_FASTER
    on_cuda = "triton" if kernel_device.type == "cuda" else "torch"
    inside = torch.empty(corner["rows"], corner["classes"], device=kernel_device)
    assert choose_backend("auto", inside, corner["rank"], 1.0, corner) == "torch"
    assert choose_backend("auto", inside, corner["rank"], 1.0) == on_cuda  # the smoothed hinge's kernel: no corner
    assert choose_backend("auto", inside, corner["rank"] - 1, 1.0, corner) == on_cuda
    assert choose_backend("auto", inside[: corner["rows"] // 2], corner["rank"], 1.0, corner) == on_cuda
    wider = torch.empty(corner["rows"], corner["classes"] + 1, device=kernel_device)
    assert choose_backend("auto", wider, corner["rank"], 1.0, corner) == on_cuda
    assert choose_backend("triton", inside, corner["rank"], 1.0, corner) == "triton"


@pytest.mark.parametrize("call, message", [
    (lambda s, y: losses.noised_hinge(s, y, 2, 0.5, 3, backend="cuda"), "'backend' should be one of"),
    (lambda s, y: losses.noised_hinge(s, y, fused.MAX_K, 0.5, 3, backend="triton"), "handles at most rank 128, got rank 129"),
    (lambda s, y: topk.smooth_top_k(s, 2, 0.5, 3, backend="gpu"), "'backend' should be one of"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, 0.5, 3), "exactly one of 'seed'"),
    (lambda s, y: fused.perturbed_kth_largest(s, 300, 0.5, 3, seed=_seed(s)), "'k' should be"),
    (lambda s, y: fused.perturbed_kth_largest(s[None], 2, 0.5, 3, seed=_seed(s)), r"shape (rows, L), got shape (1, 4, 200)"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, -0.5, 3, seed=_seed(s)), "'epsilon' should be >= 0.0, got -0.5"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, float("nan"), 3, seed=_seed(s)), "'epsilon' should be finite"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, 0.5, 0, seed=_seed(s)), "'n_samples' should be >= 1, got 0"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, 0.5, 3, noise=torch.randn(2, 4, 200, device=s.device)),
     r"'noise' should have shape (n_samples, *s.shape) = (3, 4, 200), got (2, 4, 200)"),
    (lambda s, y: fused.perturbed_kth_largest(s, 2, 0.5, 3, noise=torch.randn(4, 200, 3, device=s.device)),
     r"= (3, 4, 200), got (4, 200, 3)"),  # pytopk's layout (rows, L, B)
    (lambda s, y: fused.perturbed_kth_largest(s, 2, 0.5, 3, seed=_seed(s), n_chunks=0), "'n_chunks' should be >= 1"),
])
def test_bad_fused_arguments_are_refused(kernel_device, call, message):
    """On the device the kernel runs on (CUDA, or the CPU under the interpreter), so that each case reaches its own
    check rather than the device check."""
    s = torch.randn(4, 200, device=kernel_device)
    y = torch.randint(0, 200, (4,), device=kernel_device)
    with pytest.raises(ValueError, match=re.escape(message)):
        call(s, y)


def _seed(s: torch.Tensor) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.long, device=s.device)


@pytest.mark.parametrize("call, message", [
    (lambda s: fused.perturbed_kth_largest(s.long(), 2, 0.5, 3, seed=_seed(s)), "'s' should be a floating-point"),
    (lambda s: fused.perturbed_kth_largest(s, 2, 0.5, 3, seed=_seed(s).int()), "'seed' should be a one-element int64"),
    (lambda s: fused.perturbed_kth_largest(s, 2, 0.5, 3, seed=7), "'seed' should be a one-element int64 tensor, got int"),
    (lambda s: fused.perturbed_kth_largest(s, 2, 0.5, 3, seed=_seed(s), prune="no"), "'prune' should be True or False"),
    (lambda s: fused.perturbed_kth_largest(s, 2.0, 0.5, 3, seed=_seed(s)), "'k' should be an integer, got 2.0"),
    (lambda s: fused.perturbed_kth_largest(s, 2, 0.5, 3, noise=torch.randn(3, 4, 200, dtype=torch.float64,
                                                                           device=s.device)),
     "'noise' should have the scores' dtype torch.float32, got torch.float64"),
])
def test_fused_arguments_of_the_wrong_kind_are_refused(kernel_device, call, message):
    with pytest.raises(TypeError, match=message):
        call(torch.randn(4, 200, device=kernel_device))


def test_triton_backend_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    """Whatever the machine: CPU scores are refused by the Triton backend unless the interpreter is on."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET" not in os.environ
    with pytest.raises(ValueError, match="needs CUDA scores, got scores on cpu"):
        losses.noised_hinge(torch.randn(4, 10), torch.zeros(4, dtype=torch.long), 2, 0.5, 3, backend="triton")


@pytest.mark.parametrize("triton_version, numpy_version, refused", [
    ("3.6.0", "2.4.6", True), ("3.6.0", "2.3.5", False), ("3.8.0", "2.4.6", False)])
def test_the_interpreter_is_refused_with_the_numpy_it_cannot_run_with(monkeypatch, triton_version, numpy_version,
                                                                     refused):
    import numpy
    import triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(numpy, "__version__", numpy_version)
    s, y = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    if refused:
        with pytest.raises(RuntimeError, match=f"Triton {triton_version}'s interpreter .* NumPy {numpy_version}"
                                               ".*numpy<2.4"):
            losses.noised_hinge(s, y, 2, 0.5, 3, backend="triton")
    else:
        assert _triton_support.interpreter_problem() is None


@pytest.mark.slow
def test_in_kernel_noise_never_exceeds_z_max(kernel_noise):
    """``tl.randn`` clamps its Box-Muller uniform at 1e-7, so ``|Z| <= Z_MAX = sqrt(2 ln 1e7)``: the fact the exact
    pruning rests on. Checked on the 4,096 draws above, whose largest |Z| is about 3.9 (below 3.0 with probability
    2e-5): a noise scale doubled, or cut to 0.6, fails."""
    assert float(kernel_noise.abs().max()) <= fused.Z_MAX * (1 + 1e-6)
    assert float(kernel_noise.abs().max()) > 3.0


def _wide_scores(device):
    """Rows of N(0, scale^2) scores, scale 1, 5 and 20: the wider the row, the more tiles lie out of reach."""
    generator = torch.Generator().manual_seed(12)
    scales = torch.tensor([1.0, 5.0, 20.0])[:, None]
    return (torch.randn(3, 1500, generator=generator) * scales).to(device)


#: The pruning tests' tiles: 64 classes (4 samples) per tile, so that a row of 1,500 classes makes 24 skip-or-not
#: decisions.
SMALL_TILE_ELEMENTS = 256


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(fused, "TILE_ELEMENTS", SMALL_TILE_ELEMENTS)


@pytest.fixture(scope="module")
def every_tile(kernel_device):
    """Values and positions with every tile processed (``prune=False``) on :func:`_wide_scores` in small tiles, rows
    whole and split in 2 chunks: computed once for both pruning tests."""
    s = _wide_scores(kernel_device)
    seed = torch.tensor([13], dtype=torch.int64, device=kernel_device)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused, "TILE_ELEMENTS", SMALL_TILE_ELEMENTS)
        return {n_chunks: fused.perturbed_kth_largest(s, 6, 0.5, 4, seed=seed, n_chunks=n_chunks, prune=False)
                for n_chunks in (1, 2)}


def test_pruning_changes_nothing(kernel_device, small_tiles, every_tile):
    """Skipping the tiles whose largest score + eps Z_MAX is below every sample's current K-th largest gives the
    same values and positions, bit for bit, as processing every tile (same seed, rows split or not)."""
    s = _wide_scores(kernel_device)
    seed = torch.tensor([13], dtype=torch.int64, device=kernel_device)
    for n_chunks, full in every_tile.items():
        pruned = fused.perturbed_kth_largest(s, 6, 0.5, 4, seed=seed, n_chunks=n_chunks, prune=True)
        assert torch.equal(pruned[0], full[0]) and torch.equal(pruned[1], full[1])


def test_pruning_with_a_too_small_bound_would_be_seen(kernel_device, small_tiles, every_tile, monkeypatch):
    """The previous test can fail: with the bound wrongly set to Z_MAX = 0, tiles that could still enter the top are
    skipped, and the results differ from processing every tile."""
    s = _wide_scores(kernel_device)
    seed = torch.tensor([13], dtype=torch.int64, device=kernel_device)
    monkeypatch.setattr(fused, "Z_MAX", 0.0)
    wrong = fused.perturbed_kth_largest(s, 6, 0.5, 4, seed=seed, prune=True)
    assert not torch.equal(wrong[1], every_tile[1][1])


def test_fused_loss_under_torch_compile_matches_eager(kernel_device):
    """A compiled model with the fused loss (which runs eagerly inside the graph: a graph break) gives the eager
    loss and gradients."""
    torch.manual_seed(14)
    model = torch.nn.Linear(16, 40).to(kernel_device)
    x = torch.randn(8, 16, device=kernel_device)
    y = torch.randint(0, 40, (8,), device=kernel_device)

    def step(m):
        generator = torch.Generator(kernel_device).manual_seed(3)
        loss = losses.noised_hinge(m(x), y, 3, 0.5, 4, generator=generator, backend="triton")
        loss.backward()
        return loss.detach(), m.weight.grad.clone()

    eager = step(model)
    model.weight.grad = None
    compiled = step(torch.compile(model, backend="aot_eager"))
    assert torch.allclose(eager[0], compiled[0]) and torch.allclose(eager[1], compiled[1])


def test_importing_topk_does_not_import_triton():
    """Triton is imported at the kernel's first use: importing it earlier (also through ``torch._dynamo``) would fix
    its interpreter mode before ``TRITON_INTERPRET`` could be set, and slow ``import topk`` for CPU users."""
    run = subprocess.run([sys.executable, "-c", "import sys, topk; print('triton' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stdout + run.stderr
