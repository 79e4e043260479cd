"""Datasets of the paper, ready for training: the real ones from the files a user downloads, and seeded synthetic
stand-ins with the same structure for machines without them. ``load(name, root, **options)`` gives a :class:`Splits`.

Real: ``cifar100`` (with superclass label noise), ``plantnet`` (Pl@ntNet-300K), ``imagenet_lt``, ``imagenet``.
Synthetic: ``cifar100_like``, ``plantnet_like``, ``imagenet_lt_like``, ``imagenet_like`` (:mod:`data_prep.synthetic`).
Each real dataset has a command, ``python -m data_prep <name> --root PATH``, that checks (and for CIFAR-100
fetches and extracts) the files and prints what it found.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from data_prep import cifar100, imagenet, plantnet, synthetic
from data_prep.common import MissingDataError, Splits

__all__ = ["load", "REAL", "SYNTHETIC", "DATASETS", "Splits", "MissingDataError"]

REAL: dict[str, Callable[..., Splits]] = {
    "cifar100": cifar100.load,
    "plantnet": plantnet.load,
    "imagenet_lt": imagenet.load_imagenet_lt,
    "imagenet": imagenet.load_imagenet,
}
SYNTHETIC: dict[str, Callable[..., Splits]] = {
    "cifar100_like": synthetic.cifar100_like,
    "plantnet_like": synthetic.plantnet_like,
    "imagenet_lt_like": synthetic.imagenet_lt_like,
    "imagenet_like": synthetic.imagenet_like,
}
DATASETS = {**REAL, **SYNTHETIC}


def load(name: str, root: str | Path | None = None, **options) -> Splits:
    """The dataset ``name``; a real one needs ``root``, the folder its ``data_prep`` command was run on."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; the datasets are {sorted(DATASETS)}")
    if name in SYNTHETIC:
        return SYNTHETIC[name](**options)
    if root is None:
        raise MissingDataError(f"the real dataset {name!r} needs a data root: run `python -m data_prep {name} --root PATH` "
                               f"and pass that PATH (or use a synthetic stand-in: {sorted(SYNTHETIC)})")
    return REAL[name](Path(root), **options)
