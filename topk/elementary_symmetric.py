"""Log-space elementary symmetric polynomials, the core of the smoothed top-k hinge of Berrada, Zisserman
& Kumar, "Smooth loss functions for deep top-k classification" (ICLR 2018).

The smoothed loss (their Eq. 10-11) needs ``log sigma_j(exp(x))`` for ``j = k - 1`` and ``k``, where
``sigma_j(e) = sum_{|A| = j} prod_{i in A} e_i`` is the coefficient of ``X^j`` in ``prod_i (1 + e_i X)``.
Following their Section 4.2, the ``n`` degree-1 polynomials are multiplied pairwise, level by level
(``ceil(log2 n)`` levels, each one vectorised over the batch and the pairs), every product truncated to
degree ``k``: ``O(k n)`` work per row. Unlike their code, every coefficient stays in log space relative to
the inputs themselves (a product of coefficients is a sum, a sum is a log-sum-exp), so nothing overflows
whatever ``x`` is, and nothing is added back at the end (no cancellation). Absent coefficients are a large
finite negative number, not ``-inf``, so that no ``-inf - (-inf)`` ever appears.

Coefficients are stored degree-major, ``[degree + 1, M]`` with ``M`` = rows x polynomials, so that every
log-sum-exp reduces over the outermost dimension of long contiguous vectors. The gradient of a level is
``dc_m / da_i = w_{m,i}``, the softmax weight of the term ``a_i + b_{m-i}`` in ``c_m``: the forward pass
keeps these weights, so the backward pass is multiply-adds only (no ``exp``), and as exact as autograd
through the log-sum-exps, which ``backward="autograd"`` uses instead (slower; kept to measure against). A
backward that must itself be differentiable (``create_graph=True``) is autograd's through the log-sum-exps, from
the factors each level keeps besides its weights (a third more memory than the weights alone).

The loss needs only ``sigma_{k-1}`` and ``sigma_k``: :func:`log_elementary_symmetric_pair` gives them, on this
tree or (``backend="triton"``) on Triton kernels that walk each row once, cut in chunks of about ``2 sqrt(n)``
entries walked side by side, with two launches forward (the chunks, then their products combined per row; a third
first finds the hinge's shift) and one backward (:mod:`topk._esp_kernel`; the custom operator
``topk::log_esp_pair``). The tree takes about ``6 log2 n`` operations per pass, each one kernel launch on a GPU.
"""

from __future__ import annotations

import math

import torch

__all__ = ["log_elementary_symmetric", "log_elementary_symmetric_pair", "absent_log"]

BACKWARDS = ("saved_weights", "autograd")


def absent_log(dtype: torch.dtype) -> float:
    """The log of an absent coefficient: finite, and far enough from the dtype's limit that a sum of three stays finite."""
    return torch.finfo(dtype).min / 16


def log_elementary_symmetric(x: torch.Tensor, k: int, *, backward: str = "saved_weights") -> torch.Tensor:
    """``log sigma_j(exp(x))`` for ``j = 0..k`` along the last dimension: shape ``(..., n) -> (..., k + 1)``.

    An entry equal to :func:`absent_log` (or below it) acts as ``exp(x_i) = 0``: the way to leave a class
    out. Coefficients of degree above the number of present entries come out near ``absent_log``.
    The gradient ``d log sigma_j / d x_i`` is the probability that ``i`` belongs to a ``j``-subset drawn
    with weight ``prod_A exp(x)``; ``backward`` in :data:`BACKWARDS` says how it is computed (see the module).

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


def log_elementary_symmetric_pair(x: torch.Tensor, k: int, *, backend: str = "torch") -> torch.Tensor:
    """``(log sigma_{k-1}, log sigma_k)`` of ``exp(x)`` along the last dimension: shape ``(..., n) -> (..., 2)``,
    ``1 <= k <= n``, float32 or float64.

    ``backend``: ``"torch"`` (the tree of :func:`log_elementary_symmetric`) or ``"triton"`` (the kernel of
    :mod:`topk._esp_kernel`, through ``topk::log_esp_pair``; CUDA, or Triton's interpreter on a CPU). Both are exact
    to rounding; the kernel's sequential recursion rounds ``n`` times where the tree rounds ``log2 n`` times.

    >>> log_elementary_symmetric_pair(torch.zeros(4), 2).exp()  # C(4, 1), C(4, 2)
    tensor([4., 6.])
    """
    if backend == "triton":
        from topk import _ops

        rows = x.reshape(-1, x.shape[-1])  # [..., n] -> [rows, n]
        return _ops.call(_ops.log_esp_pair, rows, k)[0].reshape(*x.shape[:-1], 2)
    return log_elementary_symmetric(x, k)[..., k - 1:]


#: Triton's compile options for the walking kernels: one warp per program (the coefficient block is at most 128
#: wide). Untimed.
ESP_COMPILE_OPTIONS = {"num_warps": 1}
#: The kernels' absent coefficient, in float32 and float64 alike: ``exp`` of it is 0 in both, and a sum of three
#: stays finite in float32 (a float64 input's own absent entries, far lower, are absorbed the same way).
ESP_ABSENT = absent_log(torch.float32)
#: The fewest entries of a row one program walks (:func:`esp_span`).
ESP_MIN_SPAN = 64
#: Scores read at once when the hinge's shift is looked for (:func:`topk._esp_kernel.hinge_shift`).
ESP_READ = 1024
#: Triton's compile options for :func:`topk._esp_kernel.hinge_shift`: a block of :data:`ESP_READ` scores over four
#: warps. Untimed.
SHIFT_COMPILE_OPTIONS = {"num_warps": 4}


def esp_block(k: int) -> int:
    """The kernels' coefficient block: degrees ``0..k`` padded to a power of two."""
    return 1 << k.bit_length()


def esp_span(n: int) -> int:
    """Entries of a row walked by one program: about ``2 sqrt(n)``, at least :data:`ESP_MIN_SPAN`. A program walks
    its chunk entry by entry (forward, then three times as long backward) and the row's chunks are combined one by
    one, each about five entries' work: ``4 span + 15 n / span`` sequential steps, least near ``span = 2 sqrt(n)``
    (a count of steps; not yet timed on a GPU)."""
    return max(ESP_MIN_SPAN, 2 * math.isqrt(n))


def esp_chunks(n: int) -> int:
    """How many chunks of :func:`esp_span` entries a row of ``n`` is cut into."""
    return max(1, -(-n // esp_span(n)))


def combine_slice(k: int) -> int:
    """Degrees of one factor :func:`topk._esp_kernel.log_esp_combine` multiplies at once: at most 2048 terms held."""
    return min(esp_block(k), 2048 // esp_block(k))


def combine_compile_options(k: int) -> dict:
    """:func:`topk._esp_kernel.log_esp_combine` holds ``slice x block`` terms at once: at most 16 values per thread
    of its warps. Untimed."""
    return {"num_warps": max(1, combine_slice(k) * esp_block(k) // 512)}


def _launch_forward(x: torch.Tensor, k: int, hinge: tuple | None):
    from topk._esp_kernel import hinge_shift, log_esp_chunks, log_esp_combine

    n_rows, n = x.shape
    block, span, n_chunks = esp_block(k), esp_span(n), esp_chunks(n)
    pair, prefix = x.new_empty(n_rows, 2), x.new_empty(n_rows, n, block)
    complement, chunk_poly = x.new_empty(n_rows, n_chunks, block), x.new_empty(n_rows, n_chunks, block)
    loss, aux = (x.new_empty(n_rows), x.new_empty(n_rows, 2)) if hinge else (pair, pair)
    labels, tau, alpha = hinge or (pair, 1.0, 0.0)
    if n_rows:
        if hinge:
            hinge_shift[(n_rows,)](x, labels, aux, n, READ=ESP_READ, **SHIFT_COMPILE_OPTIONS)
        log_esp_chunks[(n_rows, n_chunks)](x, prefix, chunk_poly, n, span, n_chunks, labels, aux, 1.0 / (k * tau),
                                           ABSENT=ESP_ABSENT, BLOCK=block, LOSS=hinge is not None,
                                           **ESP_COMPILE_OPTIONS)
        log_esp_combine[(n_rows,)](chunk_poly, complement, pair, n_chunks, x, n, labels, loss, aux,
                                   1.0 / (k * tau), tau, alpha / tau, K=k, ABSENT=ESP_ABSENT, BLOCK=block,
                                   LOSS=hinge is not None, SLICE=combine_slice(k), **combine_compile_options(k))
    return pair, prefix, complement, loss, aux


def _launch_backward(x, prefix, complement, pair, grad, k: int, hinge: tuple | None) -> torch.Tensor:
    from topk._esp_kernel import log_esp_backward

    grad_x = torch.empty_like(x)
    labels, aux, tau = hinge or (pair, pair, 1.0)
    (n_rows, n), n_chunks = x.shape, complement.shape[1]
    if n_rows:
        log_esp_backward[(n_rows, n_chunks)](x, prefix, complement, pair, grad.to(pair.dtype).contiguous(), grad_x, n,
                                             esp_span(n), n_chunks, labels, aux, 1.0 / (k * tau), tau, K=k,
                                             ABSENT=ESP_ABSENT, BLOCK=esp_block(k), LOSS=hinge is not None,
                                             **ESP_COMPILE_OPTIONS)
    return grad_x


def launch_pair_forward(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the kernels of :mod:`topk._esp_kernel` forward: the pair ``[rows, 2]``, then what the backward reads: the
    prefix products ``[rows, n, esp_block(k)]`` and each chunk's complement ``[rows, esp_chunks(n), esp_block(k)]``."""
    pair, prefix, complement, _, _ = _launch_forward(rows.contiguous(), k, None)
    return pair, prefix, complement


def launch_pair_backward(rows: torch.Tensor, prefix: torch.Tensor, complement: torch.Tensor, pair: torch.Tensor,
                         grad_pair: torch.Tensor, k: int) -> torch.Tensor:
    """Run :func:`topk._esp_kernel.log_esp_backward`: ``d (grad_pair . pair) / d rows``, shape ``[rows, n]``."""
    return _launch_backward(rows.contiguous(), prefix, complement, pair, grad_pair, k, None)


def launch_hinge_forward(scores: torch.Tensor, labels: torch.Tensor, k: int, tau: float,
                         alpha: float) -> tuple[torch.Tensor, ...]:
    """The smoothed hinge of each row of ``scores`` ``[rows, n]`` (labels ``[rows]``) in three launches: the loss
    ``[rows]``, then what its backward reads: the prefix products, the chunks' complements, the pair ``[rows, 2]``
    and ``(z, shift)`` ``[rows, 2]``."""
    pair, prefix, complement, loss, aux = _launch_forward(scores.contiguous(), k, (labels.contiguous(), tau, alpha))
    return loss, prefix, complement, pair, aux


def launch_hinge_backward(scores, labels, prefix, complement, pair, aux, grad_loss, k: int, tau: float) -> torch.Tensor:
    """The gradient of ``sum(grad_loss * loss)`` with respect to ``scores`` ``[rows, n]``, in one launch."""
    return _launch_backward(scores.contiguous(), prefix, complement, pair, grad_loss, k,
                            (labels.contiguous(), aux, tau))


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
    windows: row ``t + m`` of the padded ``b`` is ``b_{m - d + t}``.
    """
    degree, width = a.shape[0] - 1, a.shape[1]
    padded = torch.cat([b.new_full((degree, width), absent), b, b.new_full((product_degree - degree, width), absent)])
    windows = padded.as_strided((degree + 1, product_degree + 1, width), (width, width, 1))
    return a.flip(0).unsqueeze(1) + windows


def _log_product(a: torch.Tensor, b: torch.Tensor, product_degree: int, absent: float) -> torch.Tensor:
    """Log-coefficients of ``a * b`` truncated to degree ``product_degree``, differentiated by autograd: [d' + 1, M]."""
    return torch.logsumexp(_pair_terms(a, b, product_degree, absent), dim=0)


class _LogProduct(torch.autograd.Function):
    """:func:`_log_product` whose backward reuses the softmax weights of the forward pass. A backward that must be
    differentiable itself (``create_graph=True``, or under ``torch.func``) is the vector-Jacobian product of
    :func:`_log_product` instead, from the saved factors: exact to any order. Its forward and backward are PyTorch operations, which ``torch.func.vmap`` batches."""

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
