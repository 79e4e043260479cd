"""The top-K operators and their noise-smoothed versions.

Garcin, Servajean, Joly & Salmon, "Stochastic smoothing of the top-K calibrated hinge loss for deep
imbalanced classification", ICML 2022, Section 3.2; we follow its notation: ``top_K(s)`` is the K-th
largest entry of a score vector ``s`` of ``L`` classes and ``topSigma_K(s)`` the sum of its K largest.

The smoothed operators follow the perturbed optimizers of Berthet et al. (2020):
``topSigma_{K,eps}(s) = E[topSigma_K(s + eps Z)]`` with ``Z ~ N(0, Id_L)`` (Definition 3.2), estimated
with ``B`` Monte Carlo samples (Eq. 11), and ``top_{K,eps} = topSigma_{K,eps} - topSigma_{K-1,eps}``
(Definition 3.4). Their gradient is the pathwise estimator of Prop. 3.3, the mean over the samples of
the one-hot vectors of the selected coordinates.

All operators act on the last dimension and accept any leading batch shape. Ties are broken as
``torch.topk`` breaks them; values never depend on it. A NaN score makes the row's result NaN.
"""

from __future__ import annotations

import math
import threading

import torch

from topk import fused
from topk._validation import check_backend, check_generator, check_int, check_noise, check_real, check_scores

#: Automatic chunking: at most this many perturbed scores are materialised at once (about 16 MB in
#: float32); a single sample is always allowed, so memory stays O(batch x L) however large L is.
CHUNK_ELEMENTS = 1 << 22

# PyTorch's CPU allocator does not cache: a fresh noise buffer page-faults on every call, which costs
# about half as much as drawing the noise. Each thread keeps one CPU scratch buffer per dtype, of at
# most CHUNK_ELEMENTS numbers (CUDA's caching allocator already does this on the GPU).
_scratch = threading.local()


def _noise_buffer(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    numel = math.prod(shape)
    if like.device.type != "cpu" or numel > CHUNK_ELEMENTS:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    buffers = _scratch.__dict__.setdefault("buffers", {})
    buffer = buffers.get(like.dtype)
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[like.dtype] = torch.empty(numel, dtype=like.dtype)
    return buffer[:numel].view(shape)

__all__ = ["top_k", "top_sum_k", "smooth_top_k", "smooth_top_sum_k"]


def _nan_where_input_nan(result: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """``torch.topk`` ranks NaN above every number, so ``largest`` (the row maximum) is NaN iff the row has one."""
    return torch.where(torch.isnan(largest), largest, result)


def top_k(s: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th largest score along the last dimension, ``top_K(s) = s_[K]``.

    Its gradient is the one-hot vector of the selected coordinate (``arg top_K(s)``).

    >>> top_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2)
    tensor(2.4000)
    """
    check_scores(s)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    values = torch.topk(s, k, dim=-1).values  # [..., L] -> [..., k]
    return _nan_where_input_nan(values[..., k - 1], values[..., 0])


def top_sum_k(s: torch.Tensor, k: int) -> torch.Tensor:
    """The sum of the ``k`` largest scores, ``topSigma_K(s)``; gradient ``arg topSigma_K(s)`` (K ones).

    >>> top_sum_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2)
    tensor(5.)
    """
    check_scores(s)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    return torch.topk(s, k, dim=-1).values.sum(-1)


def _samples_per_chunk(n_samples: int, s: torch.Tensor, samples_per_chunk: int | None) -> int:
    if samples_per_chunk is not None:
        return check_int(samples_per_chunk, "samples_per_chunk", 1)
    return max(1, min(n_samples, CHUNK_ELEMENTS // max(1, s.numel())))


class _PerturbedTop(torch.autograd.Function):
    """Monte Carlo mean of ``topSigma_k`` (``kth_only=False``) or ``top_k`` (``kth_only=True``) of ``s + eps Z``.

    Forward keeps one chunk of perturbed scores alive at a time and saves only the selected positions
    (``n_samples x batch x r`` integers, r = k or 1); backward scatters ``1 / n_samples`` at them (Prop. 3.3).
    """

    @staticmethod
    def forward(ctx, s, k, kth_only, epsilon, n_samples, generator, noise, chunk):
        accumulate_dtype = torch.promote_types(s.dtype, torch.float32)
        total = torch.zeros(s.shape[:-1], dtype=accumulate_dtype, device=s.device)
        row_has_nan = torch.zeros(s.shape[:-1], dtype=torch.bool, device=s.device)
        kept = 1 if kth_only else k
        positions = torch.empty((n_samples, *s.shape[:-1], kept), dtype=torch.long, device=s.device)
        for start in range(0, n_samples, chunk):
            stop = min(start + chunk, n_samples)
            if noise is not None:
                perturbed = torch.add(s, noise[start:stop], alpha=epsilon)  # [m, ..., L]
            else:
                buffer = _noise_buffer((stop - start, *s.shape), s)
                perturbed = buffer.normal_(generator=generator).mul_(epsilon).add_(s)  # [m, ..., L]
            values, indices = torch.topk(perturbed, k, dim=-1)  # [m, ..., L] -> [m, ..., k], sorted
            row_has_nan |= torch.isnan(values[..., 0]).any(0)
            if kth_only:
                total += values[..., k - 1].sum(0, dtype=accumulate_dtype)
                positions[start:stop] = indices[..., k - 1:]
            else:
                total += values.sum((0, -1), dtype=accumulate_dtype)
                positions[start:stop] = indices
        ctx.save_for_backward(positions)
        ctx.n_classes = s.shape[-1]
        result = (total / n_samples).to(s.dtype)
        return torch.where(row_has_nan, torch.full_like(result, float("nan")), result)

    @staticmethod
    def backward(ctx, grad_output):
        (positions,) = ctx.saved_tensors
        n_samples = positions.shape[0]  # positions: [B, ..., r]
        # [B, ..., r] -> [..., B * r]: every selected position of a row, over all samples
        flat_positions = positions.movedim(0, -2).flatten(-2)
        weight = (grad_output / n_samples).unsqueeze(-1).expand(flat_positions.shape)
        grad_s = torch.zeros((*grad_output.shape, ctx.n_classes), dtype=grad_output.dtype, device=grad_output.device)
        grad_s.scatter_add_(-1, flat_positions, weight)
        return grad_s, None, None, None, None, None, None, None


def _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, kth_only, backend="torch"):
    check_scores(s)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    epsilon = check_real(epsilon, "epsilon", low=0.0)
    n_samples = check_int(n_samples, "n_samples", 1)
    generator = check_generator(generator, s)
    if noise is not None:
        check_noise(noise, n_samples, s)
    chunk = _samples_per_chunk(n_samples, s, samples_per_chunk)
    if fused.use_kernel(check_backend(backend, s, k), s, k, epsilon):
        return fused.smooth_top_k_rows(s, k, epsilon, n_samples, generator=generator, noise=noise)
    if epsilon == 0.0:
        return top_k(s, k) if kth_only else top_sum_k(s, k)
    return _PerturbedTop.apply(s, k, kth_only, epsilon, n_samples, generator, noise, chunk)


def smooth_top_sum_k(
    s: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    samples_per_chunk: int | None = None,
) -> torch.Tensor:
    """Monte Carlo estimate of ``topSigma_{K,eps}(s) = E[topSigma_K(s + eps Z)]`` (Definition 3.2, Eq. 11).

    Args:
        s: scores, shape ``(..., L)``, any floating dtype, CPU or CUDA.
        k: the number of largest scores summed, ``1 <= k <= L``.
        epsilon: the noise scale, ``>= 0``; ``0`` gives the exact ``topSigma_K`` and its gradient.
        n_samples: ``B``, the number of noise samples, ``>= 1``.
        generator: where ``Z`` is drawn from when ``noise`` is not given (default: the global RNG).
        noise: the standard normal draws ``Z`` themselves, shape ``(n_samples, *s.shape)``, same dtype
            and device as ``s``; used as given.
        samples_per_chunk: how many samples are perturbed at once; by default as many as fit in
            ``CHUNK_ELEMENTS`` numbers, at least one (memory O(batch x L) for very large L).

    Returns:
        shape ``s.shape[:-1]``; its gradient is the mean over the samples of ``arg topSigma_K(s + eps Z_b)``
        (Prop. 3.3), whose rows sum to ``k``.

    >>> z = torch.tensor([[0.2, -0.1, 0.1, 0.3], [0.1, 0.1, -0.1, 0.1], [-0.1, -0.1, 0.1, -0.1]])
    >>> smooth_top_sum_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2, 1.0, 3, noise=z)
    tensor(5.0667)
    """
    return _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, kth_only=False)


def smooth_top_k(
    s: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    samples_per_chunk: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Monte Carlo estimate of ``top_{K,eps}(s) = topSigma_{K,eps}(s) - topSigma_{K-1,eps}(s)`` (Definition 3.4).

    Both sums use the same noise, so the difference is exactly the mean over the samples of the
    ``k``-th largest perturbed score; it is computed that way, without the cancellation of a
    subtraction. The gradient is the mean of the one-hots ``arg top_K(s + eps Z_b)``: its rows sum to 1.
    Arguments as in :func:`smooth_top_sum_k`; ``|top_{K,eps}(s) - top_K(s)| <= eps K sqrt(2 log L)``
    (Prop. 3.5). ``backend``: ``"torch"``, ``"triton"`` (:mod:`topk.fused`, in-kernel noise seeded from
    ``generator``; ``samples_per_chunk`` does not apply) or ``"auto"`` (Triton for CUDA scores with
    ``epsilon > 0`` and ``k <= 128`` when it is installed).

    The worked example of Section 3.2 (L = 4, K = 2, B = 3, eps = 1):

    >>> z = torch.tensor([[0.2, -0.1, 0.1, 0.3], [0.1, 0.1, -0.1, 0.1], [-0.1, -0.1, 0.1, -0.1]])
    >>> s = torch.tensor([2.4, 2.6, 2.3, 0.5], requires_grad=True)
    >>> value = smooth_top_k(s, 2, 1.0, 3, noise=z); value.backward()
    >>> round(value.item(), 4), s.grad
    (2.4667, tensor([0.3333, 0.3333, 0.3333, 0.0000]))
    """
    return _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, kth_only=True, backend=backend)
