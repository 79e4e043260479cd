"""The CPU kernel of the perturbed top-k (Garcin et al., ICML 2022, Eq. 11), compiled by Numba: exact pruning, noise
drawn only where it can change the result, nothing of size ``n_samples x L`` stored.

**The noise.** ``z[b, r, j]``, for sample ``b``, row ``r`` and class ``j``, is a pure function of the seed and of the
counter ``(b * n_rows + r) * n_classes + j``, the position of that draw in a ``[B, R, L]`` tensor: the SplitMix64
output function (Steele, Lea & Flood, OOPSLA 2014) of the counter, keyed by the hashed seed, gives random words, and
the Ziggurat of Marsaglia & Tsang (2000) turns them into a standard normal, clamped at ``+-Z_MAX`` as the PyTorch path
clamps (:mod:`topk._bounded_noise`). A draw is computed where it is needed, in any order, and :func:`normals`
materialises the same draws for checking.

**The walk.** Per row: one pass finds the ``k`` largest scores; a second lists the other classes whose largest
perturbed value (``s_j + eps Z_MAX``, widened by the rounding slack) is not below the least the ``k``-th largest score
can reach (``s_[k] - eps Z_MAX``, likewise). Each sample draws the noise of the ``k`` largest scores first; the ``k``-th
largest of those perturbed values is a floor for its result, and only the listed classes whose largest perturbed value
reaches that floor get a draw: exact given the bounded noise.

Rows are split in blocks over ``torch.get_num_threads()`` threads when the work is large enough (the compiled function
releases the GIL). Scores in float32 and float64 are computed in their dtype, ``s + eps z`` rounded twice (product,
then sum) as PyTorch rounds it; half-precision scores are computed in float32.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch

from topk._bounded_noise import Z_MAX, slack

__all__ = ["perturbed_top", "normals", "precompile"]

#: Each thread gets at least this much work, counted as scores read plus noise draws (estimated from the candidates of
#: the first PROBE_ROWS rows). Below it a call runs on one thread: after a parallel PyTorch operation, PyTorch's OpenMP
#: workers keep spinning for a while on the other cores, and a pool thread sharing a core with one of them gains
#: nothing on a small step.
MIN_WORK_PER_THREAD = 1 << 19
PROBE_ROWS = 8
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _compiled(function):
    """``function`` compiled by Numba, releasing the GIL; its machine code cached on disk where Numba finds a writable
    place (beside this file, or the user's cache directory), else compiled again in each process."""
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # Numba found no writable cache location
        return numba.njit(nogil=True)(function)


@numba.njit(inline="always")
def _mix(x):
    """SplitMix64's output function: a bijection of 64-bit words that spreads every input bit over the output."""
    x = (x ^ (x >> np.uint64(30))) * _MIX_1
    x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def _ziggurat_layers(n_layers: int = 256, edge: float = 3.6541528853610088,
                     area: float = 0.00492867323399) -> tuple[np.ndarray, np.ndarray]:
    """The Ziggurat of Marsaglia & Tsang (J. Stat. Softw. 5(8), 2000) under ``f(x) = exp(-x^2 / 2)``: ``n_layers``
    strips of equal ``area``, the base one holding the tail beyond ``edge``. Returns the right ends ``x[0..n]``
    (``x[0] = area / f(edge)``, the base strip's width; ``x[1] = edge``; ``x[n] = 0``) and ``f(x)``."""
    x = np.empty(n_layers + 1)
    x[0], x[1] = area / math.exp(-0.5 * edge * edge), edge
    for i in range(1, n_layers - 1):
        x[i + 1] = math.sqrt(-2.0 * math.log(math.exp(-0.5 * x[i] * x[i]) + area / x[i]))
    x[n_layers] = 0.0
    return x, np.exp(-0.5 * x * x)


_LAYER_X, _LAYER_F = _ziggurat_layers()
_TAIL_EDGE = _LAYER_X[1]
#: The clamp of the draws, frozen into the compiled code (the pruning's bound is read from ``Z_MAX`` at each call).
_CLAMP = Z_MAX
#: A word with its low 9 bits cleared, read as a signed integer, times these: a signed uniform in [-1, 1) times the
#: layer's width.
_TOP_55_BITS = np.uint64(0xFFFFFFFFFFFFFE00)
_SIGNED_LAYER_X = _LAYER_X * 2.0**-63


@numba.njit(inline="always")
def _word(key, counter, n):
    """The ``n``-th random 64-bit word (``n < 16``) of draw ``counter`` (``< 2^60``) of the stream ``key``."""
    return _mix(key + ((counter << np.uint64(4)) + np.uint64(n + 1)) * _GOLDEN_GAMMA)


@numba.njit(inline="always")
def _uniform(bits):
    """The top 53 bits of ``bits`` as a number in (0, 1)."""
    return (np.float64(np.int64(bits >> np.uint64(11))) + 0.5) * 2.0**-53  # (int64 converts in one instruction)


@numba.njit(inline="always")
def _normal(key, counter):
    """Draw ``counter`` of the stream ``key``: a standard normal by the Ziggurat, clamped at ``+-Z_MAX``. One word in
    about 99% of draws: its low 8 bits choose a layer, its top 55 bits a signed uniform in [-1, 1), accepted inside the
    layer's rectangle; else the wedge test, or the tail beyond the edge by Marsaglia's exponential method. Past the
    draw's 16 words (a probability below 1e-25) it gives 0."""
    n = 0
    while n <= 14:  # an attempt reads words n and n + 1 at most
        bits = _word(key, counter, n)
        layer = bits & np.uint64(255)
        z = np.float64(np.int64(bits & _TOP_55_BITS)) * _SIGNED_LAYER_X[layer]
        if abs(z) < _LAYER_X[layer + 1]:  # inside the rectangle, below the edge < Z_MAX: no clamp
            return z
        if layer == 0:  # the tail: edge + a, a ~ Exp(edge), accepted with probability exp(-a^2 / 2); tried until then
            while n <= 13:
                a = -math.log(_uniform(_word(key, counter, n + 1))) / _TAIL_EDGE
                if -2.0 * math.log(_uniform(_word(key, counter, n + 2))) > a * a:
                    return math.copysign(min(_TAIL_EDGE + a, _CLAMP), z)
                n += 2
            break
        u = _uniform(_word(key, counter, n + 1))  # the wedge between the layer's rectangle and the curve
        if _LAYER_F[layer + 1] + u * (_LAYER_F[layer] - _LAYER_F[layer + 1]) < math.exp(-0.5 * z * z):
            return z
        n += 2
    return 0.0


@numba.njit(inline="always")
def _insert(best, best_at, filled, value, at):
    """Put ``value`` (at class ``at``) into ``best``, the ``filled`` largest so far in decreasing order, dropping the
    smallest when full; an equal value goes after those already there, as :func:`torch.topk` ranks ties."""
    i = filled if filled < best.shape[0] else best.shape[0] - 1
    while i > 0 and best[i - 1] < value:
        best[i] = best[i - 1]
        best_at[i] = best_at[i - 1]
        i -= 1
    best[i] = value
    best_at[i] = at


@numba.njit(inline="always")
def _cutoff(kth, reach, slack):
    """A score below which a class cannot beat ``kth`` perturbed: ``s + reach + slack |s| < lowest`` for every ``s`` under
    it, where ``lowest = kth - reach - slack |kth|`` is the least the class at ``kth`` can reach (NaN if undefined)."""
    lowest = kth - reach - slack * abs(kth)
    return lowest - reach - 2.0 * slack * (abs(lowest) + reach)


@numba.njit(inline="always")
def _candidates(row, reach, slack, top, top_at, is_top, others):
    """The ``k = len(top)`` largest scores of ``row`` into ``top`` (decreasing) and ``top_at``, and the other classes
    that can reach the ``k`` largest perturbed values into ``others``: returns their count, or -1 if ``row`` holds a NaN.
    ``is_top`` (all False, as left) marks the ``k`` largest while the others are listed."""
    k, n_classes = top.shape[0], row.shape[0]
    has_nan = False
    for j in range(n_classes):
        has_nan |= row[j] != row[j]
        if j < k or row[j] > top[k - 1]:
            _insert(top, top_at, j, row[j], j)
    if has_nan:
        return -1
    cutoff = _cutoff(top[k - 1], reach, slack)
    is_top[top_at] = True
    n_others = 0
    for j in range(n_classes):  # listed without a branch (an undefined cutoff keeps all)
        others[n_others] = j
        n_others += (not row[j] < cutoff) & (not is_top[j])
    is_top[top_at] = False
    return n_others


@_compiled
def _mean_candidates(scores, k, reach, slack):
    """The mean number of :func:`_candidates` beside the ``k`` largest over the rows of ``scores``."""
    n_rows, n_classes = scores.shape
    top, top_at = np.empty(k, scores.dtype), np.empty(k, np.int64)
    is_top, others = np.zeros(n_classes, np.bool_), np.empty(n_classes, np.int64)
    total = 0
    for r in range(n_rows):
        found = _candidates(scores[r], reach, slack, top, top_at, is_top, others)
        total += found if found >= 0 else n_classes
    return total / max(n_rows, 1)


@_compiled
def _top_of_rows(scores, key, epsilon, k, reach, slack, first_row, n_rows, selected, positions):
    """Per row of the block ``scores`` (rows ``first_row...`` of ``n_rows``) and sample ``b``, over the ``k`` largest of
    ``s + epsilon z_b``: ``selected[b, row]``, the ``k``-th largest, or their sum when ``positions`` has ``k`` slots
    (``topSigma_k``), summed in float64; ``positions[b, row]``, the class of the ``k``-th largest, or of each of the
    ``k`` largest in decreasing order. A row holding a NaN gets NaN. ``reach``: the most ``|fl(epsilon z)|`` can be;
    ``slack``: the relative rounding of a sum in the scores' dtype."""
    n_samples, _, r_slots = positions.shape
    block_rows, n_classes = scores.shape
    drawn = np.empty(n_classes, np.int64)
    perturbed = np.empty(n_classes, scores.dtype)  # a value stored here is rounded to the scores' dtype
    perturbed[0] = epsilon
    eps = perturbed[0]
    top, best = np.empty(k, scores.dtype), np.empty(k, scores.dtype)
    top_at, best_at = np.empty(k, np.int64), np.empty(k, np.int64)
    others = np.empty(n_classes, np.int64)
    is_top = np.zeros(n_classes, np.bool_)
    for r in range(block_rows):
        row, out = scores[r], first_row + r
        n_others = _candidates(row, reach, slack, top, top_at, is_top, others)
        if n_others < 0:  # a NaN score
            selected[:, out] = np.nan
            positions[:, out, :] = 0
            continue
        for b in range(n_samples):
            base = np.uint64(((b * n_rows) + out) * n_classes)
            # draws in loops of independent iterations (a draw's latency hides behind the next one's), then insertions:
            # the k largest scores' first, then those of the classes that can beat the k-th largest of these
            for t in range(k):
                perturbed[t] = _normal(key, base + np.uint64(top_at[t]))
                perturbed[t] = row[top_at[t]] + eps * perturbed[t]
            for t in range(k):
                _insert(best, best_at, t, perturbed[t], top_at[t])
            n_drawn = 0
            for t in range(n_others):
                j = others[t]
                drawn[n_drawn] = j
                n_drawn += not row[j] + reach + slack * abs(row[j]) < best[k - 1]
            for t in range(n_drawn):
                perturbed[t] = _normal(key, base + np.uint64(drawn[t]))
                perturbed[t] = row[drawn[t]] + eps * perturbed[t]
            for t in range(n_drawn):
                if perturbed[t] > best[k - 1]:
                    _insert(best, best_at, k, perturbed[t], drawn[t])
            if r_slots == k:
                total = 0.0
                for t in range(k):
                    total += best[t]
                    positions[b, out, t] = best_at[t]
                selected[b, out] = total
            else:
                selected[b, out] = best[k - 1]
                positions[b, out, 0] = best_at[k - 1]


@_compiled
def _fill_normals(key, out):
    for counter in range(out.shape[0]):
        out[counter] = _normal(key, np.uint64(counter))


def _key(seed: int) -> np.uint64:
    return np.uint64(_mix(np.uint64(seed)))


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool() -> ThreadPoolExecutor:
    """This process's pool (a forked child gets its own: a parent's worker threads do not survive a fork)."""
    pid = os.getpid()
    if pid not in _pools:
        _pools.clear()
        _pools[pid] = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="topk-cpu")
    return _pools[pid]


def _n_blocks(rows: np.ndarray, k: int, reach: float, margin: float, n_samples: int) -> int:
    """How many threads share the rows: one per ``MIN_WORK_PER_THREAD`` of estimated work, at most
    ``torch.get_num_threads()``."""
    threads = min(torch.get_num_threads(), rows.shape[0])
    if threads <= 1:
        return 1
    draws_per_row = n_samples * (k + _mean_candidates(rows[:PROBE_ROWS], k, reach, margin))
    work = rows.shape[0] * (rows.shape[1] + draws_per_row)
    return max(1, min(threads, int(work // MIN_WORK_PER_THREAD)))


def _kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def perturbed_top(scores: torch.Tensor, seed: int, k: int, epsilon: float, n_samples: int,
                  sum_top: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of the CPU ``scores`` (``[R, L]``) and each sample ``b``: the ``k``-th largest of ``s + epsilon z_b``
    (``sum_top``: the sum of the ``k`` largest), ``[B, R]`` in float32 (float64 for float64 scores), and its class
    (``sum_top``: theirs, in decreasing order), ``[B, R, 1]`` (``[B, R, k]``) int64. ``z`` is the noise of
    :func:`normals` for ``seed``, drawn only for the classes that can reach the top."""
    dtype = _kernel_dtype(scores.dtype)
    rows = scores.detach().to(dtype).contiguous().numpy()
    n_rows, n_classes = rows.shape
    selected = np.empty((n_samples, n_rows), rows.dtype)
    positions = np.empty((n_samples, n_rows, k if sum_top else 1), np.int64)
    margin = slack(dtype)
    reach = epsilon * Z_MAX * (1.0 + margin)
    key = _key(seed)
    n_blocks = _n_blocks(rows, k, reach, margin, n_samples)
    bounds = [n_rows * i // n_blocks for i in range(n_blocks + 1)]

    def block(i):
        _top_of_rows(rows[bounds[i]:bounds[i + 1]], key, epsilon, k, reach, margin, bounds[i], n_rows, selected,
                     positions)

    others = [_pool().submit(block, i) for i in range(1, n_blocks)]
    block(0)
    for other in others:
        other.result()
    return torch.from_numpy(selected), torch.from_numpy(positions)


def normals(seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The draws :func:`perturbed_top` makes for ``seed``, materialised: ``shape = (B, R, L)`` (or any shape with the
    same number of elements, in that order), cast to ``dtype`` as the kernel casts them."""
    out = np.empty(math.prod(shape), np.float64)
    _fill_normals(_key(seed), out)
    return torch.from_numpy(out).to(_kernel_dtype(dtype)).to(dtype).view(shape)


def precompile() -> None:
    """Compile the kernels for float32 and float64 scores into Numba's cache (or load them from it): what ``make venv``
    runs, so that the first training or test of a fresh install does not wait about 4 s per dtype and process."""
    for dtype in (torch.float32, torch.float64):
        scores = torch.zeros(2, 4, dtype=dtype)
        perturbed_top(scores, 0, 1, 0.5, 2, sum_top=False)
        _mean_candidates(scores.numpy(), 1, 0.5, slack(dtype))  # called where rows are shared among threads
    normals(0, (1, 1, 2))
