"""The profile-wide commands of ``python -m experiments``:

    python -m experiments plan PROFILE                         # every run, the notebooks that read it, its state
    python -m experiments plan PROFILE --stack 8               # and the groups `train --stack 8` would stack
    python -m experiments plan gpu --gpus 4                    # its hours on 4 GPUs at each measured setting
    python -m experiments train PROFILE --executor local --jobs 2
    python -m experiments train PROFILE --executor local --per-gpu 1 --device cuda --compile reduce-overhead
    python -m experiments train PROFILE --executor local --per-gpu 4 --device cuda --compile reduce-overhead  # MPS
    python -m experiments train PROFILE --executor local --per-gpu 1 --device cuda --stack 4   # 4 runs in one model
    python -m experiments train PROFILE --executor slurm --device cuda --compile reduce-overhead --partition gpu \
        --gpus-per-task 1 --time-min 600
    python -m experiments run-one KEY [KEY ...] --profile PROFILE   # planned runs, stacked if several (an array task)

``train`` exits with the number of failed runs (0 when every run finished), each named with its log; with 2 when the
command is refused before training, 1 when Slurm refuses or stops answering, each with its ``error:`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import data_prep
from experiments.analysis.timings import made_with_todays_engine, sharing_text
from experiments.engine.config import RunConfig, stack_mismatch
from experiments.engine.run_claim import live_holder
from experiments.engine.store import ResultsStore, unusable_store
from experiments.engine.train import COMPILE_MODES
from experiments.paths import BENCHMARK_RESULTS, BUILD, FIGURES, RESULTS
from experiments.provenance import device_name, git_commit
from experiments.scale import executors, slurm, slurm_queue, slurm_request
from experiments.scale.gpu_sharing import gpu_sharing
from experiments.scale.hours import (Rates, calibration_first_then, completeness_then_hours, counted_text, estimate,
                                    estimate_moves, invocations, models_and_batches, read_measurements,
                                    runs_measured_by, setting_text)
from experiments.scale.plan import (CalibrationFirst, PlannedRun, calibrations_to_make, missing_dataset_text, plan,
                                    stacks, stand_in_memory, table)
from experiments.scale.progress import Progress, failure_reason
from experiments.spec.profiles import PROFILES, Profile, get_profile
from experiments.tuning import fixed_point

COMMANDS = ("plan", "train", "run-one")
EXECUTORS = ("inline", "local", "slurm")


def _training_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="results store folder (default: results/PROFILE, as the notebooks use)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--data-root", help="root of the real datasets (the paper profile), as given to make DATA=")
    parser.add_argument("--workers", type=int, help="processes reading an image-folder dataset, per run")
    parser.add_argument("--compile", dest="compile_mode", choices=COMPILE_MODES, help="torch.compile mode of the step")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads per run (default: the local executor splits the machine's cores "
                             "between its workers; otherwise torch's default)")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("plan", help="list every distinct run of a profile and what the store holds of it",
                                  description="List every distinct run of PROFILE, from the grids its notebooks use: "
                                  "its key, its state in the store (finished, diverged, training, queued, partial or "
                                  "missing), its epochs done of all, its training images and the notebooks that read "
                                  "it; then the totals, each stand-in's images in a run's memory, and what `make "
                                  "calibrate` has left to do first.")
    listing.add_argument("profile", choices=PROFILES)
    listing.add_argument("--store", help="results store folder (default: results/PROFILE)")
    listing.add_argument("--stack", type=int, default=1, help="also number each run's group as `train --stack` "
                         "would stack them from this store")
    listing.add_argument("--gpus", type=int, help="also estimate the hours on this many GPUs at each setting "
                         "benchmarks.bench_concurrency measured on CUDA in --rates (today's engine's, else earlier ones)")
    listing.add_argument("--rates", type=Path, help="with --gpus: the measured rates (default: "
                         "benchmarks/results/concurrency.csv)")
    train = commands.add_parser("train", help="train every missing run of a profile through an executor",
                                description="Train every run of PROFILE that the store does not hold finished (a "
                                "partial one resumes from its checkpoint), through an executor. Exits with the number "
                                "of failed runs, each named with its log.")
    train.add_argument("profile", choices=PROFILES)
    train.add_argument("--executor", choices=EXECUTORS, default="inline",
                       help="inline (default): one run after another in this process; local: worker processes on this "
                            "machine (--jobs, --per-gpu); slurm: Slurm array tasks")
    train.add_argument("--jobs", type=int, default=1, help="local: worker processes on this machine (default 1)")
    train.add_argument("--per-gpu", type=int, help="local: runs side by side on each visible GPU, or on GPU N alone "
                       "with --device cuda:N (instead of --jobs)")
    train.add_argument("--stack", type=int, default=1,
                       help="train runs that share their data, model and optimiser settings this many at a time, "
                            "stacked into one model (grouped layers; default 1: each run alone)")
    train.add_argument("--figures", help="where the executor's manifest goes, beside the notebooks' (default: "
                       "figures/PROFILE when training into the notebooks' store, else none is written)")
    train.add_argument("--uncalibrated", action="store_true",
                       help="train even where the profile's stand-ins are not calibrated yet (their default "
                            "difficulty and learning rates: runs that calibrating later makes obsolete)")
    _training_options(train)
    slurm_request.add_options(train)
    one = commands.add_parser("run-one", help="train planned runs, stacked into one model if several (an array "
                              "task's command)",
                              description="Train the runs of PROFILE named by their keys (as `plan` lists them), "
                              "stacked into one model if several, or read them back from the store; what a Slurm array "
                              "task runs. Prints each run's outcome: finished, or diverged (its loss became NaN, kept "
                              "in the store).")
    one.add_argument("keys", nargs="+", metavar="key", help="a run's key, as `plan` lists it")
    one.add_argument("--profile", required=True, choices=PROFILES)
    one.add_argument("--configs", type=Path, help="a folder of run configs (KEY.json) for runs outside the plan, the "
                     "calibration's: the slurm executor writes them beside its scripts")
    _training_options(one)
    return main


def main(argv: list[str]) -> int:
    """The command's exit status; data not found or a store file this user may not read is raised, for
    :func:`executors.run_as_command` to say (:data:`executors.USER_ERRORS`)."""
    args = parser().parse_args(argv)
    profile = get_profile(args.profile)
    store = args.store or str(RESULTS / profile.name)
    runs = plan(profile)
    if refusal := _refusal(args, runs, store):
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    if args.command == "train" and not args.uncalibrated and (setups := fixed_point.unsettled(profile)):
        print(f"error: {uncalibrated_text(profile, setups)}", file=sys.stderr)
        return 2
    stack = getattr(args, "stack", 1)  # run-one stacks the runs it is given
    if args.command == "plan":
        held, config_of = ResultsStore(store), {run.key: run.config for run in runs}
        groups = stacks(runs, stack, held) if stack > 1 else None
        in_queue = slurm_queue.still_in_queue(runs, str(Path(store) / "slurm"))  # train's default --slurm-folder
        ended = {key: _ended_text(job_id, log) for key, (job_id, log) in (in_queue.ended.items() if in_queue else [])
                 if not held.holds_outcome(config_of[key])}  # a finished run's log is not read
        print(table(runs, held, groups, {run.key: job_id for run, job_id, _ in (in_queue.tasks if in_queue else [])},
                    ended))
        fewest = calibrations_to_make(profile)
        calibrations = (fewest, calibrations_to_make(profile, searched=None) if fewest else {})
        if fewest:
            print(calibration_line(*calibrations))
        if beyond_search := [setup for setup in fixed_point.unsettled(profile) if setup not in fewest]:
            print(steps_left_line(profile, beyond_search))
        if args.gpus is None:
            return 0
        return _print_hours(runs, args.gpus, args.rates or BENCHMARK_RESULTS / "concurrency.csv", calibrations)
    data_root = str(Path(args.data_root).resolve()) if args.data_root else None  # Slurm's tasks start elsewhere
    options = executors.TrainOptions(store, args.device, data_root, args.workers, args.compile_mode, args.threads,
                                     stack, leave_held=args.command == "train" and args.executor != "slurm")
    try:
        if args.command == "run-one":
            return _run_one(runs, args.keys, options, args.configs)
        return _train(runs, args, options)
    except KeyboardInterrupt:
        queued = slurm.still_queued_text(profile.name) if getattr(args, "executor", None) == "slurm" else ""
        print(f"\ninterrupted: every finished run and every epoch's checkpoint is kept in {store}; the same command "
              f"resumes{queued}", file=sys.stderr)
        return 130


def uncalibrated_text(profile: Profile, setups: list[str]) -> str:
    """Why ``train`` refuses a profile whose stand-ins ``setups`` are not calibrated, and what to do."""
    return (f"the {profile.name} profile's stand-ins {profile.setups_text(setups)} have calibration steps left "
            f"(experiments/calibrated/{profile.name}.json: not calibrated, calibrated by an earlier search or earlier "
            "training code, or their learning rates still to choose): a run's key holds its stand-in's difficulty and "
            "learning rate, so runs trained now would all be trained again once they are done. Calibrate first: "
            f"`make calibrate PROFILE={profile.name}` (with the same EXECUTOR, DEVICE and SLURM options), which `make "
            "paper-figures` runs before training; or give --uncalibrated (`make train UNCALIBRATED=1`) to train on "
            "the difficulty and rates they have now anyway")


def _refusal(args: argparse.Namespace, runs: list[PlannedRun], store: str) -> str | None:
    """What is wrong with the command's options, before anything trains (None: nothing)."""
    if problem := unusable_store(store):
        return problem
    if getattr(args, "stack", 1) < 1:
        return f"--stack should be a positive number of runs stacked into one model, got {args.stack}"
    if args.command == "plan":
        if args.rates is not None and args.gpus is None:
            return f"--rates {args.rates} gives the rates of the hours on GPUs: add --gpus N"
        return (f"--gpus should be a positive number of GPUs, got {args.gpus}"
                if args.gpus is not None and args.gpus < 1 else None)
    if problem := executors.device_refusal(args.device, trains_here=False):  # its form
        return problem
    if args.workers is not None and args.workers < 0:
        return (f"--workers should be 0 (read in the training process) or a positive number of processes, got "
                f"{args.workers}")
    if args.threads < 0:
        return (f"--threads should be 0 (the default) or a positive number of torch CPU threads per run, got "
                f"{args.threads}")
    if args.command == "run-one":
        return executors.device_refusal(args.device)
    held = ResultsStore(store)
    todo = [run for run in runs if not held.holds_outcome(run.config)]
    here = args.executor != "slurm" and bool(todo)  # nothing to train (a login node after Slurm's tasks): no device
    if here and (problem := executors.device_refusal(args.device)):
        return problem
    if args.executor != "local" and (args.jobs != 1 or args.per_gpu is not None):
        return (f"--{'per-gpu' if args.per_gpu is not None else 'jobs'} places the local executor's workers, but the "
                f"executor is {args.executor}: add --executor local, or leave it out")
    if args.jobs != 1 and args.per_gpu is not None:
        return (f"--jobs {args.jobs} and --per-gpu {args.per_gpu} each place the local executor's workers: give "
                "--jobs on a CPU or --per-gpu on GPUs, not both")
    if args.executor == "local" and todo and (problem := executors.slots_refusal(args.jobs, args.per_gpu, args.device)):
        return problem
    if args.executor == "slurm" and (problem := slurm_request.refusal(args)):
        return problem
    if args.executor == "slurm" and (problem := slurm_request.memory_refusal(args, stand_in_memory(todo))):
        return problem
    if args.executor != "slurm" and (problem := slurm_request.refusal_elsewhere(args)):
        return problem
    real = [run for run in todo if run.data_subdir is not None]
    if real and args.data_root is None:
        return (f"{len(real)} runs of the {args.profile} profile still to train are on real datasets: pass their root "
                "(--data-root, make DATA=)")
    for folder, dataset in {run.data_root(args.data_root): run.config.dataset for run in real if here}.items():
        if not folder.is_dir():  # read as a run starts: said now, not once a run (Slurm's nodes may hold it alone)
            readers = sum(run.config.dataset == dataset for run in real)
            return missing_dataset_text(dataset, folder, f" that {readers} runs still to train read")
    return None


#: Calibrations searching on one seed (:func:`experiments.tuning.calibration.search_seeds`), then on every seed.
Calibrations = tuple[dict[str, CalibrationFirst], dict[str, CalibrationFirst]]


def calibration_line(fewest: dict[str, CalibrationFirst], every: dict[str, CalibrationFirst]) -> str:
    """What ``make paper-figures`` trains before the plan's runs, its searches averaging one seed (``fewest``) or
    every seed (``every``): "and first, make calibrate: at least N runs ..."."""
    def trained(calibrations: dict[str, CalibrationFirst]) -> list[PlannedRun]:
        return [run for first in calibrations.values() for run in first.runs]

    def images(calibrations: dict[str, CalibrationFirst]) -> str:
        return f"{sum(run.train_images or 0 for run in trained(calibrations)):,} training images"

    datasets = [first.runs[0].config.dataset for first in fewest.values()]
    shared = sum(len(first.notebooks_trained) for first in fewest.values())
    return (f"and first, make calibrate: at least {len(trained(fewest))} runs of {len(fewest)} "
            f"stand-in{'s' * (len(fewest) > 1)} to calibrate ({', '.join(datasets)}), {shared} of them the notebooks' "
            f"own once calibrated, {images(fewest)} in all, where the seeds at a search's start agree so closely "
            f"that it averages one; {len(trained(every))} runs and {images(every)} where it needs every seed "
            "(docs/reproducing.md#the-calibrations-hours)")


def steps_left_line(profile: Profile, setups: list[str]) -> str:
    """What ``make paper-figures`` also does first for stand-ins whose calibration search is today's but which have a
    step left (:func:`experiments.tuning.fixed_point.next_step`: their learning rates to choose, again or for the first
    time, or another round), each with its state (:func:`experiments.tuning.fixed_point.status`)."""
    states = "; ".join(f"{getattr(profile, setup).dataset}: {fixed_point.status(profile, setup)['state']}"
                       for setup in setups)
    return f"and first, make calibrate: {len(setups)} stand-in{'s' * (len(setups) > 1)} with a step left ({states})"


def _print_hours(runs: list[PlannedRun], gpus: int, rates_csv: Path, calibrations: Calibrations) -> int:
    """The estimated hours on ``gpus`` GPUs of each setting measured in ``rates_csv`` on CUDA with the model and batch
    of some of ``runs`` (:mod:`experiments.scale.hours`), by the measurements made with today's engine (else by the
    earlier ones, said to be stale): the most complete estimates first, then the fastest, then the settings that
    cannot be estimated; then the least hours of each stand-in's calibration in ``calibrations``
    (:func:`_print_calibration_hours`)."""
    try:
        measured = invocations(read_measurements(rates_csv), runs)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not measured:
        batches: dict[str, list[str]] = {}
        for model, batch in sorted(models_and_batches(runs), key=lambda trained: (trained[0], int(trained[1]))):
            batches.setdefault(model, []).append(batch)
        trained = ", ".join(f"{model} at batch {' or '.join(sizes)}" for model, sizes in batches.items())
        print(f"error: no measurement in {rates_csv} was made on a GPU with a model and batch size that this "
              f"profile's runs on stand-ins train ({trained}): `python -m benchmarks.bench_concurrency --model MODEL "
              "--batch-size BATCH` measures one on a GPU (on CIFAR-100-shaped images, 32 px)", file=sys.stderr)
        return 2
    current = [invocation for invocation in measured if all(made_with_todays_engine(row) for row in invocation)]
    print(f"\nestimated hours on {gpus} GPU{'s' * (gpus > 1)}, at the rates of {rates_csv.name}'s measurements made "
          + ("with today's engine:" if current else "with an earlier engine (stale: the engine's code changed since):"))
    print("(a setting measured more than once has a line per measurement, its device, compile mode and date named, "
          "those covering the most runs first, then the fastest. Through Slurm: PER_GPU=1 is a task on each whole GPU, "
          "--gpus-per-task 1; PER_GPU=M under MPS, a task on each share where the site offers gres/mps, "
          "--sbatch-option gres=mps:N with N = 100/M at Slurm's usual 100 a GPU; STACK=S, --stack S)")
    estimated, not_estimated = [], []
    for invocation in current or measured:
        first, rates = invocation[0], Rates.from_rows(invocation)
        covered = runs_measured_by(runs, first)
        where = (f"{first['device_name']}, {sharing_text(first).replace('`', '')}, {first['date']}: {len(covered)} of "
                 f"{len(runs)} runs ({first['model']}, batch {first['batch_size']})")
        for per_gpu, stack in rates.train:
            found = estimate(covered, rates, per_gpu=per_gpu, stack=stack, gpus=gpus)
            if found is None:
                not_estimated.append(f"  PER_GPU={per_gpu} STACK={stack}: not estimated, a group of its plan has no "
                                     f"measured rate ({where})")
            else:
                estimated.append((found, where, rates, {run.config.dataset for run in covered}))
    estimated.sort(key=lambda each: completeness_then_hours(each[0]))
    for found, where, _, _ in estimated:
        print(f"  {setting_text(found).strip('`'):20s} {found.hours:7.1f} h  {where}; {counted_text(found)}")
    for line in not_estimated:
        print(line)
    _print_calibration_hours(calibrations, current or measured, gpus)
    _print_with_calibration(estimated, calibrations)
    return 0


def _print_with_calibration(estimated: list[tuple], calibrations: Calibrations) -> None:
    """Each estimate of the notebooks' runs on one stand-in (``estimated``: the estimate, where it was measured, its
    rates, the runs' datasets) with that stand-in's calibration first, as ``make paper-figures`` takes them from an
    empty store (:func:`experiments.scale.hours.calibration_first_then`): at least, its search averaging one seed,
    then every seed."""
    fewest, every = calibrations
    lines = []
    for found, where, rates, datasets in estimated:
        setup = next((setup for setup, first in fewest.items() if {first.runs[0].config.dataset} == datasets), None)
        if setup is None:
            continue
        both = [calibration_first_then(found, search, rates) for search in (fewest[setup], every[setup])]
        if None not in both:
            lines.append(f"  {setting_text(found).strip('`'):20s} {both[0].hours:7.1f} h ({both[1].hours:.1f} h)  "
                         f"{', '.join(datasets)}: its calibration, then its notebooks' runs; {where}")
    if lines:
        print("\nthe notebooks' runs above with their stand-in's calibration first, as make paper-figures takes them "
              "from an empty store, at least (its search averaging one seed; every seed in brackets):")
        print("\n".join(lines))


def _print_calibration_hours(calibrations: Calibrations, measured: list[list[dict]], gpus: int) -> None:
    """For each stand-in of ``calibrations``, the hours of its shortest calibration alone (:func:`estimate_moves`),
    its search averaging one seed and every seed, at each ``PER_GPU`` measured with lone runs, by each invocation of
    ``measured`` that stands for all its runs; or that none does."""
    fewest, every = calibrations
    lines = []
    for setup, first in fewest.items():
        dataset, estimated = first.runs[0].config.dataset, []
        for invocation in measured:
            row, rates = invocation[0], Rates.from_rows(invocation)
            if len(every[setup].runs) != len(runs_measured_by(every[setup].runs, row)):
                continue
            for per_gpu in sorted(processes for processes, stack in rates.train if stack == 1):
                found = [estimate_moves(search.moves, rates, per_gpu=per_gpu, gpus=gpus)
                         for search in (first, every[setup])]
                if None not in found:
                    estimated.append((found[0].hours, f"  {dataset:18s} PER_GPU={per_gpu:<3d} {found[0].hours:7.1f} h "
                                      f"({found[1].hours:.1f} h)  {len(first.runs)} runs ({len(every[setup].runs)}) in "
                                      f"{len(first.moves)} moves; {row['device_name']}, "
                                      f"{sharing_text(row).replace('`', '')}, {row['date']}; {counted_text(found[0])}"))
        lines += [line for _, line in sorted(estimated)] or [
            f"  {dataset:18s} not estimated: no measurement of its model and batch ({first.runs[0].config.model}, "
            f"batch {first.runs[0].config.batch_size})"]
    if lines:
        print("\nand first, calibrating the stand-ins (make calibrate) takes at least (no move of a search improving "
              "on its start; each move's runs wait for the last's; the notebooks' runs among them are not trained "
              "again), each search averaging one seed (every seed, in brackets):")
        print("\n".join(lines))


def _run_one(runs: list[PlannedRun], keys: list[str], options: executors.TrainOptions, configs: Path | None) -> int:
    """Train the planned runs named by ``keys`` (a sibling's key names its training), or the stand-in runs whose
    configs are ``configs/KEY.json`` (the calibration's), stacked if several."""
    group = []
    for key in keys:
        matches = [run for run in runs if key in {sibling.key() for sibling in run.config.siblings()}]
        if not matches and configs is not None and (written := configs / f"{key}.json").exists():
            try:
                config = RunConfig.from_dict(json.loads(written.read_text()))
            except (OSError, ValueError, TypeError) as error:
                print(f"error: bad config {written}: {error}", file=sys.stderr)
                return 2
            if config.key() != key or config.dataset not in data_prep.SYNTHETIC:
                print(f"error: {written} should hold stand-in run {key}, holds {config.key()} on {config.dataset!r}",
                      file=sys.stderr)
                return 2
            matches = [PlannedRun.outside_plan(config)]
        if not matches:
            print(f"error: no run of this profile has the key {key!r}: `python -m experiments plan PROFILE` lists "
                  "them" + (f", and {configs} holds no {key}.json" if configs is not None else ""), file=sys.stderr)
            return 2
        if matches[0] not in group:  # a sibling's key names a training already asked for
            group.append(matches[0])
    if mismatch := stack_mismatch([run.config for run in group]):
        print(f"error: the runs {group[0].key} and {mismatch[0].key()} cannot train stacked into one model: they "
              f"differ in {mismatch[1]}", file=sys.stderr)
        return 2
    try:
        executors.train_group(group, options)
    except FloatingPointError:  # an outcome, kept in the store: said below, run by run
        pass
    store, unfinished = ResultsStore(options.store), 0
    for run in group:
        if (record := store.finished(run.key)) is not None:
            print(f"{run.key}: finished, selected epoch {record['selected_epoch']}")
        elif (message := store.divergence(run.config.training_key())) is not None:
            print(f"{run.key}: diverged: {message} (kept in the store as its outcome)")
        else:
            print(f"{run.key}: not finished", file=sys.stderr)
            unfinished += 1
    return min(unfinished, 100)


def _ended_text(job_id: str, log: str) -> str:
    """What ``plan`` says of a run whose Slurm task left the queue without its outcome: why, as its log says; Slurm
    opens a task's log when the task starts, so a task without one never started (cancelled or refused in the queue)."""
    if not Path(log).exists():
        return f"its Slurm task {job_id} left the queue without starting (no log: cancelled or refused while queued)"
    return f"its Slurm task {job_id} ended without its record: {failure_reason(log) or 'its log says nothing'}; log: {log}"


def _train(runs: list[PlannedRun], args: argparse.Namespace, options: executors.TrainOptions) -> int:
    store = ResultsStore(options.store)
    todo = [run for run in runs if not store.holds_outcome(run.config)]
    diverged = sum(not store.record_path(run.key).exists() for run in runs if run not in todo)  # done, no record
    elsewhere = [run for run in todo if live_holder(store.root, run.config.training_key()) is not None]
    todo = [run for run in todo if run not in elsewhere]
    print(f"{args.profile}: {len(runs)} runs, {len(runs) - len(todo) - len(elsewhere) - diverged} already finished"
          f"{f', {diverged} diverged' if diverged else ''}"
          f"{f', {len(elsewhere)} being trained by other processes (waited for; `plan` names them)' if elsewhere else ''}"
          f", {len(todo)} to train ({args.executor} executor)", file=sys.stderr)
    scripts_only = args.executor == "slurm" and args.sbatch_only  # nothing trains here: the scripts are written
    if not todo and (not elsewhere or scripts_only):  # no device needed; the manifest of the training that made them is kept
        return 0
    if args.executor == "inline" and options.device.startswith("cuda") and torch.cuda.device_count() > 1:
        print(f"note: the inline executor trains on {options.device} alone; `--executor local --per-gpu 1` trains on "
              f"each of the {torch.cuda.device_count()} visible GPUs", file=sys.stderr)
    progress, started = Progress(todo + elsewhere, store=store), time.time()
    on_gpus = (args.executor == "local" and args.per_gpu) or options.device.startswith("cuda")
    sharing = gpu_sharing("cuda" if on_gpus else "")  # how the GPUs were shared, as training begins

    def train(part: list[PlannedRun]) -> None:
        if args.executor == "inline":
            executors.inline(part, options, progress)
        elif args.executor == "local":
            executors.local(part, options, progress, jobs=args.jobs, per_gpu=args.per_gpu, sharing=sharing)
        else:
            slurm.train(part, options, progress, slurm_request.SlurmOptions.from_args(args), profile=args.profile)

    followed = elsewhere if not scripts_only else []  # beside this call's training: each reported as it ends
    with progress.watching(), holders_followed(followed, store, progress) as left_by_holders:
        if todo:
            train(todo)
        orphans = left_by_holders() + await_holders(progress.left_to_others(todo), store, progress)
        while orphans:  # claimed by other processes, at the start or while this call trained, and left by them
            print(f"{len(orphans)} of the runs other processes trained were left without an outcome (their holders "
                  "stopped): training them here", file=sys.stderr)
            train(orphans)
            orphans = await_holders(progress.left_to_others(orphans), store, progress)
    if not scripts_only:
        print(progress.summary(), file=sys.stderr)
    into_notebooks_store = Path(options.store).resolve() == (RESULTS / args.profile).resolve()
    if (args.figures or into_notebooks_store) and not scripts_only:
        _write_manifest(args, options, progress, len(runs) - len(todo) - len(elsewhere), time.time() - started, sharing)
    if into_notebooks_store:
        out_of_date(runs, progress.finished | set(progress.diverged), BUILD / args.profile)
    return min(len(progress.failed), 100)


def out_of_date(runs: list[PlannedRun], trained: set[str], executed: Path) -> list[str]:
    """Remove the executed notebooks (``executed/<notebook>.ipynb``) that read a run of ``trained`` (keys: finished or
    diverged in this call), so that
    ``make notebooks`` runs them again on the new records: make sees the notebooks' code, not the store. Returns the
    notebooks removed."""
    readers = sorted({notebook for run in runs if run.key in trained for notebook in run.notebooks})
    removed = [notebook for notebook in readers if (executed / f"{notebook}.ipynb").exists()]
    for notebook in removed:
        (executed / f"{notebook}.ipynb").unlink()
    if removed:
        print(f"to run again on the runs trained now: {', '.join(removed)} (`make notebooks`)", file=sys.stderr)
    return removed


#: seconds between two looks at the runs other processes train (:func:`await_holders`)
HOLDERS_POLL_S = 10.0


def await_holders(runs: list[PlannedRun], store: ResultsStore, progress: Progress,
                  stop: threading.Event | None = None) -> list[PlannedRun]:
    """Follow ``runs``, which live processes train (their claims' holders), until each has its outcome in ``store``
    (reported to ``progress``) or its holder stops without one: those are returned, to be trained by the caller; or
    until ``stop`` is set."""
    stop = stop or threading.Event()
    for run in runs:
        progress.elsewhere(run)
    waiting, orphans = list(runs), []
    while waiting:
        for run in list(waiting):
            training = run.config.training_key()
            if not progress.report_stored(run, store, str(store.divergence_path(training))):
                if live_holder(store.root, training) is not None:
                    continue
                orphans.append(run)
            waiting.remove(run)
        if waiting and stop.wait(HOLDERS_POLL_S):
            break
    return orphans


@contextmanager
def holders_followed(runs: list[PlannedRun], store: ResultsStore,
                     progress: Progress) -> Iterator[Callable[[], list[PlannedRun]]]:
    """:func:`await_holders` in a thread of its own beside the caller's training, so that each run other processes
    train is reported as it ends; yields what waits for that thread and gives the runs whose holders left them. Where
    the thread fails (the store unreadable a moment, say), it says so at once and the runs are followed again once
    asked for. Leaving the block (Ctrl-C too) stops the thread."""
    if not runs:
        yield lambda: []
        return
    stop, ended = threading.Event(), []

    def follow() -> None:
        try:
            ended.append(await_holders(runs, store, progress, stop))
        except Exception as error:
            print(f"note: following the {len(runs)} runs other processes train failed ({error}); they are followed "
                  "again after this call's own training", file=sys.stderr)
            ended.append(None)

    thread = threading.Thread(target=follow, name="holders", daemon=True)
    thread.start()

    def orphans() -> list[PlannedRun]:
        thread.join()
        return ended[0] if ended[0] is not None else await_holders(runs, store, progress)
    try:
        yield orphans
    finally:
        stop.set()
        thread.join()


def _write_manifest(args: argparse.Namespace, options: executors.TrainOptions, progress: Progress, already: int,
                    seconds: float, sharing: str) -> None:
    """The executor's manifest beside the notebooks' (``FIGURES/manifests/executor.json``): how long it trained and
    how many runs, where, with how many workers and threads each (none for Slurm's tasks, which ran elsewhere); the
    main job's time is the executor's and the notebooks' together; on CUDA, how its processes shared a GPU."""
    if args.executor == "local":
        devices = executors.slots(args.jobs, args.per_gpu, options.device)
        threads = options.threads or executors.cpu_threads(len(devices))
    elif args.executor == "inline":
        devices, threads = [options.device], torch.get_num_threads()
    else:  # Slurm's tasks ran elsewhere
        devices, threads = [], None
    manifest = {"executor": args.executor, "workers": len(devices) or None, "profile": args.profile,
                "commit": git_commit(), "device": devices[0] if devices else options.device,
                "seconds": round(seconds, 1),
                "runs": {"trained": len(progress.finished - progress.others), "from_store": already,
                         "failed": len(progress.failed), "diverged": len(progress.diverged),
                         **({"trained_by_others": len(progress.finished & progress.others)}
                            if progress.finished & progress.others else {})},
                "stack": options.stack, "threads": threads, "cpus": os.cpu_count(),
                "machine": device_name(devices[0]) if devices else None,
                "gpu_sharing": (sharing or None) if devices else None}
    folder = Path(args.figures or FIGURES / args.profile) / "manifests"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "executor.json").write_text(json.dumps(manifest, indent=1))
