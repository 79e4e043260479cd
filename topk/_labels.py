"""The true class's score and one-hot in each row of scores: the ``s_y`` and ``e_y`` of the hinge losses (Eq. 10,
12, 13) and of the losses of Table 1."""

import torch
from torch import Tensor


def true_scores(s: Tensor, y: Tensor) -> Tensor:
    """``s_y`` of each row: ``[..., L] -> [...]``."""
    return s.gather(-1, y.unsqueeze(-1)).squeeze(-1)


def is_true(s: Tensor, y: Tensor) -> Tensor:
    """The boolean one-hot of ``y``, shape ``s.shape`` (``F.one_hot`` would read the labels' range on the host)."""
    return torch.arange(s.shape[-1], device=s.device) == y.unsqueeze(-1)
