"""The bounded Gaussian noise every estimator draws, and the exact candidate pruning it allows.

Every path of the perturbed top-K (Garcin et al., ICML 2022, Eq. 11) draws ``Z`` with ``|Z| <= Z_MAX``:

- Triton's ``tl.randn4x`` is Box-Muller with its uniform clamped at 1e-7, so its radius, hence ``|Z|``, never exceeds
  ``Z_MAX = sqrt(2 ln 1e7) ~ 5.68``;
- the PyTorch path clamps ``torch.randn`` at ``+-Z_MAX``, and the CPU kernel (:mod:`topk._cpu_kernel`) its own normal
  draws. A standard normal exceeds that radius with probability ``2 (1 - Phi(5.68)) ~ 1.4e-8`` per draw; the clamp
  moves that mass onto ``+-Z_MAX``, a change to the estimator far below its Monte Carlo error.

With bounded noise, a class ``j`` whose score is below ``s_[k] - 2 eps Z_MAX`` (``s_[k]``: the k-th largest score of
its row) can never be among the ``k`` largest of ``s + eps Z``: each of the ``k`` largest scores keeps a perturbed
value above ``s_[k] - eps Z_MAX``, and ``s_j + eps Z_j`` stays below it. So the top-k of the perturbed row is the top-k
of its *candidates*, the classes at or above that threshold: exact, not probable. For a trained network's logits
(spread over tens of units) and the paper's eps (0.2 on CIFAR-100, 1e-2 on Pl@ntNet) a handful of classes are
candidates, and only they need noise. The CPU kernel and the Triton kernel (:mod:`topk.fused`) prune so.
"""

from __future__ import annotations

import math

import torch

#: The largest |Z| either path draws: Triton's Box-Muller radius with the uniform clamped at 1e-7.
Z_MAX = math.sqrt(-2.0 * math.log(1e-7))
#: Relative slack on the pruning bounds, above float32 rounding of ``s + eps z`` (2^-22 at most); the CPU kernel
#: widens it to its dtype's rounding (:func:`slack`).
PRUNE_SLACK = 2.0**-20


def slack(dtype: torch.dtype) -> float:
    """Relative slack covering the rounding of ``s + eps z`` computed in ``dtype`` (8 units in the last place)."""
    return max(PRUNE_SLACK, 8 * torch.finfo(dtype).eps)


def bounded_normal(shape: tuple[int, ...], *, generator: torch.Generator | None, dtype: torch.dtype | None = None,
                   device: torch.device | None = None) -> torch.Tensor:
    """Standard normal draws clamped at ``+-Z_MAX``, the noise of the PyTorch path."""
    return torch.empty(shape, dtype=dtype, device=device).normal_(generator=generator).clamp_(-Z_MAX, Z_MAX)
