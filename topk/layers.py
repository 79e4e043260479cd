"""Layers used with the margin-based losses."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from topk._validation import check_int, check_real


class CosineClassifier(nn.Module):
    """Scores ``scale * cos(x, w_j)``: normalised features times normalised class weights.

    The normalised last layer used with LDAM (Cao et al., 2019) and with the noised imbalanced loss
    (Garcin et al., 2022, Section 4.5): scores are bounded by ``scale``, so per-class margins act on a
    fixed range. For those two losses keep ``scale=1`` and give the loss the scaling constant (their
    ``scale``): the margins and eps are then in cosine units, as in the papers.

    >>> head = CosineClassifier(16, 10, scale=30.0)
    >>> head(torch.randn(4, 16)).abs().max() <= 30.0
    tensor(True)
    """

    def __init__(self, in_features: int, num_classes: int, scale: float = 1.0):
        super().__init__()
        self.in_features = check_int(in_features, "in_features", 1)
        self.num_classes = check_int(num_classes, "num_classes", 1)
        self.scale = check_real(scale, "scale", low=0.0, strict=True)
        self.weight = nn.Parameter(torch.empty(num_classes, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # as nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"'x' should have {self.in_features} features on its last dimension, got shape {tuple(x.shape)}")
        return self.scale * F.linear(F.normalize(x, dim=-1), F.normalize(self.weight, dim=-1))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}, scale={self.scale}"
