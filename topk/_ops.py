"""The custom operators behind the smoothed top-K and the noised hinge, registered in the ``topk`` namespace.

Garcin et al. (ICML 2022) estimate ``topSigma_{K,eps}`` and ``top_{K,eps}`` by the mean over ``B`` noise
samples of ``topSigma_K`` / ``top_K`` of ``s + eps Z_b`` (Eq. 11), with the pathwise gradient of Prop. 3.3, the
mean of the selected one-hots (and, for the noised hinge, minus ``e_y``: Eq. 12). Three operators do it:

- ``topk::perturbed_top``: the PyTorch path, any device; the noise is an input (``B x ... x L``);
- ``topk::fused_perturbed_top``: the Triton kernel of :mod:`topk.fused` (CUDA; on a CPU only under Triton's
  interpreter); the noise is drawn in the kernel from a Philox seed given as a one-element device tensor,
  or given explicitly;
- ``topk::perturbed_top_backward``: the gradient of both, a scatter of ``grad / B`` at the saved positions.

Each has a fake (meta) implementation, and the two forward operators a registered autograd formula, so that
``torch.compile`` traces a loss as one graph (an operator is one opaque node: no graph break) and CUDA graphs
capture it. The operators are deterministic given their inputs; the randomness (the noise or the seed) is
drawn by the caller from the device's generator, so a captured graph draws fresh noise at every replay.

With ``labels`` the forward operators return ``mean_b top(s + eps Z_b) - s_y``, the term of the hinge (Eq. 10,
13), and the backward subtracts ``grad`` at ``y``: the loss's whole gradient is written in one pass.
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["perturbed_top", "fused_perturbed_top", "perturbed_top_backward"]


def _accumulate_dtype(scores: Tensor) -> torch.dtype:
    return torch.promote_types(scores.dtype, torch.float32)


def _minus_true_scores(value: Tensor, scores: Tensor, labels: Optional[Tensor]) -> Tensor:
    """``value - s_y`` in ``value``'s (accumulation) dtype, or ``value`` without labels; then in the scores' dtype."""
    if labels is not None:
        value = value - scores.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(value.dtype)  # [..., L] -> [...]
    return value.to(scores.dtype)


@torch.library.custom_op("topk::perturbed_top", mutates_args=())
def perturbed_top(scores: Tensor, noise: Tensor, k: int, epsilon: float, sum_top: bool,
                  labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of ``top_k`` (``sum_top``: ``topSigma_k``) of ``s + epsilon Z_b`` (Eq. 11).

    ``scores``: ``(..., L)``; ``noise``: ``(B, ..., L)`` in the scores' dtype. ``s + eps z`` is rounded twice
    (product, then sum), as the fused kernel does. Returns the value, shape ``(...)`` (minus ``s_y`` with
    ``labels``), and the selected positions, int64 of shape ``(B, ..., r)`` with ``r = k`` (``sum_top``) or 1.
    A row holding a NaN gets a NaN value (``torch.topk`` ranks NaN first).
    """
    accumulate = _accumulate_dtype(scores)
    perturbed = (noise * epsilon).add_(scores)  # [B, ..., L]
    values, positions = torch.topk(perturbed, k, dim=-1)  # [B, ..., L] -> [B, ..., k], sorted
    if sum_top:
        selected = values.sum(-1, dtype=accumulate)
    else:
        selected, positions = values[..., k - 1].to(accumulate).contiguous(), positions[..., k - 1:].contiguous()
    value = selected.sum(0) / noise.shape[0]  # [B, ...] -> [...], summed in the fused operator's order
    value = torch.where(values[..., 0].isnan().any(0), float("nan"), value)
    return _minus_true_scores(value, scores, labels), positions


@perturbed_top.register_fake
def _(scores, noise, k, epsilon, sum_top, labels):
    positions_shape = (noise.shape[0], *scores.shape[:-1], k if sum_top else 1)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=torch.long)


@torch.library.custom_op("topk::fused_perturbed_top", mutates_args=())
def fused_perturbed_top(scores: Tensor, seed: Optional[Tensor], noise: Optional[Tensor], k: int, epsilon: float,
                        n_samples: int, labels: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Mean over the samples of the ``k``-th largest of ``s + epsilon Z_b`` on the fused kernel (:mod:`topk.fused`).

    Exactly one of ``seed`` (a one-element int64 tensor on the scores' device: in-kernel Philox noise) and
    ``noise`` (``(B, ..., L)``, explicit draws). Returns the value, shape ``(...)`` (minus ``s_y`` with
    ``labels``), and the positions, int32 of shape ``(B, ..., 1)``.
    """
    from topk import fused

    rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [rows, L]
    if noise is not None:
        noise = noise.reshape(n_samples, *rows.shape)  # [B, ..., L] -> [B, rows, L]
    values, positions = fused.perturbed_kth_largest(rows, k, epsilon, n_samples, seed=seed, noise=noise)
    value = (values.sum(0) / n_samples).reshape(scores.shape[:-1])  # [B, rows] -> [...]
    return _minus_true_scores(value, scores, labels), positions.reshape(n_samples, *scores.shape[:-1], 1)


@fused_perturbed_top.register_fake
def _(scores, seed, noise, k, epsilon, n_samples, labels):
    positions_shape = (n_samples, *scores.shape[:-1], 1)
    return scores.new_empty(scores.shape[:-1]), scores.new_empty(positions_shape, dtype=torch.int32)


@torch.library.custom_op("topk::perturbed_top_backward", mutates_args=())
def perturbed_top_backward(grad: Tensor, positions: Tensor, labels: Optional[Tensor], n_classes: int) -> Tensor:
    """``grad`` times the estimator's gradient: ``grad / B`` added at every saved position (Prop. 3.3), and
    ``-grad`` at the label when given (Eq. 12). ``grad``: ``(...)``, positions ``(B, ..., r)``; returns ``(..., L)``."""
    n_samples = positions.shape[0]
    flat_positions = positions.movedim(0, -2).flatten(-2).long()  # [B, ..., r] -> [..., B * r]
    weight = (grad / n_samples).unsqueeze(-1).expand(flat_positions.shape)
    grad_scores = grad.new_zeros((*grad.shape, n_classes)).scatter_add_(-1, flat_positions, weight)
    if labels is not None:
        grad_scores.scatter_add_(-1, labels.unsqueeze(-1), -grad.unsqueeze(-1))
    return grad_scores


@perturbed_top_backward.register_fake
def _(grad, positions, labels, n_classes):
    return grad.new_empty((*grad.shape, n_classes))


def _save_positions(ctx, inputs, output):
    scores, labels = inputs[0], inputs[-1]
    ctx.save_for_backward(output[1], labels)
    ctx.n_classes = scores.shape[-1]
    ctx.n_inputs = len(inputs)


def _scatter_gradient(ctx, grad_value, grad_positions):
    positions, labels = ctx.saved_tensors
    grad_scores = perturbed_top_backward(grad_value, positions, labels, ctx.n_classes)
    return (grad_scores,) + (None,) * (ctx.n_inputs - 1)


for _operator in (perturbed_top, fused_perturbed_top):
    _operator.register_autograd(_scatter_gradient, setup_context=_save_positions)
