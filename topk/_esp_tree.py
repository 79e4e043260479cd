"""Log-space elementary symmetric polynomials on a product tree, in PyTorch operations: the core of the smoothed top-k
hinge of Berrada, Zisserman & Kumar (ICLR 2018, Eq. 10-11), computed as their Section 4.2 does.

``sigma_j(e)``, the coefficient of ``X^j`` in ``prod_i (1 + e_i X)``, comes from multiplying the ``n`` degree-1 factors
pairwise, level by level (``ceil(log2 n)`` levels, each vectorised over the rows and the pairs), every product truncated
to degree ``k``: ``O(k n)`` work per row, about ``6 log2 n`` operations per pass. Every coefficient stays in log space
relative to the inputs (a product is a sum, a sum a log-sum-exp): nothing overflows whatever ``x`` is, and nothing is
added back at the end, so nothing cancels. An absent coefficient is a large finite negative number
(:func:`absent_log`), not ``-inf``, so that no ``-inf - (-inf)`` appears.

Coefficients are stored degree-major, ``[degree + 1, M]`` (``M`` = rows x polynomials), so that every log-sum-exp
reduces over the outermost dimension of long contiguous vectors. A level's gradient is ``dc_m / da_i = w_{m,i}``, the
softmax weight of the term ``a_i + b_{m-i}`` in ``c_m``: the forward pass keeps the weights, so the backward is
multiply-adds only (no ``exp``), as exact as autograd through the log-sum-exps (``backward="autograd"``: slower, kept
as a check). A backward that must be differentiable (``create_graph=True``) is autograd's, from the factors each level
also keeps (a third more memory than the weights alone).
"""

from __future__ import annotations

import math

import torch

__all__ = ["log_elementary_symmetric", "log_pair", "absent_log", "infinite_log", "BACKWARDS"]

BACKWARDS = ("saved_weights", "autograd")


def absent_log(dtype: torch.dtype) -> float:
    """The log of an absent coefficient: finite, and far enough from the dtype's limit that a sum of three stays
    finite."""
    return torch.finfo(dtype).min / 16


def infinite_log(dtype: torch.dtype) -> float:
    """The exponent an infinite score stands in at, above the row's largest finite one (at 0): ``exp(-it)`` is the
    square of the dtype's rounding, so that the coefficients it enters are dominated by it to rounding, as they are
    by an infinite one in the limit (the smoothed hinge's infinite scores)."""
    return -2 * math.log(torch.finfo(dtype).eps)


def log_elementary_symmetric(x: torch.Tensor, k: int, *, backward: str = "saved_weights") -> torch.Tensor:
    """``log sigma_j(exp(x))`` for ``j = 0..k`` along the last dimension: shape ``(..., n) -> (..., k + 1)``.

    An entry equal to :func:`absent_log` (or below it) acts as ``exp(x_i) = 0``: the way to leave a class
    out. Coefficients of degree above the number of present entries come out near ``absent_log``.
    The gradient ``d log sigma_j / d x_i`` is the probability that ``i`` belongs to a ``j``-subset drawn
    with weight ``prod_A exp(x)``; ``backward`` (:data:`BACKWARDS`) computes it from the softmax weights each level
    keeps (``"saved_weights"``: multiply-adds only) or by autograd through the log-sum-exps (``"autograd"``).

    >>> log_elementary_symmetric(torch.tensor([0.0, 0.0, 0.0]), 2).exp()  # sigma_j(1, 1, 1) = C(3, j)
    tensor([1., 3., 3.])
    """
    if k < 0:
        raise ValueError(f"'k' should be >= 0, got {k}")
    if backward not in BACKWARDS:
        raise ValueError(f"'backward' should be one of {BACKWARDS}, got {backward!r}")
    batch_shape, n = x.shape[:-1], x.shape[-1]
    if k == 0:
        return x.new_zeros(*batch_shape, 1)
    absent = absent_log(x.dtype)
    saved_weights = _LogProduct if torch.compiler.is_compiling() else _LogProductWithTangent
    multiply = (lambda *args: saved_weights.apply(*args)[0]) if backward == "saved_weights" else _log_product
    rows = batch_shape.numel()
    # One polynomial 1 + e_i X per entry, degree-major: [..., n] -> [2, N, P = n].
    polys = torch.stack([torch.zeros_like(x), x.clamp_min(absent)]).reshape(2, rows, n)
    if n == 0:
        polys = _one(x.new_empty(2, rows, 0), absent)
    while polys.shape[2] > 1:
        if polys.shape[2] % 2:
            polys = torch.cat([polys, _one(polys, absent)], dim=2)
        degree, half = polys.shape[0] - 1, polys.shape[2] // 2
        product_degree = min(2 * degree, k)
        # Pair polynomial p with p + half: [d + 1, N, P] -> two [d + 1, N * P / 2].
        first = polys[:, :, :half].reshape(degree + 1, rows * half)
        second = polys[:, :, half:].reshape(degree + 1, rows * half)
        polys = multiply(first, second, product_degree, absent).reshape(product_degree + 1, rows, half)
    coefficients = polys[:, :, 0]  # [d + 1, N, 1] -> [d + 1, N]
    if coefficients.shape[0] < k + 1:  # fewer entries than k: the higher coefficients are absent
        coefficients = torch.cat([coefficients, coefficients.new_full((k + 1 - coefficients.shape[0], rows), absent)])
    return coefficients.T.reshape(*batch_shape, k + 1)


def log_pair(x: torch.Tensor, k: int) -> torch.Tensor:
    """``(log sigma_{k-1}, log sigma_k)`` of ``exp(x)`` on the tree: ``(..., n) -> (..., 2)``, ``k >= 1``."""
    return log_elementary_symmetric(x, k)[..., k - 1:]


def _negligible_log(dtype: torch.dtype) -> float:
    """An exponent whose ``exp`` is a normal number yet negligible next to 1 (about 1e-35 in float32)."""
    return math.log(torch.finfo(dtype).tiny) + 8.0


def _one(polys: torch.Tensor, absent: float) -> torch.Tensor:
    """The polynomial ``1``, one per row, shaped like one column of ``polys``: [d + 1, N, 1]."""
    one = polys.new_full((polys.shape[0], polys.shape[1], 1), absent)
    one[0] = 0.0
    return one


def _pair_terms(a: torch.Tensor, b: torch.Tensor, product_degree: int, absent: float) -> torch.Tensor:
    """``terms[t, m] = a_{d - t} + b_{m - d + t}``, so that ``c_m = logsumexp_t terms[t, m]``: [d + 1, d' + 1, M].

    ``b`` is padded with absent coefficients (``d`` below, ``d' - d`` above), then read through overlapping
    windows: row ``t + m`` of the padded ``b`` is ``b_{m - d + t}``. The windows are ``unfold``'s, whose gradient
    sums each row's windows in a fixed order; an overlapping ``as_strided`` view's gradient adds them with atomics on
    CUDA, so that a differentiable backward gave different last bits from one call to the next.
    """
    degree, width = a.shape[0] - 1, a.shape[1]
    padded = torch.cat([b.new_full((degree, width), absent), b, b.new_full((product_degree - degree, width), absent)])
    windows = padded.unfold(0, product_degree + 1, 1).transpose(1, 2)  # [d + 1, d' + 1, M]
    return a.flip(0).unsqueeze(1) + windows


def _log_product(a: torch.Tensor, b: torch.Tensor, product_degree: int, absent: float) -> torch.Tensor:
    """Log-coefficients of ``a * b`` truncated to degree ``product_degree``, differentiated by autograd: [d' + 1, M]."""
    return torch.logsumexp(_pair_terms(a, b, product_degree, absent), dim=0)


class _LogProduct(torch.autograd.Function):
    """:func:`_log_product` whose backward reuses the softmax weights of the forward pass. A backward that must be
    differentiable itself (``create_graph=True``, or under ``torch.func``) is the vector-Jacobian product of
    :func:`_log_product` instead, from the saved factors: exact to any order. Its forward and backward are PyTorch
    operations, which ``torch.func.vmap`` batches."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a, b, product_degree, absent):
        terms = _pair_terms(a, b, product_degree, absent)  # [d + 1, d' + 1, M]
        largest = terms.amax(dim=0)
        # exp is many times slower where it underflows: floor the exponents where the weight is negligible anyway.
        weights = terms.sub_(largest).clamp_min_(_negligible_log(terms.dtype)).exp_()
        total = weights.sum(dim=0)
        weights /= total
        return largest + total.log_(), weights

    @staticmethod
    def setup_context(ctx, inputs, output):  # apart from the forward, for torch.func's transforms
        a, b, ctx.product_degree, ctx.absent = inputs
        ctx.save_for_backward(output[1], a, b)
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad, _):
        if grad is None:  # the product's gradient is not materialised where nothing flows back through it
            return None, None, None, None
        weights, a, b = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True, or under torch.func: a differentiable vector-Jacobian product
            product = lambda a, b: _log_product(a, b, ctx.product_degree, ctx.absent)  # noqa: E731
            return *torch.func.vjp(product, a, b)[1](grad), None, None
        degree, product_degree = weights.shape[0] - 1, weights.shape[1] - 1
        weighted = weights * grad  # [d + 1, d' + 1, M]: d c_m / d terms[t, m] times the incoming gradient
        grad_a = weighted.sum(dim=1).flip(0)
        grad_padded = grad.new_zeros(degree + product_degree + 1, grad.shape[1])
        for t in range(degree + 1):  # terms[t, m] reads row t + m of the padded b
            grad_padded[t:t + product_degree + 1] += weighted[t]
        return grad_a, grad_padded[degree:2 * degree + 1], None, None


class _LogProductWithTangent(_LogProduct):
    """:class:`_LogProduct` with its forward-mode formula (``torch.func.jvp``, ``jacfwd``), for eager mode: Dynamo
    traces no autograd function that defines one."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        _LogProduct.setup_context(ctx, inputs, output)
        ctx.save_for_forward(output[1], *inputs[:2])

    @staticmethod
    def jvp(ctx, tangent_a, tangent_b, *unused):
        """Forward mode: the tangent of ``logsumexp_t terms[t, m]`` is the softmax-weighted sum of the terms' tangents,
        and ``terms`` is linear in ``(a, b)`` up to the absent coefficients' constant."""
        weights, a, b = ctx.saved_tensors
        tangent_a = torch.zeros_like(a) if tangent_a is None else tangent_a
        tangent_b = torch.zeros_like(b) if tangent_b is None else tangent_b
        return (weights * _pair_terms(tangent_a, tangent_b, ctx.product_degree, 0.0)).sum(0), None
