"""The bounded Gaussian noise both estimators draw, and the exact candidate pruning it allows.

Both paths of the perturbed top-K (Garcin et al., ICML 2022, Eq. 11) draw ``Z`` with ``|Z| <= Z_MAX``:

- Triton's ``tl.randn4x`` is Box-Muller with its uniform clamped at 1e-7, so its radius, hence ``|Z|``, never exceeds
  ``Z_MAX = sqrt(2 ln 1e7) ~ 5.68``;
- the PyTorch path clamps ``torch.randn`` at ``+-Z_MAX``. A standard normal exceeds that radius with probability
  ``2 (1 - Phi(5.68)) ~ 1.4e-8`` per draw; the clamp moves that mass onto ``+-Z_MAX``, a change to the estimator far
  below its Monte Carlo error.

With bounded noise, a class ``j`` whose score is below ``s_[k] - 2 eps Z_MAX`` (``s_[k]``: the k-th largest score of
its row) can never be among the ``k`` largest of ``s + eps Z``: each of the ``k`` largest scores keeps a perturbed
value above ``s_[k] - eps Z_MAX``, and ``s_j + eps Z_j`` stays below it. So the top-k of the perturbed row is the top-k
of its *candidates*, the classes at or above that threshold: exact, not probable. For a trained network's logits
(spread over tens of units) and the paper's eps (0.2 on CIFAR-100, 1e-2 on Pl@ntNet) a handful of classes are
candidates, and only they need noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: The largest |Z| either path draws: Triton's Box-Muller radius with the uniform clamped at 1e-7.
Z_MAX = math.sqrt(-2.0 * math.log(1e-7))
#: Relative slack on the pruning bounds, above float32 rounding of ``s + eps z`` (2^-22 at most); the PyTorch path
#: widens it to its dtype's rounding (:func:`slack`).
PRUNE_SLACK = 2.0**-20


def slack(dtype: torch.dtype) -> float:
    """Relative slack covering the rounding of ``s + eps z`` computed in ``dtype`` (8 units in the last place)."""
    return max(PRUNE_SLACK, 8 * torch.finfo(dtype).eps)


def bounded_normal(shape: tuple[int, ...], *, generator: torch.Generator | None, dtype: torch.dtype | None = None,
                   device: torch.device | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Standard normal draws clamped at ``+-Z_MAX``, the noise of the PyTorch path; into ``out`` when given."""
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    return out.normal_(generator=generator).clamp_(-Z_MAX, Z_MAX)


def candidate_threshold(s: torch.Tensor, k: int, epsilon: float) -> torch.Tensor:
    """Per row, the score below which a class cannot reach the ``k`` largest of ``s + eps Z``: ``s_[k] - 2 eps Z_MAX``,
    lowered by the rounding slack of ``s``'s dtype. Shape ``(..., 1)``."""
    kth = torch.topk(s, k, dim=-1).values[..., -1:]  # [..., L] -> [..., 1]
    margin = slack(s.dtype)
    return kth - 2 * epsilon * Z_MAX * (1 + margin) - margin * kth.abs()


@dataclass(frozen=True)
class Candidates:
    """The candidate classes of the rows of an ``[n_rows, n_classes]`` score matrix, listed row by row: ``flat``, their
    flat index in that matrix; ``padded``, their flat index in ``[n_rows, width]``, where each row's candidates fill
    its first slots (``width``: the largest count of a row)."""

    flat: torch.Tensor
    padded: torch.Tensor
    width: int
    n_rows: int
    n_classes: int

    def columns(self) -> torch.Tensor:
        """``[n_rows, width]``: the class of each slot; 0 in the slots past a row's candidates."""
        columns = torch.zeros(self.n_rows * self.width, dtype=torch.long)
        return columns.index_copy_(0, self.padded, self.flat.remainder(self.n_classes)).view(self.n_rows, self.width)


def candidates(s: torch.Tensor, k: int, epsilon: float) -> Candidates | None:
    """The classes of each row of ``s`` (``[R, L]``) that can reach the ``k`` largest of ``s + eps Z``: those not below
    :func:`candidate_threshold` (every class of a row whose threshold is NaN, and a NaN score, are candidates).
    ``None`` where a row has more than half its classes as candidates, where pruning would not pay. Reads the counts
    on the host: for CPU scores (on CUDA the fused kernel prunes without a host read)."""
    n_rows, n_classes = s.shape
    is_candidate = torch.lt(s, candidate_threshold(s, k, epsilon)).logical_not_()  # [R, L]
    counts = is_candidate.sum(-1)  # [R]
    width = int(counts.max()) if n_rows else 0
    if 2 * width > n_classes:
        return None
    flat = is_candidate.view(-1).nonzero().squeeze(1)  # [n], row by row
    row_starts = counts.cumsum(0) - counts  # [R]: each row's first entry in the list
    rows = flat.div(n_classes, rounding_mode="floor")
    slots = torch.arange(flat.numel()) - row_starts.repeat_interleave(counts, output_size=flat.numel())
    return Candidates(flat=flat, padded=rows * width + slots, width=width, n_rows=n_rows, n_classes=n_classes)
