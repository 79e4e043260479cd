"""Why DDP processes must not share the noised losses' noise: the variance of the noised hinge's gradient (summed over
each process's batch, averaged over the processes, as DDP averages) when every process draws from the same seed,
against independent seeds (:func:`experiments.engine.train.reseed_process`). Printed as a ratio, per logit scale.

    python -m benchmarks.bench_ddp_noise [--processes 8] [--repeats 200]
"""

from __future__ import annotations

import argparse

import torch

from topk.losses import noised_hinge

K, EPSILON, N_SAMPLES, CLASSES, BATCH = 5, 0.2, 10, 100, 32


def process_gradient(scores: torch.Tensor, labels: torch.Tensor, seed: int) -> torch.Tensor:
    """One process's gradient of the summed loss with respect to its scores, summed over its batch: [L]."""
    scores = scores.clone().requires_grad_(True)
    torch.manual_seed(seed)
    noised_hinge(scores, labels, k=K, epsilon=EPSILON, n_samples=N_SAMPLES).backward()
    return scores.grad.sum(0)


def variance_ratio(scale: float, processes: int, repeats: int) -> float:
    """Total variance of the processes' mean gradient, shared seeds / independent seeds, at logits ``scale`` N(0, 1)."""
    data = torch.Generator().manual_seed(0)
    batches = [(scale * torch.randn(BATCH, CLASSES, generator=data),
                torch.randint(0, CLASSES, (BATCH,), generator=data)) for _ in range(processes)]

    def mean_gradient(seeds: list[int]) -> torch.Tensor:
        return sum(process_gradient(s, y, seed) for (s, y), seed in zip(batches, seeds)) / processes

    shared = torch.stack([mean_gradient([i] * processes) for i in range(repeats)])
    independent = torch.stack([mean_gradient([10_000 + processes * i + r for r in range(processes)])
                               for i in range(repeats)])
    return float(shared.var(0).sum() / independent.var(0).sum())


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    for scale in (0.05, 1.0, 5.0):
        ratio = variance_ratio(scale, args.processes, args.repeats)
        print(f"{args.processes} processes, logits {scale:g} x N(0, 1), K {K}, eps {EPSILON}, B {N_SAMPLES}, "
              f"batch {BATCH} x L {CLASSES}: variance with shared noise / independent x{ratio:.2f}")


if __name__ == "__main__":
    main()
