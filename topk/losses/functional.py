"""The losses of Table 1 of Garcin et al. (ICML 2022), as functions of scores ``s`` and labels ``y``.

``s`` has shape ``(..., L)`` (classes last), ``y`` integer labels of shape ``s.shape[:-1]``. Each loss
returns per-sample values reduced by ``reduction`` in ``("mean", "sum", "none")``. Formulas, parameters
and references are in :mod:`topk.losses.registry` (Table 1 is printed from it); each docstring names
the equation. A NaN score gives a NaN loss for its sample.

Each function checks its arguments once, without reading a tensor's values on the host (the labels' range is
an asynchronous assertion, see :func:`topk._validation.check_labels`), so that every loss runs without a device
synchronisation and ``torch.compile(..., fullgraph=True)`` traces it, backward included, as one graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from topk import _ops
from topk._labels import is_true, true_scores
from topk._smooth_hinge_tree import smooth_hinge_tree
from topk._validation import (
    NOISED_TORCH_FASTER,
    check_generator,
    check_hyperparameter,
    check_int,
    check_labels,
    check_margins,
    check_noise,
    check_scores,
    choose_backend,
)
from topk.operators import exact_top, monte_carlo_top

__all__ = [
    "zero_one_topk",
    "cross_entropy",
    "focal",
    "ldam",
    "lapin_hinge",
    "convex_hinge",
    "calibrated_hinge",
    "smooth_hinge",
    "noised_hinge",
    "class_margins",
]


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _checked(s, y, reduction):
    check_scores(s)
    return check_labels(y, s), check_hyperparameter("reduction", reduction)


def _without_true(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``s`` with the true class's score set to -inf: it can never be selected among the others."""
    return s.scatter(-1, y.unsqueeze(-1), float("-inf"))


def _log_softmax_true(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return true_scores(F.log_softmax(s, dim=-1), y)


def zero_one_topk(s: torch.Tensor, y: torch.Tensor, k: int, *, reduction: str = "mean") -> torch.Tensor:
    """The top-K 0/1 loss ``1{top_K(s) > s_y}`` (Eq. 3): 1 when the true class is not among the K best.

    A true class tied with the K-th score counts as in the top K. Piecewise constant: no gradient.

    >>> zero_one_topk(torch.tensor([[2.4, 2.6, 2.3, 0.5]]), torch.tensor([2]), 2)
    tensor(1.)
    """
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    with torch.no_grad():
        loss = (exact_top(s, k) > true_scores(s, y)).to(s.dtype)
        loss = torch.where(torch.isnan(s).any(-1), torch.full_like(loss, float("nan")), loss)
    return _reduce(loss, reduction)


def cross_entropy(s: torch.Tensor, y: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy ``-log softmax(s)_y``, top-K calibrated for every K (Yang & Koyejo, 2020)."""
    y, reduction = _checked(s, y, reduction)
    return _reduce(-_log_softmax_true(s, y), reduction)


def focal(s: torch.Tensor, y: torch.Tensor, gamma: float, *, reduction: str = "mean") -> torch.Tensor:
    """Focal loss ``(1 - p_y)^gamma * CE(s, y)`` with ``p = softmax(s)`` (Lin et al., 2017).

    The expression printed in the paper's Table 1 is a typo; this is the standard one. ``gamma = 0``
    is cross-entropy. ``1 - p_y`` is floored at the dtype's smallest normal number so that the gradient
    stays finite when ``p_y`` rounds to 1.
    """
    y, reduction = _checked(s, y, reduction)
    gamma = check_hyperparameter("gamma", gamma)
    log_p_true = _log_softmax_true(s, y)
    one_minus_p = (-torch.expm1(log_p_true)).clamp_min(torch.finfo(s.dtype).tiny)
    return _reduce(one_minus_p.pow(gamma) * -log_p_true, reduction)


def ldam(
    s: torch.Tensor,
    y: torch.Tensor,
    margins: float | torch.Tensor,
    *,
    scale: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Label-distribution-aware margin loss ``CE(scale * (s - m_y e_y), y)`` (Cao et al., 2019).

    ``margins``: one value, or one per class (``class_margins(counts, C)`` gives ``m_y = C / n_y^(1/4)``).
    ``scale`` is the softmax temperature of Cao et al. (30 in their code): give it the cosines of
    :class:`topk.layers.CosineClassifier` with ``scale=1``, so that the margins are in cosine units as theirs (largest
    0.5) and the paper's (0.2, 0.4). ``margins = 0, scale = 1`` is cross-entropy. Works on any device.
    """
    y, reduction = _checked(s, y, reduction)
    margins = check_margins(margins, s)
    scale = check_hyperparameter("scale", scale)
    per_class = margins.to(s.dtype) if isinstance(margins, torch.Tensor) else margins
    shifted = s - is_true(s, y).to(s.dtype) * per_class  # subtract m_y from s_y only
    return _reduce(-_log_softmax_true(scale * shifted, y), reduction)


def lapin_hinge(s: torch.Tensor, y: torch.Tensor, k: int, *, reduction: str = "mean") -> torch.Tensor:
    """Top-K hinge ``(1 + top_K(s without y) - s_y)_+`` (Eq. 4, Lapin et al., 2015); needs ``k <= L - 1``."""
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1] - 1, " (the number of classes other than the true one)")
    return _reduce(F.relu(1 + exact_top(_without_true(s, y), k) - true_scores(s, y)), reduction)


def convex_hinge(s: torch.Tensor, y: torch.Tensor, k: int, *, reduction: str = "mean") -> torch.Tensor:
    """Convexified top-K hinge ``(topSigma_K(1 - e_y + s) / K - s_y)_+`` (Table 1, Lapin et al., 2015)."""
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    with_margin = s + 1 - is_true(s, y).to(s.dtype)
    return _reduce(F.relu(exact_top(with_margin, k, sum_top=True) / k - true_scores(s, y)), reduction)


def calibrated_hinge(s: torch.Tensor, y: torch.Tensor, k: int, *, reduction: str = "mean") -> torch.Tensor:
    """Top-K calibrated hinge ``(1 + top_{K+1}(s) - s_y)_+`` (Eq. 5, Yang & Koyejo, 2020); needs ``k + 1 <= L``."""
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1] - 1, " (k + 1 must not exceed the number of classes)")
    return _reduce(F.relu(1 + (exact_top(s, k + 1) - true_scores(s, y))), reduction)


def smooth_hinge(
    s: torch.Tensor,
    y: torch.Tensor,
    k: int,
    tau: float,
    alpha: float = 1.0,
    *,
    hard_switch: bool = False,
    reduction: str = "mean",
    backend: str = "auto",
) -> torch.Tensor:
    """The smoothed top-k hinge of Berrada, Zisserman & Kumar (ICLR 2018), Eq. 10-11: ``tau * softplus(z)`` with

    ``z = alpha / tau + log sigma_k(e) - log sigma_{k-1}(e)``, ``e_j = exp((s_j - s_y) / (k tau))`` for ``j != y``,

    where ``sigma_j`` is the j-th elementary symmetric polynomial (:mod:`topk.elementary_symmetric`). It is the
    log-sum-exp (temperature ``tau``) smoothing of both maxima of the hard loss
    ``max_{|A|=k} [alpha 1{y not in A} + mean_A s] - max_{|A|=k, y in A} mean_A s = (alpha + (top_k(s without y) - s_y) / k)_+``,
    to which it converges as ``tau -> 0`` (their Prop. 2). ``k = 1`` uses the log-sum-exp form
    ``tau * logsumexp_j((s_j + alpha 1{j != y} - s_y) / tau)``; ``(k, tau, alpha) = (1, 1, 0)`` is cross-entropy.
    Needs ``k + 1 <= L``. Computed in log space: finite in float32 for any ``tau > 0`` (float16 and bfloat16
    scores are computed in float32). The gradient is exact, ``dL/ds_y = -sigmoid(z) / k``, and can be differentiated
    again (``create_graph=True``: the Hessian through the log-sum-exps of the tree, whatever the backend). Infinite
    scores give the limit: 0 for ``s_y = +inf``, +inf for ``s_y = -inf`` or ``k`` other scores at +inf, with fewer
    the finite limit (as the hard loss's k-th largest other score); NaN where there is none (``s_y`` and another
    score at +inf, every score at -inf). Where the loss is a number, a score at +inf gets a gradient of 0 and the
    others finite ones.

    ``hard_switch=True`` reproduces the reference code (github oval-group/smooth-topk): samples whose gap
    ``top_k(s) - top_{k+1}(s)`` is at least ``k tau ln(1000)`` get the hard loss instead. The loss is then
    discontinuous (it jumps by up to ``tau ln k`` at the switch); off by default.

    ``backend`` chooses the implementation: ``"torch"`` (PyTorch operations, ``sigma_{k-1}`` and ``sigma_k`` on the
    tree of :func:`topk.elementary_symmetric.log_elementary_symmetric_pair`, ``O(log L)`` vectorised steps),
    ``"triton"`` (for ``k >= 2``, the whole loss of each row in three kernel launches, its gradient in one more:
    ``topk::smooth_hinge_rows``) or ``"auto"``: Triton for CUDA scores when it is installed and ``k + 1 <=
    topk.fused.MAX_K``, PyTorch otherwise.

    >>> s = torch.tensor([[2.4, 2.6, 2.3, 0.5]])
    >>> smooth_hinge(s, torch.tensor([2]), k=2, tau=0.01)  # the hard loss is 1 + (2.4 - 2.3) / 2
    tensor(1.0500)
    """
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1] - 1, " (k + 1 must not exceed the number of classes)")
    tau = check_hyperparameter("tau", tau)
    alpha = check_hyperparameter("alpha", alpha)
    hard_switch = check_hyperparameter("hard_switch", hard_switch)
    scores = s.to(torch.promote_types(s.dtype, torch.float32))
    backend = choose_backend(backend, scores, k + 1, tau)
    if k > 1 and backend == "triton":  # the whole loss of each row in three launches, its gradient in one more
        rows = scores.reshape(-1, scores.shape[-1])  # [..., L] -> [rows, L]
        loss = _ops.call(_ops.smooth_hinge_rows, rows, y.reshape(-1), k, tau, alpha)[0].reshape(scores.shape[:-1])
    else:
        loss = smooth_hinge_tree(scores, y, k, tau, alpha)
    if hard_switch:
        loss = torch.where(_separated(scores, k, tau), _tuple_hinge(scores, y, k, alpha), loss)
    return _reduce(loss.to(s.dtype), reduction)


def _separated(s: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """The reference code's switch to the hard loss: ``top_k(s) - top_{k+1}(s) >= k tau ln(1000)``."""
    top = s.topk(k + 1, dim=-1).values
    return top[..., k - 1] - top[..., k] >= k * tau * math.log(1000.0)


def _tuple_hinge(s: torch.Tensor, y: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    """Berrada et al.'s hard top-k hinge (their Eq. 8), ``(alpha + (top_k(s without y) - s_y) / k)_+``."""
    return F.relu(alpha + (exact_top(_without_true(s, y), k) - true_scores(s, y)) / k)


def noised_hinge(
    s: torch.Tensor,
    y: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    margins: float | torch.Tensor = 1.0,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    reduction: str = "mean",
    backend: str = "auto",
) -> torch.Tensor:
    """The noised top-K hinge ``scale * (m_y + top_{K+1,eps,B}(s) - s_y)_+`` of Garcin et al. (ICML 2022).

    With a scalar ``margins`` it is the balanced loss (Eq. 8, estimated by Eq. 10); with one margin per
    class (a tensor of shape ``(L,)``, e.g. from :func:`class_margins`) the imbalanced loss (Eq. 13).
    ``scale`` is the paper's scaling constant for a normalised last layer (Sec. 4.5: 60 on Pl@ntNet-300K, 50 on
    ImageNet-LT): give it the cosines of :class:`topk.layers.CosineClassifier` with ``scale=1``, so that the
    margins and ``epsilon`` are in cosine units, as in the paper's grids (largest margin 0.2 to 0.5, eps 0.01 to
    0.1) and in the authors' code. It is the same loss as ``scale = 1`` on scores, margins and ``epsilon`` all
    multiplied by ``scale``; margins of 0.2 on scores already scaled by 60 would be 60 times smaller than the paper's.
    ``top_{K+1,eps,B}`` is :func:`topk.smooth_top_k` with ``B = n_samples`` noise samples, drawn from
    ``generator`` or given as ``noise`` of shape ``(n_samples, *s.shape)``. The gradient is the estimator
    of Eq. 12, ``1{m_y + top_{K+1,eps,B}(s) > s_y} (mean one-hot - e_y)`` (Prop. 3.7), whose rows sum to 0.
    ``epsilon = 0`` is the calibrated hinge (Eq. 5) exactly. Needs ``k + 1 <= L``.

    ``backend`` chooses the implementation: ``"torch"`` (:func:`topk.smooth_top_k`), ``"triton"`` (the fused
    kernel of :mod:`topk.fused`: noise generated in the kernel by Philox from one seed drawn from
    ``generator``, nothing of size ``n_samples x L`` stored) or ``"auto"``: Triton for CUDA scores when it is
    installed, ``epsilon > 0`` and ``k + 1 <= topk.fused.MAX_K``, outside the sizes where PyTorch was measured
    faster (``topk._validation.NOISED_TORCH_FASTER``), PyTorch otherwise. Both give the same
    estimator; for the same ``generator`` state they draw different noise, for the same ``noise`` the same loss.
    """
    y, reduction = _checked(s, y, reduction)
    k = check_int(k, "k", 1, s.shape[-1] - 1, " (k + 1 must not exceed the number of classes)")
    epsilon = check_hyperparameter("epsilon", epsilon)
    n_samples = check_hyperparameter("n_samples", n_samples)
    margins = check_margins(margins, s)
    scale = check_hyperparameter("scale", scale)
    generator = check_generator(generator, s)
    if noise is not None:
        check_noise(noise, n_samples, s)
    backend = choose_backend(backend, s, k + 1, epsilon, NOISED_TORCH_FASTER)
    true_margin = margins.to(s.dtype)[y] if isinstance(margins, torch.Tensor) else margins
    if epsilon == 0.0 and backend == "torch":
        violation = exact_top(s, k + 1) - true_scores(s, y)
    else:  # top_{K+1,eps,B}(s) - s_y, and in backward the whole gradient of Eq. 12 in one pass
        violation = monte_carlo_top(s, k + 1, epsilon, n_samples, generator=generator, noise=noise, labels=y,
                                    backend=backend)
    hinge = F.relu(true_margin + violation)
    return _reduce(hinge if scale == 1.0 else scale * hinge, reduction)


def class_margins(class_counts: Sequence[int] | torch.Tensor, max_margin: float) -> torch.Tensor:
    """Per-class margins ``m_y = C / n_y^(1/4)`` (Cao et al., 2019; the paper's Eq. 13), the largest equal to ``max_margin``.

    ``class_counts``: the number of training samples of each class, all positive.

    >>> class_margins([10000, 625, 1], 0.2)
    tensor([0.0200, 0.0400, 0.2000])
    """
    try:
        counts = torch.as_tensor(class_counts)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"'class_counts' should be a 1-d sequence or tensor of numbers of samples, got "
                        f"{class_counts!r:.80}") from None
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(f"'class_counts' should be a non-empty 1-d sequence of counts, got shape {tuple(counts.shape)}")
    if counts.is_complex() or counts.dtype == torch.bool:
        raise TypeError(f"'class_counts' should hold numbers of samples, got dtype {counts.dtype}")
    counts = counts.to(torch.get_default_dtype() if not counts.is_floating_point() else counts.dtype)
    bad = torch.nonzero(~(counts > 0) | ~torch.isfinite(counts)).flatten()
    if bad.numel():
        first = int(bad[0])
        raise ValueError(
            f"'class_counts' should be positive and finite (a class with no sample has no margin), "
            f"got {counts[first].item()} for class {first}"
        )
    fractional = torch.nonzero(counts != counts.round()).flatten()
    if fractional.numel():
        first = int(fractional[0])
        raise ValueError(f"'class_counts' should be whole numbers of samples, got {counts[first].item()} for class {first}")
    max_margin = check_hyperparameter("max_margin", max_margin)
    inverse_fourth_root = counts.pow(-0.25)
    return inverse_fourth_root * (max_margin / inverse_fourth_root.max())
