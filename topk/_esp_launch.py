"""The launchers of the smoothed hinge's Triton kernels (:mod:`topk._esp_kernel`): their sizes, compile options, and the
computations of the operators ``topk::log_esp_pair``, ``topk::smooth_hinge_rows`` and their backward operators.

Each row is cut in :func:`esp_chunks` chunks of about ``2 sqrt(n)`` entries walked side by side, one program per (row,
chunk). Forward: the chunks' prefix products, then one program per row combining them into ``log sigma_{k-1}`` and
``log sigma_k`` (for the hinge, Berrada et al. 2018, Eq. 10-11, a first launch finds each row's shift and the last
computes the loss). Backward: one launch, each chunk walked back from its complement. The kernels' sequential recursion
rounds ``n`` times where the tree of :mod:`topk._esp_tree` rounds ``log2 n`` times; both are exact to rounding.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from topk._esp_tree import absent_log, infinite_log

#: Triton's compile options for the walking kernels: one warp per program (the coefficient block is at most 128 wide).
ESP_COMPILE_OPTIONS = {"num_warps": 1}
#: The kernels' absent coefficient, in float32 and float64 alike: ``exp`` of it is 0 in both, and a sum of three
#: stays finite in float32 (a float64 input's own absent entries, far lower, are absorbed the same way).
ESP_ABSENT = absent_log(torch.float32)
#: The fewest entries of a row one program walks (:func:`esp_span`).
ESP_MIN_SPAN = 64
#: Scores read at once when the hinge's shift is looked for (:func:`topk._esp_kernel.hinge_shift`).
ESP_READ = 1024
#: Triton's compile options for :func:`topk._esp_kernel.hinge_shift`: a block of :data:`ESP_READ` scores over four
#: warps.
SHIFT_COMPILE_OPTIONS = {"num_warps": 4}


def esp_block(k: int) -> int:
    """The kernels' coefficient block: degrees ``0..k`` padded to a power of two."""
    return 1 << k.bit_length()


def esp_span(n: int) -> int:
    """Entries of a row walked by one program: about ``2 sqrt(n)``, at least :data:`ESP_MIN_SPAN`. A program walks
    its chunk entry by entry (forward, then three times as long backward) and the row's chunks are combined one by
    one, each about five entries' work: ``4 span + 15 n / span`` sequential steps, least near ``span = 2 sqrt(n)``."""
    return max(ESP_MIN_SPAN, 2 * math.isqrt(n))


def esp_chunks(n: int) -> int:
    """How many chunks of :func:`esp_span` entries a row of ``n`` is cut into."""
    return max(1, -(-n // esp_span(n)))


def combine_slice(k: int) -> int:
    """Degrees of one factor :func:`topk._esp_kernel.log_esp_combine` multiplies at once: at most 2048 terms held."""
    return min(esp_block(k), 2048 // esp_block(k))


def combine_compile_options(k: int) -> dict:
    """:func:`topk._esp_kernel.log_esp_combine` holds ``slice x block`` terms at once: at most 16 values per thread
    of its warps."""
    return {"num_warps": max(1, combine_slice(k) * esp_block(k) // 512)}


def _launch_forward(x: Tensor, k: int, hinge: Optional[tuple]):
    # imported at first use: Triton is optional, and reads TRITON_INTERPRET when it is imported
    from topk._esp_kernel import hinge_shift, log_esp_chunks, log_esp_combine

    n_rows, n = x.shape
    block, span, n_chunks = esp_block(k), esp_span(n), esp_chunks(n)
    pair, prefix = x.new_empty(n_rows, 2), x.new_empty(n_rows, n, block)
    complement, chunk_poly = x.new_empty(n_rows, n_chunks, block), x.new_empty(n_rows, n_chunks, block)
    loss, aux = (x.new_empty(n_rows), x.new_empty(n_rows, 2)) if hinge else (pair, pair)
    labels, tau, alpha = hinge or (pair, 1.0, 0.0)
    if n_rows:
        if hinge:
            hinge_shift[(n_rows,)](x, labels, aux, n, torch.finfo(x.dtype).min, READ=ESP_READ,
                                   **SHIFT_COMPILE_OPTIONS)
        log_esp_chunks[(n_rows, n_chunks)](x, prefix, chunk_poly, n, span, n_chunks, labels, aux, 1.0 / (k * tau),
                                           infinite_log(x.dtype), ABSENT=ESP_ABSENT, BLOCK=block, LOSS=hinge is not None,
                                           **ESP_COMPILE_OPTIONS)
        log_esp_combine[(n_rows,)](chunk_poly, complement, pair, n_chunks, x, n, labels, loss, aux,
                                   1.0 / (k * tau), tau, alpha / tau, K=k, ABSENT=ESP_ABSENT, BLOCK=block,
                                   LOSS=hinge is not None, SLICE=combine_slice(k), **combine_compile_options(k))
    return pair, prefix, complement, loss, aux


def _launch_backward(x, prefix, complement, pair, grad, k: int, hinge: Optional[tuple]) -> Tensor:
    # imported at first use: Triton is optional, and reads TRITON_INTERPRET when it is imported
    from topk._esp_kernel import log_esp_backward

    grad_x = torch.empty_like(x)
    labels, aux, tau = hinge or (pair, pair, 1.0)
    (n_rows, n), n_chunks = x.shape, complement.shape[1]
    if n_rows:
        log_esp_backward[(n_rows, n_chunks)](x, prefix, complement, pair, grad.to(pair.dtype).contiguous(), grad_x, n,
                                             esp_span(n), n_chunks, labels, aux, 1.0 / (k * tau), tau,
                                             infinite_log(x.dtype), K=k,
                                             ABSENT=ESP_ABSENT, BLOCK=esp_block(k), LOSS=hinge is not None,
                                             **ESP_COMPILE_OPTIONS)
    return grad_x


# The operators' computations; their signatures are the operators' schemas (topk._ops).


def log_esp_pair(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(log sigma_{k-1}, log sigma_k)`` of ``exp(x)`` for each row of ``x`` (``[rows, n]`` -> ``[rows, 2]``), then
    what the backward reads (not differentiable): the prefix products ``[rows, n, esp_block(k)]`` and each chunk's
    complement ``[rows, esp_chunks(n), esp_block(k)]``."""
    pair, prefix, complement, _, _ = _launch_forward(x.contiguous(), k, None)
    return pair, prefix, complement


def log_esp_pair_backward(x: Tensor, prefix: Tensor, complement: Tensor, pair: Tensor, grad_pair: Tensor,
                          k: int) -> Tensor:
    """``sum_j grad_pair[:, j] d pair[:, j] / d x``, ``[rows, n]``, in one launch, from
    ``d log sigma_j / d x_i = e^{x_i} sigma_{j-1}(x without i) / sigma_j(x)``."""
    return _launch_backward(x.contiguous(), prefix, complement, pair, grad_pair, k, None)


def smooth_hinge_rows(scores: Tensor, labels: Tensor, k: int, tau: float,
                      alpha: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The smoothed hinge of each row of ``scores`` (``[rows, n]``, labels ``[rows]``) in three launches (the shift, the
    chunks, their combination): the loss ``[rows]``, then what its backward reads (not differentiable): the prefix
    products, the chunks' complements, the pair ``log sigma_{k-1}, log sigma_k`` and ``(z, shift)``, ``[rows, 2]``
    each."""
    pair, prefix, complement, loss, aux = _launch_forward(scores.contiguous(), k, (labels.contiguous(), tau, alpha))
    return loss, prefix, complement, pair, aux


def smooth_hinge_rows_backward(scores: Tensor, labels: Tensor, prefix: Tensor, complement: Tensor, pair: Tensor,
                               aux: Tensor, grad_loss: Tensor, k: int, tau: float) -> Tensor:
    """``d sum(grad_loss * loss) / d scores``, ``[rows, n]``, in one launch."""
    return _launch_backward(scores.contiguous(), prefix, complement, pair, grad_loss, k,
                            (labels.contiguous(), aux, tau))
