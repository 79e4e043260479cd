"""The Triton source of the smoothed hinge's kernels (launched by :mod:`topk._esp_launch`), imported on first use so
that ``TRITON_INTERPRET`` is read then.

Each row ``x`` of length ``n`` is cut into chunks of ``span`` entries, one program per (row, chunk), so that a long
row is walked by many programs at once instead of one:

1. :func:`log_esp_chunks` walks its chunk once, keeping the log-coefficients of ``prod_{i < t} (1 + e^{x_i} X)`` up
   to degree ``K`` (the recursion ``sigma_j <- sigma_j + e^{x_t} sigma_{j-1}``, as a log-add-exp); it stores each
   prefix product and the chunk's whole product;
2. :func:`log_esp_combine` (one program per row) multiplies the chunks' products into the row's, stores for each chunk
   the product of all the *other* chunks (its complement), and for the hinge computes the loss;
3. :func:`log_esp_backward` walks each chunk back with the suffix product, started from the chunk's complement, and
   combines it with the stored prefix into ``sigma_m(x without i)`` with additions only (nothing cancels), which
   gives ``d log sigma_j / d x_i = e^{x_i} sigma_{j-1}(x without i) / sigma_j(x)`` (:func:`_share`).

For the hinge the exponents are ``(s_i - shift) / (k tau)``, ``shift`` the row's largest score but the label's (every
exponent ``<= 0``), found first by :func:`hinge_shift`: every chunk is walked relative to the same shift, so that the
chunks' products are multiplied as they are.
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
def _times_stored(log_poly, stored_ptr, BLOCK: tl.constexpr, SLICE: tl.constexpr):
    """Log-coefficients of ``poly * q``, truncated to the block, ``q``'s stored at ``stored_ptr``:
    ``c_m = logsumexp_{a <= m} log_poly_a + q_{m - a}``, over ``a`` in slices of ``SLICE`` (a running log-sum-exp), so
    that no more than ``SLICE x BLOCK`` terms are held at once. The degree-0 term of both is ``log 1 = 0``, so
    ``c_m >= max(log_poly_m, q_m)``: absent coefficients never pile up."""
    degree = tl.arange(0, BLOCK)
    top = tl.full((BLOCK,), float("-inf"), log_poly.dtype)
    total = tl.zeros((BLOCK,), log_poly.dtype)
    for first in range(0, BLOCK, SLICE):
        term_degree = first + tl.arange(0, SLICE)
        if SLICE == BLOCK:
            log_poly_slice = log_poly
        else:
            log_poly_slice = _take(log_poly, term_degree, BLOCK)
        other = degree[None, :] - term_degree[:, None]  # [a, m] -> m - a
        q = tl.load(stored_ptr + other, mask=other >= 0, other=0.0)
        terms = tl.where(other >= 0, log_poly_slice[:, None] + q, float("-inf"))
        new_top = tl.maximum(top, tl.max(terms, axis=0))  # finite from the first slice on: it holds a = 0
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(terms - new_top[None, :]), axis=0)
        top = new_top
    return top + tl.log(total)


@triton.jit
def _log_coefficient_without(prefix, suffix, m, BLOCK: tl.constexpr):
    """``log sigma_m`` of the row without one entry: ``logsumexp_{a <= m} prefix_a + suffix_{m - a}``."""
    degree = tl.arange(0, BLOCK)
    terms = tl.where(degree <= m, prefix + _take(suffix, m - degree, BLOCK), float("-inf"))
    top = tl.max(terms, axis=0)
    return top + tl.log(tl.sum(tl.exp(terms - top), axis=0))


@triton.jit
def _share(x_i, log_without_below, log_without, log_whole):
    """``d log sigma_j / d x_i``, the probability that ``i`` is in a ``j``-subset drawn with weight ``prod e^{x}``:
    ``e^{x_i} sigma_{j-1}(x without i) / sigma_j(x)`` where that is below 1/2, else one minus the probability that it is
    not, ``sigma_j(x without i) / sigma_j(x)``. Each exponential is of a difference of large log-coefficients (up to
    ``j`` scores over ``k tau``), which float32 rounds by up to a few hundredths at the extremes of ``tau``: taking the
    smaller of the two probabilities keeps that error relative to it, not to 1, so that ``d log sigma_K - d log
    sigma_{K-1}``, the hinge's gradient, does not lose its digits where both are near 1."""
    inside = tl.minimum(tl.exp(x_i + log_without_below - log_whole), 1.0)
    outside = tl.minimum(tl.exp(log_without - log_whole), 1.0)
    return tl.where(inside < 0.5, inside, 1.0 - outside)


@triton.jit
def hinge_shift(x_ptr, label_ptr, aux_ptr, n, lowest: tl.float64, READ: tl.constexpr):
    """``aux[row, 1]``: the hinge's shift, the largest finite score of ``x[row]`` other than the label's (``lowest``,
    the dtype's, if none is); ``aux[row, 0]``: how many of them are +inf, or NaN where the loss is (a NaN score, which
    the maxima here and in the recursion would drop; every score -inf), read then overwritten by
    :func:`log_esp_combine`."""
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(label_ptr + row)
    largest = tl.full((), lowest, x_ptr.dtype.element_ty)
    n_infinite, n_nan = tl.zeros((), tl.int32), tl.zeros((), tl.int32)
    for first in range(0, n, READ):
        column = first + tl.arange(0, READ)
        values = tl.load(x_ptr + row * n + column, mask=column < n, other=float("-inf"))
        infinite = (column != label) & (values == float("inf"))
        largest = tl.maximum(largest, tl.max(tl.where((column == label) | infinite, float("-inf"), values), axis=0))
        n_infinite += tl.sum(infinite.to(tl.int32), axis=0)
        n_nan += tl.sum((values != values).to(tl.int32), axis=0)
    all_low = (n_infinite == 0) & (largest == lowest) & (tl.load(x_ptr + row * n + label) == float("-inf"))
    tl.store(aux_ptr + row * 2, tl.where((n_nan > 0) | all_low, float("nan"), n_infinite.to(x_ptr.dtype.element_ty)))
    tl.store(aux_ptr + row * 2 + 1, largest)


@triton.jit
def _hinge_exponent(x_i, i, label, shift, scale, ceiling, ABSENT: tl.constexpr, LOSS: tl.constexpr):
    """Entry ``i`` of the polynomial's row: ``x_i`` itself, or for the hinge ``(s_i - shift) / (k tau)`` with the
    label's left out, a score at +inf at ``ceiling`` (:func:`topk._esp_tree.infinite_log`) and one at -inf absent."""
    if LOSS:
        exponent = (x_i - shift) * scale
        exponent = tl.where(exponent > ceiling, ceiling, tl.where(exponent < ABSENT, ABSENT, exponent))  # NaN kept
        return tl.where(i == label, ABSENT, exponent)
    return x_i


@triton.jit
def log_esp_chunks(x_ptr, prefix_ptr, chunk_poly_ptr, n, span, n_chunks, label_ptr, aux_ptr, scale: tl.float64,
                   ceiling: tl.float64, ABSENT: tl.constexpr, BLOCK: tl.constexpr, LOSS: tl.constexpr):
    """Program (row, chunk) walks ``x[row, chunk * span:][:span]`` (``x``: contiguous rows of ``n``):
    ``prefix[row, t]``, the log-coefficients of the product of the chunk's factors before ``t``, and
    ``chunk_poly[row, chunk]``, of all of them. ``LOSS``: ``x`` holds scores, and the exponents are the hinge's, with
    the row's shift ``aux[row, 1]``."""
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start = chunk * span
    stop = tl.minimum(start + span, n)
    degree = tl.arange(0, BLOCK)
    dtype = x_ptr.dtype.element_ty
    scale, ceiling = tl.full((), scale, dtype), tl.full((), ceiling, dtype)
    label, shift = -1, 0.0
    if LOSS:
        label, shift = tl.load(label_ptr + row), tl.load(aux_ptr + row * 2 + 1)
    log_poly = tl.where(degree == 0, 0.0, ABSENT).to(dtype)  # the empty product: 1
    for t in range(start, stop):
        tl.store(prefix_ptr + (row * n + t) * BLOCK + degree, log_poly)
        x_t = _hinge_exponent(tl.load(x_ptr + row * n + t), t, label, shift, scale, ceiling, ABSENT, LOSS)
        log_poly = _times_one_plus(log_poly, x_t, degree, ABSENT, BLOCK)
    tl.store(chunk_poly_ptr + (row * n_chunks + chunk) * BLOCK + degree, log_poly)


@triton.jit
def log_esp_combine(chunk_poly_ptr, complement_ptr, out_ptr, n_chunks, x_ptr, n, label_ptr, loss_ptr, aux_ptr,
                    scale: tl.float64, tau: tl.float64, alpha_over_tau: tl.float64, K: tl.constexpr,
                    ABSENT: tl.constexpr, BLOCK: tl.constexpr, LOSS: tl.constexpr, SLICE: tl.constexpr):
    """Program ``row``: ``out[row] = (log sigma_{K-1}, log sigma_K)`` of the product of the row's chunk products, and
    ``complement[row, c]``, the product of every chunk but ``c`` (the backward's start).

    ``LOSS``: the row is the smoothed hinge's (Berrada et al. 2018, Eq. 10-11) for the label ``label[row]``, its
    polynomial taken of ``(s_j - shift) / (k tau)`` without the label's entry, ``shift = aux[row, 1]``;
    ``loss[row] = tau softplus(z)`` and ``aux[row, 0] = z``, ``z = alpha / tau + (shift - s_y) / (k tau) +
    log sigma_K - log sigma_{K-1}`` (at infinite scores, its limit). The scalars come in float64 and are used in the
    scores' dtype."""
    row = tl.program_id(0).to(tl.int64)
    degree = tl.arange(0, BLOCK)
    dtype = chunk_poly_ptr.dtype.element_ty
    scale, tau, alpha_over_tau = tl.full((), scale, dtype), tl.full((), tau, dtype), tl.full((), alpha_over_tau, dtype)
    one = tl.where(degree == 0, 0.0, ABSENT).to(dtype)
    log_poly = one
    for c in range(n_chunks):  # the products of the chunks before each chunk, then the row's
        tl.store(complement_ptr + (row * n_chunks + c) * BLOCK + degree, log_poly)
        log_poly = _times_stored(log_poly, chunk_poly_ptr + (row * n_chunks + c) * BLOCK, BLOCK, SLICE)
    tl.debug_barrier()  # the products stored above, by any thread of the program, are read below by others
    log_suffix = one
    for step in range(n_chunks):  # each chunk's complement: the product before it times the product after it
        c = n_chunks - 1 - step
        slot = complement_ptr + (row * n_chunks + c) * BLOCK
        # the product before c is read in full (by the reductions) before its slot is overwritten
        tl.store(slot + degree, _times_stored(log_suffix, slot, BLOCK, SLICE))
        log_suffix = _times_stored(log_suffix, chunk_poly_ptr + (row * n_chunks + c) * BLOCK, BLOCK, SLICE)
    tl.store(out_ptr + row * 2 + degree - (K - 1), log_poly, mask=(degree == K - 1) | (degree == K))
    if LOSS:
        label, shift = tl.load(label_ptr + row), tl.load(aux_ptr + row * 2 + 1)
        log_gap = tl.sum(tl.where(degree == K, log_poly, 0.0) - tl.where(degree == K - 1, log_poly, 0.0), axis=0)
        true, n_infinite = tl.load(x_ptr + row * n + label), tl.load(aux_ptr + row * 2)
        # the limit at infinite scores (topk._smooth_hinge_tree.limit_offset); NaN for a row with a NaN score
        offset = tl.where(n_infinite >= K, float("inf"),
                          tl.where(((n_infinite > 0) & (true == float("inf"))) | (n_infinite != n_infinite),
                                   float("nan"), 0.0))
        z = alpha_over_tau + (shift - true) * scale + log_gap + offset
        small = tl.exp(-tl.abs(z))
        near_one = 1.0 + small  # log1p(small) = log(near_one) small / (near_one - 1), exact where small < eps too
        rounded_away = near_one == 1.0
        log1p = tl.where(rounded_away, small, tl.log(near_one) * small / tl.where(rounded_away, 1.0, near_one - 1.0))
        tl.store(loss_ptr + row, tau * (tl.maximum(z, 0.0) + log1p))
        tl.store(aux_ptr + row * 2, z)


@triton.jit
def log_esp_backward(x_ptr, prefix_ptr, complement_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, span, n_chunks,
                     label_ptr, aux_ptr, scale: tl.float64, tau: tl.float64, ceiling: tl.float64, K: tl.constexpr,
                     ABSENT: tl.constexpr, BLOCK: tl.constexpr, LOSS: tl.constexpr):
    """Program (row, chunk): ``grad_x[row, i] = sum_j grad_out[row, j] d log sigma_j / d x_i`` for ``j = K - 1, K`` and
    the chunk's ``i``. ``LOSS``: ``grad_out[row]`` is the loss's incoming gradient and ``grad_x`` the hinge's gradient
    with respect to the scores, ``tau sigmoid(z) (d log sigma_K - d log sigma_{K-1}) / (k tau)`` off the label. At the
    label it is minus their sum, ``-sigmoid(z) / k`` exactly (the sums over ``i`` of ``d log sigma_j / d x_i`` are
    ``j``; the shift is a constant: the loss does not change when every score moves alike)."""
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start = chunk * span
    stop = tl.minimum(start + span, n)
    degree = tl.arange(0, BLOCK)
    dtype = x_ptr.dtype.element_ty
    scale, tau, ceiling = tl.full((), scale, dtype), tl.full((), tau, dtype), tl.full((), ceiling, dtype)
    log_lower, log_upper = tl.load(out_ptr + row * 2), tl.load(out_ptr + row * 2 + 1)
    label, shift = -1, 0.0
    if LOSS:
        label, shift = tl.load(label_ptr + row), tl.load(aux_ptr + row * 2 + 1)
        z = tl.load(aux_ptr + row * 2)
        small = tl.exp(-tl.abs(z))  # sigmoid(z) without exp(-z), which overflows where z is far below 0
        grad_upper = tl.load(grad_out_ptr + row) * tau * tl.where(z >= 0, 1.0 / (1.0 + small), small / (1.0 + small))
        grad_lower = -grad_upper
    else:
        grad_lower, grad_upper = tl.load(grad_out_ptr + row * 2), tl.load(grad_out_ptr + row * 2 + 1)
    log_suffix = tl.load(complement_ptr + (row * n_chunks + chunk) * BLOCK + degree)
    for step in range(stop - start):
        i = stop - 1 - step
        s_i = tl.load(x_ptr + row * n + i)
        x_i = _hinge_exponent(s_i, i, label, shift, scale, ceiling, ABSENT, LOSS)
        log_prefix = tl.load(prefix_ptr + (row * n + i) * BLOCK + degree)
        without_upper = _log_coefficient_without(log_prefix, log_suffix, K, BLOCK)
        without_middle = _log_coefficient_without(log_prefix, log_suffix, K - 1, BLOCK)
        upper_share = _share(x_i, without_middle, without_upper, log_upper)
        if K >= 2:
            without_lower = _log_coefficient_without(log_prefix, log_suffix, K - 2, BLOCK)
            lower_share = _share(x_i, without_lower, without_middle, log_lower)
        else:
            lower_share = 0.0
        grad_i = grad_upper * upper_share + grad_lower * lower_share
        if LOSS:  # a score at +inf stands in at the ceiling: its gradient is 0
            grad_i = tl.where(i == label, -grad_upper * scale, tl.where(s_i == float("inf"), 0.0, grad_i * scale))
        tl.store(grad_x_ptr + row * n + i, grad_i)
        log_suffix = _times_one_plus(log_suffix, x_i, degree, ABSENT, BLOCK)
