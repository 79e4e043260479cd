"""What the Triton kernels need of the machine: the package, an interpreter that runs on this NumPy, and the largest
K their register buffer holds. Kept apart from :mod:`topk.fused` so that the argument checks (:mod:`topk._validation`)
can ask without importing the launchers, which check their own arguments with them."""

from __future__ import annotations

import importlib.util

import torch

#: The largest K handled by the kernel; the buffer of the K largest values lives in registers.
MAX_K = 128
#: Whether Triton is installed, found without importing it (a module constant: Dynamo reads it when it traces a loss,
#: where it would warn about a cached function on every compile).
_INSTALLED = importlib.util.find_spec("triton") is not None


def available() -> bool:
    """Whether Triton is installed (it ships with the Linux x86-64 wheels of PyTorch)."""
    return _INSTALLED


@torch.compiler.assume_constant_result  # called, not traced, when Dynamo meets it
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernels here, or None. Triton 3.6's interpreter hands a kernel's scalar
    arguments over as one-element arrays and converts them back with ``int()``, which NumPy 2.4 refuses (``TypeError:
    only 0-dimensional arrays can be converted to Python scalars``); Triton 3.8's does not."""
    import numpy
    import triton

    version = lambda text: tuple(int(part) for part in text.split(".")[:2])  # noqa: E731
    if version(triton.__version__) <= (3, 6) and version(numpy.__version__) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter cannot run the kernels with NumPy {numpy.__version__} "
                "(it converts one-element arrays to scalars, which NumPy 2.4 refuses): install numpy<2.4, or a newer "
                "Triton")
    return None
