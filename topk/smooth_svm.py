"""Log-space elementary symmetric polynomials, the core of the smoothed top-k hinge of Berrada, Zisserman
& Kumar, "Smooth loss functions for deep top-k classification" (ICLR 2018).

The smoothed loss (their Eq. 10-11) needs ``log sigma_j(exp(x))`` for ``j = k - 1`` and ``k``, where
``sigma_j(e) = sum_{|A| = j} prod_{i in A} e_i`` is the coefficient of ``X^j`` in ``prod_i (1 + e_i X)``.
Following their Section 4.2, the ``n`` degree-1 polynomials are multiplied pairwise, level by level
(``ceil(log2 n)`` levels, each one vectorised over the batch and the pairs), every product truncated to
degree ``k``: ``O(k n)`` work per row. Unlike their code, every coefficient stays in log space relative to
the inputs themselves (a product of coefficients is a sum, a sum is a log-sum-exp), so nothing overflows
whatever ``x`` is, and nothing is added back at the end (no cancellation). Absent coefficients are a large
finite negative number, not ``-inf``, so that autograd never sees ``-inf - (-inf)``.
"""

from __future__ import annotations

import torch

__all__ = ["log_elementary_symmetric", "absent_log"]


def absent_log(dtype: torch.dtype) -> float:
    """The log of an absent coefficient: finite, and far enough from the dtype's limit that a sum of three stays finite."""
    return torch.finfo(dtype).min / 16


def log_elementary_symmetric(x: torch.Tensor, k: int) -> torch.Tensor:
    """``log sigma_j(exp(x))`` for ``j = 0..k`` along the last dimension: shape ``(..., n) -> (..., k + 1)``.

    An entry equal to :func:`absent_log` (or below it) acts as ``exp(x_i) = 0``: the way to leave a class
    out. Coefficients of degree above the number of present entries come out near ``absent_log``.
    Differentiable by autograd; its gradient ``d log sigma_j / d x_i`` is the probability that ``i``
    belongs to a ``j``-subset drawn with weight ``prod_{A} exp(x)``.

    >>> log_elementary_symmetric(torch.tensor([0.0, 0.0, 0.0]), 2).exp()  # sigma_j(1, 1, 1) = C(3, j)
    tensor([1., 3., 3.])
    """
    if k < 0:
        raise ValueError(f"'k' should be >= 0, got {k}")
    absent = absent_log(x.dtype)
    batch_shape, n = x.shape[:-1], x.shape[-1]
    rows = x.reshape(batch_shape.numel(), n)  # [..., n] -> [N, n]
    if k == 0:
        return x.new_zeros(*batch_shape, 1)
    # One polynomial 1 + e_i X per entry, as log-coefficients: [N, n] -> [N, P=n, degree + 1 = 2].
    polys = torch.stack([torch.zeros_like(rows), rows.clamp_min(absent)], dim=-1)
    if n == 0:
        polys = _one(polys, 1, absent)
    degree = 1
    while polys.shape[1] > 1:
        if polys.shape[1] % 2:
            polys = torch.cat([polys, _one(polys, degree, absent)], dim=1)
        product_degree = min(2 * degree, k)
        polys = _multiply_pairs(polys[:, 0::2], polys[:, 1::2], degree, product_degree, absent)
        degree = product_degree
    coefficients = polys[:, 0]  # [N, 1, degree + 1] -> [N, degree + 1]
    if degree < k:  # fewer entries than k: the higher coefficients are absent
        coefficients = torch.cat([coefficients, coefficients.new_full((coefficients.shape[0], k - degree), absent)], -1)
    return coefficients.reshape(*batch_shape, k + 1)


def _one(polys: torch.Tensor, degree: int, absent: float) -> torch.Tensor:
    """The polynomial ``1`` with ``degree + 1`` log-coefficients, one per row: [N, 1, degree + 1]."""
    one = polys.new_full((polys.shape[0], 1, degree + 1), absent)
    one[..., 0] = 0.0
    return one


def _multiply_pairs(a: torch.Tensor, b: torch.Tensor, degree: int, product_degree: int, absent: float) -> torch.Tensor:
    """Log-coefficients of ``a * b`` truncated to ``product_degree``: ``c_m = logsumexp_i (a_i + b_{m - i})``.

    ``a``, ``b``: [N, P, degree + 1] -> [N, P, product_degree + 1].
    """
    rows, pairs = b.shape[:2]
    # Pad b with absent coefficients so that window m of width degree + 1 holds b_{m - degree}, ..., b_m.
    padded = torch.cat([
        b.new_full((rows, pairs, degree), absent),
        b,
        b.new_full((rows, pairs, product_degree - degree), absent),
    ], dim=-1)
    windows = padded.unfold(-1, degree + 1, 1)  # [N, P, product_degree + 1, degree + 1]: b_{m - degree + t}
    terms = a.flip(-1).unsqueeze(-2) + windows  # a_{degree - t} + b_{m - degree + t}: the pairs i + j = m
    return torch.logsumexp(terms, dim=-1)
