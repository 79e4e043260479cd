"""Thin ``nn.Module`` forms of the losses in :mod:`topk.losses.functional`.

Each module stores its hyperparameters (tensors as buffers, so ``.to(device)`` moves per-class margins
along), checks the ones that do not depend on the data when it is built or loaded (per-class margins' values
included), and calls its function.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn

from topk._validation import HYPERPARAMETERS
from topk.losses import functional as LF

__all__ = ["ZeroOneTopK", "CrossEntropy", "Focal", "LDAM", "LapinHinge", "ConvexHinge", "CalibratedHinge", "SmoothHinge",
           "NoisedHinge"]


class _LossModule(nn.Module):
    loss_function: Callable[..., torch.Tensor]

    def __init_subclass__(cls, **kwargs):
        """Each module's ``__init__`` documented by its function's docstring, the one place its parameters are
        described (``help(NoisedHinge)`` would show ``nn.Module``'s otherwise)."""
        super().__init_subclass__(**kwargs)
        function = cls.loss_function
        described = re.split(r"\n\s*>>>", inspect.cleandoc(function.__doc__))[0].rstrip()  # its examples stay there
        cls.__init__.__doc__ = (f"The loss :func:`topk.losses.{function.__name__}` as a module: its parameters but "
                                f"the scores ``s`` and labels ``y``, given at each call.\n\n{described}")

    def __init__(self, **hyperparameters):
        super().__init__()
        self._hyperparameter_names = tuple(hyperparameters)
        for name, value in hyperparameters.items():
            if name in HYPERPARAMETERS:
                HYPERPARAMETERS[name](value)
            if isinstance(value, torch.Tensor):
                self.register_buffer(name, value)
            else:
                setattr(self, name, value)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint's margins checked as the constructor checks them, so that a bad one fails at load."""
        for name in self._hyperparameter_names:
            value = state_dict.get(prefix + name)
            if name in HYPERPARAMETERS and isinstance(value, torch.Tensor) and not value.is_meta:  # meta: no values
                HYPERPARAMETERS[name](value)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hyperparameters = {name: getattr(self, name) for name in self._hyperparameter_names}
        return type(self).loss_function(s, y, **hyperparameters)

    def extra_repr(self) -> str:
        shown = []
        for name in self._hyperparameter_names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                value = f"tensor(shape={tuple(value.shape)})"
            shown.append(f"{name}={value}")
        return ", ".join(shown)


class ZeroOneTopK(_LossModule):
    """Module form of :func:`~topk.losses.zero_one_topk` (Eq. 3)."""

    loss_function = staticmethod(LF.zero_one_topk)

    def __init__(self, k: int, *, reduction: str = "mean"):
        super().__init__(k=k, reduction=reduction)


class CrossEntropy(_LossModule):
    """Module form of :func:`~topk.losses.cross_entropy`."""

    loss_function = staticmethod(LF.cross_entropy)

    def __init__(self, *, reduction: str = "mean"):
        super().__init__(reduction=reduction)


class Focal(_LossModule):
    """Module form of :func:`~topk.losses.focal` (Lin et al., 2017)."""

    loss_function = staticmethod(LF.focal)

    def __init__(self, gamma: float, *, reduction: str = "mean"):
        super().__init__(gamma=gamma, reduction=reduction)


class LDAM(_LossModule):
    """Module form of :func:`~topk.losses.ldam` (Cao et al., 2019)."""

    loss_function = staticmethod(LF.ldam)

    def __init__(self, margins: float | torch.Tensor, *, scale: float = 1.0, reduction: str = "mean"):
        super().__init__(margins=margins, scale=scale, reduction=reduction)

    @classmethod
    def from_class_counts(cls, class_counts: Sequence[int] | torch.Tensor, max_margin: float, **kwargs) -> "LDAM":
        """Margins ``m_y = C / n_y^(1/4)`` with the largest equal to ``max_margin``."""
        return cls(LF.class_margins(class_counts, max_margin), **kwargs)


class LapinHinge(_LossModule):
    """Module form of :func:`~topk.losses.lapin_hinge` (Eq. 4)."""

    loss_function = staticmethod(LF.lapin_hinge)

    def __init__(self, k: int, *, reduction: str = "mean"):
        super().__init__(k=k, reduction=reduction)


class ConvexHinge(_LossModule):
    """Module form of :func:`~topk.losses.convex_hinge` (Table 1)."""

    loss_function = staticmethod(LF.convex_hinge)

    def __init__(self, k: int, *, reduction: str = "mean"):
        super().__init__(k=k, reduction=reduction)


class CalibratedHinge(_LossModule):
    """Module form of :func:`~topk.losses.calibrated_hinge` (Eq. 5)."""

    loss_function = staticmethod(LF.calibrated_hinge)

    def __init__(self, k: int, *, reduction: str = "mean"):
        super().__init__(k=k, reduction=reduction)


class SmoothHinge(_LossModule):
    """Module form of :func:`~topk.losses.smooth_hinge` (Berrada et al., 2018).

    >>> loss = SmoothHinge(k=5, tau=1.0)
    >>> scores = torch.randn(8, 100, requires_grad=True)
    >>> loss(scores, torch.randint(0, 100, (8,))).backward()
    """

    loss_function = staticmethod(LF.smooth_hinge)

    def __init__(self, k: int, tau: float, alpha: float = 1.0, *, hard_switch: bool = False, reduction: str = "mean",
                 backend: str = "auto"):
        super().__init__(k=k, tau=tau, alpha=alpha, hard_switch=hard_switch, reduction=reduction, backend=backend)


class NoisedHinge(_LossModule):
    """Module form of :func:`~topk.losses.noised_hinge`: balanced (Eq. 8) or, with per-class margins, imbalanced (Eq. 13).

    >>> loss = NoisedHinge(k=5, epsilon=0.2, n_samples=10)
    >>> scores = torch.randn(8, 100, requires_grad=True)
    >>> loss(scores, torch.randint(0, 100, (8,))).backward()
    """

    loss_function = staticmethod(LF.noised_hinge)

    def __init__(
        self,
        k: int,
        epsilon: float,
        n_samples: int,
        *,
        margins: float | torch.Tensor = 1.0,
        scale: float = 1.0,
        generator: torch.Generator | None = None,
        reduction: str = "mean",
        backend: str = "auto",
    ):
        super().__init__(k=k, epsilon=epsilon, n_samples=n_samples, margins=margins, scale=scale, generator=generator,
                         reduction=reduction, backend=backend)

    @classmethod
    def imbalanced(cls, k: int, epsilon: float, n_samples: int, class_counts: Sequence[int] | torch.Tensor,
                   max_margin: float, **kwargs) -> "NoisedHinge":
        """The imbalanced loss (Eq. 13) with ``m_y = C / n_y^(1/4)``, the largest margin equal to ``max_margin``."""
        return cls(k, epsilon, n_samples, margins=LF.class_margins(class_counts, max_margin), **kwargs)
