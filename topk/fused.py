"""The fused Triton kernel of the perturbed K-th largest score (:mod:`topk._fused_kernel`) and its launchers: the noised
hinge losses' estimate on CUDA (Garcin et al., ICML 2022, Eq. 10-13).

For every row ``s`` of scores and noise sample ``b`` the kernel finds the K-th largest of ``s + eps Z_b`` and its
position (Eq. 11-12), reading each score once and storing nothing of size ``n_samples x L`` (the PyTorch path
materialises the perturbed scores and calls ``torch.topk``):

- the noise is drawn in the kernel by Philox from one seed (``tl.randn4x``: four normals per counter), never stored;
  explicit ``noise`` can be given instead, to test the kernel exactly against the PyTorch path (``s + eps z`` is
  rounded twice, product then sum, as PyTorch rounds it: the kernel is compiled without fused multiply-adds);
- each program streams its rows tile by tile and keeps, per sample, the K largest values so far; a value enters only
  if it beats the current K-th largest, at most K per tile, so nothing is sorted (one reduction tells whether any value
  of a tile enters, and each insertion is one reduction over the tile and one over the K);
- long rows are cut in chunks handled by separate programs, whose K candidates are merged on the host;
- exact pruning (in-kernel noise only): that noise is bounded by ``Z_MAX`` (:mod:`topk._bounded_noise`), so a tile
  whose largest score plus ``eps Z_MAX`` is below every sample's current K-th largest, or below the row's hard K-th
  largest minus ``eps Z_MAX``, cannot change the result and draws no noise: the less work, the more scores lie far
  below the top.

The gradient, ``grad / B`` at the positions (Prop. 3.3) and ``-grad`` at the label (Eq. 12), is written by a second
kernel in one launch, zeros included (:func:`kth_gradient`). The losses reach both through the operators
``topk::fused_perturbed_top`` and ``topk::fused_perturbed_top_backward`` (:mod:`topk._ops`). Triton is optional
(:func:`available`); on a CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set before the first
call), as their tests do without a GPU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from topk._bounded_noise import PRUNE_SLACK, Z_MAX
from topk._triton_support import MAX_K, available
from topk._validation import check_bool, check_int, check_noise, check_real, check_scores, choose_backend

__all__ = ["available", "perturbed_kth_largest", "kth_gradient", "MAX_K", "Z_MAX"]


#: Perturbed values in one tile of one program (samples x classes, four quarters of classes), a power of two, and
#: the warps of a program: 16 values per thread, which fit in MAX_REGISTERS registers without spilling
#: (``python -m benchmarks.kernel_resources`` checks the compiled kernels).
TILE_ELEMENTS = 2048
NUM_WARPS = 4
#: ``maxnreg`` of the compiled kernel: the hardware's limit per thread, so that ptxas never trades spills for occupancy.
MAX_REGISTERS = 255
#: Noise samples handled by one program; more samples are spread over programs (which re-read the scores).
MAX_BLOCK_SAMPLES = 8
#: At most this many (sample, slot) entries in the buffer of the K largest: 4 per thread.
BUFFER_ELEMENTS = 512
#: Chunks are not made shorter than this many classes: below it the merge would cost more than it saves.
MIN_CHUNK = 2048


@functools.cache
def _kernel():
    """The jitted kernel, imported on first use: Triton is optional, and reads ``TRITON_INTERPRET`` when imported."""
    from topk._fused_kernel import perturbed_kth_largest

    return perturbed_kth_largest


@functools.cache
def _gradient_kernel():
    """The jitted gradient kernel, imported on first use (as :func:`_kernel`)."""
    from topk._fused_kernel import kth_gradient

    return kth_gradient


@dataclass(frozen=True)
class LaunchPlan:
    """How the work is split: tiles of ``block_samples x block_classes``, rows cut into ``n_chunks`` chunks."""

    block_samples: int
    block_classes: int
    block_k: int
    n_chunks: int
    chunk_length: int
    num_warps: int


def launch_plan(n_rows: int, n_classes: int, n_samples: int, k: int, dtype: torch.dtype, device: torch.device,
                n_chunks: int | None = None) -> LaunchPlan:
    """Tile sizes from ``n_samples`` and ``k``; chunks so that about 4 programs per multiprocessor run."""
    block_k = max(2, _next_power_of_2(k))
    block_samples = min(_next_power_of_2(n_samples), MAX_BLOCK_SAMPLES, max(1, BUFFER_ELEMENTS // block_k))
    tile = TILE_ELEMENTS // 2 if dtype == torch.float64 else TILE_ELEMENTS  # float64 takes two registers
    block_classes = max(16, tile // block_samples)
    if n_chunks is None:
        programs = n_rows * math.ceil(n_samples / block_samples)
        wanted = 4 * _multiprocessors(device) if device.type == "cuda" else 1
        n_chunks = max(1, min(math.ceil(wanted / programs), n_classes // MIN_CHUNK))
    # chunks start at multiples of the tile, so that the tiles' Philox counters never overlap
    chunk_length = math.ceil(math.ceil(n_classes / n_chunks) / block_classes) * block_classes
    if chunk_length < k and n_chunks > 1:
        raise ValueError(f"'n_chunks' = {n_chunks} leaves chunks of {chunk_length} classes, fewer than k = {k}")
    return LaunchPlan(block_samples, block_classes, block_k, math.ceil(n_classes / chunk_length), chunk_length,
                      NUM_WARPS)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def compile_options(plan: LaunchPlan) -> dict[str, object]:
    """Triton's compile options for a launch: ``s + eps z`` rounded twice, as PyTorch does (no fused multiply-add),
    and the register bound."""
    return {"num_warps": plan.num_warps, "enable_fp_fusion": False, "maxnreg": MAX_REGISTERS}


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def perturbed_kth_largest(
    s: torch.Tensor,
    k: int,
    epsilon: float,
    n_samples: int,
    *,
    seed: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    n_chunks: int | None = None,
    prune: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k``-th largest of ``s + epsilon Z_b`` and its position, for each row of ``s`` and each sample ``b``.

    Args:
        s: scores of shape ``(rows, L)``, on CUDA (or on a CPU under ``TRITON_INTERPRET=1``, any floating dtype but
            bfloat16 there: the interpreter computes bfloat16 on its raw bits).
        k: ``1 <= k <= min(L, MAX_K)``.
        epsilon: the noise scale, ``>= 0`` (0: the hard K-th largest).
        n_samples: ``B >= 1``.
        seed: a one-element int64 tensor on ``s``'s device, the Philox seed of the in-kernel noise.
        noise: instead of ``seed``, the standard normal draws themselves, shape ``(n_samples, rows, L)``, in ``s``'s
            dtype.
        n_chunks: how many programs share one row, ``>= 1`` (default: from :func:`launch_plan`).
        prune: skip the tiles that cannot reach the top (exact; in-kernel noise only, see the module's docstring).

    Returns:
        ``(values, positions)``, both of shape ``(n_samples, rows)``: float32 (float64 for float64 scores) and
        int32. A row holding a NaN gets NaN values.
    """
    if (seed is None) == (noise is None):
        raise ValueError("give exactly one of 'seed' (in-kernel noise) and 'noise' (explicit draws)")
    s = check_scores(s)
    if s.dim() != 2:
        raise ValueError(f"'s' should have shape (rows, L), got shape {tuple(s.shape)}")
    k = check_int(k, "k", 1, min(s.shape[-1], MAX_K), " for the fused kernel")
    epsilon = check_real(epsilon, "epsilon", low=0.0)
    n_samples = check_int(n_samples, "n_samples", 1)
    if seed is not None:
        _check_seed(seed, s)
    else:
        check_noise(noise, n_samples, s)
    if n_chunks is not None:
        n_chunks = check_int(n_chunks, "n_chunks", 1)
    check_bool(prune, "prune")
    choose_backend("triton", s, k, epsilon)  # refuses a device, dtype or interpreter the kernel cannot run on
    return launch_kth_largest(s, k, epsilon, n_samples, seed, noise, n_chunks, prune)


def _check_seed(seed: object, s: torch.Tensor) -> None:
    if not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.numel() != 1:
        got = f"dtype {seed.dtype}, {seed.numel()} elements" if isinstance(seed, torch.Tensor) else type(seed).__name__
        raise TypeError(f"'seed' should be a one-element int64 tensor, got {got}")
    if seed.device != s.device:
        raise ValueError(f"'seed' is on {seed.device} but the scores are on {s.device}")


def launch_kth_largest(s: torch.Tensor, k: int, epsilon: float, n_samples: int, seed: torch.Tensor | None,
                       noise: torch.Tensor | None, n_chunks: int | None,
                       prune: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`perturbed_kth_largest` on arguments already checked, checking none (the operators' computation calls it:
    the losses check their arguments once, at the public call)."""
    n_rows, n_classes = s.shape
    if s.stride(-1) != 1:
        s = s.contiguous()
    accumulate = torch.float64 if s.dtype == torch.float64 else torch.float32
    plan = launch_plan(n_rows, n_classes, n_samples, k, s.dtype, s.device, n_chunks)
    final = plan.n_chunks == 1
    width = 1 if final else plan.n_chunks * k
    values = torch.empty((n_samples, n_rows, width), dtype=accumulate, device=s.device)
    positions = torch.empty((n_samples, n_rows, width), dtype=torch.int32, device=s.device)
    grid = (n_rows, plan.n_chunks, math.ceil(n_samples / plan.block_samples))
    # a computed s + eps z is at most tile_max + eps Z_MAX (1 + 2u) + u |tile_max| (u: unit roundoff, <= 2^-24)
    reach = epsilon * Z_MAX * (1 + PRUNE_SLACK)
    pruned = prune and noise is None
    # the hard K-th largest of each row, on the device (read in place, column k - 1 of torch.topk's values): from
    # the first tile on, a tile entirely below it minus 2 eps Z_MAX gets no noise
    floor = torch.topk(s, k, dim=-1).values[:, k - 1] if pruned else s
    _kernel()[grid](
        s, noise.contiguous() if noise is not None else s, seed if seed is not None else positions,
        floor, values, positions, epsilon,  # epsilon reaches the kernel as a float64 scalar
        n_rows, n_classes, n_samples, s.stride(0), floor.stride(0), plan.chunk_length, plan.n_chunks, reach,
        PRUNE_SLACK, K=k, HAS_NOISE=noise is not None, FINAL=final, PRUNE=pruned,
        BLOCK_B=plan.block_samples, BLOCK_L=plan.block_classes, BLOCK_K=plan.block_k, **compile_options(plan),
    )
    if final:
        return values.squeeze(-1), positions.squeeze(-1)
    top, slot = torch.topk(values, k, dim=-1)  # merge the chunks' candidates: [B, rows, n_chunks * k] -> [B, rows, k]
    return top[..., -1], positions.gather(-1, slot[..., -1:]).squeeze(-1)


#: Classes per program of the gradient's kernel, and at most this many samples per block of its positions' check.
GRADIENT_BLOCK_L = 1024
GRADIENT_BLOCK_B = 64
#: Triton's compile options for the gradient's kernel (its launch and ``python -m benchmarks.kernel_resources``).
GRADIENT_COMPILE_OPTIONS = {"num_warps": NUM_WARPS}


def gradient_block_samples(n_samples: int) -> int:
    """Samples per block of the gradient kernel's positions' check."""
    return min(GRADIENT_BLOCK_B, _next_power_of_2(n_samples))


def kth_gradient(grad: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor | None,
                 n_classes: int) -> torch.Tensor:
    """The gradient of the kernel's estimate, one launch: ``grad / B`` added at each of the ``B`` positions of a row
    (Prop. 3.3) and, with ``labels``, ``-grad`` at the label (Eq. 12).

    Args:
        grad: the gradient of the estimate, shape ``(rows,)``, in the scores' dtype.
        positions: int32 of shape ``(B, rows)``, as :func:`perturbed_kth_largest` returns them.
        labels: int64 of shape ``(rows,)``, or None.
        n_classes: ``L``.

    Returns:
        ``(rows, L)`` in ``grad``'s dtype: the same numbers, bit for bit, as the PyTorch path's scatter.
    """
    n_samples, n_rows = positions.shape
    weight = grad / n_samples  # divided as the PyTorch path divides it
    out = torch.empty((n_rows, n_classes), dtype=grad.dtype, device=grad.device)
    grid = (n_rows, math.ceil(n_classes / GRADIENT_BLOCK_L))
    _gradient_kernel()[grid](
        weight, grad, grad.stride(0), positions.contiguous(), labels.contiguous() if labels is not None else positions, out,
        n_rows, n_classes, n_samples, HAS_LABELS=labels is not None,
        BLOCK_B=gradient_block_samples(n_samples), BLOCK_L=GRADIENT_BLOCK_L, **GRADIENT_COMPILE_OPTIONS,
    )
    return out
