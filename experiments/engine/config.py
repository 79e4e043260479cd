"""The typed configuration of one training run, checked before anything is trained, and its key in the results store."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

from data_prep.synthetic import GENERATOR_VERSIONS

SELECTION = re.compile(r"^(macro_)?top(\d+)$")


def selection_metrics(eval_ks: tuple[int, ...]) -> tuple[str, ...]:
    """Every metric a run evaluated at ``eval_ks`` can select its model on: top-K and macro-average top-K."""
    return tuple(f"{macro}top{k}" for k in eval_ks for macro in ("", "macro_"))


def _check_parts(dataset: str, dataset_options: dict, model: str, model_options: dict, loss: str,
                 loss_options: dict) -> None:
    """Raise ``ValueError`` unless the registries know the dataset, model and loss named, and take their options."""
    import data_prep  # the registries are imported here: reading a config needs neither torch nor the data
    from experiments.engine.models import MODELS, model_options as options_of
    from topk.losses import LOSSES, build_loss

    for name, value, choices in (("dataset", dataset, data_prep.DATASETS), ("model", model, MODELS),
                                 ("loss", loss, LOSSES)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; the {name}{'es' if name == 'loss' else 's'} are {sorted(choices)}")
    data_prep.check_options(dataset, dataset_options)
    unknown = sorted(set(model_options) - set(options_of(model)))
    if unknown:
        raise ValueError(f"unknown model_options {unknown} of the model {model!r}; its options are {options_of(model)}")
    try:  # built once, on two classes: the loss's own checks of its parameters' names and values
        build_loss(loss, class_counts=[1, 1], **loss_options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"'loss_options' {loss_options} of the loss {loss!r}: {error}") from None


#: The fields runs trained stacked into one model share (:meth:`RunConfig.stack_signature`).
STACK_FIELDS = ("dataset", "dataset_options", "model", "model_options", "epochs", "batch_size", "lr", "weight_decay",
                "milestones", "lr_gamma", "momentum")

#: The parts already checked, by their ``repr`` (which tells a tuple from a list and 1 from 1.0 or True): a grid makes
#: thousands of configs from a few dozen datasets, models and losses with their options.
_CHECKED_PARTS: set[str] = set()


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's result. Execution details (device, data root, workers) are not part of it."""

    dataset: str
    model: str
    loss: str
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    milestones: tuple[int, ...] = ()  #: epochs at which the learning rate is multiplied by ``lr_gamma``
    lr_gamma: float = 0.1
    momentum: float = 0.9  #: SGD with Nesterov momentum, as in every experiment of the paper
    seed: int = 0
    selection_metric: str = "top5"  #: "top<K>" or "macro_top<K>" on the validation set
    eval_ks: tuple[int, ...] = (1, 5)
    dataset_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    loss_options: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "milestones", tuple(self.milestones))
        object.__setattr__(self, "eval_ks", tuple(self.eval_ks))
        self.validate()

    def validate(self) -> None:
        """Refuse a bad value with a message naming it and what was expected."""
        for name in ("dataset_options", "model_options", "loss_options"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"'{name}' should be a mapping of option names to values, got {getattr(self, name)!r}")
        parts = (self.dataset, self.dataset_options, self.model, self.model_options, self.loss, self.loss_options)
        if repr(parts) not in _CHECKED_PARTS:  # a refused config raises here every time: only passed parts are kept
            _check_parts(*parts)
            _CHECKED_PARTS.add(repr(parts))
        for name in ("epochs", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"'{name}' should be a positive integer, got {getattr(self, name)!r}")
        for name in ("lr", "weight_decay", "momentum", "lr_gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ValueError(f"'{name}' should be a number >= 0, got {value!r}")
        if list(self.milestones) != sorted(set(self.milestones)) or any(not 0 < m < self.epochs for m in self.milestones):
            raise ValueError(f"'milestones' should be increasing epochs in (0, {self.epochs}), got {self.milestones}")
        if not self.eval_ks or any(not isinstance(k, int) or k < 1 for k in self.eval_ks):
            raise ValueError(f"'eval_ks' should be positive integers, got {self.eval_ks}")
        match = SELECTION.match(self.selection_metric)
        if not match or int(match.group(2)) not in self.eval_ks:
            raise ValueError(f"'selection_metric' should be 'top<K>' or 'macro_top<K>' with K in eval_ks "
                             f"{self.eval_ks}, got {self.selection_metric!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; the fields are {sorted(cls.__dataclass_fields__)}")
        return cls(**values)

    def key(self) -> str:
        """A stable name for the run: a hash of its canonical JSON (16 hex digits), with the version of a synthetic
        stand-in's drawing where it changed since its first (:data:`data_prep.synthetic.GENERATOR_VERSIONS`)."""
        fields = self.to_dict()
        if self.dataset in GENERATOR_VERSIONS:
            fields["generator_version"] = GENERATOR_VERSIONS[self.dataset]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def siblings(self) -> list["RunConfig"]:
        """This run at every selection metric of its ``eval_ks``, itself included: one training serves them all, as
        the metric only picks the epoch whose model is tested."""
        return [self.replace(selection_metric=metric) for metric in selection_metrics(self.eval_ks)]

    def training_key(self) -> str:
        """The key shared by this run's :meth:`siblings`: what is actually trained."""
        return self.replace(selection_metric=selection_metrics(self.eval_ks)[0]).key()

    def _stack_values(self) -> dict[str, str]:
        """Each field of :data:`STACK_FIELDS` as canonical JSON (a tuple and its list, key orders, compare equal)."""
        return {name: json.dumps(getattr(self, name), sort_keys=True) for name in STACK_FIELDS}

    def stack_signature(self) -> str:
        """What runs trained stacked into one model (:func:`experiments.engine.train.run_stacked`) share: the data,
        the architecture, the batches and the optimiser's settings and schedule (the loss, the seed and the
        selection may differ), as canonical JSON."""
        return json.dumps(self._stack_values(), sort_keys=True)

    def stack_differences(self, other: "RunConfig") -> list[str]:
        """The fields of :data:`STACK_FIELDS` in which this run and ``other`` differ, with both values."""
        mine, theirs = self._stack_values(), other._stack_values()
        return [f"{name} {getattr(self, name)!r} against {getattr(other, name)!r}" for name in STACK_FIELDS
                if mine[name] != theirs[name]]

    def replace(self, **changes) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **changes})


def stack_mismatch(configs: list[RunConfig]) -> tuple[RunConfig, str] | None:
    """Why ``configs`` cannot train stacked into one model: the first run that differs from the first, and in what
    (:meth:`RunConfig.stack_differences`, joined); None when they can."""
    for config in configs[1:]:
        if differences := config.stack_differences(configs[0]):
            return config, "; ".join(differences)
    return None
