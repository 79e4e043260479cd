"""Executors that train a profile's planned runs into its results store: ``inline`` (one after another in this process)
and ``local`` (worker processes side by side on one machine: ``jobs`` on the CPU, or ``per_gpu`` on each visible GPU).

Every run trains under the store's claim (:func:`experiments.engine.run_claim.train_once`), so executors, notebooks
and other machines sharing a store never train one run twice at once. A run that fails is logged to
``<store>/logs/<key>.log`` and the others go on; a worker that dies is replaced, its run resumed later from its
checkpoint by the next ``train``. Runs whose timings are the result (:attr:`PlannedRun.alone`) train last, in this
process, with nothing beside them.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import torch

from experiments.engine.run_claim import train_once
from experiments.engine.store import ResultsStore
from experiments.scale.plan import PlannedRun
from experiments.scale.progress import Progress


@dataclass(frozen=True)
class TrainOptions:
    """How each run is trained; none of it enters a run's config or key."""

    store: str
    device: str = "cpu"
    data_root: str | None = None
    workers: int | None = None  #: processes reading an image-folder dataset
    compile_mode: str | None = None
    threads: int = 0  #: torch CPU threads of the process (0: torch's default)


def train_run(run: PlannedRun, options: TrainOptions, device: str | None = None) -> dict:
    """``run``'s record, trained (or read back) with ``options``; waits for another process that holds its claim."""
    if options.threads:
        torch.set_num_threads(options.threads)
    return train_once(run.config, ResultsStore(options.store), device=device or options.device,
                      data_root=run.data_root(options.data_root), num_workers=options.workers,
                      compile_mode=options.compile_mode)


def log_path(options: TrainOptions, run: PlannedRun) -> Path:
    return Path(options.store) / "logs" / f"{run.key}.log"


def _log_failure(options: TrainOptions, run: PlannedRun, error: BaseException) -> str:
    path = log_path(options, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write("".join(traceback.format_exception(error)))
    return str(path)


def inline(runs: list[PlannedRun], options: TrainOptions, progress: Progress) -> None:
    """Train ``runs`` one after another in this process."""
    for run in runs:
        progress.start(run)
        try:
            train_run(run, options)
        except Exception as error:  # one failed run must not stop the others: it is logged and named
            progress.fail(run, _log_failure(options, run, error))
        else:
            progress.finish(run)


def slots(jobs: int, per_gpu: int | None, device: str) -> list[str]:
    """The device of each worker: ``per_gpu`` workers on each visible GPU, else ``jobs`` workers on ``device``."""
    if per_gpu is not None:
        if per_gpu < 1:
            raise ValueError(f"'per_gpu' should be a positive number of runs per GPU, got {per_gpu}")
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError("'per_gpu' was given, but torch sees no CUDA device here: use --jobs on the CPU")
        return [f"cuda:{gpu}" for gpu in range(gpus) for _ in range(per_gpu)]
    if jobs < 1:
        raise ValueError(f"'jobs' should be a positive number of worker processes, got {jobs}")
    return [device] * jobs


def cpu_threads(workers: int) -> int:
    """The machine's usable cores split between ``workers`` processes (at least one each)."""
    return max(1, len(os.sched_getaffinity(0)) // workers)


def local(runs: list[PlannedRun], options: TrainOptions, progress: Progress, *, jobs: int = 1,
          per_gpu: int | None = None) -> None:
    """Train ``runs`` in worker processes side by side (see :func:`slots`), each with its share of the CPU threads,
    then the runs that must train alone, in this process."""
    devices = slots(jobs, per_gpu, options.device)
    threads = options.threads or cpu_threads(len(devices))
    side_by_side = [run for run in runs if not run.alone]
    if side_by_side:
        _Pool(devices, options, threads, progress).train(side_by_side)
    inline([run for run in runs if run.alone], options, progress)


class _Pool:
    """Worker processes, each sent one run at a time over its own pipe, so that a dead worker's run is known."""

    def __init__(self, devices: list[str], options: TrainOptions, threads: int, progress: Progress):
        self.devices, self.options, self.threads, self.progress = devices, options, threads, progress
        self.context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
        self.workers: dict[int, tuple] = {}  # slot -> (process, connection, the run it trains or None)

    def _start(self, slot: int) -> None:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child, self.devices[slot], self.options, self.threads),
                                       name=f"topk-worker-{slot}", daemon=True)
        process.start()
        child.close()
        self.workers[slot] = (process, parent, None)

    def _send(self, slot: int, run: PlannedRun) -> None:
        process, connection, _ = self.workers[slot]
        connection.send(run)
        self.workers[slot] = (process, connection, run)
        self.progress.start(run)

    def train(self, runs: list[PlannedRun]) -> None:
        queue = list(reversed(runs))
        for slot in range(min(len(self.devices), len(runs))):
            self._start(slot)
            self._send(slot, queue.pop())
        try:
            while any(run is not None for _, _, run in self.workers.values()):
                self._collect(queue)
        finally:
            for process, connection, _ in self.workers.values():
                try:
                    connection.send(None)
                except OSError:
                    pass
                process.join(timeout=5)
                if process.is_alive():
                    process.terminate()

    def _collect(self, queue: list[PlannedRun]) -> None:
        busy = {slot: worker for slot, worker in self.workers.items() if worker[2] is not None}
        ready = wait([connection for _, connection, _ in busy.values()] + [process.sentinel for process, _, _ in busy.values()])
        for slot, (process, connection, run) in busy.items():
            if connection in ready and connection.poll():
                outcome, detail = connection.recv()
                if outcome == "finished":
                    self.progress.finish(run)
                else:
                    self.progress.fail(run, detail)
            elif process.sentinel in ready and not process.is_alive():
                path = log_path(self.options, run)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as handle:
                    handle.write(f"worker process {process.pid} died (exit code {process.exitcode}) while training "
                                 f"this run; its checkpoint is kept, the next `train` resumes it\n")
                self.progress.fail(run, str(path))
                connection.close()
                self._start(slot)
            else:
                continue
            self.workers[slot] = (*self.workers[slot][:2], None)
            if queue:
                self._send(slot, queue.pop())


def _worker(connection, device: str, options: TrainOptions, threads: int) -> None:
    """A worker process: trains each run it is sent, with its output in the run's log, until it is sent None."""
    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    while (run := connection.recv()) is not None:
        path = log_path(options, run)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log:
            sys.stdout.flush(), sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            try:
                train_run(run, options, device)
                outcome = ("finished", None)
            except Exception as error:  # reported to the parent, which names the run and its log
                traceback.print_exc()
                outcome = ("failed", str(path))
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[0]), os.close(saved[1])
        connection.send(outcome)
