"""The ``slurm`` executor: one array task per missing run (or per group of runs stacked into one model, with
``--stack``), submitted through submitit (the launcher most PyTorch research code uses), followed through ``squeue``
and the results store (no accounting database needed).

A task that is preempted or runs out of time is requeued and resumes from its run's last checkpoint in the store:
preempted, by ``--requeue``; out of time, at most :attr:`SlurmOptions.max_requeues` times, by submitit's checkpoint hook
or, in the plain scripts, by a trap on the warning signal Slurm sends :data:`WARNING_S` seconds before the limit
(Slurm itself never requeues a task that reached its time limit). Runs whose timings are the result (:attr:`PlannedRun.alone`) go in a
second array whose tasks each hold a whole node (``--exclusive``). The same arrays are always written as plain
``sbatch --array`` scripts calling ``python -m experiments run-one KEY [KEY ...]``, for sites without submitit or with another
scheduler (``--sbatch-only`` writes them and submits nothing).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path

from experiments.engine.store import ResultsStore
from experiments.paths import PROJECT_ROOT
from experiments.scale.executors import TrainOptions, groups, train_group
from experiments.scale.gpu_sharing import MEASURED_IN, replays_cuda_graphs
from experiments.scale.plan import PlannedRun
from experiments.scale.progress import Progress
from experiments.scale.slurm_queue import (LEDGER, UNANSWERED, InQueue, array_ids, job_name, queued, queued_tasks,
                                          record, still_in_queue)


WARNING_S = 120  #: seconds before its time limit that Slurm warns a plain script's task (``--signal=B:USR1@...``)

#: The plain scripts' answer to Slurm's warning: requeue the task, which then resumes from its checkpoints.
_OUT_OF_TIME = """out_of_time() {{  # Slurm's warning, {warning} s before the time limit
  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {max_requeues} ]; then
    echo "out of time after {max_requeues} requeues: not requeued again; give a longer --time-min" >&2
  elif scontrol requeue "$SLURM_JOB_ID"; then
    echo "out of time: requeued (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of at most {max_requeues}); it resumes from its checkpoints" >&2
  else
    echo "out of time, and scontrol could not requeue the task: its checkpoints are kept, run it again" >&2
  fi
}}
trap out_of_time USR1
"""


@dataclass(frozen=True)
class SlurmOptions:
    """What each array task asks Slurm for, and where the submission's files go."""

    folder: str  #: scripts, key lists and the tasks' logs
    partition: str | None = None
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    mem_gb: float | None = None
    time_min: int = 60
    max_requeues: int = 20  #: times a task out of time is requeued to go on from its checkpoints
    array_parallelism: int = 64  #: tasks of one array running at once
    poll: float = 10.0  #: seconds between two looks at the queue
    sbatch_only: bool = False
    #: other sbatch options for every task, each (name, value) or (name, None) for a flag: ``--account``, ``--qos``...
    sbatch_options: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SlurmOptions":
        folder = args.slurm_folder or str(Path(args.store or PROJECT_ROOT / "results" / args.profile) / "slurm")
        return cls(folder, args.partition, args.gpus_per_task, args.cpus_per_task, args.mem_gb, args.time_min,
                   args.max_requeues, args.array_parallelism, args.poll, args.sbatch_only, sbatch_options(args))


#: The sbatch options that ``--sbatch-option`` cannot give, nor any abbreviation of them (which sbatch would take for
#: them), each with the option of ``train`` that gives it, or None: those the executor sets itself, those that would
#: change what a task runs on (more tasks, nodes or GPUs than its one run uses), and those that change how sbatch
#: answers (the job id the executor reads).
OWN_SBATCH_OPTIONS = {
    "account": "--account", "qos": "--qos", "constraint": "--constraint", "partition": "--partition",
    "time": "--time-min", "cpus-per-task": "--cpus-per-task", "mem": "--mem-gb", "array": "--array-parallelism",
    **dict.fromkeys(("gpus-per-task", "gpus", "gpus-per-node", "gpus-per-socket", "tres-per-task"), "--gpus-per-task"),
    **dict.fromkeys(("job-name", "ntasks", "ntasks-per-node", "nodes", "requeue", "no-requeue", "signal", "output",
                     "error", "open-mode", "exclusive", "wrap", "wckey", "parsable", "quiet", "test-only", "wait")),
}
_SBATCH_OPTION = re.compile(r"(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>.+))?")


def sbatch_options(args: argparse.Namespace) -> tuple[tuple[str, str | None], ...]:
    """``--account``, ``--qos``, ``--constraint`` and each ``--sbatch-option NAME[=VALUE]`` as (name, value) pairs,
    in that order (:func:`refusal` has checked them)."""
    named = [(name, getattr(args, name)) for name in ("account", "qos", "constraint") if getattr(args, name)]
    given = [_SBATCH_OPTION.fullmatch(option.removeprefix("--")) for option in args.sbatch_option or ()]
    return tuple(named + [(match["name"], match["value"]) for match in given])


def add_options(parser: argparse.ArgumentParser, *, folder: str = "STORE/slurm",
                sbatch_only: str = "write the plain sbatch scripts and submit nothing (run them with sbatch "
                                   "yourself)") -> None:
    """The Slurm executor's options; ``folder``: the default of ``--slurm-folder`` as help shows it; ``sbatch_only``:
    what ``--sbatch-only`` does, as help says it."""
    group = parser.add_argument_group("slurm executor")
    group.add_argument("--partition", help="Slurm partition (default: the cluster's default)")
    group.add_argument("--gpus-per-task", type=int, default=0,
                       help="GPUs per run (default 0; with --device cuda, give 1)")
    group.add_argument("--cpus-per-task", type=int, default=1, help="CPU cores per run (default 1)")
    group.add_argument("--mem-gb", type=float, help="memory per run in GB (default: the partition's)")
    group.add_argument("--time-min", type=int, default=60,
                       help="time limit per task in minutes; a task out of time is requeued and resumes (default 60)")
    group.add_argument("--max-requeues", type=int, default=20,
                       help="times a task is requeued when its time is up (default 20; the plain scripts count every "
                            "requeue, preemptions too); a run needing more tasks than that fails: give a longer "
                            "--time-min")
    group.add_argument("--array-parallelism", type=int, default=64, help="tasks of an array running at once (default 64)")
    group.add_argument("--poll", type=float, default=10.0, help="seconds between two looks at the queue (default 10)")
    group.add_argument("--account", help="the account the tasks are charged to (sbatch --account)")
    group.add_argument("--qos", help="the tasks' quality of service (sbatch --qos)")
    group.add_argument("--constraint", help="the node features the tasks need, e.g. a GPU model (sbatch --constraint)")
    group.add_argument("--sbatch-option", action="append", metavar="NAME[=VALUE]",
                       help="any other sbatch option for every task, without its dashes or as "
                            "--sbatch-option=--NAME=VALUE (repeatable): --sbatch-option reservation=ours "
                            "--sbatch-option mail-type=FAIL")
    group.add_argument("--slurm-folder", help=f"scripts and task logs (default: {folder})")
    group.add_argument("--sbatch-only", action="store_true", help=sbatch_only)


def refusal_elsewhere(args: argparse.Namespace) -> str | None:
    """Why the Slurm executor's options cannot go with ``args``'s other executor, which would ignore them: the first
    given another value than its default; None where none is."""
    parser = argparse.ArgumentParser()
    add_options(parser)
    given = [name for name, default in vars(parser.parse_args([])).items() if getattr(args, name, default) != default]
    return (f"--{given[0].replace('_', '-')} is an option of the Slurm executor: add --executor slurm, or leave it out"
            if given else None)


#: The generic resources through which a task holds a share of a GPU beside other tasks: ``mps`` (a share of NVIDIA's
#: Multi-Process Service, which runs the tasks' kernels at once) and ``shard`` (a share taken in turns, time-sliced).
GPU_SHARES = ("mps", "shard")


def _gres(gres: str) -> list[tuple[str, list[str]]]:
    """A ``--gres`` value's resources, each (name, the rest of its colon-separated fields: a type, a count), with
    Slurm's optional ``gres:`` prefix and socket bindings such as ``(S:0-1)`` aside."""
    return [(name, rest) for resource in gres.split(",") if resource
            for name, *rest in [re.sub(r"\(.*\)$", "", resource.removeprefix("gres:")).split(":")]]


def gres_gpus(gres: str) -> int:
    """The GPUs a ``--gres`` value asks for: ``gpu`` and ``gpu:a100`` one, ``gpu:2`` and ``gpu:a100:2`` two; other
    resources, shares of a GPU (:data:`GPU_SHARES`) among them, none."""
    return sum(int(rest[-1]) if rest and re.fullmatch(r"[0-9]+", rest[-1]) else 1
               for name, rest in _gres(gres) if name == "gpu")


def gres_shares(gres: str) -> list[str]:
    """The shares of a GPU (:data:`GPU_SHARES`) a ``--gres`` value asks for, each as given (``mps:25``); a share of
    count 0 holds nothing."""
    return [":".join([name, *rest]) for name, rest in _gres(gres)
            if name in GPU_SHARES and not (rest and re.fullmatch(r"0+", rest[-1]))]


def sharing_note(gres: str, compile_mode: str | None) -> str:
    """Empty, unless the tasks take turns on shares of a GPU (``shard``) while their steps replay CUDA graphs: then
    side by side they go no faster than one after another, as processes without MPS (:mod:`gpu_sharing`)."""
    if not any(share.startswith("shard") for share in gres_shares(gres)) or not replays_cuda_graphs(compile_mode):
        return ""
    return (f"note: --sbatch-option gres={gres}: Slurm's shards take turns on a GPU, so steps replayed as CUDA graphs "
            f"({compile_mode}) go no faster side by side than one after another ({MEASURED_IN}); where the cluster "
            "offers NVIDIA's Multi-Process Service as gres/mps, gres=mps:N runs them at once")


def _sbatch_options_refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--sbatch-option`` (:data:`OWN_SBATCH_OPTIONS`, an option given twice, or a memory per CPU
    or GPU beside ``--mem-gb``); None: nothing."""
    for option in args.sbatch_option or ():
        if (match := _SBATCH_OPTION.fullmatch(option.removeprefix("--"))) is None:
            return (f"--sbatch-option {option!r} should be an sbatch option's long name, with =VALUE if it takes one "
                    "(mail-type=FAIL, say)")
        if owned := [own for own in OWN_SBATCH_OPTIONS if own.startswith(match["name"])]:
            own = match["name"] if match["name"] in owned else owned[0]
            return f"--sbatch-option {option!r} is sbatch's --{own}, which " + (
                f"train gives itself: use {OWN_SBATCH_OPTIONS[own]}" if OWN_SBATCH_OPTIONS[own] else
                "the executor sets itself, or which would change what a task runs on or how sbatch answers")
        if match["name"] in ("mem-per-cpu", "mem-per-gpu") and args.mem_gb is not None:
            return f"--sbatch-option {option!r} and --mem-gb {args.mem_gb:g} each set the tasks' memory: give one"
    names = [name for name, _ in sbatch_options(args)]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        return (f"sbatch's --{twice[0]} is given twice (--sbatch-option, or its own option): give it once, with "
                "every value in it (gres=gpu:1,nvme:1, say)")
    return None


def refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with the Slurm options of ``train`` (None: nothing). A run trains on one GPU, the first its task
    sees, so a task holds one GPU, or a share of one, exactly when it trains on ``cuda``: through ``--gpus-per-task
    1``, or, where the cluster counts GPUs as generic resources only, ``--sbatch-option gres=gpu:1``, or a share where
    it shares them (``gres=mps:N``, ``gres=shard:N``)."""
    for name in ("cpus_per_task", "time_min", "array_parallelism"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} should be a positive number, got {getattr(args, name)}"
    if args.max_requeues < 0:
        return f"--max-requeues should be 0 or more, got {args.max_requeues}"
    if args.time_min * 60 <= WARNING_S + 60:  # Slurm may warn up to a minute early: the task would requeue at once
        return (f"--time-min {args.time_min} leaves no time to train: Slurm warns a task {WARNING_S} s before its "
                f"limit to requeue it; give more than {(WARNING_S + 60) // 60} minutes")
    if args.poll <= 0:
        return f"--poll should be a positive number of seconds, got {args.poll}"
    if args.mem_gb is not None and args.mem_gb <= 0:
        return f"--mem-gb should be a positive number of GB, got {args.mem_gb}"
    if args.slurm_folder and Path(args.slurm_folder).exists() and not Path(args.slurm_folder).is_dir():
        return f"--slurm-folder {args.slurm_folder} is a file: give a folder (it is made if missing)"
    if args.device not in ("cpu", "cuda"):
        return f"--device should be cpu or cuda for Slurm's tasks (each numbers its own GPUs from 0), got {args.device}"
    if args.gpus_per_task not in (0, 1):
        return f"--gpus-per-task should be 0 or 1 (a run trains on one GPU), got {args.gpus_per_task}"
    for name in ("partition", "account", "qos", "constraint"):
        if (value := getattr(args, name)) is not None and not value.strip():
            return f"--{name} is empty ({value!r}): give one, or leave the option out"
    if problem := _sbatch_options_refusal(args):
        return problem
    gres_value = _gres_value(args)
    gres, shares = gres_gpus(gres_value), gres_shares(gres_value)
    if (gres or shares) and args.gpus_per_task:
        return (f"--gpus-per-task 1 and --sbatch-option gres={gres_value}: each asks for the task's GPU; give one of "
                "them")
    if gres > 1:
        return f"--sbatch-option gres={gres_value} asks for {gres} GPUs a task, where a run trains on one: give gpu:1"
    if gres and shares or len(shares) > 1:
        return (f"--sbatch-option gres={gres_value} asks for a GPU more than once (a GPU and a share of one, or two "
                "shares): give one of gpu:1, mps:N or shard:N")
    if bool(args.gpus_per_task or gres or shares) != (args.device == "cuda"):
        asked = (f"--gpus-per-task {args.gpus_per_task}" if args.gpus_per_task or not gres_value else
                 f"--sbatch-option gres={gres_value}")
        return (f"{asked} with --device {args.device}: the tasks would "
                + ("hold GPUs and train on the CPU; add --device cuda" if args.gpus_per_task or gres or shares else
                   "train on CUDA without a GPU; add --gpus-per-task 1 (or --sbatch-option gres=gpu:1, or a share of "
                   "one: gres=mps:N)"))
    return None


def array_sbatch_options(slurm: SlurmOptions, alone: bool) -> tuple[tuple[str, str | None], ...]:
    """``slurm.sbatch_options`` for one array. The runs trained alone, whose timings are the result, hold a whole GPU
    (``gres`` ``gpu:1``) where the others hold a share of one (:data:`GPU_SHARES`): under MPS a share caps the run's
    part of the GPU, and Slurm refuses a shard beside ``--exclusive``."""
    if not alone:
        return slurm.sbatch_options
    return tuple((name, ",".join(map(_whole_gpu, value.split(","))) if name == "gres" and value else value)
                 for name, value in slurm.sbatch_options)


def _whole_gpu(resource: str) -> str:
    """A share of a GPU as a whole GPU of the same type (``mps:a100:25`` as ``gpu:a100:1``); another resource as is."""
    if not gres_shares(resource):
        return resource
    _, fields = _gres(resource)[0]
    return ":".join(["gpu", *[field for field in fields if not re.fullmatch(r"[0-9]+", field)][:1], "1"])


def _gres_value(args: argparse.Namespace) -> str:
    """The ``gres`` of ``--sbatch-option`` (empty if none)."""
    return next((value or "" for name, value in sbatch_options(args) if name == "gres"), "")


def sbatch_script(tasks: list[list[PlannedRun]], options: TrainOptions, slurm: SlurmOptions, profile: str,
                  name: str, outside_plan: bool = False) -> Path:
    """Write ``<folder>/<name>-<digest>.keys`` (a line of keys per task; named by its content, so that a later
    submission never changes the keys of tasks still queued) and ``<folder>/<name>.sbatch``: an array with one task per
    group of runs, each calling ``python -m experiments run-one``; returns the script's path."""
    folder = Path(slurm.folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(" ".join(run.key for run in group) + "\n" for group in tasks)
    keys = folder / f"{name}-{sha1(lines.encode()).hexdigest()[:12]}.keys"
    keys.write_text(lines)
    if outside_plan:  # what run-one reads for runs no notebook's grid holds
        (folder / "configs").mkdir(exist_ok=True)
        for run in (run for group in tasks for run in group):
            (folder / "configs" / f"{run.key}.json").write_text(json.dumps(run.config.to_dict()))
    alone = name.endswith("alone")
    directives = [f"--job-name={job_name(profile, name)}", f"--array=0-{len(tasks) - 1}%{1 if alone else slurm.array_parallelism}",
                  "--ntasks=1", f"--cpus-per-task={slurm.cpus_per_task}", f"--time={slurm.time_min}", "--requeue",
                  f"--signal=B:USR1@{WARNING_S}", f"--output={folder}/%A_%a.out", f"--error={folder}/%A_%a.err",
                  "--open-mode=append"]  # a requeued task's log goes on after its earlier runs
    directives += [f"--partition={slurm.partition}"] if slurm.partition else []
    directives += [f"--gpus-per-task={slurm.gpus_per_task}"] if slurm.gpus_per_task else []
    directives += [f"--mem={int(slurm.mem_gb * 1024)}M"] if slurm.mem_gb else []
    directives += ["--exclusive"] if alone else []
    directives += [f"--{name}" + (f"={shlex.quote(value)}" if value is not None else "")
                   for name, value in array_sbatch_options(slurm, alone)]
    command = [sys.executable, "-m", "experiments", "run-one", "$keys", "--profile", profile,
               *(["--configs", str(folder / "configs")] if outside_plan else []), *_run_one_options(options)]
    runs = sum(len(group) for group in tasks)
    script = folder / f"{name}.sbatch"
    script.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {line}\n" for line in directives)
                      + f"# {runs} runs of the {profile} profile in {len(tasks)} tasks; each resumes from its "
                        "checkpoint if requeued.\n"
                      + _OUT_OF_TIME.format(max_requeues=slurm.max_requeues, warning=WARNING_S)
                      + f"cd {shlex.quote(str(PROJECT_ROOT))}\n"
                      + f'keys=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(str(keys))})\n'
                      + " ".join(part if part == "$keys" else shlex.quote(part) for part in command)
                      + " &  # $keys unquoted: a task's keys are words\n"
                      + 'run=$!\n'
                      + 'while kill -0 "$run" 2>/dev/null; do wait "$run"; done  # a trap ends a wait, not the run\n'
                      + 'wait "$run"  # its own exit status, also where it ended during a trap\n')
    return script


def _run_one_options(options: TrainOptions) -> list[str]:
    pairs = [("--store", str(Path(options.store).resolve())), ("--device", options.device),
             ("--data-root", options.data_root), ("--workers", options.workers), ("--compile", options.compile_mode),
             ("--threads", options.threads or None)]
    return [str(part) for flag, value in pairs if value is not None for part in (flag, value)]


class RunTask:
    """What a submitit array task calls: train one group of runs (one run, or runs stacked into one model); on
    preemption or time-out, requeue the same call (submitit calls :meth:`checkpoint`), which resumes from the runs'
    checkpoints in the store."""

    def __init__(self, options: TrainOptions):
        self.options = options

    def __call__(self, group: list[PlannedRun]) -> list[str]:
        # submitit ignores SIGTERM, so a requeued or preempted task would go on training until Slurm's KillWait;
        # it stops at once instead: the epochs it finished are in its checkpoints.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        train_group(group, self.options)
        return [run.key for run in group]

    def checkpoint(self, group: list[PlannedRun]):
        import submitit  # optional: only a submitit task calls this

        return submitit.helpers.DelayedSubmission(self, group)


def train(runs: list[PlannedRun], options: TrainOptions, progress: Progress, slurm: SlurmOptions, *,
          profile: str, outside_plan: bool = False) -> None:
    """Submit ``runs`` as arrays and follow them until every task has ended (see the module's text); with
    ``outside_plan`` (the calibration's runs), each run's config is written beside the scripts for ``run-one``. Runs
    whose task of an earlier submission (:data:`LEDGER`) is still in the queue are followed, not submitted again."""
    gres = dict(slurm.sbatch_options).get("gres") or ""
    if any(not run.alone for run in runs) and (note := sharing_note(gres, options.compile_mode)):
        print(note, file=sys.stderr)
    if gres_shares(gres) and (timed := sum(run.alone for run in runs)):
        print(f"note: the {timed} runs trained alone (timed) each hold a whole GPU (gres "
              f"{dict(array_sbatch_options(slurm, True))['gres']}), not a share of one ({gres})", file=sys.stderr)
    earlier_tasks, in_queue = [], set()
    if not slurm.sbatch_only:
        earlier = _ledger_in_queue(runs, slurm)
        earlier_tasks, in_queue = earlier.tasks, earlier.in_queue
        followed = {run.key for run, _, _ in earlier_tasks}
        runs = [run for run in runs if run.key not in followed]
        if earlier_tasks:
            print(f"{len(earlier_tasks)} runs are in the queue from an earlier submission (job "
                  f"{', '.join(array_ids(job_id for _, job_id, _ in earlier_tasks))}): followed, not submitted again",
                  file=sys.stderr)
        if not runs:
            return follow(earlier_tasks, options, progress, slurm.poll)
    arrays = [(name, groups(part, options)) for name, part in (("runs", [run for run in runs if not run.alone]),
                                                                ("alone", [run for run in runs if run.alone])) if part]
    try:
        scripts = [sbatch_script(tasks, options, slurm, profile, name, outside_plan) for name, tasks in arrays]
    except OSError as error:
        raise SystemExit(f"error: the Slurm scripts cannot be written in {slurm.folder} ({error.strerror or error}): "
                         "give a --slurm-folder (or --store) you can write to") from None
    if slurm.sbatch_only:
        checked = test_only(scripts)
        print("wrote " + ", ".join(map(str, scripts)) + f" ({checked}): submit each with `sbatch SCRIPT`",
              file=sys.stderr)
        return
    unknown = queued_tasks(profile) - len(in_queue)
    if not outside_plan and unknown > 0:  # the calibration's stand-ins share their names
        print(f"note: {unknown} tasks of an earlier submission for the {profile} profile are still queued that no "
              f"ledger here lists (from another --slurm-folder, or another script); a run they have not started is "
              f"submitted again, and its second task waits for the first ({_scancel_hint(profile)} stop the earlier "
              "ones)", file=sys.stderr)
    try:
        import submitit
    except ImportError:
        raise SystemExit("the slurm executor submits through submitit: `pip install submitit`, or submit the scripts "
                         f"written with sbatch yourself: {', '.join(map(str, scripts))}") from None
    tasks_submitted = []
    for name, tasks in arrays:
        executor = submitit.AutoExecutor(folder=Path(slurm.folder) / "submitit", cluster="slurm",
                                         slurm_max_num_timeout=slurm.max_requeues)  # submitit's default: 3
        # one task a job, said outright: Slurm refuses --gpus-per-task without a task count (22.05 as 23.11)
        executor.update_parameters(name=job_name(profile, name), timeout_min=slurm.time_min, tasks_per_node=1,
                                   cpus_per_task=slurm.cpus_per_task, slurm_array_parallelism=
                                   1 if name == "alone" else slurm.array_parallelism,
                                   slurm_additional_parameters={"requeue": True, **({"exclusive": True}
                                                                                    if name == "alone" else {}),
                                                                **{option: True if value is None else value
                                                                   for option, value in
                                                                   array_sbatch_options(slurm, name == "alone")}},
                                   **({"slurm_partition": slurm.partition} if slurm.partition else {}),
                                   **({"slurm_gpus_per_task": slurm.gpus_per_task} if slurm.gpus_per_task else {}),
                                   **({"mem_gb": slurm.mem_gb} if slurm.mem_gb else {}))
        try:
            submitted = executor.map_array(RunTask(options), tasks)
        except submitit.core.utils.FailedJobError as error:  # sbatch said no: a partition, a gres, a limit
            why = [line for line in str(error).strip().splitlines() if line and not line.startswith("Try ")]
            raise SystemExit(f"error: sbatch refused the {name} array: {why[-1] if why else 'it gave no reason'}") \
                from None
        except submitit.core.utils.FailedSubmissionError as error:  # an answer without the job id
            raise SystemExit(f"error: sbatch's answer for the {name} array names no job ({error}); it may be queued "
                             f"all the same: `squeue --me --name {job_name(profile, name)}` tells") from None
        array_tasks = [(group, job.job_id, str(job.paths.stderr)) for group, job in zip(tasks, submitted)]
        record([(job_id, [run.key for run in group], log) for group, job_id, log in array_tasks], slurm.folder)
        tasks_submitted += [(run, job_id, log) for group, job_id, log in array_tasks for run in group]
    print(f"submitted {len({job_id for _, job_id, _ in tasks_submitted})} array tasks (job "
          f"{', '.join(array_ids(job_id for _, job_id, _ in tasks_submitted))})", file=sys.stderr)
    follow(earlier_tasks + tasks_submitted, options, progress, slurm.poll)


#: What sbatch says when it cannot ask the controller (no answer, no configuration, no munge), as against a refusal.
_UNCHECKED = re.compile(f"{UNANSWERED.pattern}|configuration (file|source)|authentication|munge", re.IGNORECASE)


def test_only(scripts: list[Path], timeout: float = 60.0) -> str:
    """Ask this machine's sbatch whether it would take each script as written (``sbatch --test-only``: its options
    parsed, then its partition, GPUs, node features and account weighed by the controller; time and QOS limits are
    not; nothing is queued), so that a misspelled ``--sbatch-option`` is caught before a script is submitted by hand.
    Returns how far each script was checked; raises SystemExit with sbatch's reason where it refuses one."""
    if shutil.which("sbatch") is None:
        return "not checked: no sbatch here; sbatch checks them when you submit them"
    checked = {}
    for script in scripts:
        try:
            answer = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                                    timeout=timeout)
        except subprocess.TimeoutExpired:
            checked[script.name] = f"not checked: sbatch --test-only gave no answer in {timeout:g} s"
            continue
        why = [line for line in answer.stderr.splitlines() if line.strip() and not line.startswith("Try ")]
        if answer.returncode and _UNCHECKED.search(answer.stderr):
            checked[script.name] = f"not checked against the cluster: {why[-1]}"
        elif answer.returncode:
            raise SystemExit(f"error: sbatch --test-only refuses {script}: {'; '.join(why) or 'it gave no reason'}. "
                             "Nothing was submitted; the scripts are written all the same (for another cluster, "
                             "submit them there), or mend the option and run the same command again")
        else:
            checked[script.name] = "taken by sbatch --test-only, nothing queued"
    if len(set(checked.values())) == 1:
        return next(iter(checked.values()))
    return "; ".join(f"{name}: {said}" for name, said in checked.items())


def _ledger_in_queue(runs: list[PlannedRun], slurm: SlurmOptions, tries: int = 3) -> InQueue:
    """:func:`still_in_queue` for ``train``, asked up to ``tries`` times ``slurm.poll`` apart while the queue does not
    answer; then the command stops rather than submit runs whose tasks may still be queued."""
    for attempt in range(tries):
        if (answer := still_in_queue(runs, slurm.folder)) is not None:
            return answer
        if attempt + 1 < tries:
            time.sleep(slurm.poll)
    raise SystemExit(f"error: Slurm (squeue or scontrol) did not answer {tries} times, so the tasks that "
                     f"{Path(slurm.folder) / LEDGER} lists may still be queued: nothing submitted, so that no run is "
                     "submitted twice; run the same command again once `squeue --me` answers")


def still_queued_text(profile: str) -> str:
    """What an interrupted follower says of the arrays it submitted for ``profile``: they go on without it."""
    return f"; the Slurm tasks already submitted go on (`squeue --me` lists them; {_scancel_hint(profile)} stop them)"


def _scancel_hint(profile: str) -> str:
    """The commands that cancel this user's arrays of ``profile``, and no other user's of the same names."""
    return " and ".join(f"`scancel --user $USER --name {job_name(profile, array)}`" for array in ("runs", "alone"))


#: Seconds without an answer from ``squeue`` after which the follower stops (the tasks go on; a new ``train`` follows
#: them through the ledger).
SILENT_QUEUE_S = 1800.0


def follow(tasks: list[tuple[PlannedRun, str, str]], options: TrainOptions, progress: Progress,
           poll: float) -> None:
    """Report each run (with its array task's job id and log) as it runs and ends: finished when its record is in the
    store, diverged when the store keeps its loss's NaN, failed when its task left the queue with neither; stops after
    :data:`SILENT_QUEUE_S` seconds without an answer from the queue."""
    store, waiting = ResultsStore(options.store), {run.key: (run, job_id, log) for run, job_id, log in tasks}
    followed_arrays = array_ids(job_id for _, job_id, _ in tasks)
    last_answer = time.monotonic()
    while waiting:
        if (states := queued(followed_arrays)) is None:
            if time.monotonic() - last_answer > SILENT_QUEUE_S:
                raise SystemExit(f"error: squeue has not answered for {SILENT_QUEUE_S / 60:g} minutes: the "
                                 f"{len(waiting)} tasks still followed go on without this command; run it again to "
                                 "follow them (runs still queued are not submitted again)")
            time.sleep(poll)
            continue
        last_answer = time.monotonic()
        for key, (run, job_id, log) in list(waiting.items()):
            if not progress.report_stored(run, store, log):
                if job_id in states:
                    if states[job_id] == "RUNNING" and run.key not in progress.running:
                        progress.start(run)
                    continue
                progress.fail(run, log)
            del waiting[key]
        if waiting:
            time.sleep(poll)
