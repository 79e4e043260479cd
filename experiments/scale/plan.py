"""Every distinct run of a profile, listed before anything trains: the same grids the notebooks call
(:data:`experiments.spec.grids.NOTEBOOK_GRIDS`), each training once (runs that differ only in their selection metric
are one training: :meth:`experiments.engine.config.RunConfig.siblings`), with the notebooks that read it, its work,
and what the results store holds of it.

    python -m experiments plan quick
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

import data_prep
from experiments.analysis.workload import run_images, stand_in_size
from experiments.engine.config import RunConfig
from experiments.engine.run_claim import live_holder
from experiments.engine.store import ResultsStore
from experiments.spec.grids import NOTEBOOK_GRIDS
from experiments.spec.profiles import SETUPS, Profile, Setup
from experiments.tuning.calibration import current_entry, shortest_search, todays

#: Notebooks whose result is the runs' own timing (Fig. 3's epoch times): their runs train with nothing beside them.
TIMED_NOTEBOOKS = ("fig3_epoch_time",)
STATES = ("finished", "diverged", "training", "queued", "partial", "missing")


@dataclass(frozen=True)
class PlannedRun:
    """One training of the profile: the config the first notebook asks for, the notebooks that read it."""

    config: RunConfig
    notebooks: tuple[str, ...]
    data_subdir: str | None  #: where its real dataset lives under the data root; None on a synthetic stand-in
    train_images: int | None  #: images through a training step over all epochs (full batches); None on real data
    val_images: int | None = None  #: images validated (after every epoch); None on real data
    test_images: int | None = None  #: images tested, at most (:func:`~experiments.analysis.workload.run_images`)
    #: its stand-in's images in the memory of the process that trains it (:class:`~experiments.analysis.workload.
    #: StandInSize`); None on real data, read from its files
    image_bytes: int | None = None

    @classmethod
    def outside_plan(cls, config: RunConfig) -> "PlannedRun":
        """A run on a stand-in that no notebook's grid holds (the calibration's), with its work: the progress line's
        images per second and time left count it."""
        if config.dataset not in data_prep.SYNTHETIC:
            return cls(config, ("calibration",), None, None)
        return _on_stand_in(config, ("calibration",), stand_in_size(config))

    @property
    def key(self) -> str:
        return self.config.key()

    @property
    def alone(self) -> bool:
        """True when its epoch times are a result: no other run may share the machine while it trains."""
        return any(notebook in TIMED_NOTEBOOKS for notebook in self.notebooks)

    def data_root(self, root: str | Path | None) -> Path | None:
        """The folder its dataset is read from, under the real datasets' ``root``; None on a stand-in."""
        if self.data_subdir is None:
            return None
        if root is None:
            raise data_prep.MissingDataError(
                f"run {self.key} trains on the real {self.config.dataset!r}: pass the datasets' root (--data-root)")
        return Path(root) / self.data_subdir


def missing_dataset_text(dataset: str, folder: Path, readers: str = "") -> str:
    """A real ``dataset`` not found in ``folder`` (``readers``: which runs read it), and the command that prepares
    it."""
    return (f"the {dataset} dataset{readers} is not in {folder}: `python -m data_prep {dataset} --root {folder}` "
            "prepares it")


def plan(profile: Profile, setups: tuple[str, ...] = SETUPS) -> list[PlannedRun]:
    """The profile's trainings in the notebooks' order, each once; those of ``setups`` (the profile's attributes:
    cifar, plantnet, imagenet_lt, imagenet) only."""
    first: dict[str, tuple] = {}  # training key -> (config, setup)
    readers: dict[str, list[str]] = {}
    datasets = {getattr(profile, name).dataset for name in setups}  # each setup has its own dataset
    for notebook, notebook_grids in NOTEBOOK_GRIDS.items():
        for grid in notebook_grids:
            for cell in (cell for cell in grid(profile) if cell.setup.dataset in datasets):
                training = cell.config.training_key()
                first.setdefault(training, (cell.config, cell.setup))
                if notebook not in readers.setdefault(training, []):
                    readers[training].append(notebook)
    return [planned_run(config, setup, tuple(readers[training])) for training, (config, setup) in first.items()]


def planned_run(config: RunConfig, setup: Setup, notebooks: tuple[str, ...]) -> PlannedRun:
    """The run of ``config`` on ``setup``'s data, read by ``notebooks``, with its work where its data is a stand-in."""
    if not setup.synthetic:
        return PlannedRun(config, notebooks, setup.data_subdir, None)
    return _on_stand_in(config, notebooks, stand_in_size(setup))


def _on_stand_in(config: RunConfig, notebooks: tuple[str, ...], size) -> PlannedRun:
    """The run of ``config`` on a stand-in of ``size``, with its work."""
    return PlannedRun(config, notebooks, None, *run_images(config, size), size.image_bytes)


@dataclass(frozen=True)
class CalibrationFirst:
    """What ``make calibrate`` trains at least for a stand-in before its notebooks, from an empty store: the runs of
    its shortest search (:func:`experiments.tuning.calibration.shortest_search`) move by move, each once, a move's
    runs waiting for the last's; and the notebooks' runs at the knobs it chooses, those it leaves to train after it and
    those it trains itself."""

    setup: str
    moves: list[list[PlannedRun]]
    notebooks_left: list[PlannedRun]
    notebooks_trained: list[PlannedRun]  #: as the notebooks plan them: among its runs, under another notebook name

    @property
    def runs(self) -> list[PlannedRun]:
        return [run for move in self.moves for run in move]


def calibration_first(profile: Profile, setup: str, searched: int | None = 1) -> CalibrationFirst:
    """:class:`CalibrationFirst` for ``setup``'s stand-in, its search averaging ``searched`` seeds (None: every seed;
    :func:`experiments.tuning.calibration.search_seeds`); a run two moves ask for trains once, in the first."""
    moves_asked, knobs = shortest_search(profile, setup, searched)
    seen, moves = set(), []
    for configs in moves_asked:
        move = []
        for config in configs:
            if config.training_key() not in seen:
                seen.add(config.training_key())
                move.append(planned_run(config, getattr(profile, setup), ("calibration",)))
        moves.append(move)
    calibrated = replace(profile, **{setup: replace(getattr(profile, setup), difficulty=knobs)})
    notebooks = plan(calibrated, (setup,))
    return CalibrationFirst(setup, [move for move in moves if move],
                            [run for run in notebooks if run.config.training_key() not in seen],
                            [run for run in notebooks if run.config.training_key() in seen])


def calibrations_to_make(profile: Profile, searched: int | None = 1) -> dict[str, CalibrationFirst]:
    """:func:`calibration_first` of each stand-in whose stored calibration is not current or was trained by earlier
    code, its search averaging ``searched`` seeds (None: every seed): what ``make calibrate`` trains first (nothing
    for a current one)."""
    return {setup: calibration_first(profile, setup, searched) for setup in profile.calibrated_setups
            if todays(current_entry(profile, setup)) is None}


def state(run: PlannedRun, store: ResultsStore) -> tuple[str, int]:
    """``("finished" | "diverged" | "training" | "partial" | "missing", epochs done)`` from the store's record,
    divergence, claims and checkpoint of ``run`` (a diverged run's epochs: those before its loss became NaN;
    training: a live process holds its claim, :func:`experiments.engine.run_claim.live_holder`)."""
    if store.finished(run.key) is not None:  # a damaged record is set aside: the run is trained again
        return "finished", run.config.epochs
    checkpoint = store.load_checkpoint(run.key)
    epochs = checkpoint["state"]["epoch"] if checkpoint is not None else 0
    if store.divergence(run.config.training_key()) is not None:
        return "diverged", epochs
    if live_holder(store.root, run.config.training_key()) is not None:
        return "training", epochs
    return ("partial", epochs) if checkpoint is not None else ("missing", 0)


def holder_text(holder: dict) -> str:
    """Who trains a run, as its claim names it: "HOST pid N, Slurm task A_I" (an array's task, as ``squeue`` names
    it), or "..., Slurm job J"."""
    job = (f", Slurm task {holder['slurm_task']}" if holder.get("slurm_task") else
           f", Slurm job {holder['slurm_job']}" if holder.get("slurm_job") else "")
    return f"{holder.get('host', 'an unnamed host')} pid {holder.get('pid', '?')}{job}"


def stacks(runs: list[PlannedRun], size: int, store: ResultsStore | None) -> list[list[PlannedRun]]:
    """``runs`` in groups that train stacked into one model (:func:`experiments.engine.train.run_stacked`), at most
    ``size`` to a group, in the plan's order: runs that share a :meth:`RunConfig.stack_signature` and the epochs
    their checkpoints in ``store`` reached (None: an empty store, every run at its start). Runs that train alone
    (:attr:`PlannedRun.alone`) and runs on real datasets (read from files, which stacks cannot share) are groups of
    one."""
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"'size' should be a positive number of runs stacked into one model, got {size!r}")
    groups, filling = [], {}  # the group each signature and epoch is filling
    for run in runs:
        if run.alone or run.data_subdir is not None or size == 1:
            groups.append([run])
            continue
        signature = (run.config.stack_signature(), state(run, store)[1] if store is not None else 0)
        group = filling.get(signature)
        if group is None or len(group) == size:  # a new group: the first of its kind, or the last one full
            group = filling[signature] = []
            groups.append(group)
        group.append(run)
    return groups


def stand_in_memory(runs: list[PlannedRun]) -> dict[str, float]:
    """The GiB that each stand-in's images of ``runs`` take in the memory of a process training one of them
    (:attr:`PlannedRun.image_bytes`), largest first."""
    return images_gib((run.config.dataset, run.image_bytes) for run in runs if run.image_bytes is not None)


def images_gib(image_bytes: Iterable[tuple[str, int]]) -> dict[str, float]:
    """(dataset, bytes of its images) pairs as GiB by dataset, largest first."""
    sizes = {dataset: size / 2 ** 30 for dataset, size in image_bytes}
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


def table(runs: list[PlannedRun], store: ResultsStore, groups: list[list[PlannedRun]] | None = None,
          queued: dict[str, str] | None = None, ended: dict[str, str] | None = None) -> str:
    """The plan as text: one line per run, then the totals by state; with ``groups`` (:func:`stacks`), each run's
    group and its size, and how many groups of each size. ``queued``: the Slurm task (its job id) of each run whose
    task waits in the queue (:func:`experiments.scale.slurm_queue.still_in_queue`): a partial or missing run is
    "queued". ``ended``: what to say of a partial or missing run whose last Slurm task left the queue (why it
    failed)."""
    group_of = {run.key: (number, len(group)) for number, group in enumerate(groups or [], 1) for run in group}
    lines = [f"{'key':16s} {'state':>9s} {'epochs':>9s} {'images':>13s}  " + "group      " * bool(groups) + "notebooks"]
    counts = dict.fromkeys(STATES, 0)
    for run in runs:
        status, done = state(run, store)
        if status in ("partial", "missing") and run.key in (queued or {}):
            status = "queued"
        counts[status] += 1
        images = f"{run.train_images:,}" if run.train_images is not None else "real data"
        group = f"{group_of[run.key][0]:>4d} (x{group_of[run.key][1]})".ljust(11) if groups else ""
        notes = "  (trained alone: its timings are the result)" if run.alone else ""
        if status == "training":
            notes += f"  (by {holder_text(live_holder(store.root, run.config.training_key()) or {})})"
        elif status == "queued":
            notes += f"  (Slurm task {queued[run.key]})"
        elif status in ("partial", "missing") and run.key in (ended or {}):
            notes += f"  ({ended[run.key]})"
        lines.append(f"{run.key:16s} {status:>9s} {done:>4d}/{run.config.epochs:<4d} {images:>13s}  {group}"
                     f"{', '.join(run.notebooks)}{notes}")
    counted = [run.train_images for run in runs if run.train_images is not None]
    images = (f"{sum(counted):,} training images in all" if len(counted) == len(runs) else
              f"{sum(counted):,} training images in the {len(counted)} runs on stand-ins (the others train on "
              "real data, not read to plan)" if counted else "training images of real data, not read to plan")
    lines.append(f"{len(runs)} runs: " + ", ".join(f"{counts[name]} {name}" for name in STATES) + f"; {images}")
    if memory := stand_in_memory(runs):
        lines.append("a run's process first holds its stand-in's images in memory (with --executor slurm, --mem-gb "
                     "must cover them and the process itself): "
                     + ", ".join(f"{dataset} {gib:.1f} GiB" if gib >= 0.1 else f"{dataset} {gib * 1024:.0f} MiB"
                                 for dataset, gib in memory.items()))
    if groups:
        sizes = sorted({len(group) for group in groups}, reverse=True)
        lines.append(f"{len(groups)} groups: " + ", ".join(
            f"{sum(len(group) == size for group in groups)} of {size} run{'s' * (size > 1)}" for size in sizes))
    return "\n".join(lines)
