"""The ``slurm`` executor: one array task per missing run (or per group of runs stacked into one model, with
``--stack``), submitted through submitit (the launcher most PyTorch research code uses) or, where it is missing or
with ``--submit-with sbatch``, as the plain scripts below through ``sbatch``; followed through ``squeue`` and the
results store (no accounting database needed).

A task that is preempted or runs out of time is requeued and resumes from its run's last checkpoint in the store:
preempted, by ``--requeue``; out of time, at most :attr:`SlurmOptions.max_requeues` times, by submitit's checkpoint
hook or, in the plain scripts, by a trap on the warning signal Slurm sends :data:`WARNING_S` seconds before the limit
(Slurm itself never requeues a task that reached its time limit). Runs whose timings are the result
(:attr:`PlannedRun.alone`) go in a second array whose tasks each hold a whole node (``--exclusive``). The same arrays
are always written as plain ``sbatch --array`` scripts calling ``python -m experiments run-one KEY [KEY ...]``, for
sites with another scheduler, or to submit by hand (``--sbatch-only`` writes them and submits nothing).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from hashlib import sha1
from pathlib import Path

from experiments.engine.store import ResultsStore
from experiments.paths import PROJECT_ROOT
from experiments.scale.executors import TrainOptions, device_refusal, groups, train_group
from experiments.scale.plan import PlannedRun
from experiments.scale.progress import Progress
from experiments.scale.slurm_queue import (LEDGER, STALLED, UNANSWERED, InQueue, array_ids, job_name, queued,
                                          queued_tasks, record, still_in_queue, task_log)
from experiments.scale.slurm_request import (WARNING_S, SlurmOptions, array_sbatch_options, gres_of, gres_shares,
                                            has_submitit, sharing_note)


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
        if problem := device_refusal(self.options.device):  # before the data are built: no GPU, no minutes lost
            raise RuntimeError(problem)
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
    gres = gres_of(slurm.sbatch_options)
    if any(not run.alone for run in runs) and (note := sharing_note(gres, options.compile_mode)):
        print(note, file=sys.stderr)
    if gres_shares(gres) and (timed := sum(run.alone for run in runs)):
        print(f"note: the {timed} runs trained alone (timed) each hold a whole GPU (gres "
              f"{gres_of(array_sbatch_options(slurm, True))}), not a share of one ({gres})", file=sys.stderr)
    earlier_tasks, in_queue = [], set()
    if not slurm.sbatch_only:
        earlier = _ledger_in_queue(runs, slurm)
        earlier_tasks, in_queue = earlier.tasks, earlier.in_queue
        followed, to_train = {run.key for run, _, _ in earlier_tasks}, len(runs)
        runs = [run for run in runs if run.key not in followed]
        if earlier_tasks:
            print(f"{len(earlier_tasks)} of the {to_train} runs to train are in the queue from an earlier submission "
                  f"(job {', '.join(array_ids(job_id for _, job_id, _ in earlier_tasks))}): followed, not submitted "
                  f"again{f'; the other {len(runs)} are submitted' if runs else ''}", file=sys.stderr)
        if not runs:
            return follow(earlier_tasks, options, progress, slurm.poll)
    first = "calibration" if outside_plan else "runs"  # a name of its own: one scancel stops one or the other
    arrays = [(name, groups(part, options)) for name, part in ((first, [run for run in runs if not run.alone]),
                                                                ("alone", [run for run in runs if run.alone])) if part]
    try:
        scripts = [sbatch_script(tasks, options, slurm, profile, name, outside_plan) for name, tasks in arrays]
        written = [script.read_text() for script in scripts]  # what sbatch submits: a later train may rewrite them
    except OSError as error:
        raise SystemExit(f"error: the Slurm scripts cannot be written in {slurm.folder} ({error.strerror or error}): "
                         "give a --slurm-folder (or --store) you can write to") from None
    if slurm.sbatch_only:
        checked = test_only(scripts)
        print("wrote " + ", ".join(map(str, scripts)) + f" ({checked}): submit each with `sbatch SCRIPT`",
              file=sys.stderr)
        return
    unknown = queued_tasks(profile) - len(in_queue)
    if not outside_plan and unknown > 0:  # the training's arrays alone: the calibration's are not its business
        print(f"note: {unknown} tasks of an earlier submission for the {profile} profile are still queued that no "
              f"ledger here lists (from another --slurm-folder, or another script); a run they have not started is "
              f"submitted again, and its second task waits for the first ({_scancel_hint(profile)} stop the earlier "
              "ones)", file=sys.stderr)
    by_sbatch = slurm.submit_with == "sbatch" or (slurm.submit_with is None and not has_submitit())
    if by_sbatch and slurm.submit_with is None:
        print("note: submitit is not installed here: the plain scripts are submitted with sbatch", file=sys.stderr)
    tasks_submitted = []
    for (name, tasks), script, text in zip(arrays, scripts, written):
        job_ids = (_submitted_by_sbatch(script, text, len(tasks), name, profile) if by_sbatch else
                   _submitted_by_submitit(tasks, name, options, slurm, profile))
        array_tasks = [(group, job_id, log) for group, (job_id, log) in zip(tasks, job_ids)]
        record([(job_id, [run.key for run in group], log) for group, job_id, log in array_tasks], slurm.folder)
        tasks_submitted += [(run, job_id, log) for group, job_id, log in array_tasks for run in group]
    print(f"submitted {len({job_id for _, job_id, _ in tasks_submitted})} array tasks (job "
          f"{', '.join(array_ids(job_id for _, job_id, _ in tasks_submitted))})"
          + (" with sbatch" if by_sbatch else ""), file=sys.stderr)
    follow(earlier_tasks + tasks_submitted, options, progress, slurm.poll)


def _submitted_by_submitit(tasks: list[list[PlannedRun]], name: str, options: TrainOptions, slurm: SlurmOptions,
                           profile: str) -> list[tuple[str, str]]:
    """Submit the array ``name`` through submitit, one task a group of ``tasks`` (:class:`RunTask`): each task's job id
    and log."""
    import submitit  # optional: train submits through sbatch where it is missing

    executor = submitit.AutoExecutor(folder=Path(slurm.folder) / "submitit", cluster="slurm",
                                     slurm_max_num_timeout=slurm.max_requeues)  # submitit's default: 3
    # one task a job, said outright: Slurm refuses --gpus-per-task without a task count (22.05 as 24.11)
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
        raise SystemExit(_refused(name, str(error))) from None
    except submitit.core.utils.FailedSubmissionError as error:  # an answer without the job id
        raise SystemExit(_no_job_named(name, profile, str(error))) from None
    return [(job.job_id, str(job.paths.stderr)) for job in submitted]


def _submitted_by_sbatch(script: Path, text: str, tasks: int, name: str, profile: str) -> list[tuple[str, str]]:
    """Submit the plain script of the array ``name`` (of ``tasks`` tasks), as written (``text``, on sbatch's input:
    another ``train`` may since have rewritten the file), with ``sbatch``: each task's job id (``<array>_<index>``)
    and log."""
    try:
        answer = subprocess.run(["sbatch", "--parsable"], input=text, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SystemExit("error: the slurm executor found no sbatch here: run it where Slurm's commands are (a login "
                         "node), or give --sbatch-only to write the scripts") from None
    except subprocess.TimeoutExpired:
        raise SystemExit(_no_job_named(name, profile, "sbatch gave no answer in 120 s")) from None
    if answer.returncode != 0:  # refused, or no answer from the controller, when it may be queued all the same
        raise SystemExit(_no_job_named(name, profile, answer.stderr.strip()) if UNANSWERED.search(answer.stderr)
                         else _refused(name, answer.stderr))
    lines = answer.stdout.strip().splitlines()  # a site's sbatch wrapper may print lines before sbatch's own
    array = lines[-1].split(";")[0] if lines else ""  # --parsable: the job id[;cluster]
    if not array.isdigit():
        raise SystemExit(_no_job_named(name, profile, answer.stdout.strip() or answer.stderr.strip()))
    return [(f"{array}_{index}", str(task_log(script.parent, f"{array}_{index}"))) for index in range(tasks)]


def _refused(name: str, said: str) -> str:
    why = _sbatch_said(said)
    return f"error: sbatch refused the {name} array: {why[-1] if why else 'it gave no reason'}"


def _no_job_named(name: str, profile: str, said: str) -> str:
    return (f"error: sbatch's answer for the {name} array names no job ({said}); it may be queued all the same: "
            f"`squeue --me --name {job_name(profile, name)}` tells")


#: What sbatch says when it cannot ask the controller (no answer, no configuration, no munge), as against a refusal.
_UNCHECKED = re.compile(f"{UNANSWERED.pattern}|configuration (file|source)|authentication|munge", re.IGNORECASE)


def _sbatch_said(text: str) -> list[str]:
    """sbatch's lines of ``text``, its ``Try "sbatch --help"`` hint aside."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("Try ")]


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
        why = _sbatch_said(answer.stderr)
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


def still_queued_text(profile: str, calibration: bool = False) -> str:
    """What an interrupted follower says of the arrays it submitted for ``profile`` (its ``calibration``'s): they go
    on without it."""
    hint = _scancel_hint(profile, ("calibration",) if calibration else ("runs", "alone"))
    return f"; the Slurm tasks already submitted go on (`squeue --me` lists them; {hint} stop them)"


def _scancel_hint(profile: str, arrays: tuple[str, ...] = ("runs", "alone")) -> str:
    """The commands that cancel this user's arrays of ``profile``, and no other user's of the same names."""
    return " and ".join(f"`scancel --user $(id -un) --name {job_name(profile, array)}`" for array in arrays)


def _stalled_text(job_id: str, state: str, run: PlannedRun) -> str:
    """What the follower says, once, of a task Slurm holds or suspended (``scontrol hold``, a node's failure, a
    preemption by suspension): it waits for it, and how to go on."""
    said = state.lower().replace("_", " ")
    return (f"note: Slurm task {job_id} (run {run.key}) is {said}: followed until it trains (`scontrol release "
            f"{job_id}` or `scontrol resume {job_id}`); or `scancel {job_id}` and the same command again, which "
            "submits its run anew")


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
    last_answer, stalled = time.monotonic(), set()  # stalled: the tasks said to be held or suspended
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
                    elif states[job_id] in STALLED and job_id not in stalled:
                        stalled.add(job_id)
                        print(_stalled_text(job_id, states[job_id], run), file=sys.stderr, flush=True)
                    continue
                progress.fail(run, log)
            del waiting[key]
        if waiting:
            time.sleep(poll)
