"""How long a profile's planned runs would take on GPUs at the rates ``benchmarks.bench_concurrency`` measured,
grouped and scheduled as the ``local`` executor does it (:mod:`experiments.scale.executors`): an estimate.

With ``per_gpu`` workers on each of ``gpus`` GPUs and ``stack`` runs to a group (``make paper-figures PER_GPU=...
STACK=...``), the plan's groups (:func:`experiments.scale.plan.stacks`, from an empty store) go in the plan's order to
whichever worker is free first, the GPUs in turn; the runs that must train alone follow, one after another. A worker's
group takes:

- its compilation: the measured warm-up (compilation and the first steps) of the setting that stands for the group,
  for every group, though a process's later compilations find inductor's caches warm (so this part is an upper
  bound);
- its training images and its validation images (a stack validates in one pass), and its test images
  (:func:`experiments.analysis.workload.run_images`: at most a pass per selection metric) as lone runs, since each run
  of a stack is tested alone, each at its share of the GPU's rate.

The workers at work on a GPU share its aggregate rate: the one measured with as many processes, interpolated between
the counts measured (none: no rate), so that the last groups, with idle workers beside them, go faster. A compiling
worker counts as one at work though it leaves the GPU to the others: that part is conservative too.

The setting that stands for a group is the one measured with ``per_gpu`` processes whose stack is the largest no
larger than the group: a smaller stack's rate where the group's own size was not measured. A part whose rate was not
measured is left out, and said to be. The rates are cross-entropy's: the paper's losses add their own cost (Fig. 3);
the dataset's generation and the processes' start are not counted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from experiments.scale.plan import CalibrationFirst, PlannedRun, stacks

#: The parts of a group's time, in the order the texts name them.
PARTS = ("compilation", "validation", "testing")


#: The columns of ``concurrency.csv`` an estimate reads (``eval_images_per_s`` and ``warmup_s`` where measured).
RATE_COLUMNS = ("device", "device_name", "date", "model", "batch_size", "compile", "concurrency",
                "aggregate_images_per_s")


def read_measurements(csv_path: Path) -> list[dict]:
    """The rows of a ``concurrency.csv`` (``benchmarks.bench_concurrency``'s), those without a date left out;
    raises FileNotFoundError or ValueError naming the file and what it lacks."""
    path = Path(csv_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: `bash benchmarks/gpu_session.sh stacked reduce-overhead 2 4 "
                                "8` (or its `concurrency` stage) writes the measured rates on a GPU")
    with path.open() as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in RATE_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} is not a CSV of benchmarks.bench_concurrency: it lacks the columns {missing}")
        return [row for row in reader if row["date"]]


def _model_and_batch(run: PlannedRun) -> tuple[str, str] | None:
    """What a measurement must have trained to stand for ``run``: its model and batch size, as a ``concurrency.csv``
    row spells them; None for a run on real data, whose images are not counted."""
    return (run.config.model, str(run.config.batch_size)) if run.train_images is not None else None


def models_and_batches(runs: list[PlannedRun]) -> set[tuple[str, str]]:
    """The models and batch sizes that ``runs`` on stand-ins train (:func:`_model_and_batch`)."""
    return {trained for run in runs if (trained := _model_and_batch(run)) is not None}


def invocations(rows: list[dict], runs: list[PlannedRun]) -> list[list[dict]]:
    """The invocations of ``bench_concurrency`` in ``rows`` (rows sharing a date, in their order) that ran on CUDA
    with the model and batch size of some of ``runs`` on stand-ins, as ``make`` trains them: not those that let cuDNN
    time its algorithms first (``--cudnn-benchmark``), which the engine never does."""
    trained = models_and_batches(runs)
    by_date: dict[str, list[dict]] = {}
    for row in rows:
        if (row["device"] == "cuda" and (row["model"], row["batch_size"]) in trained
                and row.get("cudnn_benchmark") != "True"):
            by_date.setdefault(row["date"], []).append(row)
    return list(by_date.values())


def runs_measured_by(runs: list[PlannedRun], row: dict) -> list[PlannedRun]:
    """The ``runs`` on stand-ins that train the model and batch size of a ``concurrency.csv`` row: those its rates
    stand for."""
    return [run for run in runs if _model_and_batch(run) == (row["model"], row["batch_size"])]


@dataclass(frozen=True)
class Rates:
    """One measurement's figures for one GPU by setting (processes on the GPU, runs stacked in each): training and
    validation images per second summed over its processes (validation: every run of a stack counted), and the
    seconds of a process's warm-up (compilation included), where they were measured."""

    train: dict[tuple[int, int], float]
    validation: dict[tuple[int, int], float]
    warmup_s: dict[tuple[int, int], float]

    @classmethod
    def from_rows(cls, rows: list[dict]) -> Rates:
        """From the rows of ``concurrency.csv`` that one invocation of ``bench_concurrency`` wrote (older rows lack
        the validation rate and the warm-up)."""
        rates = cls({}, {}, {})
        for row in rows:
            setting = (int(row["concurrency"]), int(row.get("stack") or 1))
            for figures, column in ((rates.train, "aggregate_images_per_s"), (rates.validation, "eval_images_per_s"),
                                    (rates.warmup_s, "warmup_s")):
                if row.get(column) and float(row[column]) > 0:  # a rate of 0 was not measured
                    figures[setting] = float(row[column])
        return rates

    def measured_for(self, per_gpu: int, runs: int) -> tuple[int, int] | None:
        """The measured setting that stands for ``per_gpu`` processes training groups of ``runs``: the largest stack
        measured with ``per_gpu`` processes that is no larger than the group; None if there is none."""
        stacked = [stack for processes, stack in self.train if processes == per_gpu and stack <= runs]
        return (per_gpu, max(stacked)) if stacked else None


@dataclass(frozen=True)
class Estimate:
    """A profile part's hours on ``gpus`` GPUs with ``per_gpu`` workers on each, ``stack`` runs to a group, and the
    parts of :data:`PARTS` left out for want of a measured rate."""

    per_gpu: int
    stack: int
    gpus: int
    hours: float
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class Part:
    """One part of a group's work: ``amount`` seconds of compilation, or ``amount`` images trained, validated or
    tested at the rates of ``table`` (``Rates.train`` or ``Rates.validation``) for runs stacked by ``stack``."""

    amount: float
    table: dict[tuple[int, int], float] | None  #: None: wall-clock seconds
    stack: int

    def rate(self, busy: int) -> float:
        """Its progress a second on a GPU where ``busy`` workers are at work: a share of the GPU's aggregate rate for
        ``busy`` processes, interpolated linearly between the counts measured for this stack, from none at 0 (a count
        above every measured one is not asked for: the workers' own count is measured)."""
        if self.table is None:
            return 1.0
        counts = sorted(processes for processes, stack in self.table if stack == self.stack)
        upper = next(count for count in counts if count >= busy)
        lower = max((count for count in counts if count < busy), default=0)
        high, low = self.table[(upper, self.stack)], self.table.get((lower, self.stack), 0.0)
        return (low + (high - low) * (busy - lower) / (upper - lower)) / busy


def _in_order(parts: set[str]) -> tuple[str, ...]:
    """``parts`` (of :data:`PARTS`) in the order the texts name them."""
    return tuple(part for part in PARTS if part in parts)


def group_parts(group: list[PlannedRun], rates: Rates, per_gpu: int) -> tuple[list[Part], set[str]] | None:
    """The parts of the work of ``group`` for a worker, one of ``per_gpu`` on its GPU (as the module says), and the
    parts left out for want of a rate measured with ``per_gpu`` processes; None where no measured setting stands for
    the group."""
    setting = rates.measured_for(per_gpu, len(group))
    if setting is None:
        return None
    stack = setting[1]
    parts, left_out = [Part(sum(run.train_images for run in group), rates.train, stack)], set()
    for name, parts_stack, images in (("validation", stack, "val_images"), ("testing", 1, "test_images")):
        if (per_gpu, parts_stack) in rates.validation:
            parts.append(Part(sum(getattr(run, images) for run in group), rates.validation, parts_stack))
        else:
            left_out.add(name)
    if setting in rates.warmup_s:
        parts.insert(0, Part(rates.warmup_s[setting], None, stack))
    else:
        left_out.add("compilation")
    return [part for part in parts if part.amount > 0], left_out


def makespan(groups: list[list[Part]], per_gpu: int, gpus: int) -> float:
    """Seconds until the last of ``groups`` is done, each sent in turn to the first free of ``per_gpu`` workers on each
    of ``gpus`` GPUs (worker ``w`` on GPU ``w % gpus``, as :func:`experiments.scale.executors.slots` orders them), the
    workers at work on a GPU sharing its rate (:meth:`Part.rate`)."""
    queue = [list(group) for group in reversed(groups) if group]

    def next_group() -> list[list] | None:  # its parts, each with the amount left
        return [[part, part.amount] for part in queue.pop()] if queue else None

    working = [next_group() for _ in range(per_gpu * gpus)]
    now = 0.0
    while any(working):
        busy = [sum(1 for worker in working[gpu::gpus] if worker) for gpu in range(gpus)]
        speeds = {slot: worker[0][0].rate(busy[slot % gpus]) for slot, worker in enumerate(working) if worker}
        elapsed = min(working[slot][0][1] / speed for slot, speed in speeds.items())
        now += elapsed
        for slot, speed in speeds.items():
            worker = working[slot]
            worker[0][1] -= speed * elapsed
            if worker[0][1] <= 1e-9 * worker[0][0].amount:
                worker.pop(0)
            if not worker:  # its group is done: the next one, if any
                working[slot] = next_group()
    return now


def estimate(runs: list[PlannedRun], rates: Rates, *, per_gpu: int, stack: int, gpus: int) -> Estimate | None:
    """The hours of ``runs`` (a plan's, on stand-ins: their images are known) scheduled as the module says; None
    where a group's rate was not measured."""
    side_by_side = [group_parts(group, rates, per_gpu)
                    for group in stacks([run for run in runs if not run.alone], stack, None)]
    alone = [group_parts([run], rates, 1) for run in runs if run.alone]
    if None in side_by_side or None in alone:
        return None
    seconds = (makespan([parts for parts, _ in side_by_side], per_gpu, gpus)
               + makespan([parts for parts, _ in alone], 1, 1))
    left_out = set().union(*(parts for _, parts in side_by_side + alone))
    return Estimate(per_gpu, stack, gpus, seconds / 3600, _in_order(left_out))


def estimate_moves(moves: list[list[PlannedRun]], rates: Rates, *, per_gpu: int, gpus: int) -> Estimate | None:
    """The hours of runs trained move by move, each move's runs side by side once the last move's are done, as
    ``make calibrate`` trains its search (one run to a group): the sum of each move's :func:`estimate`; None where a
    move's rate was not measured."""
    found = [estimate(move, rates, per_gpu=per_gpu, stack=1, gpus=gpus) for move in moves]
    if None in found:
        return None
    left_out = {part for each in found for part in each.left_out}
    return Estimate(per_gpu, 1, gpus, sum(each.hours for each in found),
                    _in_order(left_out))


def calibration_first_then(notebooks: Estimate, first: CalibrationFirst, rates: Rates) -> Estimate | None:
    """The hours of ``first``'s calibration (its runs alone, move after move), then of the notebooks' runs it left,
    at the setting of ``notebooks`` (their estimate from an empty store): at least, since it is the shortest search;
    None where a part's rate was not measured."""
    moves = estimate_moves(first.moves, rates, per_gpu=notebooks.per_gpu, gpus=notebooks.gpus)
    left = estimate(first.notebooks_left, rates, per_gpu=notebooks.per_gpu, stack=notebooks.stack,
                    gpus=notebooks.gpus)
    if moves is None or left is None:
        return None
    left_out = set(moves.left_out) | set(left.left_out)
    return Estimate(notebooks.per_gpu, notebooks.stack, notebooks.gpus, moves.hours + left.hours,
                    _in_order(left_out))


def fastest(runs: list[PlannedRun], rates: Rates, gpus: int) -> Estimate | None:
    """Of the measured settings, each taken as ``PER_GPU`` and ``STACK`` on ``gpus`` GPUs, the one whose estimate
    leaves the fewest parts out, and of those the fastest."""
    estimates = [estimate(runs, rates, per_gpu=per_gpu, stack=stack, gpus=gpus) for per_gpu, stack in rates.train]
    return min((found for found in estimates if found is not None), key=completeness_then_hours, default=None)


def completeness_then_hours(found: Estimate) -> tuple[int, float]:
    """The order of :func:`fastest`: estimates that count more parts first, then fewer hours."""
    return len(found.left_out), found.hours


def setting_text(found: Estimate) -> str:
    """The make options of an estimate's setting: "`PER_GPU=1 STACK=8`"."""
    return f"`PER_GPU={found.per_gpu} STACK={found.stack}`"


def counted_text(found: Estimate) -> str:
    """What the hours count: "training, compilation, validation and testing counted", or "training and validation
    counted; compilation and testing not measured"."""
    def listed(parts: list[str]) -> str:
        return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]

    counted = listed(["training", *(part for part in PARTS if part not in found.left_out)]) + " counted"
    return counted + (f"; {listed(list(found.left_out))} not measured" if found.left_out else "")
