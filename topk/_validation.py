"""Argument checks shared by the public functions.

Every check runs before any computation and raises a ``TypeError`` (wrong kind of object) or a
``ValueError`` (right kind, bad value) whose message names the argument, shows the bad value and says
what was expected.
"""

from __future__ import annotations

import math
import numbers
import os

import torch

REDUCTIONS = ("mean", "sum", "none")


def check_scores(s: object, name: str = "s") -> torch.Tensor:
    """Scores: a floating tensor with at least one dimension (classes on the last one)."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"'{name}' should be a torch.Tensor of scores, got {type(s).__name__}")
    if not s.is_floating_point():
        raise TypeError(f"'{name}' should be a floating-point tensor, got dtype {s.dtype}")
    if s.dim() < 1 or s.shape[-1] < 1:
        raise ValueError(f"'{name}' should have shape (..., L) with L >= 1 classes, got shape {tuple(s.shape)}")
    return s


def check_int(value: object, name: str, low: int, high: int | None = None, what: str = "") -> int:
    """An integer (a bool is not one) with ``low <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"'{name}' should be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"'{name}' should be {bound}{what}, got {value}")
    return value


def check_real(value: object, name: str, low: float | None = None, strict: bool = False) -> float:
    """A finite real number, optionally ``> low`` (strict) or ``>= low``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"'{name}' should be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"'{name}' should be finite, got {value}")
    if low is not None and (value <= low if strict else value < low):
        raise ValueError(f"'{name}' should be {'>' if strict else '>='} {low}, got {value}")
    return value


def check_labels(y: object, s: torch.Tensor, name: str = "y") -> torch.Tensor:
    """Integer labels of shape ``s.shape[:-1]`` in ``[0, L)`` on ``s``'s device; returned as int64."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"'{name}' should be a torch.Tensor of class indices, got {type(y).__name__}")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"'{name}' should be an integer tensor of class indices, got dtype {y.dtype}")
    if y.shape != s.shape[:-1]:
        raise ValueError(
            f"'{name}' should have shape {tuple(s.shape[:-1])} (the scores' shape without the class dimension), "
            f"got {tuple(y.shape)}"
        )
    if y.device != s.device:
        raise ValueError(f"'{name}' is on {y.device} but the scores are on {s.device}")
    n_classes = s.shape[-1]
    if y.numel() > 0:
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= n_classes:
            bad = low if low < 0 else high
            raise ValueError(f"'{name}' should hold class indices in [0, {n_classes - 1}], got {bad}")
    return y.long()


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"'{name}' should be one of {choices}, got {value!r}")
    return value  # type: ignore[return-value]


def check_reduction(reduction: object) -> str:
    return check_choice(reduction, "reduction", REDUCTIONS)


def check_noise(noise: object, n_samples: int, s: torch.Tensor) -> torch.Tensor:
    """Standard normal draws of shape ``(n_samples, *s.shape)``, same dtype and device as ``s``."""
    if not isinstance(noise, torch.Tensor):
        raise TypeError(f"'noise' should be a torch.Tensor or None, got {type(noise).__name__}")
    expected = (n_samples, *s.shape)
    if tuple(noise.shape) != expected:
        raise ValueError(f"'noise' should have shape (n_samples, *s.shape) = {expected}, got {tuple(noise.shape)}")
    if noise.dtype != s.dtype:
        raise TypeError(f"'noise' should have the scores' dtype {s.dtype}, got {noise.dtype}")
    if noise.device != s.device:
        raise ValueError(f"'noise' is on {noise.device} but the scores are on {s.device}")
    return noise


def check_generator(generator: object, s: torch.Tensor) -> torch.Generator | None:
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"'generator' should be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != s.device.type:
        raise ValueError(f"'generator' is on {generator.device} but the scores are on {s.device}")
    return generator


def check_margins(margins: object, s: torch.Tensor) -> float | torch.Tensor:
    """A finite scalar margin, or one finite margin per class: a tensor of shape (L,) on ``s``'s device."""
    if not isinstance(margins, torch.Tensor) or margins.dim() == 0:
        return check_real(margins, "margins")
    n_classes = s.shape[-1]
    if margins.shape != (n_classes,):
        raise ValueError(f"'margins' should be a scalar or have shape ({n_classes},) (one per class), "
                         f"got {tuple(margins.shape)}")
    if not margins.is_floating_point():
        raise TypeError(f"'margins' should be a floating-point tensor, got dtype {margins.dtype}")
    if margins.device != s.device:
        raise ValueError(f"'margins' is on {margins.device} but the scores are on {s.device}")
    if not bool(torch.isfinite(margins).all()):
        raise ValueError(f"'margins' should be finite, got {margins.tolist()}")
    return margins


BACKENDS = ("auto", "torch", "triton")


def check_backend(backend: object, s: torch.Tensor, rank: int) -> str:
    """``"auto"``, ``"torch"`` or ``"triton"``; Triton needs the package, CUDA scores (or its interpreter,
    ``TRITON_INTERPRET=1``) and a selected rank (``k`` of the operator, ``k + 1`` of the loss) of at most
    ``topk.fused.MAX_K``."""
    if check_choice(backend, "backend", BACKENDS) != "triton":
        return backend
    from topk import fused

    if not fused.available():
        raise ValueError("backend='triton' needs the triton package (pip install triton), which is not installed")
    if not s.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend='triton' needs CUDA scores, got scores on {s.device} "
                         "(set TRITON_INTERPRET=1 to run the kernel in Triton's interpreter)")
    if rank > fused.MAX_K:
        raise ValueError(f"backend='triton' selects at most the {fused.MAX_K}-th largest score, got rank {rank} "
                         "(k + 1 for the noised hinge)")
    return backend
