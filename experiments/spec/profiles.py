"""The scales at which the notebooks run: ``smoke`` (CI, minutes), ``quick`` (a laptop-class CPU, under two hours),
``gpu`` (the paper's models and schedules on full-size stand-ins) and ``paper`` (the paper's protocols on the real
datasets). ``python -m experiments.analysis.workload PROFILE`` counts what a profile trains;
``python -m benchmarks.bench_profile_time`` turns that into hours on a given machine.

A :class:`Setup` is one dataset with its model and training schedule; a notebook's grid
(:mod:`experiments.spec.grids`) turns it into one :class:`RunConfig` per loss, hyperparameter and seed. The loss
hyperparameters are the paper's at every profile; only the data, the model and the schedule shrink, and where the
schedule is short (``lr_multipliers``) each loss's learning rate is chosen on validation data.

A profile that judges training claims on synthetic stand-ins takes their difficulty knobs (cross-entropy alone fitted
to the paper's cross-entropy numbers: :mod:`experiments.tuning.calibration`) and, where its schedule is short, each
loss's learning rate (chosen on validation data: :mod:`experiments.tuning.learning_rates`) from what
:mod:`experiments.tuning.fixed_point` stored for it (:mod:`experiments.spec.tuned`), and only for the very setup they
were chosen for (:meth:`Setup.fingerprint`, :meth:`Setup.tuned_fingerprint`).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, replace

from experiments.engine.config import RunConfig
from experiments.spec import tuned


@dataclass(frozen=True)
class Setup:
    """A dataset, a model and a training schedule, with the seeds of its runs."""

    dataset: str
    model: str
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    milestones: tuple[int, ...]
    seeds: tuple[int, ...]
    dataset_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    data_subdir: str = ""  #: where a real dataset lives under the data root (its ``data_prep --root``)
    difficulty: dict = field(default_factory=dict)  #: a stand-in's calibrated knobs (:mod:`data_prep.synthetic`)
    #: learning-rate multipliers chosen on validation data (:mod:`experiments.tuning.learning_rates`), by
    #: "<loss> <selection>"
    lr_scales: dict = field(default_factory=dict)
    # A model option may name a file in the dataset's folder as "{data_root}/name": the config's key stays the same
    # on every machine and the training loop resolves it (ImageNet weights for Pl@ntNet's ResNet-50).

    def config(self, loss: str, seed: int, *, loss_options: dict | None = None, dataset_options: dict | None = None,
               model_options: dict | None = None, **changes) -> RunConfig:
        """The run of ``loss`` with this setup; option dicts are merged into the setup's, other fields replace."""
        return RunConfig(dataset=self.dataset, model=self.model, loss=loss, epochs=self.epochs,
                         batch_size=self.batch_size, lr=self.lr, weight_decay=self.weight_decay,
                         milestones=self.milestones, seed=seed,
                         dataset_options={**self.dataset_options, **self.difficulty, **(dataset_options or {})},
                         model_options={**self.model_options, **(model_options or {})},
                         loss_options=dict(loss_options or {})).replace(**changes)

    @property
    def synthetic(self) -> bool:
        return self.dataset.endswith("_like")

    def fingerprint(self) -> str:
        """A hash of everything but the difficulty knobs and the learning rates chosen: calibrated knobs apply to the
        setup with this fingerprint."""
        return tuned.fingerprint({**self._chosen_apart(), "difficulty": None})

    def tuned_fingerprint(self) -> str:
        """A hash of everything but the learning rates chosen, the difficulty knobs included: learning rates chosen on
        validation data apply to the setup with this fingerprint."""
        return tuned.fingerprint(self._chosen_apart())

    def trained_fingerprint(self) -> str:
        """A hash of the whole setup, its difficulty knobs and chosen learning rates included: what its runs are
        trained with (a notebook's manifest names it, so results made with another calibration are caught)."""
        return tuned.fingerprint(asdict(self))

    def _chosen_apart(self) -> dict:
        fields = asdict(self)
        del fields["lr_scales"]
        return fields


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    cifar: Setup  #: Tables 2, 3, 4, 7 and Figs. 2, 3
    plantnet: Setup  #: Tables 5 and 8
    imagenet_lt: Setup  #: Table 6
    imagenet: Setup  #: Table 9
    sweep_seeds: tuple[int, ...]  #: seeds of the eps and B sweeps (Tables 2 and 3)
    figure3_ks: tuple[int, ...]
    figure3_epochs: int  #: epochs timed per point of Fig. 3 (their mean is plotted)
    judges_training: bool  #: False where training is too short for a verdict on a training claim
    level_set_points: int  #: subdivisions of the simplex's sides in Figs. 1, 4, 5, 6
    replications: int  #: noise draws averaged in the level sets of Figs. 1 and 6 (the paper: 100)
    bound_samples: int  #: Monte Carlo samples per point of the Prop. 3.5 check
    #: multipliers of each loss's learning rate tried on validation data (:mod:`experiments.tuning.learning_rates`);
    #: (1.0,): every loss trains at the learning rate the grids give it, as in the paper
    lr_multipliers: tuple[float, ...] = (1.0,)

    @property
    def calibrated_setups(self) -> tuple[str, ...]:
        """The setups whose stand-ins are calibrated: synthetic ones, on a profile that judges training claims."""
        return tuple(name for name in SETUPS if self.judges_training and getattr(self, name).synthetic)

    def setups_text(self, setups: tuple[str, ...] | list[str]) -> str:
        """``setups`` named as messages name them, each with its dataset as ``plan`` names it: ``cifar
        (cifar100_like), plantnet (plantnet_like)``."""
        return ", ".join(f"{setup} ({getattr(self, setup).dataset})" for setup in setups)


SETUPS = ("cifar", "plantnet", "imagenet_lt", "imagenet")


def calibrated(profile: Profile) -> Profile:
    """``profile`` with the difficulty knobs stored for it (:func:`experiments.spec.tuned.calibrations`), for each
    setup whose fingerprint they were chosen for (a setup changed since keeps the default knobs, with a warning), then
    :func:`with_learning_rates`."""
    if not profile.calibrated_setups or not tuned.calibration_path(profile.name).exists():
        return profile
    stored = _stored(tuned.calibrations, profile.name, f"the {profile.name} stand-ins keep their default difficulty")
    if stored is None:
        return profile
    changes = {}
    for name in profile.calibrated_setups:
        setup, entry = getattr(profile, name), stored.get(name)
        if entry is not None and entry.fits(setup.fingerprint()):
            changes[name] = replace(setup, difficulty=entry.knobs)
        else:
            warnings.warn(f"the {profile.name} profile's {name} setup has no calibration in "
                          f"{tuned.calibration_path(profile.name)} (changed since?): its stand-in keeps the default "
                          f"difficulty; {_RETUNE.format(profile.name)}", stacklevel=2)
    return with_learning_rates(replace(profile, **changes))


def with_learning_rates(profile: Profile) -> Profile:
    """``profile`` with each setup's learning-rate multipliers stored for it (:mod:`experiments.spec.tuned`), for each
    setup whose tuned fingerprint (its calibrated difficulty included) and multipliers they were chosen for; a setup
    changed since keeps the grids' learning rates, with a warning."""
    if len(profile.lr_multipliers) == 1:
        return profile
    stored = _stored(tuned.learning_rates, profile.name, f"the {profile.name} profile's losses keep the grids' "
                                                         f"learning rates")
    if stored is None:
        return profile
    changes = {}
    for name in profile.calibrated_setups:
        setup, entry = getattr(profile, name), stored.get(name)
        if entry is not None and entry.fits(setup.tuned_fingerprint(), profile.lr_multipliers):
            changes[name] = replace(setup, lr_scales=entry.scales)
        else:
            warnings.warn(f"the {profile.name} profile's {name} setup has no learning rates chosen for it in "
                          f"{tuned.learning_rates_path(profile.name)} (changed since?): its losses keep the grids' "
                          f"learning rates; {_RETUNE.format(profile.name)}", stacklevel=2)
    return replace(profile, **changes)


def recalibrated(profile: Profile) -> Profile:
    """``profile`` with its stand-ins' knobs and learning rates read afresh from the stored files (:func:`calibrated`
    of the profile without them): what a new process would use after :mod:`experiments.tuning.fixed_point` stored
    them."""
    bare = {name: replace(getattr(profile, name), difficulty={}, lr_scales={}) for name in profile.calibrated_setups}
    return calibrated(replace(profile, **bare))


def untuned(profile: Profile, setup: str) -> Profile:
    """``profile`` with ``setup``'s losses at the grids' own learning rates (no choice applied)."""
    return replace(profile, **{setup: replace(getattr(profile, setup), lr_scales={})})


_RETUNE = "run `make calibrate PROFILE={}`"


def _stored(read, profile_name: str, consequence: str) -> dict | None:
    """``read(profile_name)``, or None with a warning saying why and ``consequence``."""
    try:
        return read(profile_name)
    except (OSError, ValueError) as error:
        warnings.warn(f"{error}: {consequence}; {_RETUNE.format(profile_name)}", stacklevel=3)
        return None


def _small_cnn(width: int) -> dict:
    return {"model": "small_cnn", "model_options": {"width": width}}


SMOKE = Profile(
    name="smoke",
    description="tiny synthetic stand-ins and 1-2 epochs: checks that every notebook runs (CI); its training "
                "numbers mean nothing",
    cifar=Setup("cifar100_like", **_small_cnn(8), epochs=2, batch_size=64, lr=0.05, weight_decay=5e-4,
                milestones=(1,), seeds=(0,), dataset_options={"per_class_train": 6, "per_class_val": 2,
                                                              "per_class_test": 2, "image_size": 16}),
    plantnet=Setup("plantnet_like", **_small_cnn(8), epochs=2, batch_size=64, lr=0.05, weight_decay=5e-4,
                   milestones=(1,), seeds=(0,), dataset_options={"n_images": 1500, "n_classes": 20}),
    imagenet_lt=Setup("imagenet_lt_like", **_small_cnn(8), epochs=2, batch_size=64, lr=0.05, weight_decay=5e-4,
                      milestones=(1,), seeds=(0,), dataset_options={"n_images": 1500, "n_classes": 20}),
    imagenet=Setup("imagenet_like", **_small_cnn(8), epochs=2, batch_size=64, lr=0.05, weight_decay=5e-4,
                   milestones=(1,), seeds=(0,), dataset_options={"per_class_train": 6, "per_class_val": 2,
                                                                 "per_class_test": 2, "n_classes": 60}),
    sweep_seeds=(0,), figure3_ks=(1, 5, 20), figure3_epochs=1, judges_training=False,
    level_set_points=30, replications=10, bound_samples=200,
)

QUICK = calibrated(Profile(
    name="quick",
    description="synthetic stand-ins shaped like each dataset, a small CNN, 10-12 epochs, 2-3 seeds: "
                "the paper's qualitative claims at laptop scale",
    cifar=Setup("cifar100_like", **_small_cnn(16), epochs=12, batch_size=64, lr=0.05, weight_decay=5e-4,
                milestones=(6, 9), seeds=(0, 1, 2), dataset_options={"per_class_train": 80, "per_class_val": 10,
                                                                     "per_class_test": 20, "image_size": 16}),
    plantnet=Setup("plantnet_like", **_small_cnn(16), epochs=10, batch_size=64, lr=0.05, weight_decay=5e-4,
                   milestones=(6, 8), seeds=(0, 1), dataset_options={"n_images": 12_000, "n_classes": 100}),
    imagenet_lt=Setup("imagenet_lt_like", **_small_cnn(16), epochs=10, batch_size=64, lr=0.05, weight_decay=5e-4,
                      milestones=(6, 8), seeds=(0, 1), dataset_options={"n_images": 10_000, "n_classes": 100}),
    imagenet=Setup("imagenet_like", **_small_cnn(16), epochs=10, batch_size=64, lr=0.05, weight_decay=5e-4,
                   milestones=(6, 8), seeds=(0, 1), dataset_options={"per_class_train": 40, "per_class_val": 10,
                                                                     "per_class_test": 10, "n_classes": 200}),
    sweep_seeds=(0, 1, 2), figure3_ks=(1, 5, 10, 20, 50), figure3_epochs=2, judges_training=True,
    level_set_points=90, replications=100, bound_samples=4000, lr_multipliers=(0.3, 1.0, 3.0, 10.0),
))

PAPER = Profile(
    name="paper",
    description="the paper's protocols on the real datasets (Section 4 and Appendix E); needs GPUs",
    cifar=Setup("cifar100", "densenet40_40", epochs=300, batch_size=64, lr=0.1, weight_decay=1e-4,
                milestones=(150, 225), seeds=(0, 1, 2, 3), data_subdir="cifar100"),
    plantnet=Setup("plantnet", "resnet50", epochs=30, batch_size=32, lr=2e-3, weight_decay=1e-4, milestones=(20, 25),
                   seeds=(0, 1, 2), data_subdir="plantnet_300K",
                   model_options={"weights": "{data_root}/resnet50-imagenet.pth"}),
    imagenet_lt=Setup("imagenet_lt", "resnet34", epochs=100, batch_size=128, lr=1e-2, weight_decay=2e-3,
                      milestones=(60, 80), seeds=(0, 1, 2, 3), data_subdir="imagenet"),
    imagenet=Setup("imagenet", "resnet18", epochs=120, batch_size=256, lr=0.1, weight_decay=1e-4,
                   milestones=(30, 60, 90), seeds=(0, 1, 2), data_subdir="imagenet"),
    sweep_seeds=(0,), figure3_ks=(1, 2, 3, 5, 10, 20, 30, 40, 50), figure3_epochs=3, judges_training=True,
    level_set_points=150, replications=100, bound_samples=20_000,
)

GPU = calibrated(Profile(
    name="gpu",
    description="full-size synthetic stand-ins (the real datasets' numbers of images and classes; the 224-px ones "
                "rendered at 64 px to stay in GPU memory) with the paper's models, schedules and seeds; randomly "
                "initialised (no ImageNet weights for a stand-in)",
    cifar=replace(PAPER.cifar, dataset="cifar100_like", data_subdir="",
                  dataset_options={"per_class_train": 450, "per_class_val": 50, "per_class_test": 100}),
    plantnet=replace(PAPER.plantnet, dataset="plantnet_like", data_subdir="", model_options={},
                     dataset_options={"n_images": 306_146, "n_classes": 1081, "image_size": 64}),
    imagenet_lt=replace(PAPER.imagenet_lt, dataset="imagenet_lt_like", data_subdir="",
                        dataset_options={"n_images": 115_846, "n_classes": 1000, "image_size": 64}),
    imagenet=replace(PAPER.imagenet, dataset="imagenet_like", data_subdir="",
                     dataset_options={"per_class_train": 1231, "per_class_val": 50, "per_class_test": 50,
                                      "n_classes": 1000, "image_size": 64}),
    sweep_seeds=PAPER.sweep_seeds, figure3_ks=PAPER.figure3_ks, figure3_epochs=PAPER.figure3_epochs,
    judges_training=True, level_set_points=PAPER.level_set_points, replications=PAPER.replications,
    bound_samples=PAPER.bound_samples,
))

PROFILES = {profile.name: profile for profile in (SMOKE, QUICK, GPU, PAPER)}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; the profiles are {sorted(PROFILES)}")
    return PROFILES[name]
