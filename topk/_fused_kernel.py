"""The Triton source of :mod:`topk.fused` (imported on first use, so that ``TRITON_INTERPRET`` is read then).

One program handles one row of scores, one chunk of its classes and a block of noise samples; see
:mod:`topk.fused` for the algorithm and the exact pruning.
"""

import triton
import triton.language as tl


@triton.jit
def perturb(scores, z, column_ok, sample_ok, epsilon):
    """``s + eps z`` of a quarter tile (``[BLOCK_B, QUARTER]``), ``-inf`` outside the row and the samples."""
    return tl.where(sample_ok[:, None] & column_ok[None, :], scores[None, :] + epsilon * z, float("-inf"))


@triton.jit
def insert_tile(best, best_at, kth, kth_slot, perturbed, first_column, QUARTER: tl.constexpr, BLOCK_K: tl.constexpr):
    """Insert a quarter tile's perturbed values into the K largest while they beat the K-th: at most K times.

    Each round is one reduction over the tile (its largest value per sample, with the position) and one over the
    buffer (the new K-th largest and its slot)."""
    lanes = tl.arange(0, QUARTER)
    slots = tl.arange(0, BLOCK_K)
    top, top_lane = tl.max(perturbed, axis=1, return_indices=True)
    enters = top > kth
    while tl.max(enters.to(tl.int32)) > 0:
        replaced = enters[:, None] & (slots[None, :] == kth_slot[:, None])
        best = tl.where(replaced, top[:, None], best)
        best_at = tl.where(replaced, (first_column + top_lane)[:, None], best_at)
        perturbed = tl.where(lanes[None, :] == top_lane[:, None], float("-inf"), perturbed)
        kth, kth_slot = tl.min(best, axis=1, return_indices=True)
        top, top_lane = tl.max(perturbed, axis=1, return_indices=True)
        enters = top > kth
    return best, best_at, kth, kth_slot


@triton.jit
def perturbed_kth_largest(
    s_ptr, noise_ptr, seed_ptr, floor_ptr, out_values_ptr, out_positions_ptr, epsilon: tl.float64,
    n_rows, n_classes, n_samples, row_stride, floor_stride, chunk_length, n_chunks, reach, slack,
    K: tl.constexpr, HAS_NOISE: tl.constexpr, FINAL: tl.constexpr, PRUNE: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
):
    QUARTER: tl.constexpr = BLOCK_L // 4
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    samples = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    sample_ok = samples < n_samples
    slots = tl.arange(0, BLOCK_K)  # [BK]
    lanes = tl.arange(0, QUARTER)  # [Q]
    accumulate = out_values_ptr.dtype.element_ty  # float32, float64 for float64 scores
    epsilon = tl.full((), epsilon, accumulate)
    if not HAS_NOISE:
        seed = tl.load(seed_ptr)
    chunk_start = chunk * chunk_length
    chunk_stop = tl.minimum(chunk_start + chunk_length, n_classes)
    # the K largest so far, per sample; the padding slots (>= K) hold +inf so they are never the minimum
    best = tl.where(slots[None, :] < K, float("-inf"), float("inf")).to(accumulate) + tl.zeros(
        (BLOCK_B, BLOCK_K), accumulate)
    best_at = tl.zeros((BLOCK_B, BLOCK_K), tl.int32) + chunk_start
    kth, kth_slot = tl.min(best, axis=1, return_indices=True)  # [BB], the current K-th largest and its slot
    has_nan = tl.zeros((QUARTER,), tl.int1)
    if PRUNE:  # the row's hard K-th largest score: a class more than 2 eps Z_MAX below it never reaches the top
        floor = tl.load(floor_ptr + row * floor_stride).to(accumulate)
    counter_base = (samples.to(tl.int64) * n_rows + row) * n_classes  # [BB], noise[b, row, :] starts here
    row_scores = s_ptr + row.to(tl.int64) * row_stride
    # a tile is four quarters of QUARTER classes; in-kernel noise: counter start/4 + q gives quarter j its z_j
    for start in range(chunk_start, chunk_stop, BLOCK_L):
        c0 = start + lanes
        c1 = c0 + QUARTER
        c2 = c1 + QUARTER
        c3 = c2 + QUARTER
        s0 = tl.load(row_scores + c0, mask=c0 < chunk_stop, other=0.0).to(accumulate)
        s1 = tl.load(row_scores + c1, mask=c1 < chunk_stop, other=0.0).to(accumulate)
        s2 = tl.load(row_scores + c2, mask=c2 < chunk_stop, other=0.0).to(accumulate)
        s3 = tl.load(row_scores + c3, mask=c3 < chunk_stop, other=0.0).to(accumulate)
        has_nan = has_nan | (s0 != s0) | (s1 != s1) | (s2 != s2) | (s3 != s3)
        reachable = True
        if PRUNE:  # can any s + eps z of this tile (|z| <= Z_MAX) beat some sample's K-th largest?
            tile_max = tl.maximum(
                tl.maximum(tl.max(tl.where(c0 < chunk_stop, s0, float("-inf"))),
                           tl.max(tl.where(c1 < chunk_stop, s1, float("-inf")))),
                tl.maximum(tl.max(tl.where(c2 < chunk_stop, s2, float("-inf"))),
                           tl.max(tl.where(c3 < chunk_stop, s3, float("-inf")))))
            highest = tile_max + reach + slack * tl.abs(tile_max)  # the most any s + eps z of the tile can be
            reachable = (highest >= tl.min(tl.where(sample_ok, kth, float("inf")))) & (
                highest >= floor - reach - slack * tl.abs(floor))
        if reachable:
            if HAS_NOISE:
                noise = noise_ptr + counter_base[:, None]
                inside = sample_ok[:, None]
                z0 = tl.load(noise + c0[None, :], mask=inside & (c0 < chunk_stop)[None, :], other=0.0)
                z1 = tl.load(noise + c1[None, :], mask=inside & (c1 < chunk_stop)[None, :], other=0.0)
                z2 = tl.load(noise + c2[None, :], mask=inside & (c2 < chunk_stop)[None, :], other=0.0)
                z3 = tl.load(noise + c3[None, :], mask=inside & (c3 < chunk_stop)[None, :], other=0.0)
            else:
                z0, z1, z2, z3 = tl.randn4x(seed, counter_base[:, None] + (start // 4 + lanes)[None, :])
            p0 = perturb(s0, z0.to(accumulate), c0 < chunk_stop, sample_ok, epsilon)
            p1 = perturb(s1, z1.to(accumulate), c1 < chunk_stop, sample_ok, epsilon)
            p2 = perturb(s2, z2.to(accumulate), c2 < chunk_stop, sample_ok, epsilon)
            p3 = perturb(s3, z3.to(accumulate), c3 < chunk_stop, sample_ok, epsilon)
            # one reduction tells whether any value of the tile enters; after the first tiles, most tiles have none
            above = kth[:, None]
            if tl.max(((p0 > above) | (p1 > above) | (p2 > above) | (p3 > above)).to(tl.int32)) > 0:
                best, best_at, kth, kth_slot = insert_tile(best, best_at, kth, kth_slot, p0, start, QUARTER, BLOCK_K)
                best, best_at, kth, kth_slot = insert_tile(best, best_at, kth, kth_slot, p1, start + QUARTER,
                                                           QUARTER, BLOCK_K)
                best, best_at, kth, kth_slot = insert_tile(best, best_at, kth, kth_slot, p2, start + 2 * QUARTER,
                                                           QUARTER, BLOCK_K)
                best, best_at, kth, kth_slot = insert_tile(best, best_at, kth, kth_slot, p3, start + 3 * QUARTER,
                                                           QUARTER, BLOCK_K)
    nan = tl.max(has_nan.to(tl.int32)) > 0
    if FINAL:
        kth_at = tl.sum(tl.where(slots[None, :] == kth_slot[:, None], best_at, 0), axis=1)
        kth = tl.where(nan, float("nan"), kth)
        out = samples * n_rows + row
        tl.store(out_values_ptr + out, kth, mask=sample_ok)
        tl.store(out_positions_ptr + out, kth_at, mask=sample_ok)
    else:
        best = tl.where(nan, float("nan"), best)
        out = ((samples[:, None] * n_rows + row) * n_chunks + chunk) * K + slots[None, :]
        keep = sample_ok[:, None] & (slots[None, :] < K)
        tl.store(out_values_ptr + out, best, mask=keep)
        tl.store(out_positions_ptr + out, best_at, mask=keep)


@triton.jit
def kth_gradient(weight_ptr, grad_ptr, grad_stride, positions_ptr, labels_ptr, out_ptr, n_rows, n_classes, n_samples,
                 HAS_LABELS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_L: tl.constexpr):
    """One tile of the estimator's gradient (Prop. 3.3; Eq. 12 with labels), zeros included, written once:
    ``out[row, j] = sum_b 1{positions[b, row] = j} weight[row] - 1{j = labels[row]} grad[row * grad_stride]``.

    The weights (``grad / B``) are added one sample at a time and the label's term last, in the gradient's dtype, as
    the scatter of the PyTorch path adds them: the same numbers, bit for bit. Only a tile holding a position pays for
    the samples' loop."""
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BLOCK_L
    columns = first + tl.arange(0, BLOCK_L)
    weight = tl.load(weight_ptr + row)
    gradient = tl.zeros((BLOCK_L,), weight.dtype)
    holds = 0
    for start in range(0, n_samples, BLOCK_B):
        samples = start + tl.arange(0, BLOCK_B)
        at = tl.load(positions_ptr + samples * n_rows + row, mask=samples < n_samples, other=-1)
        holds = tl.maximum(holds, tl.max(((at >= first) & (at < first + BLOCK_L)).to(tl.int32)))
    if holds > 0:
        for b in range(n_samples):
            gradient = tl.where(columns == tl.load(positions_ptr + b * n_rows + row), gradient + weight, gradient)
    if HAS_LABELS:
        gradient = tl.where(columns == tl.load(labels_ptr + row), gradient - tl.load(grad_ptr + row * grad_stride),
                            gradient)
    tl.store(out_ptr + row * n_classes + columns, gradient, mask=columns < n_classes)
