"""The tuned values a profile carries: typed entries of ``experiments/calibrated/*.json``, read and written here only.

Two steps run once per profile (:mod:`experiments.tuning.fixed_point`) and keep what they chose for each setup:

- ``<profile>.json``: a :class:`Calibration` per synthetic stand-in, its difficulty knobs fitted with cross-entropy
  alone to the paper's CE numbers (:mod:`experiments.tuning.calibration`);
- ``<profile>_learning_rates.json``: a :class:`LearningRates` per setup, each loss's learning-rate multiplier chosen
  on validation data (:mod:`experiments.tuning.learning_rates`).

A file is ``{"profile": name, "setups": {setup: entry}}``, JSON with sorted keys written in one step (an interrupted
write leaves the previous file whole). An entry applies only to the setup it was made for: the setup's
:func:`fingerprint` must still be the one stored (:meth:`Calibration.fits`, :meth:`LearningRates.fits`), and a step
whose own specification changed since made it stale (``is_current``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from experiments.engine.store import atomic_write
from experiments.paths import CALIBRATED


def fingerprint(spec: dict) -> str:
    """A short hash of ``spec`` (JSON with sorted keys): an entry names what it was made for by it."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class _Entry:
    """What both files' entries share: JSON in and out. A field absent from a stored entry takes its default (the
    empty value, or what entries stored before it meant); an unknown field makes the entry unreadable."""

    _nested: dict = {}  #: field -> how to read its JSON

    @classmethod
    def from_json(cls, data: dict):
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} in a stored {cls.__name__} entry")
        return cls(**{name: cls._nested[name](value) if name in cls._nested else value
                      for name, value in data.items()})

    @classmethod
    def of(cls, entry):
        """``entry`` itself, or the typed form of a stored entry's JSON."""
        return entry if isinstance(entry, cls) else cls.from_json(entry)

    @classmethod
    def load(cls, path: Path) -> dict:
        """The entries of the file ``path``, by setup ({} without a file); ValueError if it cannot be read."""
        return _read(cls, path)[1]

    _new_fields: tuple[str, ...] = ()  #: fields entries stored before them lack: written only where not the default

    def to_json(self) -> dict:
        """Its JSON, without the :attr:`_new_fields` at their defaults (so an entry read and kept again is unchanged)."""
        defaults = {f.name: f.default for f in fields(self) if f.name in self._new_fields}
        return {name: value for name, value in asdict(self).items()
                if not (name in defaults and value == defaults[name])}


@dataclass(frozen=True)
class Number:
    """One of the paper's CE numbers (:class:`experiments.tuning.calibration.Target`) and ours at the chosen knobs."""

    label: str
    published: float  #: percent
    fitted: bool  #: False: held out
    ours: float  #: percent, the mean over the setup's seeds
    cell: tuple[tuple[str, object], ...] = ()  #: labels picking the CE run in the grid (beside loss and seed)
    metric: tuple[str, ...] = ()  #: path in the run's test metrics

    @classmethod
    def from_json(cls, data: dict) -> Number:
        return cls(**{**data, "cell": tuple(tuple(pair) for pair in data.get("cell", ())),
                      "metric": tuple(data.get("metric", ()))})


@dataclass(frozen=True)
class Point:
    """A point the calibration's search evaluated: the knobs, our numbers there (the searched seeds' mean), the fitted
    RMS gap."""

    knobs: dict
    values: dict  #: percent, by the number's label
    rms_gap: float  #: points

    @classmethod
    def from_json(cls, data: dict) -> Point:
        return cls(**data)


@dataclass(frozen=True)
class Calibration(_Entry):
    """The calibration of one stand-in, an entry of ``<profile>.json``."""

    dataset: str = ""
    knobs: dict = field(default_factory=dict)  #: the chosen difficulty knobs (:mod:`data_prep.synthetic`)
    start: dict = field(default_factory=dict)  #: where the search started
    targets: tuple[Number, ...] = ()  #: the paper's CE numbers and ours at the chosen knobs
    rms_gap_fitted: float = float("nan")  #: points, over the fitted numbers
    points: tuple[Point, ...] = ()  #: every point evaluated, in order
    ce_multipliers: dict = field(default_factory=dict)  #: CE's learning-rate multipliers by choice key (absent: 1)
    round: int = 1  #: the round of :mod:`experiments.tuning.fixed_point`
    setup_fingerprint: str = ""  #: :meth:`experiments.spec.profiles.Setup.fingerprint`
    search_fingerprint: str = ""  #: :meth:`experiments.tuning.calibration.StandIn.fingerprint`
    commit: str = ""
    seconds: float = 0.0  #: wall time of the search (runs found in the results store cost nothing)
    searched_seeds: tuple[int, ...] = ()  #: the seeds the points' numbers average (empty: every seed, as stored before)
    seed_spread: float | None = None  #: points: the seeds' spread at the start, which chose them (None: not measured)

    _nested = {"targets": lambda rows: tuple(map(Number.from_json, rows)),
               "points": lambda rows: tuple(map(Point.from_json, rows)), "searched_seeds": tuple}
    _new_fields = ("searched_seeds", "seed_spread")

    def fits(self, setup_fingerprint: str) -> bool:
        """Whether this calibration was made for the setup of ``setup_fingerprint``."""
        return self.setup_fingerprint == setup_fingerprint

    def is_current(self, setup_fingerprint: str, search_fingerprint: str) -> bool:
        """Whether it was made for this setup by this search."""
        return self.fits(setup_fingerprint) and self.search_fingerprint == search_fingerprint

    @property
    def fitted(self) -> tuple[Number, ...]:
        return tuple(number for number in self.targets if number.fitted)


@dataclass(frozen=True)
class Choice:
    """The learning-rate multiplier chosen for one loss and selection metric (its choice key) on one setup."""

    choice: str  #: :func:`experiments.spec.grids.choice_key`
    lr: float  #: the grid's learning rate
    multiplier: float  #: the one chosen
    validation: dict  #: the best validation value at each multiplier (f"{m:g}"), None where the loss became NaN
    run: str = ""  #: the key of the run at the grid's rate: the choice is stale once the grid's run changes

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        return cls(**data)


@dataclass(frozen=True)
class AtChosenRate:
    """One of CE's calibration numbers in the tables' own runs, at the learning rate CE chose."""

    ours: float  #: percent, the mean over ``seeds``
    multiplier: float
    seeds: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: dict) -> AtChosenRate:
        return cls(**{**data, "seeds": tuple(data.get("seeds", ()))})


@dataclass(frozen=True)
class LearningRates(_Entry):
    """The learning rates chosen on one setup, an entry of ``<profile>_learning_rates.json``."""

    dataset: str = ""
    multipliers: tuple[float, ...] = ()  #: the multipliers tried (the profile's ``lr_multipliers``)
    scales: dict = field(default_factory=dict)  #: the multiplier chosen, by choice key
    choices: tuple[Choice, ...] = ()
    cross_entropy: dict = field(default_factory=dict)  #: CE's calibration numbers at its chosen rate, by label
    setup_fingerprint: str = ""  #: :meth:`experiments.spec.profiles.Setup.tuned_fingerprint` (difficulty included)
    commit: str = ""
    seconds: float = 0.0

    _nested = {"multipliers": tuple, "choices": lambda rows: tuple(map(Choice.from_json, rows)),
               "cross_entropy": lambda numbers: {label: AtChosenRate.from_json(number)
                                                 for label, number in numbers.items()}}

    def fits(self, tuned_fingerprint: str, multipliers) -> bool:
        """Whether these rates were chosen for the setup of ``tuned_fingerprint`` among ``multipliers``."""
        return self.setup_fingerprint == tuned_fingerprint and self.multipliers == tuple(multipliers)

    def is_current(self, tuned_fingerprint: str, multipliers, runs: dict[str, str], seeds) -> bool:
        """:meth:`fits`, chosen from the runs ``runs`` (run key by choice key: a loss whose options changed is chosen
        again), with CE's numbers at the chosen rates averaged over ``seeds``."""
        return self.fits(tuned_fingerprint, multipliers) and bool(self.cross_entropy) \
            and all(number.seeds == tuple(seeds) for number in self.cross_entropy.values()) \
            and {choice.choice: choice.run for choice in self.choices} == runs


def calibration_path(profile_name: str) -> Path:
    return CALIBRATED / f"{profile_name}.json"


def learning_rates_path(profile_name: str) -> Path:
    return CALIBRATED / f"{profile_name}_learning_rates.json"


def _path(kind: type[_Entry], profile_name: str) -> Path:
    return (calibration_path if kind is Calibration else learning_rates_path)(profile_name)


def _read(kind: type[_Entry], path: Path) -> tuple[str | None, dict]:
    """The profile named in the file ``path`` (None without a file) and its entries, by setup."""
    if not path.exists():
        return None, {}
    try:
        stored = json.loads(path.read_text())
        return stored["profile"], {setup: kind.from_json(entry) for setup, entry in stored["setups"].items()}
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error})") from error


def calibrations(profile_name: str) -> dict[str, Calibration]:
    """The calibrations stored for a profile, by setup ({} without a file); ValueError if the file cannot be read."""
    return Calibration.load(calibration_path(profile_name))


def learning_rates(profile_name: str) -> dict[str, LearningRates]:
    """The learning rates stored for a profile, by setup ({} without a file); ValueError if it cannot be read."""
    return LearningRates.load(learning_rates_path(profile_name))


#: One writer of the files at a time in this process: the stand-ins calibrated side by side keep their entries from
#: threads of their own (:mod:`experiments.scale.calibrate`).
_KEEPING = threading.Lock()


def keep(profile_name: str, setup: str, entry: Calibration | LearningRates) -> None:
    """Store ``entry`` as ``setup``'s in its profile's file, the other setups' entries as they were (read and written
    under :data:`_KEEPING`, so that no thread's entry is lost)."""
    path = _path(type(entry), profile_name)
    with _KEEPING:
        name, stored = _read(type(entry), path)
        stored[setup] = entry
        text = json.dumps({"profile": name or profile_name, "setups": {s: e.to_json() for s, e in stored.items()}},
                          indent=1, sort_keys=True) + "\n"
        atomic_write(path, lambda tmp: tmp.write_text(text))
