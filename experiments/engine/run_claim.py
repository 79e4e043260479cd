"""Who trains a run: a claim file in the results store, so that many processes (one machine, or a cluster on a shared
filesystem) never train one run twice at once.

``root/claims/<training key>.json`` names the holder (host, PID namespace, pid and the process's start, Slurm job and
restart if any, start time). It is created with ``O_CREAT | O_EXCL``, which is atomic on a local disk and on NFS v3+;
the holder touches it every :data:`HEARTBEAT` seconds. A claim is stale when its process is gone, seen from the same
host and PID namespace (a container's pids mean nothing outside it; a pid reused by another process, started at
another time, is gone too), else when its heartbeat is older than :data:`STALE_AFTER`. A stale claim is moved aside by
one atomic rename, and put back if what was moved is not the claim judged stale (a competitor's new one), so of two
processes taking it over one wins. A holder whose claim was taken over all the same (paused past :data:`STALE_AFTER`)
stops at its next write: its store (:class:`ClaimedStore`) refuses the checkpoint, record or divergence with
:class:`ClaimLost`, and it waits for the new holder instead. The claim is per training (:meth:`experiments.engine.config.RunConfig.training_key`): the
siblings that differ only in their selection metric are one training.

A compiled training (``compile_mode``) keeps its compilations in the user's cache folder
(:func:`experiments.engine.compile_cache.share_compilations`), so that the user's processes on every machine that
shares it compile each graph once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from experiments.engine.compile_cache import share_compilations
from experiments.engine.store import ResultsStore
from experiments.engine.train import run, run_stacked
from experiments.provenance import git_commit

HEARTBEAT = 30.0  #: seconds between two touches of a held claim
STALE_AFTER = 300.0  #: a claim from another host whose heartbeat is older than this is taken over


class ClaimLost(RuntimeError):
    """This process's claim on a training now names another holder (or none): another process judged it stale and took
    the run over, so this one must write nothing more of it."""


def claim_path(root: Path, training_key: str) -> Path:
    return Path(root) / "claims" / f"{training_key}.json"


def holder() -> dict:
    """This process, as a claim names it."""
    return {"host": socket.gethostname(), "pid_namespace": _pid_namespace(), "pid": os.getpid(),
            "pid_start": _process_start(os.getpid()), "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "slurm_task": _slurm_array_task(), "slurm_restart": _slurm_restart(), "since": time.time()}


def _slurm_array_task() -> str | None:
    """This Slurm array task as ``squeue`` names it (``<array>_<index>``); None outside an array."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else None


def _stat_after_name(pid: int) -> list[str] | None:
    """The fields of Linux's ``/proc/PID/stat`` after the command's name (which may hold spaces), from field 3 (the
    state) on; None elsewhere or when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s field 22), which tells it from a
    later process given the same pid; None elsewhere or when it is gone."""
    fields = _stat_after_name(pid)
    return int(fields[19]) if fields else None


def _slurm_restart() -> int:
    """How many times Slurm requeued this task (0 outside Slurm)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def _pid_namespace() -> int | None:
    """The inode of this process's PID namespace (Linux), which tells a container's pids from the host's; None
    elsewhere."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def read_claim(path: Path) -> dict | None:
    """The claim's holder, or None when there is none; an unreadable claim (cut by a crash, or JSON that is not a
    holder's mapping) reads as an empty dict, which :func:`is_stale` judges by its age."""
    try:
        claim = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return claim if isinstance(claim, dict) else {}


def is_stale(path: Path, claim: dict, *, stale_after: float = STALE_AFTER) -> bool:
    """True when the claim's process cannot be training any more: this very Slurm task before Slurm requeued it (the
    same job id, fewer restarts), gone as seen from this host and PID namespace, or, seen from elsewhere (or where
    ``/proc`` hides the process's start: ``hidepid``), silent for longer than ``stale_after``."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and claim.get("slurm_job") == job and claim.get("slurm_restart", -1) < _slurm_restart():
        return True
    seen_here = claim.get("host") == socket.gethostname() and claim.get("pid_namespace") == _pid_namespace()
    if seen_here and isinstance(claim.get("pid"), int):  # its process tells, whatever its heartbeat (Ctrl-Z, say)
        if not _alive(claim["pid"]):
            return True
        if (started := claim.get("pid_start")) is None:  # nothing to tell a reused pid by
            return False
        if (now := _process_start(claim["pid"])) is not None:
            return now != started
    try:  # its heartbeat tells (from elsewhere, or where /proc hides the process's start)
        return time.time() - path.stat().st_mtime > stale_after
    except FileNotFoundError:
        return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and has not exited (a zombie, ended but not yet reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    fields = _stat_after_name(pid)
    return fields is None or fields[0] != "Z"  # without /proc, existing is all that can be told


def live_holder(root: Path, training_key: str, *, stale_after: float = STALE_AFTER) -> dict | None:
    """The claim's holder while it trains ``training_key`` (its claim not stale), else None."""
    path = claim_path(root, training_key)
    claim = read_claim(path)
    return None if claim is None or is_stale(path, claim, stale_after=stale_after) else claim


def try_claim(root: Path, training_key: str, *, stale_after: float = STALE_AFTER) -> bool:
    """Take the claim on ``training_key`` (True), or leave it to its live holder (False). A stale claim is taken
    over."""
    path = claim_path(root, training_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a stale claim moved aside by us or by a competitor: try again
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _move_aside_if_stale(path, stale_after):
                return False
            continue
        with os.fdopen(descriptor, "w") as handle:
            json.dump(holder(), handle)
        return True
    return False


def _move_aside_if_stale(path: Path, stale_after: float) -> bool:
    """Move the claim at ``path`` out of the way if it is stale (True: gone, try to create one), else False (a live
    holder's). Between the look and the rename a competitor may have moved that stale claim aside and made its own:
    the file moved is then not the one judged (another inode, time or content), and it is put back."""
    try:
        seen = path.stat()
    except FileNotFoundError:
        return True
    claim = read_claim(path)
    if claim is None:
        return True
    if not is_stale(path, claim, stale_after=stale_after):
        return False
    aside = path.with_name(f".{path.name}.stale.{os.getpid()}")
    try:
        path.replace(aside)
    except FileNotFoundError:  # a competitor moved it first
        return True
    try:
        moved = aside.stat()
        judged = (moved.st_ino, moved.st_mtime_ns) == (seen.st_ino, seen.st_mtime_ns) and read_claim(aside) == claim
        if not judged:
            try:
                os.link(aside, path)  # put back; FileExistsError: a third process's claim stands there now
            except FileExistsError:
                pass
            except OSError:  # no hard links on this filesystem (some CIFS or FUSE mounts): put back by a rename
                if not path.exists():
                    aside.replace(path)
        return judged
    finally:
        aside.unlink(missing_ok=True)


def _is_mine(claim: dict | None) -> bool:
    """Whether ``claim`` names this very process (host, PID namespace, pid and its start)."""
    mine = holder()
    return bool(claim) and all(claim.get(field) == mine[field]
                               for field in ("host", "pid_namespace", "pid", "pid_start"))


def _read_own_claim(path: Path) -> dict | None:
    """The claim at ``path``, which this process made, looked at twice, a moment apart, when it is gone: a competitor
    that moved it aside by mistake (:func:`_move_aside_if_stale`) puts it back at once. None when gone both times."""
    if (claim := read_claim(path)) is None:
        time.sleep(0.2)
        claim = read_claim(path)
    return claim


def _taken_over(path: Path) -> dict | None:
    """The claim at ``path``, which this process made, where it is no longer its own: another holder's, or ``{}`` when
    it is gone; None while it is this process's (or unreadable a moment on a shared filesystem: not judged)."""
    if (claim := _read_own_claim(path)) is None:
        return {}
    return claim if claim and not _is_mine(claim) else None


def release(root: Path, training_key: str) -> None:
    """Give the claim back, if this process holds it (also where a competitor is putting it back just now, so that a
    finished run's claim never outlives its training)."""
    path = claim_path(root, training_key)
    if _is_mine(_read_own_claim(path)):
        path.unlink(missing_ok=True)


class ClaimedStore:
    """``store`` (a :class:`ResultsStore`, every method handed on) that writes a training's checkpoints and records
    only while this process still holds the claims on ``trainings`` (training keys): else :class:`ClaimLost`, so that
    a holder taken over writes nothing more."""

    def __init__(self, store: ResultsStore, trainings: list[str]):
        self.store, self.trainings = store, trainings

    def __getattr__(self, name: str):
        if name == "store":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.store, name)

    def _check_held(self) -> None:
        for training in self.trainings:
            if (claim := _taken_over(claim_path(self.store.root, training))) is not None:
                by = f"{claim.get('host')} (pid {claim.get('pid')})" if claim else "no one (its claim is gone)"
                raise ClaimLost(f"the claim on training {training} was taken over by {by}: this process stops "
                                "training it and waits for that holder's record")

    def save_checkpoint(self, key: str, state: dict) -> None:
        self._check_held()
        self.store.save_checkpoint(key, state)

    def save_record(self, key: str, record: dict) -> None:
        self._check_held()
        self.store.save_record(key, record)

    def save_divergence(self, training_key: str, message: str, commit: str) -> None:
        self._check_held()
        self.store.save_divergence(training_key, message, commit)


@contextmanager
def held(root: Path, training_key: str, *, heartbeat: float = HEARTBEAT):
    """Keep the claim alive (its file touched every ``heartbeat`` seconds) while the body trains; release it after,
    whatever happens."""
    path, stop = claim_path(root, training_key), threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat):
            if _taken_over(path) is not None:  # never keep another's claim fresh
                return
            try:
                os.utime(path)
            except FileNotFoundError:
                return
            except OSError:  # a shared filesystem's passing error (NFS's ESTALE, EIO): beat again next time
                continue

    thread = threading.Thread(target=beat, name=f"claim-{training_key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        release(root, training_key)


def train_once(config, store, *, wait: bool = True, poll: float = 2.0, **options) -> dict | None:
    """``config``'s record: read back from ``store``, or trained by :func:`experiments.engine.train.run` (``options``)
    while this process holds the claim on its training. When a live process holds it, wait for its record (or return
    None at once with ``wait=False``); when that process dies, its claim goes stale and this one resumes the run from
    its checkpoint. A training whose loss became NaN raises the engine's ``FloatingPointError``, kept in the store
    (:meth:`ResultsStore.save_divergence`), so that every later reader raises the same one without training."""
    key = config.training_key()
    if options.get("compile_mode") is not None:
        share_compilations()
    while True:
        if (record := store.finished(config.key())) is not None:
            return record
        if (message := store.divergence(key)) is not None:
            raise FloatingPointError(message)
        if try_claim(store.root, key):
            claimed = ClaimedStore(store, [key])
            with held(store.root, key):
                try:
                    try:
                        return run(config, claimed, **options)
                    except FloatingPointError as error:
                        claimed.save_divergence(key, str(error), git_commit())
                        raise
                except ClaimLost as lost:  # its new holder's outcome is waited for, as any live holder's
                    print(f"note: run {config.key()}: {lost}", file=sys.stderr, flush=True)
            continue
        if not wait:
            return None
        time.sleep(poll)


def train_stacked_once(configs, store, *, wait: bool = True, poll: float = 2.0, **options) -> list[dict | None]:
    """The records of ``configs``: the unfinished runs whose claims this process takes train stacked into one model
    (:func:`experiments.engine.train.run_stacked`, ``options``); those a live process holds are waited for as
    :func:`train_once` waits (and resumed alone if it dies), or with ``wait=False`` left as None. When runs of the
    stack became NaN, the others go on alone from the epoch they saved, and so do those, each meeting its own NaN
    again (:func:`train_once` keeps it); the first such ``FloatingPointError`` is raised once the others are done."""
    if options.get("compile_mode") is not None:
        share_compilations()
    with ExitStack() as claims:
        mine, trainings = [], set()
        for config in configs:
            if config.training_key() in trainings:  # a sibling of a run already here: one training
                continue
            trainings.add(config.training_key())
            if (store.finished(config.key()) is None and store.divergence(config.training_key()) is None
                    and try_claim(store.root, config.training_key())):
                claims.enter_context(held(store.root, config.training_key()))
                mine.append(config)
        if mine:
            try:
                run_stacked(mine, ClaimedStore(store, [config.training_key() for config in mine]), **options)
            except FloatingPointError:  # which runs is for each to find alone, below
                pass
            except ClaimLost as lost:  # the runs still held here go on alone, below; the others are waited for
                print(f"note: a stack of {len(mine)} runs: {lost}", file=sys.stderr, flush=True)
    options.pop("stop_after_epochs", None)  # the runs left to others are waited for, not trained a part of
    records, diverged = [], []
    for config in configs:
        try:
            records.append(train_once(config, store, wait=wait, poll=poll, **options))
        except FloatingPointError as error:
            diverged.append(error)
    if diverged:
        raise diverged[0]
    return records
