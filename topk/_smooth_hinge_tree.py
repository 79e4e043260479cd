"""The smoothed top-k hinge of Berrada, Zisserman & Kumar (ICLR 2018, Eq. 10-11) per sample, in PyTorch operations on
the tree of :mod:`topk._esp_tree`: the ``"torch"`` backend of :func:`topk.losses.smooth_hinge`, and the function a
backward with ``create_graph=True`` differentiates for the kernel's loss (``topk::smooth_hinge_rows``)."""

import torch

from topk._esp_tree import absent_log, log_pair
from topk._labels import is_true, true_scores


def smooth_hinge_tree(scores: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """``tau * softplus(z)``, ``z = alpha / tau + log sigma_k(e) - log sigma_{k-1}(e)``, ``e_j = exp((s_j - s_y) /
    (k tau))`` for ``j != y``; for ``k = 1``, ``tau * logsumexp_j((s_j + alpha 1{j != y} - s_y) / tau)``. Arguments
    checked, ``scores`` in float32 or float64; returns ``scores.shape[:-1]``."""
    true = is_true(scores, y)
    gaps = scores - true_scores(scores, y).unsqueeze(-1)  # s_j - s_y, exact to the rounding of one subtraction
    # Both forms are invariant to shifting the gaps by a constant, so shifting by the (detached) largest one keeps
    # every exponent <= 0, whatever tau, and leaves the values and the autograd gradient exact.
    if k == 1:
        logits = gaps + alpha * ~true
        top = logits.amax(-1, keepdim=True).detach()
        return (top + tau * torch.logsumexp((logits - top) / tau, dim=-1, keepdim=True)).squeeze(-1)
    others = gaps.masked_fill(true, float("-inf"))
    top = others.amax(-1, keepdim=True).detach()
    x = ((others - top) / (k * tau)).masked_fill(true, absent_log(scores.dtype))  # e_y = 0: y is left out
    log_sigma = log_pair(x, k)  # [..., L] -> [..., 2]
    z = (alpha + top.squeeze(-1) / k) / tau + log_sigma[..., 1] - log_sigma[..., 0]
    return tau * torch.logaddexp(z, torch.zeros_like(z))  # softplus(z), exact also for z > 20 in float64
