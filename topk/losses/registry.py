"""One registry of every loss of the paper's Table 1: the single place where a loss's formula,
parameters and reference are written. Table 1 is printed from it (:func:`table_1`), and experiments
build losses by name (:func:`build_loss`).

Corrections to the printed Table 1 of Garcin et al. (ICML 2022): the focal loss is the standard
``(1 - p_y)^gamma CE`` (the printed expression is a typo), its reference is Lin et al. (2017) and LDAM's
is Cao et al. (2019) (the printed references are swapped), and the smoothed hinge's second sum runs over
the subsets that contain ``y`` (Berrada et al., 2018, Eq. 8).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from topk.losses import modules

__all__ = ["LossSpec", "LOSSES", "build_loss", "table_1"]


@dataclass(frozen=True)
class LossSpec:
    """A row of Table 1 plus how to build the loss."""

    name: str  #: registry key, e.g. ``"noised_balanced"``
    title: str  #: the loss's name in Table 1
    symbol: str  #: LaTeX symbol, e.g. ``\ell_{\mathrm{CE}}``
    formula: str  #: LaTeX expression of ``\ell(s, y)``
    parameters: tuple[str, ...]  #: LaTeX symbols of its parameters, as in Table 1 (:attr:`keywords`: build_loss's)
    reference: str
    constructor: Callable[..., nn.Module]
    #: whether the constructor makes per-class margins from the training set's ``class_counts`` (Eq. 13)
    takes_class_counts: bool = False

    @property
    def keywords(self) -> dict[str, object]:
        """The keyword arguments :func:`build_loss` takes for this loss, each with its default (``inspect``'s
        ``Parameter.empty`` where it has none: a required one); ``class_counts`` is passed by :func:`build_loss`."""
        parameters = list(inspect.signature(self.constructor).parameters.values())
        if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):  # a classmethod passing **kwargs
            made = {parameter.name for parameter in parameters} | {"margins"}  # to its class, which makes the margins
            parameters += [parameter for parameter in inspect.signature(self.constructor.__self__).parameters.values()
                           if parameter.name not in made]
        return {parameter.name: parameter.default for parameter in parameters
                if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
                and parameter.name != "class_counts"}


_SPECS = (
    LossSpec("zero_one", "Top-K (0/1)", r"\ell^{K}",
             r"\mathbb{1}_{\{\mathrm{top}_K(s) > s_y\}}", ("K",), "Eq. (3)", modules.ZeroOneTopK),
    LossSpec("cross_entropy", "Cross-entropy", r"\ell_{\mathrm{CE}}",
             r"-\ln\big(e^{s_y} / \sum_{k \in [L]} e^{s_k}\big)", (), "", modules.CrossEntropy),
    LossSpec("ldam", "LDAM", r"\ell^{m_y}_{\mathrm{LDAM}}",
             r"-\ln\big(e^{s_y - m_y} / [e^{s_y - m_y} + \sum_{k \neq y} e^{s_k}]\big)", ("m_y",),
             "Cao et al. (2019)", modules.LDAM.from_class_counts, takes_class_counts=True),
    LossSpec("focal", "Focal", r"\ell^{\gamma}_{\mathrm{focal}}",
             r"(1 - p_y)^{\gamma}\, \ell_{\mathrm{CE}}(s, y),\ p = \mathrm{softmax}(s)", (r"\gamma",),
             "Lin et al. (2017)", modules.Focal),
    LossSpec("lapin_hinge", "Hinge top-K", r"\ell^{K}_{\mathrm{Hinge}}",
             r"\big(1 + \mathrm{top}_K(s_{\setminus y}) - s_y\big)_+", ("K",),
             "Eq. (4), Lapin et al. (2015)", modules.LapinHinge),
    LossSpec("convex_hinge", "Convexified hinge top-K", r"\ell^{K}_{\mathrm{CVXHinge}}",
             r"\big(\tfrac{1}{K} \sum_{k \in [K]} \mathrm{top}_k(\mathbf{1}_L - \delta_y + s) - s_y\big)_+", ("K",),
             "Lapin et al. (2015)", modules.ConvexHinge),
    LossSpec("calibrated_hinge", "Calibrated hinge top-K", r"\ell^{K}_{\mathrm{Cal.\,Hinge}}",
             r"\big(1 + \mathrm{top}_{K+1}(s) - s_y\big)_+", ("K",),
             "Eq. (5), Yang & Koyejo (2020)", modules.CalibratedHinge),
    LossSpec("smooth_hinge", "Log-sum smoothed hinge top-K", r"\ell^{K,\tau}_{\mathrm{Smoothed\,Hinge}}",
             r"\tau \ln \sum_{|A| = K} e^{\frac{\mathbb{1}_{\{y \notin A\}}}{\tau} + \sum_{j \in A} \frac{s_j}{K\tau}}"
             r" - \tau \ln \sum_{|A| = K,\, y \in A} e^{\sum_{j \in A} \frac{s_j}{K\tau}}",
             ("K", r"\tau"), "Berrada et al. (2018)", modules.SmoothHinge),
    LossSpec("noised_balanced", "Noised balanced hinge top-K (proposed)", r"\ell^{K,\epsilon,B}_{\mathrm{Noised\,bal.}}",
             r"\big(1 + \widehat{\mathrm{top}}_{K+1,\epsilon,B}(s) - s_y\big)_+", ("K", r"\epsilon", "B"),
             "Eq. (8), Garcin et al. (2022)", modules.NoisedHinge),
    LossSpec("noised_imbalanced", "Noised imbalanced hinge top-K (proposed)",
             r"\ell^{K,\epsilon,B,m_y}_{\mathrm{Noised\,imbal.}}",
             r"\big(m_y + \widehat{\mathrm{top}}_{K+1,\epsilon,B}(s) - s_y\big)_+", ("K", r"\epsilon", "B", "m_y"),
             "Eq. (13), Garcin et al. (2022)", modules.NoisedHinge.imbalanced, takes_class_counts=True),
)

#: Every loss of Table 1, in the table's order, by registry key.
LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in _SPECS}


def build_loss(name: str, class_counts: Sequence[int] | torch.Tensor | None = None, **parameters) -> nn.Module:
    """The loss module registered as ``name``, built with ``parameters``.

    ``class_counts`` (training examples per class) goes to the losses that make their margins from it
    (:attr:`LossSpec.takes_class_counts`: LDAM and the noised imbalanced loss, which need it) and is unused by the
    others, so a training loop builds any loss with one call.

    >>> build_loss("noised_balanced", k=5, epsilon=0.2, n_samples=10)
    NoisedHinge(k=5, epsilon=0.2, n_samples=10, margins=1.0, scale=1.0, generator=None, reduction=mean, backend=auto)
    >>> build_loss("ldam", class_counts=[100, 10, 1], max_margin=0.5)
    LDAM(margins=tensor(shape=(3,)), scale=1.0, reduction=mean)
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; the registered losses are {sorted(LOSSES)}")
    spec = LOSSES[name]
    if spec.takes_class_counts:
        if class_counts is None:
            raise ValueError(f"the loss {name!r} makes its per-class margins from the training set: give "
                             "class_counts=, the number of training examples of each class")
        parameters["class_counts"] = class_counts
    keywords = spec.keywords
    unknown = sorted(set(parameters) - set(keywords) - {"class_counts"})
    missing = [keyword for keyword, default in keywords.items() if default is inspect.Parameter.empty
               and keyword not in parameters]
    if unknown or missing:
        named = [keyword if default is inspect.Parameter.empty else f"{keyword}={default!r}"
                 for keyword, default in keywords.items()]
        problem = f"unknown parameter{'s' if len(unknown) > 1 else ''} {unknown}" if unknown else f"missing {missing}"
        raise TypeError(f"build_loss({name!r}, ...): {problem}; its parameters are {', '.join(named)}")
    return spec.constructor(**parameters)


def table_1() -> list[dict[str, str]]:
    """Table 1 as rows of LaTeX strings: loss, expression, parameters, reference."""
    return [
        {
            "loss": f"${spec.symbol}(s, y)$",
            "expression": f"${spec.formula}$",
            "parameters": ", ".join(f"${p}$" for p in spec.parameters) or "—",
            "reference": spec.reference or "—",
        }
        for spec in _SPECS
    ]
