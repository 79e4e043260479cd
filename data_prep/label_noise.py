"""Label noise within groups of classes (Garcin et al. 2022, Section 5.2): each training label, with probability ``p``,
redrawn uniformly among the classes of its group. It draws CIFAR-100's noise and its stand-in's, so it is training code
(``experiments.paths.TRAINING_CODE``): a change here makes the committed results stale."""

from __future__ import annotations

import torch


def label_noise_within_groups(labels: torch.Tensor, groups: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``labels`` where each one, with probability ``p``, is redrawn uniformly among the labels of its group (``groups``:
    each example's group, such as its superclass), fixed by ``seed``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the label-noise probability should be in [0, 1], got {p}")
    n_groups = int(groups.max()) + 1
    members = [torch.unique(labels[groups == g]) for g in range(n_groups)]  # the classes of each group
    generator = torch.Generator().manual_seed(seed)
    redraw = torch.rand(len(labels), generator=generator) < p
    choice = torch.rand(len(labels), generator=generator)
    noisy = labels.clone()
    for g, classes in enumerate(members):
        rows = redraw & (groups == g)
        noisy[rows] = classes[(choice[rows] * len(classes)).long().clamp_max(len(classes) - 1)]
    return noisy
