"""Executors that train a profile's planned runs into its results store: ``inline`` (one after another in this process)
and ``local`` (worker processes side by side on one machine: ``jobs`` on the CPU, or ``per_gpu`` on each visible GPU).

Every run trains under the store's claim (:func:`experiments.engine.run_claim.train_once`), so executors, notebooks
and other machines sharing a store never train one run twice at once. With ``stack`` above 1, runs that share their
data, model and optimiser settings train that many at a time stacked into one model
(:func:`experiments.scale.plan.stacks`, :func:`experiments.engine.run_claim.train_stacked_once`); a worker then trains
a group. A run that fails is logged to ``<store>/logs/<key>.log`` (a group's, to its first run's) and the others go
on; a worker that dies is replaced, its runs resumed later from their checkpoints by the next ``train``. Runs whose
timings are the result (:attr:`PlannedRun.alone`) train last, in this process, with nothing beside them.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.resource_tracker
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable
from multiprocessing.connection import wait
from pathlib import Path

import torch

from data_prep.common import MissingDataError
from experiments.engine.batches import default_workers
from experiments.engine.run_claim import live_holder, train_once, train_stacked_once
from experiments.engine.store import ResultsStore, UnreadableStoreFile
from experiments.scale.gpu_sharing import side_by_side_note
from experiments.scale.memory import IMAGES_SHARE, group_image_bytes, images_budget
from experiments.scale.plan import PlannedRun, stacks
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
    stack: int = 1  #: runs stacked into one model (:func:`experiments.scale.plan.stacks`)
    #: leave a run whose claim another live process took meanwhile (another ``train`` on a shared store) to it,
    #: reported as :meth:`Progress.elsewhere` for the caller to follow, instead of waiting for it
    leave_held: bool = False


def train_group(group: list[PlannedRun], options: TrainOptions, device: str | None = None) -> list[dict | None]:
    """The records of ``group``, trained (or read back) with ``options``: one run alone, two or more stacked into one
    model; waits for another process that holds a run's claim, or with ``options.leave_held`` gives None for it."""
    if options.threads:
        torch.set_num_threads(options.threads)
    training = {"device": device or options.device, "data_root": group[0].data_root(options.data_root),
                "num_workers": options.workers, "compile_mode": options.compile_mode}
    store, wait = ResultsStore(options.store), not options.leave_held
    if len(group) == 1:
        return [train_once(group[0].config, store, wait=wait, **training)]
    return train_stacked_once([run.config for run in group], store, wait=wait, **training)


def _ended(group: list[PlannedRun], held: list[str], progress: Progress) -> None:
    """Report a group that trained: each run finished, but those whose keys are in ``held`` (another process took
    their claims, :attr:`TrainOptions.leave_held`), which are left to it."""
    for run in group:
        if run.key in held:
            progress.elsewhere(run)
        else:
            progress.finish(run)


def _held(group: list[PlannedRun], records: list[dict | None]) -> list[str]:
    """The keys of ``group``'s runs left to another process (no record: :func:`train_group`)."""
    return [run.key for run, record in zip(group, records) if record is None]


def groups(runs: list[PlannedRun], options: TrainOptions) -> list[list[PlannedRun]]:
    """What each worker (or each Slurm task) trains at a time: a run, or ``options.stack`` runs stacked."""
    return stacks(runs, options.stack, ResultsStore(options.store))


def log_path(options: TrainOptions, group: list[PlannedRun]) -> Path:
    """The log of a group's training: its first run's."""
    return Path(options.store) / "logs" / f"{group[0].key}.log"


def _append_to_log(options: TrainOptions, group: list[PlannedRun], text: str) -> str:
    """Append ``text`` to the group's log and return the log's path; where the log cannot be written (the store's
    disk full or gone), ``text`` goes to stderr instead, so that the failure is still reported with its reason."""
    path = log_path(options, group)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(text)
    except OSError as error:
        print(f"{text.rstrip()}\n(not written to {path}: {error})", file=sys.stderr, flush=True)
    return str(path)


def inline(runs: list[PlannedRun], options: TrainOptions, progress: Progress) -> None:
    """Train ``runs`` one after another (or one group after another) in this process."""
    for group in groups(runs, options):
        for run in group:
            progress.start(run)
        try:
            records = train_group(group, options)
        except Exception as error:  # one failed group must not stop the others: it is logged and named
            _report(group, options, progress,
                    _append_to_log(options, group, "".join(traceback.format_exception(error))))
        else:
            _ended(group, _held(group, records), progress)


def _report(group: list[PlannedRun], options: TrainOptions, progress: Progress, log: str) -> None:
    """After a group failed: its runs that finished all the same (a stack at another epoch) as finished, those whose
    loss became NaN (kept in the store) as diverged, those another process trains (a stack's run it left to them,
    :attr:`TrainOptions.leave_held`) as elsewhere, the others as failed, each with the group's log."""
    store = ResultsStore(options.store)
    for run in group:
        try:
            reported = progress.report_stored(run, store, log)
            if not reported and options.leave_held and live_holder(store.root, run.config.training_key()):
                progress.elsewhere(run)
                reported = True
        except OSError:  # the store unreadable: the run is not known to have ended well
            reported = False
        if not reported:
            progress.fail(run, log)


def slots(jobs: int, per_gpu: int | None, device: str) -> list[str]:
    """The device of each worker: ``per_gpu`` workers on each visible GPU (``device`` ``cuda``) or on GPU N alone
    (``cuda:N``), else ``jobs`` workers on ``device``. The GPUs take turns (``cuda:0``, ``cuda:1``, ..., ``cuda:0``,
    ...), so that the first groups, and fewer groups than workers, spread over every GPU."""
    if per_gpu is not None:
        if per_gpu < 1:
            raise ValueError(f"'per_gpu' (--per-gpu) should be a positive number of runs per GPU, got {per_gpu}")
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError("'per_gpu' (--per-gpu) was given, but torch sees no CUDA device here: use --jobs on "
                             "the CPU")
        if not device.startswith("cuda"):
            raise ValueError(f"'per_gpu' (--per-gpu) places runs on GPUs, but the device is {device!r}: give --device "
                             "cuda (every visible GPU) or cuda:N (GPU N alone), or --jobs on the CPU")
        if device != "cuda":
            if int(device.split(":")[1]) >= gpus:
                raise ValueError(f"device {device!r} was asked for, but torch sees {gpus} CUDA device(s) here "
                                 f"(cuda:0 to cuda:{gpus - 1})")
            return [device] * per_gpu
        return [f"cuda:{gpu}" for _ in range(per_gpu) for gpu in range(gpus)]
    if jobs < 1:
        raise ValueError(f"'jobs' (--jobs) should be a positive number of worker processes, got {jobs}")
    return [device] * jobs


def device_refusal(device: str, *, trains_here: bool = True) -> str | None:
    """What is wrong with ``device`` (cpu, cuda or cuda:N) for runs trained in this process or its workers
    (``trains_here``; Slurm's tasks train elsewhere), before anything trains; None: nothing. Inside a Slurm job
    without a usable GPU, it names the job, its node and the GPUs Slurm gave it."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        return f"--device should be cpu, cuda or cuda:N, got {device!r}"
    if device.startswith("cuda") and trains_here:
        if not torch.cuda.is_available() and "SLURMD_NODENAME" in os.environ:  # a job's step, on its node
            job, node = os.environ.get("SLURM_JOB_ID", "?"), os.environ["SLURMD_NODENAME"]
            if (given := os.environ.get("CUDA_VISIBLE_DEVICES")) is None:
                return (f"--device {device}, but Slurm job {job} on {node} holds no GPU: ask one (--gpus-per-task 1, "
                        "or --sbatch-option gres=gpu:1)")
            return (f"--device {device}, but torch sees no CUDA device in Slurm job {job} on {node} "
                    f"(CUDA_VISIBLE_DEVICES={given}): check that node's GPUs and driver (nvidia-smi)")
        if not torch.cuda.is_available():
            return (f"--device {device}, but torch sees no CUDA device here: train on a machine with a GPU (on a "
                    "cluster: inside srun or salloc, or --executor slurm from here)")
        if (torch.device(device).index or 0) >= torch.cuda.device_count():
            return f"--device {device}, but torch sees {torch.cuda.device_count()} CUDA device(s) here, numbered from 0"
    return None


def slots_refusal(jobs: int, per_gpu: int | None, device: str) -> str | None:
    """Why :func:`slots` cannot place the workers (None: it can), for a command's one-line error."""
    try:
        slots(jobs, per_gpu, device)
    except ValueError as error:
        return str(error)
    return None


def cpu_threads(workers: int) -> int:
    """The machine's usable cores split between ``workers`` processes (at least one each)."""
    return max(1, default_workers() // workers)


def local(runs: list[PlannedRun], options: TrainOptions, progress: Progress, *, jobs: int = 1,
          per_gpu: int | None = None, sharing: str = "") -> None:
    """Train ``runs`` in worker processes side by side (see :func:`slots`), each with its share of the CPU threads,
    then the runs that must train alone, in this process; with ``sharing`` (how the GPUs are shared,
    :func:`experiments.scale.gpu_sharing.gpu_sharing`), a note where runs side by side on a GPU would gain nothing."""
    pool = WorkerPool.of(options, jobs=jobs, per_gpu=per_gpu)
    if per_gpu is None and len(pool.devices) > (cores := default_workers()):
        print(f"note: {len(pool.devices)} workers on {cores} cores take turns on them, which is slower than one worker "
              "a core (--jobs)", file=sys.stderr)
    if note := pool.memory_note((run.config.dataset, run.image_bytes) for run in runs
                                if not run.alone and run.image_bytes):
        print(note, file=sys.stderr)
    if any(not run.alone for run in runs) and (note := side_by_side_note(pool.devices, options.compile_mode, sharing)):
        print(note, file=sys.stderr)
    with pool:
        pool.train_runs(runs, progress)


class WorkerPool:
    """Worker processes, one per device of :func:`slots`, each sent one group of runs at a time over its own pipe, so
    that a dead worker's runs are known. Started as groups need them and kept from one :meth:`train_runs` to the next
    (the calibration's moves) until :meth:`close`. Several threads may train through one pool at once (the
    calibration's stand-ins side by side): their groups wait in one queue, the first asked sent first, and each call
    returns once its own groups are done. Closed (:meth:`close`) while threads are still inside it (Ctrl-C), it starts
    no worker again, and their calls end with :class:`PoolClosed`."""

    #: seconds a call waits for a worker's message before it looks at the queue again, where other threads add groups
    POLL_S = 0.5

    def __init__(self, devices: list[str], options: TrainOptions, threads: int,
                 budget: Callable[[str], int] | None = None):
        self.devices, self.options, self.threads = devices, options, threads
        self._budget, self._budgets = budget or images_budget, {}  # each device's images budget, asked once
        self.context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
        self.workers: dict[int, tuple] = {}  # slot -> (process, connection, the _Job it trains or None)
        self._queue: list[_Job] = []  # groups waiting for a worker, the first asked first
        self._passed: tuple[_Job | None, int] = (None, 0)  # the queue's first group, and how many went ahead of it
        self._lock = threading.Lock()  # over the workers and the queue, never held while waiting for a worker
        self._closed = False

    @classmethod
    def of(cls, options: TrainOptions, *, jobs: int = 1, per_gpu: int | None = None) -> "WorkerPool":
        """``jobs`` workers on ``options.device``, or ``per_gpu`` on each visible GPU, each with its share of the CPU
        threads."""
        devices = slots(jobs, per_gpu, options.device)
        return cls(devices, options, options.threads or cpu_threads(len(devices)))

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exception) -> None:
        self.close()

    def train_runs(self, runs: list[PlannedRun], progress: Progress) -> None:
        """Train ``runs`` in the workers, in groups (:func:`groups`), then the runs that must train alone, in this
        process."""
        side_by_side = [run for run in runs if not run.alone]
        if side_by_side:
            self.train(groups(side_by_side, self.options), progress)
        inline([run for run in runs if run.alone], self.options, progress)

    def _start(self, slot: int) -> None:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child, self.devices[slot], self.options, self.threads),
                                       name=f"topk-worker-{slot}", daemon=True)
        # A spawned worker imports torch before its code runs: Ctrl-C then would print a traceback. It starts with
        # SIGINT blocked (the starting thread's mask, kept across fork and exec, whatever the thread: a calibration's
        # search threads start workers too) and takes Ctrl-C again once in _worker. Starting multiprocessing's
        # resource tracker unblocks SIGINT in the starting thread, so it is started first.
        multiprocessing.resource_tracker.ensure_running()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        child.close()
        self.workers[slot] = (process, parent, None)

    def _send(self, slot: int, job: _Job) -> None:
        """Send ``job``'s group to the slot's worker, started if it is not yet; one that died since its last group
        (none of its runs lost) is replaced first, but one that Ctrl-C ended while idle closes the pool instead."""
        if slot not in self.workers:
            self._start(slot)
        elif not self.workers[slot][0].is_alive():
            self._replace(slot)
        process, connection, _ = self.workers[slot]
        try:
            connection.send(job.group)
        except OSError:  # BrokenPipeError, ConnectionResetError: the worker is gone
            self._replace(slot)
            process, connection, _ = self.workers[slot]
            connection.send(job.group)
        self.workers[slot] = (process, connection, job)
        for run in job.group:
            job.progress.start(run)

    def _replace(self, slot: int) -> None:
        """Start the slot's worker again after it ended, unless Ctrl-C ended it: then the pool closes and
        KeyboardInterrupt is raised."""
        process = self.workers[slot][0]
        process.join(timeout=5)
        if process.is_alive():  # its pipe broken but not yet ended: its device's memory is needed
            process.terminate()
            process.join(timeout=5)
        if process.exitcode in INTERRUPTED_EXITS:
            self._closed = True
            raise KeyboardInterrupt
        self._start(slot)

    def train(self, groups: list[list[PlannedRun]], progress: Progress) -> None:
        """Train ``groups``, each sent to the next free worker (after the groups other threads asked for first),
        reported to ``progress``; returns once they are done."""
        call = object()
        with self._lock:
            self._queue += [_Job(group, progress, call) for group in groups]
        try:
            while True:
                with self._lock:
                    if self._closed:
                        raise PoolClosed("the worker pool was closed while these runs were training or queued")
                    self._fill()
                    if not self._owes(call):
                        return
                    busy = {slot: worker for slot, worker in self.workers.items() if worker[2] is not None}
                try:  # unlocked, so that other threads queue meanwhile
                    ready = wait([connection for _, connection, _ in busy.values()]
                                 + [process.sentinel for process, _, _ in busy.values()], timeout=self.POLL_S)
                except OSError:  # a pipe another thread closed since (its worker died): look again
                    ready = []
                with self._lock:
                    self._collect(busy, ready)
        except BaseException:  # Ctrl-C, say: this call's busy workers stop now (their checkpoints are kept)
            with self._lock:
                self._queue = [job for job in self._queue if job.call is not call]
                for slot, (process, connection, job) in list(self.workers.items()):
                    if job is not None and job.call is call:  # gone, with its group: a later call starts it afresh
                        process.terminate()
                        process.join(timeout=5)
                        connection.close()
                        del self.workers[slot]
            raise

    def _fill(self) -> None:
        """Send queued groups to the free workers, in the order of their slots, each the first of the queue whose
        images fit beside those of the groups training on that device (:meth:`_fits`, :meth:`_next_for`; a group
        leaves the queue once sent: a failed start loses no other thread's group)."""
        for slot, device in enumerate(self.devices):
            if (slot not in self.workers or self.workers[slot][2] is None) and \
                    (position := self._next_for(device)) is not None:
                self._send(slot, self._queue[position])
                del self._queue[position]

    def _next_for(self, device: str) -> int | None:
        """Where the queue's first group that fits on ``device`` stands: where the queue's first does not (a large
        stand-in waiting for room), groups behind it that fit go ahead, as many as the pool has workers, then none
        until it goes."""
        if not self._queue:
            return None
        head = self._queue[0]
        if self._fits(device, head.group):
            return 0
        waited, passed = self._passed
        passed = passed if waited is head else 0
        if passed >= len(self.devices):
            return None
        position = next((i for i, job in enumerate(self._queue) if i and self._fits(device, job.group)), None)
        self._passed = (head, passed + (position is not None))
        return position

    def _fits(self, device: str, group: list[PlannedRun]) -> bool:
        """Whether ``group``'s images fit in :func:`images_budget` beside the images of the groups training: on
        ``device`` those there, in the machine's memory (``cpu``) every one (a process renders its stand-in there and
        keeps it). A group alone always goes (too large, it fails with the memory's own error)."""
        size = group_image_bytes(group)
        busy = [(self.devices[slot], group_image_bytes(job.group)) for slot, (_, _, job) in self.workers.items()
                if job is not None]
        on_device, in_machine = [held for where, held in busy if where == device], [held for _, held in busy]
        return ((not on_device or sum(on_device) + size <= self.budget(device))
                and (not in_machine or sum(in_machine) + size <= self.budget("cpu")))

    def budget(self, device: str) -> int:
        """``device``'s images budget, asked of the device once."""
        if device not in self._budgets:
            self._budgets[device] = self._budget(device)
        return self._budgets[device]

    def memory_note(self, image_bytes: Iterable[tuple[str, int]]) -> str | None:
        """A note where the largest stand-in of ``image_bytes`` (dataset, a run's bytes of its images) leaves some
        workers of a device waiting: how many of its runs train there at once; None where every worker can train
        one."""
        dataset, size = max(image_bytes, key=lambda item: item[1], default=(None, 0))
        if not size:
            return None
        places = {device: (device, self.devices.count(device)) for device in self.devices}
        places.setdefault("cpu", ("this machine", len(self.devices)))  # where GPU runs render their images
        notes = []
        for device, (name, workers) in places.items():
            budget = self.budget(device)
            if (fit := max(1, budget // size)) < workers:
                notes.append(f"{name} ({budget / 2 ** 30:.1f} GiB for images) trains at most {fit} of them at once "
                             f"on its {workers} workers")
        return (f"note: each {dataset} run holds {size / 2 ** 30:.1f} GiB of images, "
                f"and the runs on a device may hold {IMAGES_SHARE:.0%} of its memory: " + "; ".join(notes)
                ) if notes else None

    def _owes(self, call: object) -> bool:
        """Whether a group of ``call`` is still queued or training."""
        return any(job.call is call for job in self._queue) or any(
            job is not None and job.call is call for _, _, job in self.workers.values())

    def close(self) -> None:
        """End every worker: each asked to, then those alive 5 s later (busy ones that Ctrl-C did not reach: SIGTERM to
        the command alone) terminated, all against one deadline; each run's last epoch's checkpoint is kept and the
        queued groups are dropped."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            for _, connection, _ in self.workers.values():
                try:
                    connection.send(None)
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            for process, _, _ in self.workers.values():
                process.join(timeout=max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.terminate()
            for process, _, _ in self.workers.values():  # reaped, so that none is seen alive once closed
                process.join(timeout=5)
            self.workers.clear()

    def _collect(self, busy: dict[int, tuple], ready: list) -> None:
        """Report each group of the ``busy`` workers (as they were when the wait began) that ended, by the ``ready``
        pipes and sentinels the wait returned, unless another thread collected it meanwhile; a worker ended by Ctrl-C
        closes the pool and raises KeyboardInterrupt here, once every ended group is reported."""
        interrupted = False
        for slot, worker in busy.items():
            if self.workers.get(slot) is not worker:  # another thread collected it since
                continue
            process, connection, job = worker
            if connection in ready and (received := _received(connection)) is not None:
                self.workers[slot] = (process, connection, None)
                outcome, detail = received
                if outcome == "finished":
                    _ended(job.group, detail, job.progress)
                else:
                    _report(job.group, self.options, job.progress, detail)
            elif connection in ready or (process.sentinel in ready and not process.is_alive()):
                del self.workers[slot]  # started again by the next group sent to it, if any
                process.join(timeout=5)  # its pipe closed: it died, or is dying
                if process.is_alive():  # stuck on its way out (a GPU's teardown, say): its GPU memory is needed
                    process.terminate()
                    process.join(timeout=5)
                connection.close()
                if process.exitcode in INTERRUPTED_EXITS:  # Ctrl-C reached it: the user's stop, not the run's failure,
                    interrupted = self._closed = True  # and the pool's: every call ends, none trains its runs itself
                    continue
                log = _append_to_log(self.options, job.group, (
                    f"worker process {process.pid} died (exit code {process.exitcode}) while training "
                    f"{'these runs' if len(job.group) > 1 else 'this run'}; the checkpoints are kept, the next "
                    f"`train` resumes them\n"))
                _report(job.group, self.options, job.progress, log)
        if interrupted:
            raise KeyboardInterrupt


class PoolClosed(RuntimeError):
    """A :class:`WorkerPool` was closed while a call still had groups training or queued."""


@dataclass(frozen=True)
class _Job:
    """A group of runs asked of a :class:`WorkerPool`, the progress it reports to, and the call that asked for it."""

    group: list[PlannedRun]
    progress: Progress
    call: object


def _received(connection):
    """A worker's message, or None when its pipe was closed by its death."""
    try:
        return connection.recv()
    except (EOFError, OSError):
        return None


#: A worker's exit status after Ctrl-C (as a shell's after SIGINT): not a failure of its runs.
INTERRUPTED = 130
#: The exit codes of a worker that Ctrl-C ended: its own, or SIGINT's where the signal found no Python handler
INTERRUPTED_EXITS = (INTERRUPTED, -signal.SIGINT)


def interrupt_quietly(signum: int, frame) -> None:
    """The handler of a stop signal (Ctrl-C's SIGINT; SIGTERM and SIGHUP at the command line): KeyboardInterrupt, after
    which the exceptions Python ignores but prints ("Exception ignored in ...": a library's finaliser left half done by
    the interrupt, llvmlite's under numba say) are not printed, so that an interrupted command ends with its message
    and no traceback."""
    sys.unraisablehook = lambda unraisable: None
    raise KeyboardInterrupt


#: The signals that stop a command alike: Ctrl-C, SIGTERM (kill, a scheduler) and SIGHUP (a closed terminal or ssh).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


#: What the user mends, not the code: data not where it was said to be, a store file this user may not read. A
#: command ends on one of them with its message and :data:`USER_ERROR`, not a traceback.
USER_ERRORS = (MissingDataError, UnreadableStoreFile)
USER_ERROR = 2  #: argparse's status for a bad command line
KEPT = "every finished run is kept; the same command resumes"  #: what an interrupted command says by default


def run_as_command(main: Callable[[], int | None], interrupted: str = KEPT) -> None:
    """Run a command's ``main`` and exit with its status (:func:`command_status`). Installs the stop signals'
    handler (:data:`STOP_SIGNALS`): a signal ignored at the start (SIGHUP under ``nohup``) stays ignored, and so in the
    workers. Installed here, not at import: spawned workers import the modules."""
    for stop in STOP_SIGNALS:
        if signal.getsignal(stop) is not signal.SIG_IGN:
            signal.signal(stop, interrupt_quietly)
    sys.exit(command_status(main, interrupted))


def command_status(main: Callable[[], int | None], interrupted: str = KEPT) -> int | None:
    """``main``'s exit status; a stop signal ends it quietly with status 130 (a shell's after Ctrl-C), one of
    :data:`USER_ERRORS` with its message and :data:`USER_ERROR`. A command that trains says itself what an
    interrupt kept; one stopped outside that handling prints ``interrupted``."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"\ninterrupted: {interrupted}", file=sys.stderr)
        return INTERRUPTED
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR


def _worker(connection, device: str, options: TrainOptions, threads: int) -> None:
    """A worker process: trains each group it is sent, until it is sent None (:func:`_serve`). Ctrl-C reaches the
    whole process group: the worker then ends quietly with :data:`INTERRUPTED`, and the parent says what is kept. A
    parent that dies without ending its workers (``kill -9``) stops them the same way (:func:`_stop_with_the_parent`)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of its start, held blocked (WorkerPool._start): dropped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        signal.signal(signal.SIGINT, interrupt_quietly)
        _stop_with_the_parent()
        _serve(connection, device, options, threads)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
    except (EOFError, OSError):  # the pipe closed or reset under a receive or a send: the parent died meanwhile
        if multiprocessing.parent_process().is_alive():
            raise
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the watch's signal, on its way: nobody is left to tell
        sys.unraisablehook = lambda unraisable: None
        sys.exit(INTERRUPTED)


def _stop_with_the_parent() -> None:
    """Send this worker Ctrl-C's signal when its parent dies, from a thread that waits for that: a worker left behind
    would train on for nobody, beside the next command's workers, with its run claimed in the store. Its checkpoint of
    the last epoch is kept, as at Ctrl-C."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait_for_the_parent() -> None:
        wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait_for_the_parent, name="topk-parent-watch", daemon=True).start()


def _release_device_memory(device: str, runs: int) -> str:
    """Give a group's cached device memory back to the GPU, for the pool's next groups on it
    (:meth:`WorkerPool._fits` counts the images of the training groups alone), and say what is still reserved: a
    finished run's leftovers (its CUDA graphs' pools, say)."""
    try:
        gc.collect()
        torch.cuda.empty_cache()
        return (f"{torch.cuda.memory_reserved(device) / 2 ** 20:.0f} MiB still reserved on {device} after {runs} "
                f"run{'s' * (runs > 1)}")
    except RuntimeError as error:  # a CUDA error left the device unusable: the next group on it fails and says so
        return f"the device memory of {device} could not be released: {error}"


def _serve(connection, device: str, options: TrainOptions, threads: int) -> None:
    """Train each group sent over ``connection``, with its output in the group's log."""
    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)  # "cuda" alone: the first visible GPU
    while (group := connection.recv()) is not None:
        path = log_path(options, group)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = path.open("a")
        except OSError as error:  # the store's disk full or gone: nothing trains without its log
            connection.send(("failed", f"{path}, which could not be written ({error})"))
            continue
        with log:
            sys.stdout.flush(), sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            outcome = None  # stays None where Ctrl-C or SIGTERM ends the worker
            try:
                if len(group) > 1:
                    print(f"training stacked into one model: {', '.join(run.key for run in group)}", flush=True)
                outcome = ("finished", _held(group, train_group(group, options, device)))
            except Exception:  # reported to the parent, which names the run and its log
                traceback.print_exc()
                outcome = ("failed", str(path))
            finally:
                if outcome is not None and device.startswith("cuda"):
                    print(_release_device_memory(device, len(group)), flush=True)
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[0]), os.close(saved[1])
        connection.send(outcome)
