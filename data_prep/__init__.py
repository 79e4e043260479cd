"""Datasets of the paper, ready for training: the real ones from the files a user downloads, and seeded synthetic
stand-ins with the same structure for machines without them. ``load(name, root, **options)`` gives a :class:`Splits`.

Real: ``cifar100`` (with superclass label noise), ``plantnet`` (Pl@ntNet-300K), ``imagenet_lt``, ``imagenet``.
Synthetic: ``cifar100_like``, ``plantnet_like``, ``imagenet_lt_like``, ``imagenet_like`` (:mod:`data_prep.synthetic`).
Each real dataset has a command, ``python -m data_prep <name> --root PATH``, that checks (and for CIFAR-100
fetches and extracts) the files and prints what it found.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path

from data_prep import cifar100, imagenet, plantnet, synthetic
from data_prep.common import MissingDataError
from data_prep.splits import Splits

__all__ = ["load", "check_options", "REAL", "SYNTHETIC", "DATASETS", "Splits", "MissingDataError"]

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


#: Options that are probabilities, of any dataset that takes them.
PROBABILITIES = ("noise", "superclass_mixing", "ambiguity")


def check_options(name: str, options: dict) -> None:
    """``options`` of the dataset ``name`` checked before anything is loaded or drawn: each one it takes (its loader's
    keyword parameters, a stand-in's difficulty knobs too), of its default's kind (a bool, an integer >= 0, a finite
    number >= 0, a probability), else a ``ValueError`` naming the option and listing every valid one."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; the datasets are {sorted(DATASETS)}")
    parameters = {parameter.name: parameter.default for parameter in inspect.signature(DATASETS[name]).parameters.values()
                  if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and parameter.name != "root"}
    knobs = synthetic.KNOBS.get(name, {})
    valid = sorted({*parameters, *knobs})
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} {unknown} of the dataset {name!r}; its "
                         f"options are {valid}")
    for option, value in options.items():
        default = {**knobs, **parameters}[option]
        if isinstance(default, bool):
            expected, good = "true or false", isinstance(value, bool)
        elif isinstance(default, int):
            expected, good = "an integer >= 0", isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif isinstance(default, float):
            expected = "a probability in [0, 1]" if option in PROBABILITIES else "a finite number >= 0"
            good = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value >= 0 and (value <= 1 or option not in PROBABILITIES))
        else:  # a default of None: a folder, a dict of sizes, ... checked by the loader
            continue
        if not good:
            raise ValueError(f"the dataset {name!r}'s option {option!r} should be {expected}, got {value!r}")
