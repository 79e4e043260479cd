"""Argument checks shared by the public functions.

The public functions check their arguments once, then call private cores that check nothing. A check
raises a ``TypeError`` (wrong kind of object) or a ``ValueError`` (right kind, bad value) whose message
names the argument, shows the bad value and says what was expected.

No check reads a tensor's values on the host: types, shapes, dtypes and devices are metadata, and
hyperparameters are Python numbers. The two checks on values, the labels' range and per-class margins, are
asynchronous assertions (:func:`check_labels`, :func:`check_margins`), so a training step never waits for the
device and compiles as one graph.
"""

from __future__ import annotations

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
    """A finite real number (a Python or NumPy number, not a tensor), optionally ``> low`` (strict) or ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"'{name}' should be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not value - value == 0:  # inf and nan; not math.isfinite, which Dynamo cannot trace on a symbolic float
        raise ValueError(f"'{name}' should be finite, got {value}")
    if low is not None and (value <= low if strict else value < low):
        raise ValueError(f"'{name}' should be {'>' if strict else '>='} {low}, got {value}")
    return value


def check_labels(y: object, s: torch.Tensor, name: str = "y") -> torch.Tensor:
    """Integer labels of shape ``s.shape[:-1]`` in ``[0, L)`` on ``s``'s device; returned as int64.

    The range is checked by :func:`_assert_values`: on CUDA a label out of range is a device-side assertion
    (reported at the next synchronisation), under ``torch.compile`` an assertion in the compiled kernel, and on a CPU
    in eager mode a ``ValueError`` naming the bad label.
    """
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
    y = y.long()
    highest = s.shape[-1] - 1
    values = _unwrapped(y)
    _assert_values(values, values.clamp(0, highest) == values, f"'{name}' should hold class indices in [0, {highest}]")
    return y


def _assert_values(values: torch.Tensor, good: torch.Tensor, expected: str) -> None:
    """``good.all()`` asserted by ``torch._assert_async``, which reads nothing on the host; where it raises at once (a
    CPU in eager mode, where reading the values costs nothing), a ``ValueError`` with the first bad value."""
    try:
        torch._assert_async(good.all(), expected)
    except RuntimeError:
        raise ValueError(f"{expected}, got {values[~good][0].item()}") from None


def _unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` out of its ``torch.func`` wrappers (in eager mode; a compiled graph has none): under vmap, every
    element's values in one tensor, which the assertion can read (it has no batching rule)."""
    while not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        tensor = torch._C._functorch.get_unwrapped(tensor)
    return tensor


def check_bool(value: object, name: str) -> bool:
    """``True`` or ``False`` itself: a string such as ``"False"`` is truthy, so it is refused rather than read."""
    if not isinstance(value, bool):
        raise TypeError(f"'{name}' should be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"'{name}' should be one of {choices}, got {value!r}")
    return value  # type: ignore[return-value]


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
    """A finite scalar margin >= 0, or one margin per class: a floating tensor of shape (L,) on ``s``'s device whose
    values are finite and >= 0, asserted as the labels' range is (:func:`check_labels`)."""
    if not isinstance(margins, torch.Tensor):
        return check_real(margins, "margins", low=0.0)
    n_classes = s.shape[-1]
    if margins.shape != (n_classes,):
        raise ValueError(f"'margins' should be a real number or a tensor of shape ({n_classes},) (one per class), "
                         f"got a tensor of shape {tuple(margins.shape)}")
    if not margins.is_floating_point():
        raise TypeError(f"'margins' should be a floating-point tensor, got dtype {margins.dtype}")
    if margins.device != s.device:
        raise ValueError(f"'margins' is on {margins.device} but the scores are on {s.device}")
    values = _unwrapped(margins)  # >= 0 and finite, as NaN is never equal to itself: four operators, as the labels'
    _assert_values(values, values.clamp(0, torch.finfo(values.dtype).max) == values, MARGINS_EXPECTED)
    return margins


#: A negative margin would ask a score to beat the others by less than nothing.
MARGINS_EXPECTED = "'margins' should be finite and >= 0"


def check_margin_values(margins: object) -> object:
    """Where margins are made or stored (a loss module's constructor, its ``load_state_dict``): a number >= 0, or a
    tensor's values finite and >= 0, read on the host once."""
    if not isinstance(margins, torch.Tensor):
        return check_real(margins, "margins", low=0.0)
    if not bool((torch.isfinite(margins) & (margins >= 0)).all()):
        raise ValueError(f"{MARGINS_EXPECTED}, got {margins.tolist()}")
    return margins


BACKENDS = ("auto", "torch", "triton")

#: The bounds of the hyperparameters that do not depend on the data, written once: the functions check them at every
#: call (through :func:`check_hyperparameter`), the loss modules once, when they are built. (``k``'s upper bound
#: depends on the number of classes, so only the functions check it.)
HYPERPARAMETERS = {
    "k": lambda value: check_int(value, "k", 1),
    "epsilon": lambda value: check_real(value, "epsilon", low=0.0),
    "n_samples": lambda value: check_int(value, "n_samples", 1),
    "gamma": lambda value: check_real(value, "gamma", low=0.0),
    "scale": lambda value: check_real(value, "scale", low=0.0, strict=True),
    "tau": lambda value: check_real(value, "tau", low=0.0, strict=True),
    "alpha": lambda value: check_real(value, "alpha", low=0.0),
    "max_margin": lambda value: check_real(value, "max_margin", low=0.0),
    "margins": check_margin_values,
    "reduction": lambda value: check_choice(value, "reduction", REDUCTIONS),
    "backend": lambda value: check_choice(value, "backend", BACKENDS),
    "hard_switch": lambda value: check_bool(value, "hard_switch"),
}


def check_hyperparameter(name: str, value: object):
    """``value`` checked against the bounds of :data:`HYPERPARAMETERS` ``[name]``, returned as the right type."""
    return HYPERPARAMETERS[name](value)


#: Where the PyTorch path of the noised top-K was measured faster than its fused kernel: rank 51 (the hinge's K = 50)
#: over 4096 rows of 1,000 and 10,000 classes, on N(0, 1) and x5 scores; at rank 6 the kernel won everywhere, and over
#: 256 rows everywhere but 1,000 classes of N(0, 1) scores, an eager call where the host's time dominates (H200, commit
#: 97562b2, ``fused_kernel.csv``; ``benchmarks/NOTES.md`` §10). From that corner outwards (a higher rank, more rows,
#: fewer classes) ``"auto"`` keeps the PyTorch path: over 4096 rows of 100 classes it was x2.5 faster (H100,
#: 2026-11-23, before §8's kernel changes; not measured since). At 1,000 classes the two are close (§20: seven
#: measurements in three sessions, the kernel 6.4 to 7.3 ms, the PyTorch path 5.4 to 10.1 ms).
NOISED_TORCH_FASTER = {"rank": 51, "rows": 4096, "classes": 10_000}


def _in_corner(s: torch.Tensor, rank: int, corner: dict | None) -> bool:
    """Whether scores ``s`` (rows of classes) with this ``rank`` lie in ``corner`` (as :data:`NOISED_TORCH_FASTER`)."""
    return (corner is not None and rank >= corner["rank"] and s.shape[-1] <= corner["classes"]
            and s.numel() // s.shape[-1] >= corner["rows"])


def choose_backend(backend: object, s: torch.Tensor, rank: int, epsilon: float,
                   torch_faster: dict | None = None) -> str:
    """The one backend rule: ``"torch"`` or ``"triton"`` for a kernel whose work grows with ``rank``: the rank of the
    selected perturbed score (``k`` of the operator, ``k + 1`` of the noised hinge), or the ``k + 1`` coefficients of
    the smoothed hinge (``epsilon``: its ``tau``).

    ``s``: the scores as the kernel reads them. ``"auto"`` means Triton for CUDA scores with ``epsilon > 0`` and
    ``rank <= topk.fused.MAX_K`` when it is installed, outside the sizes ``torch_faster`` where PyTorch was measured
    faster, and PyTorch otherwise. ``"triton"`` is refused, with the reason, where the kernel cannot run: without the
    package, on CPU scores (unless ``TRITON_INTERPRET=1`` runs it in Triton's interpreter, bfloat16 excepted), or
    above ``MAX_K``.
    """
    from topk import _triton_support as triton  # at first use: it imports torch._dynamo, which `import topk` must not

    check_hyperparameter("backend", backend)
    if backend == "auto":
        kernel = s.is_cuda and epsilon > 0 and rank <= triton.MAX_K and not _in_corner(s, rank, torch_faster)
        return "triton" if kernel and triton.available() else "torch"
    if backend == "torch":
        return backend
    if not triton.available():
        raise ValueError("backend='triton' needs the triton package (pip install triton), which is not installed")
    if not s.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend='triton' needs CUDA scores, got scores on {s.device} "
                         "(set TRITON_INTERPRET=1 to run the kernel in Triton's interpreter)")
    if not s.is_cuda and (problem := triton.interpreter_problem()):
        raise RuntimeError(problem)
    if not s.is_cuda and s.dtype == torch.bfloat16:
        raise TypeError("backend='triton' cannot take bfloat16 scores in Triton's interpreter, which computes on "
                        "bfloat16's raw bits (wrong gradients, no error: triton-lang/triton#4972): give float16 or "
                        "float32 scores, or run on CUDA")
    if rank > triton.MAX_K:
        raise ValueError(f"backend='triton' handles at most rank {triton.MAX_K}, got rank {rank} "
                         "(k + 1 for the hinge losses)")
    return backend
