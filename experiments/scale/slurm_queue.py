"""What Slurm's queue holds of the ``slurm`` executor's tasks: the ledger of the tasks submitted from a Slurm folder
(:data:`LEDGER`), the tasks of its plain scripts submitted by hand with ``sbatch``, found in the queue and added to the
ledger, and each task's state as ``squeue`` gives it, so that a later ``train`` follows the runs still queued instead
of submitting them again, and ``plan`` shows them queued."""

from __future__ import annotations

import getpass
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from experiments.scale.plan import PlannedRun


JOB_PREFIX = "topk-"  #: how the name of every array this executor submits begins


def job_name(profile: str, array: str) -> str:
    """The name of ``profile``'s array ``array`` (``runs``, ``alone`` for the runs trained alone, ``calibration`` for
    the calibration's) in the queue."""
    return f"{JOB_PREFIX}{profile}-{array}"


#: A line per submitted array task, in the Slurm folder: its job id, its runs' keys and its log (JSON lines, appended).
LEDGER = "submitted.jsonl"


def record(entries: list[tuple[str, list[str], str]], folder: str) -> None:
    """Append each task's (job id, keys, log) to the folder's :data:`LEDGER`, in one write."""
    lines = "".join(json.dumps({"job_id": job_id, "keys": keys, "log": log}) + "\n" for job_id, keys, log in entries)
    with open(Path(folder) / LEDGER, "a") as ledger:
        ledger.write(lines)


#: The line of a plain script that reads its task's keys (:func:`experiments.scale.slurm.sbatch_script`): the key
#: list's path is its end.
_KEYS_LINE = re.compile(r'^keys=\$\(sed -n "[^"]*" (?P<path>.+)\)$', re.MULTILINE)
#: An array task's id as ``squeue --array`` lists it, queued or running: ``<array>_<index>``.
_ARRAY_TASK = re.compile(r"(?P<array>\d+)_(?P<index>\d+)")
#: What Slurm's commands print when the controller does not answer, as against a job it does not know.
UNANSWERED = re.compile(r"contact|timed out|connect|standby|zero bytes|not responding", re.IGNORECASE)


def sbatch_submissions(folder: str, known_arrays: set[str]) -> list[tuple[str, list[str], str]] | None:
    """The queued tasks (job id, keys, log) of the arrays but ``known_arrays`` that were submitted with ``sbatch`` from
    ``folder``'s plain scripts (:func:`experiments.scale.slurm.sbatch_script`): each array's script is read back from
    Slurm (``scontrol write batch_script``), and its key list, which names each task's runs, must lie in ``folder``;
    None where Slurm did not answer."""
    folder_path = Path(folder).resolve()
    if not folder_path.is_dir():  # nothing written here: no script of it can be queued
        return []
    if (listing := _squeue(["--format=%i %j"])) is None:
        return None
    tasks_of: dict[str, list[re.Match]] = {}  # array -> its tasks in the queue
    for line in listing.splitlines():
        job_id, _, name = line.partition(" ")
        if name.startswith(JOB_PREFIX) and (task := _ARRAY_TASK.fullmatch(job_id)):
            tasks_of.setdefault(task["array"], []).append(task)
    found = []
    for array in sorted(set(tasks_of) - known_arrays):
        if (keys := _array_keys(tasks_of[array][0][0], folder_path)) is None:
            return None
        found += [(task[0], keys[int(task["index"])], str(task_log(folder_path, task[0])))
                  for task in tasks_of[array] if int(task["index"]) < len(keys)]
    return found


def _array_keys(task: str, folder: Path) -> list[list[str]] | None:
    """Each task's keys of the array of ``task`` where one of ``folder``'s plain scripts submitted it, none where
    another script did (or its key list cannot be read); None where Slurm did not answer."""
    try:
        script = subprocess.run(["scontrol", "write", "batch_script", task, "-"], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if script.returncode != 0:
        return None if UNANSWERED.search(script.stderr) else []  # else gone from the queue meanwhile
    try:
        keys = Path(shlex.split(match["path"])[0]) if (match := _KEYS_LINE.search(script.stdout)) else None
        return [line.split() for line in keys.read_text().splitlines()] if keys and keys.parent == folder else []
    except (OSError, ValueError, IndexError):  # a line like ours in a script of another's, a list damaged or gone
        return []


def task_log(folder: Path, job_id: str) -> Path:
    """The stderr log of the plain scripts' task ``job_id`` (``<array>_<index>``: their ``--error`` pattern)."""
    return folder / f"{job_id}.err"


def _squeue(arguments: list[str]) -> str | None:
    """What ``squeue`` lists of this user's tasks, one array task a line, with ``arguments``; None when it could not
    answer (the controller busy or restarting, or no ``squeue`` here)."""
    try:
        listing = subprocess.run(["squeue", "--noheader", "--array", "--user", getpass.getuser(), *arguments],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0 and "Invalid job id" not in listing.stderr:  # jobs gone from the queue: an empty answer
        return None
    return listing.stdout


#: The states of a task ``still_in_queue`` follows: waiting to run, or running. A held task (``scontrol hold``, or
#: requeued and held) or a suspended one is not followed: a new ``train`` submits its runs again.
FOLLOWED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED")
#: The states of a task that waits on someone's action, not on the queue: held (by ``scontrol hold``, or requeued and
#: held after a failed launch), suspended or stopped. A follower that meets one says so (it waits for it).
STALLED = ("HELD", "REQUEUE_HOLD", "SPECIAL_EXIT", "SUSPENDED", "STOPPED")


@dataclass(frozen=True)
class InQueue:
    """What the ledger and the queue say of some runs: ``tasks``, each run whose latest task in the ledger is
    followed (:data:`FOLLOWED`) with that task's job id and log; ``in_queue``, every task of the ledger the queue
    lists, in any state; ``ended``, each run whose latest task has left the queue, with that task's job id and log
    (whether it left a record is the store's to say)."""

    tasks: list[tuple[PlannedRun, str, str]]
    in_queue: set[str]
    ended: dict[str, tuple[str, str]] = field(default_factory=dict)


def _ledger_entries(folder: str) -> list[tuple[str, list[str], str]]:
    """The folder's :data:`LEDGER`, a (job id, keys, log) per task, the earliest first; a line cut short by a crash is
    skipped, and a folder without submissions has none."""
    try:
        lines = (Path(folder) / LEDGER).read_text(errors="replace").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
            entries.append((str(entry["job_id"]), [str(key) for key in entry["keys"]], str(entry["log"])))
        except (ValueError, KeyError, TypeError):
            continue
    return entries


def still_in_queue(runs: list[PlannedRun], folder: str) -> InQueue | None:
    """The folder's :data:`LEDGER` against Slurm's queue for ``runs`` (:class:`InQueue`); None where the queue could
    not be asked. The queued tasks of the folder's plain scripts submitted with ``sbatch`` are added to the ledger
    first (:func:`sbatch_submissions`). A run submitted several times is followed in its latest task still
    followed."""
    entries = _ledger_entries(folder)
    if (adopted := sbatch_submissions(folder, set(array_ids(job_id for job_id, _, _ in entries)))) is None:
        return None
    if adopted:
        try:
            record(adopted, folder)
        except OSError as error:
            print(f"warning: the tasks of the plain scripts found in the queue are followed, but not added to "
                  f"{Path(folder) / LEDGER} ({error})", file=sys.stderr)
    tasks_of: dict[str, list[tuple[str, str]]] = {}  # key -> its tasks, the earliest first
    for job_id, keys, log in entries + adopted:
        for key in keys:
            tasks_of.setdefault(key, []).append((job_id, log))
    if not tasks_of:
        return InQueue([], set())
    states = queued(array_ids(job_id for tasks in tasks_of.values() for job_id, _ in tasks))
    if states is None:
        return None
    followed, ended = [], {}
    for run in runs:
        live = [(job_id, log) for job_id, log in tasks_of.get(run.key, []) if states.get(job_id) in FOLLOWED]
        if live:
            followed.append((run, *live[-1]))
        elif run.key in tasks_of and tasks_of[run.key][-1][0] not in states:
            ended[run.key] = tasks_of[run.key][-1]
    return InQueue(followed, {job_id for tasks in tasks_of.values() for job_id, _ in tasks if job_id in states}, ended)


def queued_tasks(profile: str) -> int:
    """How many tasks of this user's arrays for ``profile`` (:func:`job_name`) are still in
    Slurm's queue; 0 when ``squeue`` cannot answer."""
    listing = _squeue(["--format=%i", "--name", f"{job_name(profile, 'runs')},{job_name(profile, 'alone')}"])
    return len(listing.split()) if listing is not None else 0


def array_ids(job_ids: Iterable[str]) -> list[str]:
    """The arrays of array tasks ``job_ids`` (``<job>_<task>``: the job ids alone), each once, sorted."""
    return sorted({job_id.split("_")[0] for job_id in job_ids})


def queued(job_ids: Iterable[str]) -> dict[str, str] | None:
    """The state of every task of this user's jobs ``job_ids`` still in Slurm's queue (``<job>_<task>`` -> PENDING,
    RUNNING, ...; a pending task held by ``scontrol hold`` reads HELD); None when ``squeue`` could not answer (the
    controller busy or restarting, or no ``squeue`` here)."""
    if (listing := _squeue(["--format=%i %T %r", "--jobs", ",".join(job_ids)])) is None:
        return None
    states = {}
    for line in listing.splitlines():
        if len(fields := line.split(maxsplit=2)) >= 2:
            job_id, state, reason = *fields[:2], fields[2] if len(fields) > 2 else ""
            states[job_id] = "HELD" if state == "PENDING" and "held" in reason.lower() else state
    return states
