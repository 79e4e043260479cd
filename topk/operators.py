"""The top-K operators and their noise-smoothed versions.

Garcin, Servajean, Joly & Salmon, "Stochastic smoothing of the top-K calibrated hinge loss for deep
imbalanced classification", ICML 2022, Section 3.2; we follow its notation: ``top_K(s)`` is the K-th
largest entry of a score vector ``s`` of ``L`` classes and ``topSigma_K(s)`` the sum of its K largest.

The smoothed operators follow the perturbed optimizers of Berthet et al. (2020):
``topSigma_{K,eps}(s) = E[topSigma_K(s + eps Z)]`` with ``Z ~ N(0, Id_L)`` (Definition 3.2), estimated
with ``B`` Monte Carlo samples (Eq. 11), and ``top_{K,eps} = topSigma_{K,eps} - topSigma_{K-1,eps}``
(Definition 3.4). Their gradient is the pathwise estimator of Prop. 3.3, the mean over the samples of
the one-hot vectors of the selected coordinates.

All operators act on the last dimension and accept any leading batch shape. Ties are broken as
``torch.topk`` breaks them; values never depend on it. A NaN score makes the row's result NaN.

The public functions check their arguments once; :func:`exact_top` and :func:`monte_carlo_top` are the cores
the losses share, which check nothing. The Monte Carlo estimate runs on the custom operators of
:mod:`topk._ops` (PyTorch path or fused Triton kernel), so it reads nothing on the host and compiles as one graph.
"""

from __future__ import annotations

import torch

from topk import _ops
from topk._bounded_noise import bounded_normal
from topk._validation import (NOISED_TORCH_FASTER, check_generator, check_hyperparameter, check_int, check_noise,
                              check_scores, choose_backend)

__all__ = ["top_k", "top_sum_k", "smooth_top_k", "smooth_top_sum_k"]

#: Automatic chunking of the PyTorch path: at most this many perturbed scores are materialised at once (about 16 MB in
#: float32); a single sample is always allowed, so memory stays O(batch x L) however large L is.
CHUNK_ELEMENTS = 1 << 22


def top_k(s: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th largest score along the last dimension, ``top_K(s) = s_[K]``: one value per row, in the paper's
    notation. (Not :func:`torch.topk`, which returns the ``k`` largest scores and their indices.)

    Its gradient is the one-hot vector of the selected coordinate (``arg top_K(s)``).

    >>> top_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2)
    tensor(2.4000)
    """
    check_scores(s)
    return exact_top(s, check_int(k, "k", 1, s.shape[-1], " (the number of classes)"))


def top_sum_k(s: torch.Tensor, k: int) -> torch.Tensor:
    """The sum of the ``k`` largest scores, ``topSigma_K(s)``; gradient ``arg topSigma_K(s)`` (K ones).

    >>> top_sum_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2)
    tensor(5.)
    """
    check_scores(s)
    return exact_top(s, check_int(k, "k", 1, s.shape[-1], " (the number of classes)"), sum_top=True)


def exact_top(s: torch.Tensor, k: int, sum_top: bool = False) -> torch.Tensor:
    """``top_K(s)`` (``sum_top``: ``topSigma_K(s)``) of checked arguments; a row holding a NaN gives NaN."""
    values = torch.topk(s, k, dim=-1).values  # [..., L] -> [..., k]
    if sum_top:
        return values.sum(-1)
    return torch.where(torch.isnan(values[..., 0]), values[..., 0], values[..., k - 1])


def _samples_per_chunk(n_samples: int, s: torch.Tensor, samples_per_chunk: int | None) -> int:
    if samples_per_chunk is not None:
        return samples_per_chunk
    return max(1, min(n_samples, CHUNK_ELEMENTS // max(1, s.numel())))


def monte_carlo_top(s, k, epsilon, n_samples, *, generator=None, noise=None, samples_per_chunk=None, sum_top=False,
                    labels=None, backend="torch"):
    """The Monte Carlo mean over ``n_samples`` of ``top_k`` (``sum_top``: ``topSigma_k``) of ``s + eps Z_b`` (Eq. 11),
    minus ``s_y`` when ``labels`` are given; arguments already checked, ``backend`` already chosen.

    Without explicit ``noise``, the estimate draws the bounded noise of :mod:`topk._bounded_noise` and prunes exactly:
    on CPU the kernel of :mod:`topk._cpu_kernel`, on CUDA the Triton kernel, each from one seed drawn from
    ``generator`` on the scores' device, each drawing noise only where it can change the result. On CUDA the PyTorch
    path draws noise for every class, a chunk of samples at a time (memory ``O(samples_per_chunk x s.numel())``):
    sizing the candidates would read the device. Explicit ``noise`` is used as given, for every class. Nothing reads
    the device.
    """
    if backend == "triton":
        seed = None if noise is not None else _seed(generator, s)
        return _ops.call(_ops.fused_perturbed_top, s, seed, noise, k, epsilon, n_samples, labels)[0]
    if noise is None and s.device.type == "cpu":
        return _ops.call(_ops.pruned_perturbed_top, s, _seed(generator, s), k, epsilon, n_samples, sum_top, labels)[0]
    chunk = _samples_per_chunk(n_samples, s, samples_per_chunk)
    total = 0.0
    for start in range(0, n_samples, chunk):
        stop = min(start + chunk, n_samples)
        z = noise[start:stop] if noise is not None else bounded_normal(
            (stop - start, *s.shape), generator=generator, dtype=s.dtype, device=s.device)
        part = _ops.call(_ops.perturbed_top, s, z, k, epsilon, sum_top, labels)[0]
        if chunk >= n_samples:
            return part
        total = total + part * ((stop - start) / n_samples)
    return total


def _seed(generator: torch.Generator | None, s: torch.Tensor) -> torch.Tensor:
    """A one-element int64 seed drawn from ``generator`` (default: the device's) on ``s``'s device."""
    return torch.randint(0, 2**62, (1,), generator=generator, device=s.device)


def _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, sum_top, backend="torch"):
    check_scores(s)
    k = check_int(k, "k", 1, s.shape[-1], " (the number of classes)")
    epsilon = check_hyperparameter("epsilon", epsilon)
    n_samples = check_hyperparameter("n_samples", n_samples)
    generator = check_generator(generator, s)
    if noise is not None:
        check_noise(noise, n_samples, s)
    if samples_per_chunk is not None:
        check_int(samples_per_chunk, "samples_per_chunk", 1)
    backend = choose_backend(backend, s, k, epsilon, NOISED_TORCH_FASTER)
    if epsilon == 0.0 and backend == "torch":
        return exact_top(s, k, sum_top)
    return monte_carlo_top(s, k, epsilon, n_samples, generator=generator, noise=noise,
                           samples_per_chunk=samples_per_chunk, sum_top=sum_top, backend=backend)


def smooth_top_sum_k(
    s: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    samples_per_chunk: int | None = None,
) -> torch.Tensor:
    """Monte Carlo estimate of ``topSigma_{K,eps}(s) = E[topSigma_K(s + eps Z)]`` (Definition 3.2, Eq. 11).

    Args:
        s: scores, shape ``(..., L)``, any floating dtype, CPU or CUDA.
        k: the number of largest scores summed, ``1 <= k <= L``.
        epsilon: the noise scale, ``>= 0``; ``0`` gives the exact ``topSigma_K`` and its gradient.
        n_samples: ``B``, the number of noise samples, ``>= 1``.
        generator: where ``Z`` is drawn from when ``noise`` is not given (default: the global RNG).
        noise: the standard normal draws ``Z`` themselves, shape ``(n_samples, *s.shape)``, same dtype
            and device as ``s``; used as given.
        samples_per_chunk: how many samples the PyTorch path perturbs at once (explicit ``noise``, or CUDA
            scores on the PyTorch backend); by default as many as fit in ``CHUNK_ELEMENTS`` numbers, at least one
            (memory O(batch x L) for very large L). The CPU kernel stores nothing of size ``B x L`` and needs none.

    Returns:
        shape ``s.shape[:-1]``; its gradient is the mean over the samples of ``arg topSigma_K(s + eps Z_b)``
        (Prop. 3.3), whose rows sum to ``k``.

    >>> z = torch.tensor([[0.2, -0.1, 0.1, 0.3], [0.1, 0.1, -0.1, 0.1], [-0.1, -0.1, 0.1, -0.1]])
    >>> smooth_top_sum_k(torch.tensor([2.4, 2.6, 2.3, 0.5]), 2, 1.0, 3, noise=z)
    tensor(5.0667)
    """
    return _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, sum_top=True)


def smooth_top_k(
    s: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    samples_per_chunk: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Monte Carlo estimate of ``top_{K,eps}(s) = topSigma_{K,eps}(s) - topSigma_{K-1,eps}(s)`` (Definition 3.4).

    Both sums use the same noise, so the difference is exactly the mean over the samples of the
    ``k``-th largest perturbed score; it is computed that way, without the cancellation of a
    subtraction. The gradient is the mean of the one-hots ``arg top_K(s + eps Z_b)``: its rows sum to 1.
    Arguments as in :func:`smooth_top_sum_k`; ``|top_{K,eps}(s) - top_K(s)| <= eps K sqrt(2 log L)``
    (Prop. 3.5). ``backend``: ``"torch"``, ``"triton"`` (:mod:`topk.fused`, in-kernel noise seeded from
    ``generator``; ``samples_per_chunk`` does not apply) or ``"auto"`` (Triton for CUDA scores with
    ``epsilon > 0`` and ``k <= 128`` when it is installed, outside the sizes where PyTorch was measured faster:
    ``topk._validation.NOISED_TORCH_FASTER``).

    The worked example of Section 3.2 (L = 4, K = 2, B = 3, eps = 1):

    >>> z = torch.tensor([[0.2, -0.1, 0.1, 0.3], [0.1, 0.1, -0.1, 0.1], [-0.1, -0.1, 0.1, -0.1]])
    >>> s = torch.tensor([2.4, 2.6, 2.3, 0.5], requires_grad=True)
    >>> value = smooth_top_k(s, 2, 1.0, 3, noise=z); value.backward()
    >>> round(value.item(), 4), s.grad
    (2.4667, tensor([0.3333, 0.3333, 0.3333, 0.0000]))
    """
    return _smooth(s, k, epsilon, n_samples, generator, noise, samples_per_chunk, sum_top=False, backend=backend)
