"""Log-space elementary symmetric polynomials, the core of the smoothed top-k hinge of Berrada, Zisserman
& Kumar, "Smooth loss functions for deep top-k classification" (ICLR 2018).

The smoothed loss (their Eq. 10-11) needs ``log sigma_j(exp(x))`` for ``j = k - 1`` and ``k``, where
``sigma_j(e) = sum_{|A| = j} prod_{i in A} e_i`` is the coefficient of ``X^j`` in ``prod_i (1 + e_i X)``.
:func:`log_elementary_symmetric` gives ``j = 0..k`` by multiplying the factors pairwise, level by level, in log space
(their Section 4.2; :mod:`topk._esp_tree`): nothing overflows, nothing cancels, ``O(k n)`` work per row.
:func:`log_elementary_symmetric_pair` gives the loss's two, on that tree or on Triton kernels that walk each row in
chunks (:mod:`topk._esp_launch`).
"""

import torch

from topk import _ops
from topk._esp_tree import BACKWARDS, absent_log, log_elementary_symmetric, log_pair
from topk._validation import check_choice, check_int, check_scores, choose_backend

__all__ = ["log_elementary_symmetric", "log_elementary_symmetric_pair", "absent_log", "BACKWARDS"]


def log_elementary_symmetric_pair(x: torch.Tensor, k: int, *, backend: str = "torch") -> torch.Tensor:
    """``(log sigma_{k-1}, log sigma_k)`` of ``exp(x)`` along the last dimension: shape ``(..., n) -> (..., 2)``,
    ``1 <= k <= n``, float32 or float64.

    ``backend``: ``"torch"`` (the tree of :func:`log_elementary_symmetric`) or ``"triton"`` (the kernel of
    :mod:`topk._esp_kernel`, through ``topk::log_esp_pair``; CUDA, or Triton's interpreter on a CPU). Both are exact
    to rounding; the kernel's sequential recursion rounds ``n`` times where the tree rounds ``log2 n`` times.

    >>> log_elementary_symmetric_pair(torch.zeros(4), 2).exp()  # C(4, 1), C(4, 2)
    tensor([4., 6.])
    """
    x = check_scores(x, "x")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"'x' should be float32 or float64, got dtype {x.dtype}")
    k = check_int(k, "k", 1, x.shape[-1], " (n, the length of the last dimension)")
    if check_choice(backend, "backend", ("torch", "triton")) == "triton":
        choose_backend(backend, x, k + 1, 1.0)  # refuses a device the kernel cannot run on, or k + 1 above MAX_K
        rows = x.reshape(-1, x.shape[-1])  # [..., n] -> [rows, n]
        return _ops.call(_ops.log_esp_pair, rows, k)[0].reshape(*x.shape[:-1], 2)
    return log_pair(x, k)
