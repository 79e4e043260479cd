"""The perturbed top-K estimate of Garcin et al. (ICML 2022) and its gradient, on three paths: the computations of the
custom operators of :mod:`topk._ops`, whose names they bear.

The estimate is the mean over ``B`` noise samples of ``top_k`` (or ``topSigma_k``) of ``s + eps Z_b`` (Eq. 11), minus
``s_y`` when labels are given (the hinge's term, Eq. 10, 13); its gradient is ``grad / B`` added at every selected
position (Prop. 3.3), minus ``grad`` at the label (Eq. 12). The paths: PyTorch operations on given noise (any device,
differentiable: the reference the others equal), the CPU kernel of :mod:`topk._cpu_kernel` (seeded, exact pruning) and
the fused Triton kernel of :mod:`topk.fused` (in-kernel or given noise).
"""

from typing import Optional

import torch
from torch import Tensor

from topk import _cpu_kernel
from topk._labels import true_scores


def _minus_true_scores(value: Tensor, scores: Tensor, labels: Optional[Tensor]) -> Tensor:
    """``value - s_y`` in ``value``'s (accumulation) dtype, or ``value`` without labels; then in the scores' dtype."""
    if labels is not None:
        value = value - true_scores(scores, labels).to(value.dtype)
    return value.to(scores.dtype)


def _mean_top(perturbed: Tensor, k: int, sum_top: bool, accumulate: torch.dtype) -> tuple[Tensor, Tensor]:
    """The mean over the samples (the first dimension) of ``top_k`` (``topSigma_k``) of the rows of ``perturbed``
    (``[B, ..., M]``) in the ``accumulate`` dtype (NaN for a row holding a NaN), and the selected positions, shape
    ``(B, ..., r)``."""
    values, positions = torch.topk(perturbed, k, dim=-1)  # [B, ..., M] -> [B, ..., k], sorted
    if sum_top:
        selected = values.sum(-1, dtype=accumulate)
    else:
        selected, positions = values[..., k - 1].to(accumulate).contiguous(), positions[..., k - 1:].contiguous()
    value = selected.sum(0) / perturbed.shape[0]  # [B, ...] -> [...], summed in the fused operator's order
    return torch.where(values[..., 0].isnan().any(0), float("nan"), value), positions


def perturbed_top(scores: Tensor, noise: Tensor, k: int, epsilon: float, sum_top: bool,
                  labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of ``top_k`` (``sum_top``: ``topSigma_k``) of ``s + epsilon Z_b`` (Eq. 11).

    ``scores``: ``(..., L)``; ``noise``: ``(B, ..., L)`` in the scores' dtype. Returns the value, shape ``(...)``
    (minus ``s_y`` with ``labels``), and the selected positions, int64 of shape ``(B, ..., r)`` with ``r = k``
    (``sum_top``) or 1. A row holding a NaN gets a NaN value (``torch.topk`` ranks NaN first). Half-precision scores
    are perturbed in float32, as both kernels perturb them, so that the three paths are one estimator.
    """
    accumulate = torch.promote_types(scores.dtype, torch.float32)
    # s + eps z rounded twice (product, then sum), as the fused kernel rounds it
    scaled = noise * epsilon if noise.dtype == accumulate else noise.to(accumulate).mul_(epsilon)  # one temporary
    value, positions = _mean_top(scaled.add_(scores), k, sum_top, accumulate)
    return _minus_true_scores(value, scores, labels), positions


def pruned_perturbed_top(scores: Tensor, seed: Tensor, k: int, epsilon: float, n_samples: int, sum_top: bool,
                         labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`perturbed_top` on CPU, on the kernel of :mod:`topk._cpu_kernel`: the noise is its counter-based bounded
    normals for ``seed`` (a one-element int64 tensor), drawn only for the classes that can reach the top."""
    rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [R, L]
    # [B, R] values and [B, R, r] positions
    selected, positions = _cpu_kernel.perturbed_top(rows, int(seed), k, epsilon, n_samples, sum_top)
    value = (selected.sum(0) / n_samples).reshape(scores.shape[:-1])  # a NaN row's samples are all NaN
    return (_minus_true_scores(value, scores, labels),  # an empty batch too: r given, not inferred from 0 elements
            positions.reshape(n_samples, *scores.shape[:-1], k if sum_top else 1))


def fused_perturbed_top(scores: Tensor, seed: Optional[Tensor], noise: Optional[Tensor], k: int, epsilon: float,
                        n_samples: int, labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of the ``k``-th largest of ``s + epsilon Z_b`` on the fused kernel (:mod:`topk.fused`).

    Exactly one of ``seed`` (a one-element int64 tensor on the scores' device: in-kernel Philox noise) and
    ``noise`` (``(B, ..., L)``, explicit draws). Returns the value, shape ``(...)`` (minus ``s_y`` with
    ``labels``), and the positions, int32 of shape ``(B, ..., 1)``.
    """
    from topk import fused  # at first use: it imports torch._dynamo, hence Triton, which `import topk` must not

    rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [rows, L]
    if noise is not None:
        noise = noise.reshape(n_samples, *rows.shape)  # [B, ..., L] -> [B, rows, L]
    values, positions = fused.launch_kth_largest(rows, k, epsilon, n_samples, seed, noise, None, True)
    value = (values.sum(0) / n_samples).reshape(scores.shape[:-1])  # [B, rows] -> [...]
    return _minus_true_scores(value, scores, labels), positions.reshape(n_samples, *scores.shape[:-1], 1)


def flat_positions(positions: Tensor) -> Tensor:
    """The saved positions of every sample side by side on the last dimension: ``[B, ..., r]`` -> ``[..., B * r]``."""
    return positions.movedim(0, -2).flatten(-2).long()


def perturbed_top_backward(grad: Tensor, positions: Tensor, labels: Optional[Tensor], n_classes: int) -> Tensor:
    """``grad`` times the estimator's gradient: ``grad / B`` added at every saved position (Prop. 3.3), and
    ``-grad`` at the label when given (Eq. 12). ``grad``: ``(...)``, positions ``(B, ..., r)``; returns ``(..., L)``.
    Differentiable: linear in ``grad``, constant in the scores."""
    n_samples = positions.shape[0]
    positions = flat_positions(positions)
    weight = (grad / n_samples).unsqueeze(-1).expand(positions.shape)
    grad_scores = grad.new_zeros((*grad.shape, n_classes)).scatter_add_(-1, positions, weight)
    if labels is not None:
        grad_scores.scatter_add_(-1, labels.unsqueeze(-1), -grad.unsqueeze(-1))
    return grad_scores


def fused_perturbed_top_backward(grad: Tensor, positions: Tensor, labels: Optional[Tensor], n_classes: int) -> Tensor:
    """:func:`perturbed_top_backward` for the fused kernel's positions (int32, ``(B, ..., 1)``) in one kernel launch
    (:func:`topk.fused.kth_gradient`): the same numbers, the zeros written with the rest."""
    from topk import fused  # at first use: it imports torch._dynamo, hence Triton, which `import topk` must not

    flat_labels = labels.reshape(-1) if labels is not None else None
    grad_scores = fused.kth_gradient(grad.reshape(-1), positions.reshape(positions.shape[0], -1), flat_labels,
                                     n_classes)  # [rows, L]
    return grad_scores.reshape(*grad.shape, n_classes)
