"""Slow, obviously correct references the fast code is tested against.

- :func:`loop_smooth_top`: the Monte Carlo estimators of Eq. 11 / Definition 3.4 and their gradient
  (Prop. 3.3), by Python loops over rows and samples, sorting lists of float64 numbers.
- :class:`ExactPerturbedRanks`: the exact law of the ranks of ``s + eps Z`` for a small vector ``s``,
  by 1-d quadrature. The K-th largest of independent normals ``X_j = s_j + eps Z_j`` is ``X_j`` exactly
  when K - 1 of the others exceed it, so ``P(X_j has rank r) = int f_j(x) P(r - 1 others exceed x) dx``,
  the second factor a Poisson-binomial probability computed by dynamic programming. This gives
  ``E[top_K(s + eps Z)]`` and its gradient ``P(j has rank K)`` without Monte Carlo error.
- :func:`kth_largest_cdf`: the exact distribution function of the K-th largest of ``s + eps Z``, by the same
  Poisson-binomial dynamic programming (for one-sample tests of a sampler's law).
- :func:`enumerated_smooth_hinge`: Berrada et al.'s smoothed hinge by enumerating every k-subset.
"""

from __future__ import annotations

import itertools
import math

import torch


def loop_smooth_top(s: torch.Tensor, k: int, epsilon: float, noise: torch.Tensor, kth_only: bool):
    """Value and gradient (of the sum of the values) of the estimator, rows ``s[..., :]``, in float64."""
    rows = s.detach().double().reshape(-1, s.shape[-1]).tolist()
    draws = noise.detach().double().reshape(noise.shape[0], -1, s.shape[-1])
    values, grads = [], []
    for row_index, row in enumerate(rows):
        total, grad = 0.0, [0.0] * len(row)
        for sample in range(draws.shape[0]):
            z = draws[sample, row_index].tolist()
            perturbed = [row[j] + epsilon * z[j] for j in range(len(row))]
            order = sorted(range(len(row)), key=lambda j: -perturbed[j])
            chosen = [order[k - 1]] if kth_only else order[:k]
            total += sum(perturbed[j] for j in chosen)
            for j in chosen:
                grad[j] += 1.0 / draws.shape[0]
        values.append(total / draws.shape[0])
        grads.append(grad)
    shape = s.shape[:-1]
    return torch.tensor(values, dtype=torch.float64).reshape(shape), torch.tensor(grads, dtype=torch.float64).reshape(s.shape)


class ExactPerturbedRanks:
    """Exact rank probabilities and expectations for ``s + eps Z``, ``s`` a 1-d float64 tensor (small L)."""

    def __init__(self, s: torch.Tensor, epsilon: float, n_grid: int = 20001):
        self.s = s.double()
        self.epsilon = float(epsilon)
        n_classes = self.s.numel()
        low = float(self.s.min()) - 12 * self.epsilon
        high = float(self.s.max()) + 12 * self.epsilon
        x = torch.linspace(low, high, n_grid, dtype=torch.float64)  # n_grid odd: Simpson's rule
        step = (high - low) / (n_grid - 1)
        simpson = torch.ones(n_grid, dtype=torch.float64)
        simpson[1:-1:2], simpson[2:-1:2] = 4.0, 2.0
        weights = simpson * step / 3
        standardised = (x.unsqueeze(0) - self.s.unsqueeze(1)) / self.epsilon  # [L, grid]
        density = torch.exp(-0.5 * standardised**2) / (self.epsilon * math.sqrt(2 * math.pi))
        exceed = torch.special.ndtr(-standardised)  # P(X_i > x)
        # rank[j, r] = P(X_j is the (r+1)-th largest); value[j, r] = E[X_j 1{rank r+1}]
        rank = torch.zeros(n_classes, n_classes, dtype=torch.float64)
        value = torch.zeros(n_classes, n_classes, dtype=torch.float64)
        for j in range(n_classes):
            count = torch.zeros(n_classes, n_grid, dtype=torch.float64)  # P(c others exceed x)
            count[0] = 1.0
            for i in range(n_classes):
                if i != j:
                    one_more = torch.cat([torch.zeros_like(count[:1]), count[:-1]])  # c - 1 others exceeded
                    count = count * (1 - exceed[i]) + one_more * exceed[i]
            rank[j] = (count * density[j] * weights).sum(1)
            value[j] = (count * density[j] * x * weights).sum(1)
        self.rank_probabilities = rank
        self._rank_values = value

    def top_k(self, k: int) -> float:
        """``E[top_K(s + eps Z)]``."""
        return float(self._rank_values[:, k - 1].sum())

    def top_sum_k(self, k: int) -> float:
        """``E[topSigma_K(s + eps Z)]``."""
        return float(self._rank_values[:, :k].sum())

    def grad_top_k(self, k: int) -> torch.Tensor:
        """``grad E[top_K(s + eps Z)] = E[arg top_K(s + eps Z)]`` (Prop. 3.3 applied to Definition 3.4)."""
        return self.rank_probabilities[:, k - 1].clone()

    def grad_top_sum_k(self, k: int) -> torch.Tensor:
        """``E[arg topSigma_K(s + eps Z)]``, the gradient formula of Prop. 3.3."""
        return self.rank_probabilities[:, :k].sum(1)


def kth_largest_cdf(s: torch.Tensor, k: int, epsilon: float, x: torch.Tensor) -> torch.Tensor:
    """``P(top_K(s + eps Z) <= x)`` at each point of ``x``, ``s`` a 1-d float64 tensor, ``Z`` standard normal: the
    K-th largest is at most ``x`` exactly when fewer than K of the ``X_j = s_j + eps Z_j`` exceed ``x``, a Poisson-binomial
    count (kept up to K, the last slot meaning "K or more")."""
    x = x.double().reshape(-1)
    exceed = torch.special.ndtr((s.double()[None, :] - x[:, None]) / epsilon)  # [points, L]: P(X_j > x)
    count = torch.zeros(x.numel(), k + 1, dtype=torch.float64)
    count[:, 0] = 1.0
    for j in range(exceed.shape[1]):
        p = exceed[:, j:j + 1]
        one_more = torch.cat([torch.zeros_like(count[:, :1]), count[:, :-1]], dim=1)
        count = torch.cat([count[:, :k] * (1 - p) + one_more[:, :k] * p, count[:, k:] + count[:, k - 1:k] * p], dim=1)
    return 1 - count[:, k]


def enumerated_smooth_hinge(s: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """Berrada et al. (2018) Eq. 10, literally: both log-sum-exps run over every k-subset A of the classes.

    ``tau ln sum_A exp((alpha 1{y not in A} + mean_A s) / tau) - tau ln sum_{A containing y} exp(mean_A s / tau)``,
    rows of ``s`` of shape (N, L) with small L; differentiable (use float64).
    """
    n_classes = s.shape[-1]
    subsets = torch.tensor(list(itertools.combinations(range(n_classes), k)), device=s.device)  # [C, k]
    member = torch.zeros(len(subsets), n_classes, dtype=s.dtype, device=s.device).scatter_(1, subsets, 1.0)  # [C, L]
    means = s @ member.T / k  # [N, C]
    contains_y = member[:, y].T.bool()  # [N, C]
    every = tau * torch.logsumexp((alpha * ~contains_y + means) / tau, dim=-1)
    with_y = tau * torch.logsumexp(torch.where(contains_y, means / tau, float("-inf")), dim=-1)
    return every - with_y


def linear_space_elementary_symmetric(e: torch.Tensor, k: int) -> torch.Tensor:
    """``sigma_0..sigma_k(e)`` by the textbook recursion ``sigma_j <- sigma_j + e_i sigma_{j-1}``, in linear space
    (the "summation algorithm" of Berrada et al.'s Table 5): overflows when ``e`` is large."""
    sigma = [torch.ones_like(e[..., 0])] + [torch.zeros_like(e[..., 0]) for _ in range(k)]
    for i in range(e.shape[-1]):
        for j in range(k, 0, -1):
            sigma[j] = sigma[j] + e[..., i] * sigma[j - 1]
    return torch.stack(sigma, dim=-1)
