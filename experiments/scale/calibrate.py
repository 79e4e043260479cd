"""Fit each stand-in's difficulty to the paper's cross-entropy numbers (and, where the profile chooses them, the
learning rates), each move of the search trained side by side; a no-op where the stored calibration is current and
its runs were trained by today's code.

    python -m experiments.scale.calibrate PROFILE --jobs 2                      # make calibrate EXECUTOR=local JOBS=2
    python -m experiments.scale.calibrate gpu --device cuda --per-gpu 1          # every GPU of this node
    python -m experiments.scale.calibrate gpu --device cuda --executor slurm --gpus-per-task 1 --partition gpu

The steps are :mod:`experiments.tuning.fixed_point`'s. The search tells the runs of each move (every neighbour of its
knobs, at the seeds it averages) and of the learning-rate choice to :func:`executor_ahead` before it asks for any;
those the store lacks train through the ``local`` executor's workers or as one Slurm array, and the search reads them
back. With one local worker the search trains them itself, one after another. With several, or with Slurm, the
stand-ins' searches go on side by side, each in a thread of its own: their moves share the workers (one queue,
:class:`experiments.scale.executors.WorkerPool`) or go out as arrays at once.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

try:  # torch's import takes seconds: Ctrl-C then ends the command as it would later, with no traceback
    import torch

    from experiments.engine.cuda_graph_threads import give_this_thread_cuda_graph_trees
    from experiments.engine.store import ResultsStore
    from experiments.analysis.workload import stand_in_size
    from experiments.engine.train import COMPILE_MODES
    from experiments.scale import executors, slurm, slurm_request
    from experiments.scale.plan import PlannedRun, images_gib
    from experiments.scale.progress import Progress
    from experiments.tuning import fixed_point, profile_steps
except KeyboardInterrupt:
    print("\ninterrupted while starting: nothing was trained", file=sys.stderr)
    raise SystemExit(130) from None

#: What trains a move's runs: ``trainer(runs, progress)``.
Trainer = Callable[[list[PlannedRun], Progress], None]
#: How a search thread ends when Ctrl-C reached its workers: an interruption, not a failure to name.
INTERRUPTIONS = (KeyboardInterrupt, executors.PoolClosed)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="local (default): worker processes on this machine (--jobs, --per-gpu; with one, the "
                             "search trains its runs itself); slurm: one array a move")
    parser.add_argument("--jobs", type=int, default=1, help="local: worker processes (default 1)")
    parser.add_argument("--per-gpu", type=int, help="local, instead of --jobs: that many workers on each visible GPU")
    parser.add_argument("--compile", dest="compile_mode", choices=COMPILE_MODES, help="torch.compile mode of the step")
    slurm_request.add_options(parser, folder="STORE/slurm/calibration; either way each stand-in's in a folder "
                              "named by its setup: cifar, plantnet, imagenet_lt, imagenet",
                      sbatch_only="refused where a stand-in needs calibrating: each move of the search needs the last's "
                                  "runs, so none can be written ahead (accepted so that make's SLURM options serve "
                                  "both commands)")


def main(argv: list[str] | None = None) -> int:
    command = profile_steps.parse_command("python -m experiments.scale.calibrate", __doc__.split("\n\n")[0], argv,
                                          _options)
    if command is None:
        return 2
    profile, store, device, args = command
    if problem := _refusal(args, device) or _memory_refusal(args, profile):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not profile.calibrated_setups:
        print(fixed_point.no_stand_in(profile))
        return 0
    if args.sbatch_only and (setups := fixed_point.unsettled(profile)):
        print(f"error: --sbatch-only: the {profile.name} stand-ins {profile.setups_text(setups)} need calibrating, and a "
              "calibration cannot be written as scripts ahead (each move of its search needs the last's runs). Run "
              "it with --executor slurm and without --sbatch-only (it submits and follows one array a move), then "
              "write the profile's scripts", file=sys.stderr)
        return 2
    options = executors.TrainOptions(str(store.root), device, compile_mode=args.compile_mode)
    pool = executors.WorkerPool.of(options, jobs=args.jobs, per_gpu=args.per_gpu) if _uses_workers(args, device) \
        else None
    if pool and (note := pool.memory_note(_images_to_calibrate(profile).items())):
        print(note, file=sys.stderr)
    with pool or contextlib.nullcontext():  # the local executor's workers, kept from move to move
        trainers = {setup: _trainer(args, options, profile.name, setup, pool) for setup in profile.calibrated_setups}
        return _calibrate(profile, store, device, args, trainers)


def _calibrate(profile, store, device: str, args: argparse.Namespace, trainers: dict[str, Trainer | None]) -> int:
    """Settle each stand-in of ``trainers`` with its trainer, side by side where they have one (workers or Slurm); the
    command's exit status."""
    side_by_side = len(trainers) > 1 and all(trainers.values())

    def settle(setup: str) -> str:
        """Calibrate ``setup`` as far as it goes; its state. Side by side, each line it says names its stand-in."""
        trainer = trainers[setup]

        def say(text: str) -> None:
            print("\n".join(f"[{setup}] {line}" if side_by_side else line for line in text.splitlines()), flush=True)

        settled = fixed_point.settle(profile, setup, lambda config: fixed_point.trained(
            config, store, device, profile.name, setup, args.compile_mode), say=say,
            ahead=executor_ahead(store, trainer, live=not side_by_side) if trainer else None)
        return f"{setup}: {fixed_point.status(settled, setup)['state']}"

    try:
        if side_by_side:  # the stand-ins' searches are independent: their moves train at once
            for line in _each_in_a_thread(settle, tuple(trainers)):
                print(line, flush=True)
        else:
            for setup in trainers:
                print(settle(setup), flush=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished run and every epoch's checkpoint is kept in {store.root}, and each "
              "finished step of the calibration in experiments/calibrated/; the same command resumes"
              + (slurm.still_queued_text(profile.name, calibration=True) if args.executor == "slurm" else ""),
              file=sys.stderr)
        return 130
    except FloatingPointError as error:  # a CE run of the search: no stand-in is fitted from a NaN
        print(f"error: a cross-entropy run of the calibration diverged ({error}); its NaN is kept in {store.root}/"
              "diverged/ (delete the file to train it again): change the stand-in's start or steps "
              "(experiments/tuning/calibration.py)", file=sys.stderr)
        return 1
    return 0


def _each_in_a_thread(work: Callable[[str], str], setups: tuple[str, ...]) -> list[str]:
    """``work(setup)`` for every setup at once, each in a thread of its own; their results in the setups' order once
    all have ended, or the first setup's error (the others were let finish: their steps are stored). The threads are
    daemons, so Ctrl-C, which reaches this one, ends the command at once."""
    results: dict[str, str] = {}
    errors: dict[str, BaseException] = {}
    interrupted = threading.Event()  # the threads' own errors after Ctrl-C (their workers gone) go unsaid

    def run(setup: str) -> None:
        try:
            give_this_thread_cuda_graph_trees()  # where a move trains in this thread, compiled with CUDA graphs
            results[setup] = work(setup)
        except BaseException as error:  # SystemExit of a failed run included: said now, re-raised below
            errors[setup] = error
            if not interrupted.is_set() and not isinstance(error, INTERRUPTIONS):
                print(f"[{setup}] stopped: {error}; the other stand-ins go on", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=run, args=(setup,), name=f"calibrate-{setup}", daemon=True) for setup in setups]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=1.0)
    except KeyboardInterrupt:
        interrupted.set()
        raise
    if any(isinstance(error, INTERRUPTIONS) for error in errors.values()):
        raise KeyboardInterrupt  # Ctrl-C reached the workers, not this process: said as an interruption
    for setup in setups:
        if setup in errors:
            raise errors[setup]
    return [results[setup] for setup in setups]


def _no_gpu_for_per_gpu(args: argparse.Namespace) -> bool:
    """``--per-gpu`` where torch sees no GPU (a login node, ``make calibrate DEVICE=cuda``): not an error, the search
    then trains alone, and says where to run it if it has a run to train."""
    return args.per_gpu is not None and args.per_gpu >= 1 and not torch.cuda.is_available()


def _refusal(args: argparse.Namespace, device: str) -> str | None:
    """What is wrong with the executor's options (None: nothing)."""
    if args.executor == "slurm":
        return slurm_request.refusal(args)
    if problem := slurm_request.refusal_elsewhere(args):
        return problem
    return None if _no_gpu_for_per_gpu(args) else executors.slots_refusal(args.jobs, args.per_gpu, device)


def _memory_refusal(args: argparse.Namespace, profile) -> str | None:
    """The Slurm tasks' memory (``--mem-gb``, or the partition's default) against the images of the stand-ins left to
    calibrate (:func:`slurm_request.memory_refusal`), which ``train``'s own check, after the calibration, would come
    too late for."""
    if args.executor != "slurm":
        return None
    return slurm_request.memory_refusal(args, images_gib(_images_to_calibrate(profile).items()))


def _images_to_calibrate(profile) -> dict[str, int]:
    """The bytes of a run's stand-in images, by dataset, for the stand-ins left to calibrate."""
    setups = [getattr(profile, setup) for setup in fixed_point.unsettled(profile)]
    return {setup.dataset: stand_in_size(setup).image_bytes for setup in setups}


def _uses_workers(args: argparse.Namespace, device: str) -> bool:
    """Whether the local executor has worker processes to train the moves: more than one, on devices torch sees."""
    return (args.executor == "local" and not _no_gpu_for_per_gpu(args)
            and len(executors.slots(args.jobs, args.per_gpu, device)) > 1)


def _trainer(args: argparse.Namespace, options: executors.TrainOptions, profile: str, setup: str,
             pool: executors.WorkerPool | None) -> Trainer | None:
    """How the command's executor trains a move's runs of ``setup``: as a Slurm array (each stand-in's scripts in a
    folder of their own, ``.../calibration/SETUP``), or in ``pool``'s workers; None without them (the search trains
    them itself)."""
    if args.executor == "slurm":
        folder = Path(args.slurm_folder or Path(options.store) / "slurm" / "calibration") / setup
        slurm_options = replace(slurm_request.SlurmOptions.from_args(args), folder=str(folder))
        return lambda runs, progress: slurm.train(runs, options, progress, slurm_options, profile=profile,
                                                  outside_plan=True)
    return pool.train_runs if pool is not None else None


def executor_ahead(store: ResultsStore, trainer: Trainer, *, live: bool = True):
    """What :func:`experiments.tuning.calibration.calibrate` and :func:`experiments.tuning.learning_rates.choose` tell
    a move's runs to: each training the store lacks (siblings once) goes to ``trainer``, even one alone (on a
    cluster's login node the search must not train). A run that failed there stops the calibration, naming its log;
    one whose loss became NaN is kept so in the store, where the search reads it (the learning-rate choice expects
    some). ``live``: the progress line is rewritten in place on a terminal (off where several searches share it)."""

    def ahead(configs) -> None:
        todo = {}
        for config in configs:
            if store.finished(config.key()) is None and store.divergence(config.training_key()) is None:
                todo.setdefault(config.training_key(), config)
        if not todo:
            return
        runs = [PlannedRun.outside_plan(config) for config in todo.values()]
        progress = Progress(runs, store=store, live=live)
        trainer(runs, progress)
        if progress.failed:
            raise SystemExit(f"error: {len(progress.failed)} of the calibration's runs failed: "
                             + "; ".join(f"{key} (log: {log})" for key, log in progress.failed.items()))

    return ahead


if __name__ == "__main__":
    executors.run_as_command(main)
