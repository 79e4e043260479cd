"""The paper's analytic items, computed with the library: the level sets of the losses on the simplex (Figs. 1, 4, 5
and 6), the worked example of Section 3.2, and the bound of Prop. 3.5 measured by Monte Carlo.

Level sets follow the paper's figures: L = 3 classes, scores on 2 * Delta_3 = {s >= 0, s_1 + s_2 + s_3 = 2}, every
loss rescaled to [0, 1] by its minimum and maximum there, margins equal to 1. Where the figures' printed parameters
are lost in the text of the paper, the values used here are in the panel titles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

import topk
from topk.losses import functional as losses

SIMPLEX_SCALE = 2.0


def simplex_grid(points: int) -> torch.Tensor:
    """Every s in 2 * Delta_3 whose coordinates are multiples of 2 / ``points``: shape ``[(points+1)(points+2)/2, 3]``."""
    rows = [(i, j, points - i - j) for i in range(points + 1) for j in range(points + 1 - i)]
    return SIMPLEX_SCALE * torch.tensor(rows, dtype=torch.float64) / points


def to_plane(s: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Planar coordinates of simplex points, the class ``top`` at the upper corner (the true class in the figures)."""
    others = [c for c in range(3) if c != top]
    corners = {others[0]: (0.0, 0.0), others[1]: (1.0, 0.0), top: (0.5, math.sqrt(3) / 2)}
    weights = s / SIMPLEX_SCALE
    x = sum(weights[:, c] * corners[c][0] for c in range(3))
    y = sum(weights[:, c] * corners[c][1] for c in range(3))
    return x, y


@dataclass(frozen=True)
class Panel:
    """One level-set panel: a title and the loss ``s -> loss(s, y)`` as a function of a batch of scores."""

    title: str
    loss: object  # Callable[[Tensor [N, 3], Tensor [N]], Tensor [N]]
    noised: bool = False  #: Monte Carlo: averaged over ``replications`` noise draws where asked
    options: dict = field(default_factory=dict)


def _noised(k, epsilon, n_samples, margin=1.0):
    """The noised loss with one draw of B noise vectors shared by every point of the grid (common random numbers),
    so that a panel shows the loss a training step would see, not independent noise at each point."""
    def loss(s, y, generator):
        shared = torch.randn(n_samples, 1, s.shape[-1], generator=generator, dtype=s.dtype)
        return losses.noised_hinge(s, y, k, epsilon, n_samples, margins=margin, noise=shared.expand(-1, len(s), -1),
                                   reduction="none")
    return loss


def figure_1_panels(k: int) -> list[Panel]:
    """The ten panels of Fig. 1 (K = 2) or Fig. 6 (K = 1)."""
    none = {"reduction": "none"}
    return [
        Panel(f"(a) top-{k} 0/1\n", lambda s, y: losses.zero_one_topk(s, y, k, **none)),
        Panel("(b) cross-entropy\n", lambda s, y: losses.cross_entropy(s, y, **none)),
        Panel(f"(c) hinge top-{k}\n(Lapin et al.)", lambda s, y: losses.lapin_hinge(s, y, k, **none)),
        Panel(f"(d) calibrated hinge\ntop-{k}", lambda s, y: losses.calibrated_hinge(s, y, k, **none)),
        Panel(f"(e) convexified hinge\ntop-{k}", lambda s, y: losses.convex_hinge(s, y, k, **none)),
        Panel("(f) smoothed hinge\nτ = 0.1", lambda s, y: losses.smooth_hinge(s, y, k, 0.1, **none)),
        Panel("(g) smoothed hinge\nτ = 1", lambda s, y: losses.smooth_hinge(s, y, k, 1.0, **none)),
        Panel("(h) noised bal.\nε = 0.1, B = 10", _noised(k, 0.1, 10), noised=True),
        Panel("(i) noised bal.\nε = 0.5, B = 10", _noised(k, 0.5, 10), noised=True),
        Panel("(j) noised imbal.\nε = 0.5, B = 10, m_y = 1.5", _noised(k, 0.5, 10, 1.5), noised=True),
    ]


def noise_parameter_panels(k: int, parameter: str) -> list[Panel]:
    """Fig. 4 (``parameter="B"``: eps = 1, B in {1, 3, 10, 50}) or Fig. 5 (``"epsilon"``: B = 50,
    eps in {0.1, 0.5, 1, 2}); one draw of the B noise vectors each, as the figures show the Monte Carlo estimate."""
    if parameter == "B":
        return [Panel(f"K = {k}\nε = 1, B = {b}", _noised(k, 1.0, b), noised=True) for b in (1, 3, 10, 50)]
    if parameter == "epsilon":
        return [Panel(f"K = {k}\nε = {e:g}, B = 50", _noised(k, e, 50), noised=True) for e in (0.1, 0.5, 1.0, 2.0)]
    raise ValueError(f"'parameter' should be 'B' or 'epsilon', got {parameter!r}")


def level_set_values(panel: Panel, points: int, true_class: int, *, replications: int = 1,
                     seed: int = 0) -> torch.Tensor:
    """The panel's loss on :func:`simplex_grid`, averaged over ``replications`` noise draws (noised losses), then
    rescaled to [0, 1] by its minimum and maximum over the grid (a constant loss gives zeros)."""
    s = simplex_grid(points)
    y = torch.full((len(s),), true_class, dtype=torch.long)
    if panel.noised:
        generator = torch.Generator().manual_seed(seed)
        values = torch.stack([panel.loss(s, y, generator) for _ in range(replications)]).mean(0)
    else:
        values = panel.loss(s, y)
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if high > low else torch.zeros_like(values)


def worked_example(example: dict) -> dict:
    """Section 3.2: the smoothed top-K of the example's scores with its three noise vectors, and its gradient."""
    s = torch.tensor(example["s"], dtype=torch.float64, requires_grad=True)
    noise = torch.tensor(example["noise"], dtype=torch.float64)
    value = topk.smooth_top_k(s, example["k"], example["epsilon"], len(noise), noise=noise)
    (gradient,) = torch.autograd.grad(value, s)
    return {"smoothed_top_k": value.item(), "gradient": gradient.tolist(),
            "perturbed": (s.detach() + example["epsilon"] * noise).tolist()}


def approximation_gaps(ks, ls, epsilons, n_samples: int, *, n_vectors: int = 8, seed: int = 0) -> pd.DataFrame:
    """Prop. 3.5 measured: for each (K, L, eps), the largest Monte Carlo estimate of |top_{K,eps}(s) - top_K(s)| over
    ``n_vectors`` score vectors (standard normal ones and the all-tied s = 0, where smoothing moves top_K most), its
    standard error, and the bound eps K sqrt(2 log L)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for n_classes in ls:
        scores = torch.randn(n_vectors, n_classes, generator=generator, dtype=torch.float64)
        scores[0] = 0.0
        for k in ks:
            if k > n_classes:
                continue
            for epsilon in epsilons:
                noise = torch.randn(n_samples, n_vectors, n_classes, generator=generator, dtype=torch.float64)
                gaps = (topk.smooth_top_k(scores, k, epsilon, n_samples, noise=noise) - topk.top_k(scores, k)).abs()
                worst = int(gaps.argmax())
                # [B, L] -> [B]: the K-th largest perturbed score of each sample, for the standard error
                per_sample = torch.topk(scores[worst] + epsilon * noise[:, worst], k, dim=-1).values[:, -1]
                rows.append({"K": k, "L": n_classes, "epsilon": epsilon, "observed": gaps[worst].item(),
                             "standard_error": (per_sample.std() / math.sqrt(n_samples)).item(),
                             "bound": epsilon * k * math.sqrt(2 * math.log(n_classes))})
    return pd.DataFrame(rows)
