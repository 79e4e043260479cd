"""What a profile trains, counted before anything runs: per training notebook, its distinct trainings (a run shared
with an earlier notebook is trained once, by the results store, and so are runs that differ only in their selection
metric: :meth:`experiments.engine.config.RunConfig.siblings`) and the images they push through a training step and through
an evaluation; the learning-rate choice's runs beyond the tables' own (trained only when the choice is made again:
:mod:`experiments.tuning.learning_rates`); and one point of the calibration's search.

``python -m benchmarks.bench_profile_time`` measures how fast a machine trains each setup and turns these counts into
hours. Only stand-in profiles can be counted: a real dataset's size is known from its files.

    python -m experiments.analysis.workload gpu
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from functools import cache

import data_prep
from experiments.engine.config import RunConfig
from experiments.spec import grids
from experiments.spec.grids import NOTEBOOK_GRIDS
from experiments.spec.profiles import SETUPS, Profile, Setup, get_profile
from experiments.tuning import learning_rates


CHOICE = "learning-rate choice"
CALIBRATION_POINT = "calibration point"


@dataclass(frozen=True)
class StandInSize:
    """A stand-in's split sizes, classes and image side, as its generator makes them for a setup's options."""

    train: int
    val: int
    test: int
    num_classes: int
    image_size: int

    @property
    def image_bytes(self) -> int:
        """What its images take in a process's memory as its generator renders them: every split, three channels of
        one byte."""
        return (self.train + self.val + self.test) * 3 * self.image_size ** 2


@dataclass(frozen=True)
class Work:
    """Runs of one setup within one notebook; ``notebook`` is :data:`CHOICE` for the learning-rate choice's runs that
    no notebook trains, :data:`CALIBRATION_POINT` for one point of the calibration's search on every seed (a
    cross-entropy run per seed of a calibrated setup: its start; the other points average fewer where the seeds
    agree)."""

    notebook: str
    setup: str  #: the profile's attribute: cifar, plantnet, imagenet_lt or imagenet
    runs: int
    epochs: int  #: summed over the runs
    train_images: int  #: images through a training step: full batches only, as the training loop takes them
    eval_images: int  #: images evaluated: the validation set after every epoch, the test set at most once a sibling


def stand_in_size(setup: Setup | RunConfig) -> StandInSize:
    """The sizes of ``setup``'s stand-in (a profile's setup, or a run's config, which names its dataset and options as
    a setup does: a calibration's run, which no setup holds): its generator run on 1-pixel images (the labels and
    splits are the same at every image size; only the rendering, skipped here, depends on it)."""
    if setup.dataset not in data_prep.SYNTHETIC:
        raise ValueError(f"the {setup.dataset!r} dataset is real: its size comes from its files, not from a profile; "
                         f"the stand-ins are {sorted(data_prep.SYNTHETIC)}")
    return _size(setup.dataset, tuple(sorted(setup.dataset_options.items())))


@cache
def _size(dataset: str, options: tuple) -> StandInSize:
    generator = data_prep.SYNTHETIC[dataset]
    options = dict(options)
    image_size = options.pop("image_size", inspect.signature(generator).parameters["image_size"].default)
    splits = generator(**options, image_size=1, augment=False)
    return StandInSize(len(splits.train), len(splits.val), len(splits.test), splits.num_classes, image_size)


def run_images(config, size: StandInSize) -> tuple[int, int, int]:
    """The images one run of ``config`` pushes through a training step (full batches of every epoch, as the training
    loop takes them), through validation (the validation set after every epoch) and through testing: at most one
    test pass per sibling (:meth:`RunConfig.siblings`: one per selection metric), since the model of each distinct
    selected epoch is tested."""
    return (config.epochs * (size.train // config.batch_size * config.batch_size), config.epochs * size.val,
            size.test * len(config.siblings()))


def _work(notebook: str, name: str, setup: Setup, configs: list) -> Work:
    size = stand_in_size(setup)
    images = [run_images(config, size) for config in configs]
    return Work(notebook, name, len(configs), sum(config.epochs for config in configs),
                sum(trained for trained, _, _ in images), sum(validated + tested for _, validated, tested in images))


def profile_work(profile: Profile, setups: tuple[str, ...] = SETUPS) -> list[Work]:
    """The training notebooks' work, in the report's order, one row per notebook and setup; then, on a profile that
    chooses learning rates, the choice's runs at the multipliers the tables do not train (with the stored choice);
    then one calibration point per calibrated setup (every seed, as :mod:`experiments.tuning.calibration` trains its
    start); ``setups`` only."""
    rows, seen = [], set()
    setup_names = {getattr(profile, name).dataset: name for name in SETUPS}  # each setup has its own dataset
    for notebook, notebook_grids in NOTEBOOK_GRIDS.items():
        by_setup: dict[str, list] = {}
        for grid in notebook_grids:
            for cell in grid(profile):
                if (training := cell.config.training_key()) not in seen:
                    seen.add(training)
                    by_setup.setdefault(setup_names[cell.setup.dataset], []).append(cell.config)
        rows += [_work(notebook, name, getattr(profile, name), configs) for name, configs in by_setup.items()
                 if name in setups]
    if len(profile.lr_multipliers) > 1:
        for name in (name for name in profile.calibrated_setups if name in setups):
            configs = [grids.scaled_lr(cell.config, multiplier) for cell in learning_rates.base_cells(profile, name)
                       for multiplier in profile.lr_multipliers]
            trainings = {config.training_key(): config for config in configs}
            rows.append(_work(CHOICE, name, getattr(profile, name),
                              [config for key, config in trainings.items() if key not in seen]))
    for name in (name for name in profile.calibrated_setups if name in setups):
        setup = getattr(profile, name)
        rows.append(_work(CALIBRATION_POINT, name, setup,
                          [setup.config("cross_entropy", seed) for seed in setup.seeds]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    profile = get_profile(parser.parse_args().profile)
    print(f"{'notebook':28s} {'setup':12s} {'runs':>5s} {'epochs':>7s} {'train images':>14s} {'eval images':>13s}")
    for row in profile_work(profile):
        print(f"{row.notebook:28s} {row.setup:12s} {row.runs:5d} {row.epochs:7d} {row.train_images:14,d} "
              f"{row.eval_images:13,d}")


if __name__ == "__main__":
    main()
