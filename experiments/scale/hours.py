"""How long a profile's planned runs take on GPUs at the rates ``benchmarks.bench_concurrency`` measured, grouped and
scheduled as the ``local`` executor does it (:mod:`experiments.scale.executors`).

With ``per_gpu`` workers on each of ``gpus`` GPUs and ``stack`` runs to a group (``make paper-figures PER_GPU=...
STACK=...``), the plan's groups (:func:`experiments.scale.plan.stacks`, from an empty store) go in the plan's order to
whichever worker is free first; the runs that must train alone follow, one after another. A group takes its runs'
training images at the measured training rate, and their evaluated images (:func:`experiments.analysis.workload.
run_images`) at the measured evaluation rate: the rates of ``per_gpu`` processes on one GPU, each training the largest
stack measured that is no larger than the group (where the group's own size was not measured, a smaller stack's rate
stands in for it). Evaluation counts where it was measured. The rates are cross-entropy's: the paper's losses add
their own cost (Fig. 3).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from experiments.scale.plan import PlannedRun, stacks


@dataclass(frozen=True)
class Rates:
    """One measurement's images per second of one GPU, summed over its processes, by (processes on the GPU, runs
    stacked in each): of training, and of evaluation where it was timed (images of every run of a stack counted)."""

    train: dict[tuple[int, int], float]
    evaluation: dict[tuple[int, int], float]

    @classmethod
    def from_rows(cls, rows: list[dict]) -> Rates:
        """From the rows of ``concurrency.csv`` that one invocation of ``bench_concurrency`` wrote."""
        train, evaluation = {}, {}
        for row in rows:
            setting = (int(row["concurrency"]), int(row.get("stack") or 1))
            train[setting] = float(row["aggregate_images_per_s"])
            if row.get("eval_images_per_s"):
                evaluation[setting] = float(row["eval_images_per_s"])
        return cls(train, evaluation)

    def measured_for(self, per_gpu: int, runs: int) -> tuple[int, int] | None:
        """The measured setting that stands for ``per_gpu`` processes training groups of ``runs``: the largest stack
        measured with ``per_gpu`` processes that is no larger than the group; None if there is none."""
        stacked = [stack for processes, stack in self.train if processes == per_gpu and stack <= runs]
        return (per_gpu, max(stacked)) if stacked else None


@dataclass(frozen=True)
class Estimate:
    """A profile part's hours on ``gpus`` GPUs with ``per_gpu`` workers on each, ``stack`` runs to a group."""

    per_gpu: int
    stack: int
    gpus: int
    hours: float
    evaluated: bool  #: evaluation counted: every rate it needed was measured


def group_seconds(group: list[PlannedRun], rates: Rates, per_gpu: int) -> tuple[float, bool] | None:
    """Seconds a worker, one of ``per_gpu`` on its GPU, takes to train ``group`` and whether its evaluation is counted
    in them; None where no rate stands for it."""
    setting = rates.measured_for(per_gpu, len(group))
    if setting is None:
        return None
    seconds = sum(run.train_images for run in group) / (rates.train[setting] / per_gpu)
    if setting not in rates.evaluation:
        return seconds, False
    return seconds + sum(run.eval_images for run in group) / (rates.evaluation[setting] / per_gpu), True


def estimate(runs: list[PlannedRun], rates: Rates, *, per_gpu: int, stack: int, gpus: int) -> Estimate | None:
    """The hours of ``runs`` (a plan's, on stand-ins: their images are known) scheduled as the module says; None
    where a group's rate was not measured."""
    side_by_side = [group_seconds(group, rates, per_gpu)
                    for group in stacks([run for run in runs if not run.alone], stack, None)]
    alone = [group_seconds([run], rates, 1) for run in runs if run.alone]
    if None in side_by_side or None in alone:
        return None
    workers = [0.0] * (gpus * per_gpu)  # when each worker is free: the next group goes to the first free
    for seconds, _ in side_by_side:
        heapq.heappush(workers, heapq.heappop(workers) + seconds)
    hours = (max(workers) + sum(seconds for seconds, _ in alone)) / 3600
    return Estimate(per_gpu, stack, gpus, hours, all(evaluated for _, evaluated in side_by_side + alone))


def setting_text(found: Estimate) -> str:
    """The make options of an estimate's setting: "`PER_GPU=1 STACK=8`"."""
    return f"`PER_GPU={found.per_gpu} STACK={found.stack}`"


def fastest(runs: list[PlannedRun], rates: Rates, gpus: int) -> Estimate | None:
    """The fastest of the measured settings, each taken as ``PER_GPU`` and ``STACK``, on ``gpus`` GPUs."""
    estimates = [estimate(runs, rates, per_gpu=per_gpu, stack=stack, gpus=gpus) for per_gpu, stack in rates.train]
    return min((found for found in estimates if found is not None), key=lambda found: found.hours, default=None)
