"""The smoothed top-k hinge of Berrada, Zisserman & Kumar (ICLR 2018, Eq. 10-11) per sample, in PyTorch operations on
the tree of :mod:`topk._esp_tree`: the ``"torch"`` backend of :func:`topk.losses.smooth_hinge`, and the function a
backward with ``create_graph=True`` differentiates for the kernel's loss (``topk::smooth_hinge_rows``)."""

import torch
import torch.nn.functional as F

from topk._esp_tree import absent_log, infinite_log, log_pair
from topk._labels import is_true, true_scores


def smooth_hinge_tree(scores: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """``tau * softplus(z)``, ``z = alpha / tau + (shift - s_y) / (k tau) + log sigma_k(e) - log sigma_{k-1}(e)``,
    ``e_j = exp((s_j - shift) / (k tau))`` for ``j != y`` (for ``k = 1``, a log-sum-exp), at infinite scores its limit
    (:func:`limit_offset`). Arguments checked, ``scores`` in float32 or float64; returns ``scores.shape[:-1]``."""
    true = is_true(scores, y)
    others = scores.masked_fill(true, float("-inf"))
    # z is invariant to the shift, so shifting by the (detached) largest finite other score keeps every finite
    # exponent <= 0, whatever tau, and leaves the values and the autograd gradient exact. A score at +inf stands in
    # at infinite_log (its gradient 0), one at -inf is absent.
    lowest = torch.finfo(scores.dtype).min
    shift = others.nan_to_num(nan=float("nan"), posinf=float("-inf"), neginf=lowest).amax(-1, keepdim=True).detach()
    x = ((others - shift) / (k * tau)).clamp(absent_log(scores.dtype), infinite_log(scores.dtype))
    x = x.masked_fill(true, absent_log(scores.dtype))  # e_y = 0: y is left out
    if k == 1:
        log_gap = torch.logsumexp(x, dim=-1)  # log sigma_1 - log sigma_0
    else:
        log_sigma = log_pair(x, k)  # [..., L] -> [..., 2]
        log_gap = log_sigma[..., 1] - log_sigma[..., 0]
    s_y, shift = true_scores(scores, y), shift.squeeze(-1)
    n_infinite = (others == float("inf")).sum(-1)
    z = (alpha + (shift - s_y) / k) / tau + log_gap + limit_offset(n_infinite, s_y, shift == lowest, k)
    # softplus(z) = -log sigmoid(-z): exact in float64 for any z, gradient sigmoid(z) (1/2 at 0, 1 at +inf, 0 at -inf)
    return F.logsigmoid(-z).mul(-tau)


def limit_offset(n_infinite: torch.Tensor, s_y: torch.Tensor, no_finite_other: torch.Tensor, k: int) -> torch.Tensor:
    """What ``z`` needs added at infinite scores, ``n_infinite`` other scores at +inf: +inf for ``k`` or more of them
    (the loss's limit is +inf, as the hard loss's k-th largest other score is); NaN (no limit) for one or more with
    ``s_y`` at +inf, or for every score at -inf, ``s_y`` included; 0 otherwise: with fewer than ``k`` their stand-ins
    give the finite limit, ``s_y = +inf`` gives ``z = -inf`` (a loss of 0) and ``s_y = -inf`` gives ``z = +inf``."""
    inf = float("inf")
    undefined = ((n_infinite > 0) & (s_y == inf)) | ((n_infinite == 0) & no_finite_other & (s_y == -inf))
    return torch.where(n_infinite >= k, inf, torch.where(undefined, float("nan"), 0.0)).to(s_y.dtype)
