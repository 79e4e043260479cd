"""What each task of the ``slurm`` executor asks Slurm for: the executor's options, the other sbatch options passed
through (``--account``, ``--sbatch-option``...), a GPU or a share of one (``gres`` ``mps``, ``shard``), and the refusal
of what cannot go together, each with the option to use instead."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from experiments.paths import PROJECT_ROOT
from experiments.scale.gpu_sharing import MEASURED_IN, replays_cuda_graphs


WARNING_S = 120  #: seconds before its time limit that Slurm warns a plain script's task (``--signal=B:USR1@...``)
SUBMITTERS = ("submitit", "sbatch")  #: what submits the arrays: submitit's executor, or sbatch with the plain scripts


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
    #: ``submitit`` or ``sbatch`` (the plain scripts, submitted as they are written); None: submitit where it is
    #: installed, else sbatch
    submit_with: str | None = None
    #: other sbatch options for every task, each (name, value) or (name, None) for a flag: ``--account``, ``--qos``...
    sbatch_options: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SlurmOptions":
        folder = args.slurm_folder or str(Path(args.store or PROJECT_ROOT / "results" / args.profile) / "slurm")
        return cls(folder, args.partition, args.gpus_per_task, args.cpus_per_task, args.mem_gb, args.time_min,
                   args.max_requeues, args.array_parallelism, args.poll, args.sbatch_only, args.submit_with,
                   sbatch_options(args))


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
#: The sbatch options through which ``--sbatch-option`` sets the tasks' memory, beside ``--mem-gb``'s ``--mem``.
MEMORY_OPTIONS = ("mem-per-cpu", "mem-per-gpu")
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
    group.add_argument("--submit-with", choices=SUBMITTERS,
                       help="how the arrays are submitted: through submitit, or the plain sbatch scripts with sbatch "
                            "(the same tasks, followed alike; default: submitit where it is installed, else sbatch)")


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
        if match["name"] in MEMORY_OPTIONS and args.mem_gb is not None:
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
    if args.submit_with == "submitit" and not has_submitit():
        return ("--submit-with submitit, but submitit is not installed here: `pip install submitit`, or leave the "
                "option out to submit the plain scripts with sbatch")
    gres_value = gres_of(sbatch_options(args))
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


def has_submitit() -> bool:
    """Whether submitit can be imported here (an optional dependency: without it the arrays go through sbatch)."""
    return importlib.util.find_spec("submitit") is not None


def memory_refusal(args: argparse.Namespace, memory: dict[str, float]) -> str | None:
    """Why a task cannot hold the stand-in whose images take the most of ``memory`` (GiB by dataset,
    :func:`experiments.scale.plan.stand_in_memory`): their images alone are a lower bound of a task's memory (the
    process and its rendering buffers come on top). Its memory is ``--mem-gb``, or without one (nor a memory
    ``--sbatch-option``) what the partition gives a task that asks none (:func:`default_memory`); None
    where it holds them, or where that memory is not known."""
    if not memory or (not args.mem_gb and any(name in MEMORY_OPTIONS for name, _ in sbatch_options(args))):
        return None
    dataset, gib = max(memory.items(), key=lambda item: item[1])
    images = (f"the {gib:.1f} GiB that the {dataset} stand-in's images alone take in each of its tasks (every split, "
              "built in memory before training; the process needs more on top)")
    if args.mem_gb:
        return f"--mem-gb {args.mem_gb:g} is less than {images}: give more" if gib >= args.mem_gb else None
    if (default := default_memory(args.partition, args.cpus_per_task, args.gpus_per_task)) is None:
        return None
    task_gib, setting = default
    return (f"without --mem-gb each task gets the {task_gib:.1f} GiB that Slurm gives one asking no memory on "
            f"{f'partition {args.partition}' if args.partition else 'the default partition'} ({setting}), less than "
            f"{images}: give --mem-gb above it" if gib >= task_gib else None)


def default_memory(partition: str | None, cpus: int, gpus: int) -> tuple[float, str] | None:
    """The GiB Slurm gives a task of ``cpus`` cores and ``gpus`` GPUs that asks no memory on ``partition`` (None: the
    default one): ``DefMemPerGPU`` where it asks GPUs, else ``DefMemPerCPU``, else ``DefMemPerNode`` (MiB), the
    partition's own (``scontrol show partition``) before the cluster's (``scontrol show config``), with the setting
    that gives it; None where no default is a number (``UNLIMITED``: the node's memory) or Slurm does not answer."""
    shown = _scontrol("--oneliner", "show", "partition", *([partition] if partition else []))
    lines = [line for line in (shown or "").splitlines() if partition or " Default=YES " in f" {line} "]
    if not lines:
        return None
    return _default_in(lines[0], cpus, gpus) or _default_in(_scontrol("show", "config") or "", cpus, gpus)


def _default_in(settings: str, cpus: int, gpus: int) -> tuple[float, str] | None:
    """:func:`default_memory` from one source of ``settings`` (a partition's line, or the cluster's config)."""
    for setting, count, what in (("DefMemPerGPU", gpus, "GPU"), ("DefMemPerCPU", cpus, "core"), ("DefMemPerNode", 1, "")):
        if count and (match := re.search(rf"\b{setting}\s*=\s*([0-9]+)\b", settings)):
            mib = int(match[1])
            return mib * count / 1024, f"{setting}={mib}" + (f" x {count} {what}{'s' * (count > 1)}" if what else "")
    return None


def _scontrol(*arguments: str) -> str | None:
    """What ``scontrol ARGUMENTS`` prints, or None where it fails or is not installed."""
    try:
        shown = subprocess.run(["scontrol", *arguments], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return shown.stdout if shown.returncode == 0 else None


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


def gres_of(options: tuple[tuple[str, str | None], ...]) -> str:
    """The ``gres`` among sbatch ``options`` (:func:`sbatch_options`), empty if none."""
    return next((value or "" for name, value in options if name == "gres"), "")
