"""The Triton source of the smoothed hinge's kernel (:mod:`topk.elementary_symmetric`), imported on first use so
that ``TRITON_INTERPRET`` is read then.

One program handles one row ``x`` of length ``n`` and walks it once, keeping the log-coefficients of
``prod_{i < t} (1 + e^{x_i} X)`` up to degree ``K`` (the recursion ``sigma_j <- sigma_j + e^{x_t} sigma_{j-1}``, as
a log-add-exp). The forward pass stores each prefix product; the backward pass walks the row back with the suffix
product and combines both into ``sigma_m(x without i)``, which gives ``d log sigma_j / d x_i =
e^{x_i} sigma_{j-1}(x without i) / sigma_j(x)`` with additions only: nothing is subtracted, nothing cancels.
"""

import triton
import triton.language as tl


@triton.jit
def _take(values, index, BLOCK: tl.constexpr):
    """``values[index]`` for 1-D blocks, 0 where ``index`` is outside ``[0, BLOCK)`` (one select and one sum)."""
    source = tl.arange(0, BLOCK)
    return tl.sum(tl.where(source[:, None] == index[None, :], values[:, None], 0.0), axis=0)


@triton.jit
def _times_one_plus(log_poly, x_i, degree, ABSENT: tl.constexpr, BLOCK: tl.constexpr):
    """Log-coefficients of ``poly * (1 + e^{x_i} X)``, truncated to the block: ``c_j = logaddexp(c_j, c_{j-1} + x_i)``."""
    lower = tl.where(degree == 0, ABSENT, _take(log_poly, degree - 1, BLOCK)) + x_i
    top = tl.maximum(log_poly, lower)
    return top + tl.log(1.0 + tl.exp(tl.minimum(log_poly, lower) - top))


@triton.jit
def _log_coefficient_without(prefix, suffix, m, BLOCK: tl.constexpr):
    """``log sigma_m`` of the row without one entry: ``logsumexp_{a <= m} prefix_a + suffix_{m - a}``."""
    degree = tl.arange(0, BLOCK)
    terms = tl.where(degree <= m, prefix + _take(suffix, m - degree, BLOCK), float("-inf"))
    top = tl.max(terms, axis=0)
    return top + tl.log(tl.sum(tl.exp(terms - top), axis=0))


@triton.jit
def _row_shift(x_ptr, row, n, label, CHUNK: tl.constexpr):
    """The largest score of the row other than the label's (the hinge's shift: every exponent then is <= 0)."""
    largest = tl.full((), float("-inf"), x_ptr.dtype.element_ty)
    for start in range(0, n, CHUNK):
        column = start + tl.arange(0, CHUNK)
        values = tl.load(x_ptr + row * n + column, mask=column < n, other=float("-inf"))
        largest = tl.maximum(largest, tl.max(tl.where(column == label, float("-inf"), values), axis=0))
    return largest


@triton.jit
def _hinge_exponent(x_i, i, label, shift, scale, ABSENT: tl.constexpr, LOSS: tl.constexpr):
    """Entry ``i`` of the polynomial's row: ``x_i`` itself, or for the hinge ``(s_i - shift) / (k tau)`` with the
    label's left out."""
    if LOSS:
        return tl.where(i == label, ABSENT, (x_i - shift) * scale)
    return x_i


@triton.jit
def log_esp_forward(x_ptr, prefix_ptr, out_ptr, n, label_ptr, loss_ptr, aux_ptr, scale: tl.float64, tau: tl.float64,
                    alpha_over_tau: tl.float64, K: tl.constexpr, ABSENT: tl.constexpr, BLOCK: tl.constexpr, LOSS: tl.constexpr,
                    CHUNK: tl.constexpr):
    """``out[row] = (log sigma_{K-1}, log sigma_K)`` of ``e^{x[row]}`` (``x``: contiguous rows of ``n``);
    ``prefix[row, t]``: the log-coefficients of the product of the first ``t`` factors.

    ``LOSS``: ``x`` holds scores and the row is the smoothed hinge's (Berrada et al. 2018, Eq. 10-11) for the label
    ``label[row]``: the polynomial is taken of ``(s_j - shift) / (k tau)`` without the label's entry, and
    ``loss[row] = tau softplus(z)``, ``z = alpha / tau + (shift - s_y) / (k tau) + log sigma_K - log sigma_{K-1}``;
    ``aux[row] = (z, shift)``. The scalars come in float64 and are used in the scores' dtype."""
    row = tl.program_id(0).to(tl.int64)
    degree = tl.arange(0, BLOCK)
    dtype = x_ptr.dtype.element_ty
    scale, tau, alpha_over_tau = tl.full((), scale, dtype), tl.full((), tau, dtype), tl.full((), alpha_over_tau, dtype)
    label, shift = -1, 0.0
    if LOSS:
        label = tl.load(label_ptr + row)
        shift = _row_shift(x_ptr, row, n, label, CHUNK)
    log_poly = tl.where(degree == 0, 0.0, ABSENT).to(x_ptr.dtype.element_ty)  # the empty product: 1
    for t in range(n):
        tl.store(prefix_ptr + (row * n + t) * BLOCK + degree, log_poly)
        x_t = _hinge_exponent(tl.load(x_ptr + row * n + t), t, label, shift, scale, ABSENT, LOSS)
        log_poly = _times_one_plus(log_poly, x_t, degree, ABSENT, BLOCK)
    tl.store(out_ptr + row * 2 + degree - (K - 1), log_poly, mask=(degree == K - 1) | (degree == K))
    if LOSS:
        log_gap = tl.sum(tl.where(degree == K, log_poly, 0.0) - tl.where(degree == K - 1, log_poly, 0.0), axis=0)
        z = alpha_over_tau + (shift - tl.load(x_ptr + row * n + label)) * scale + log_gap
        tl.store(loss_ptr + row, tau * (tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))))
        tl.store(aux_ptr + row * 2, z)
        tl.store(aux_ptr + row * 2 + 1, shift)


@triton.jit
def log_esp_backward(x_ptr, prefix_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, label_ptr, aux_ptr, scale: tl.float64,
                     tau: tl.float64, K: tl.constexpr, ABSENT: tl.constexpr, BLOCK: tl.constexpr, LOSS: tl.constexpr):
    """``grad_x[row, i] = sum_j grad_out[row, j] d log sigma_j / d x_i`` for ``j = K - 1, K``; ``LOSS``:
    ``grad_out[row]`` is the loss's incoming gradient and ``grad_x`` the hinge's gradient with respect to the scores,
    ``tau sigmoid(z) (d log sigma_K - d log sigma_{K-1}) / (k tau)`` off the label and minus their sum at it (exactly
    ``-sigmoid(z) / k``; the shift is a constant: the loss does not change when every score moves alike)."""
    row = tl.program_id(0).to(tl.int64)
    degree = tl.arange(0, BLOCK)
    dtype = x_ptr.dtype.element_ty
    scale, tau = tl.full((), scale, dtype), tl.full((), tau, dtype)
    log_lower, log_upper = tl.load(out_ptr + row * 2), tl.load(out_ptr + row * 2 + 1)
    label, shift = -1, 0.0
    if LOSS:
        label, shift = tl.load(label_ptr + row), tl.load(aux_ptr + row * 2 + 1)
        grad_upper = tl.load(grad_out_ptr + row) * tau * tl.sigmoid(tl.load(aux_ptr + row * 2))
        grad_lower = -grad_upper
        total = tl.zeros((), dtype)
    else:
        grad_lower, grad_upper = tl.load(grad_out_ptr + row * 2), tl.load(grad_out_ptr + row * 2 + 1)
    log_suffix = tl.where(degree == 0, 0.0, ABSENT).to(log_lower.dtype)
    for step in range(n):
        i = n - 1 - step
        x_i = _hinge_exponent(tl.load(x_ptr + row * n + i), i, label, shift, scale, ABSENT, LOSS)
        log_prefix = tl.load(prefix_ptr + (row * n + i) * BLOCK + degree)
        # d log sigma_j / d x_i = exp(x_i + log sigma_{j-1}(x without i) - log sigma_j(x))
        upper_share = tl.exp(x_i + _log_coefficient_without(log_prefix, log_suffix, K - 1, BLOCK) - log_upper)
        if K >= 2:
            lower_share = tl.exp(x_i + _log_coefficient_without(log_prefix, log_suffix, K - 2, BLOCK) - log_lower)
        else:
            lower_share = 0.0
        grad_i = grad_upper * upper_share + grad_lower * lower_share
        if LOSS:
            grad_i = tl.where(i == label, 0.0, grad_i * scale)
            total += grad_i
        tl.store(grad_x_ptr + row * n + i, grad_i)
        log_suffix = _times_one_plus(log_suffix, x_i, degree, ABSENT, BLOCK)
    if LOSS:  # the label's entry: minus the others, so that the row sums to 0 as the exact gradient does
        tl.store(grad_x_ptr + row * n + label, -total)
