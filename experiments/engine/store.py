"""The results store: one JSON record per finished run, keyed by its config, and the checkpoints of unfinished runs.

Every write goes to a temporary file first and is renamed into place, so a killed process never leaves half a file.
A file damaged some other way (a full disk, a copy cut short, a file copied under another run's key) never stops a
run with a traceback: it is set aside as ``<name>.damaged`` (kept, never deleted), a :class:`DamagedStoreWarning`
names it and says why and what happens next, and the run goes on from the last good state. Two checkpoints are kept,
the last epoch's and the one before, so a damaged last checkpoint costs one epoch; a damaged record means the run is
trained again.

The store is a trust boundary (docs/reproducing.md#sharing-a-store): its files are read as data, never as code.
Records are JSON, checked against their key and their schema. Checkpoints are read by ``torch.load`` with
``weights_only=True`` and nothing added to its allowlist: tensors, numbers, strings and the containers of them (the
engine saves nothing else, its RNG states included); a checkpoint that names any other Python object is refused
before anything in it runs.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import pickle
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from experiments.engine.config import RunConfig


class DamagedStoreWarning(UserWarning):
    """A file of the results store could not be read; it was set aside and the run goes on without it."""


class DamagedFileError(ValueError):
    """A store file that reads but is not what its name says: the reason, for :class:`DamagedStoreWarning`."""


class UnreadableStoreFile(PermissionError):
    """A store file this user may not read: whole for all anyone knows, so it is neither set aside nor trained again."""


#: The fields of every run record and their JSON types (``label_noise_fit`` only on noisy labels).
RECORD_FIELDS = {"key": str, "config": dict, "history": list, "selected_epoch": int, "test": dict, "data": dict,
                 "provenance": dict}
#: The parts of every checkpoint the engine writes (``rng``: the torch, python and numpy generators' states).
CHECKPOINT_PARTS = {"key": str, "model": dict, "optimiser": dict, "schedule": dict, "state": dict, "rng": dict}


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then renamed onto it: an interrupted write leaves the
    previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # each writer its own
    write(tmp)
    tmp.replace(path)


def write_csv(rows: list[dict], fields: list[str], path: Path) -> None:
    """``rows`` as CSV with the columns ``fields`` (others ignored), written by :func:`atomic_write`."""
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


def _set_aside(path: Path, error: Exception, consequence: str) -> None:
    """``path`` renamed to the first free ``<name>.damaged[.N]`` (an earlier damaged copy is never overwritten), and a
    :class:`DamagedStoreWarning` saying why and what happens next; nothing where ``path`` is gone meanwhile. A file
    refused for its permissions is not damaged: :class:`UnreadableStoreFile` says so and leaves it."""
    if isinstance(error, PermissionError):
        raise UnreadableStoreFile(f"{path} cannot be read by this user ({error.strerror}): left as it is. Its writer "
                                  "made it private (a umask of 077); in a store shared by a group, give it to the group "
                                  f"(chmod -R g+rwX {path.parent.parent}) and have its writers use umask 002 "
                                  "(docs/reproducing.md#sharing-a-store)") from None
    damaged = next(candidate for n in itertools.count(1)
                   if not (candidate := path.with_name(path.name + ".damaged" + (f".{n}" if n > 1 else ""))).exists())
    why = _reason(error)
    try:
        path.replace(damaged)
    except FileNotFoundError:  # another reader of the store set it aside first (and said so)
        return
    except OSError as cannot:
        raise DamagedFileError(f"{path} is damaged ({why}) and could not be set aside as {damaged.name} "
                               f"({cannot.strerror}): move it away, then run again") from None
    warnings.warn(f"{path} is damaged ({why}); kept as {damaged.name}; {consequence}", DamagedStoreWarning,
                  stacklevel=3)


def _reason(error: Exception) -> str:
    """Why a file was refused, in a line: a checkpoint that ``weights_only`` refused names the object it holds."""
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) and (named := re.search(r"Unsupported global: GLOBAL (\S+)", text)):
        return (f"it holds the Python object {named.group(1)}, and a checkpoint is read as data only: tensors, "
                "numbers, strings and their containers")
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _check_fields(what: str, values, fields: dict[str, type]) -> None:
    """``values`` is a dict holding each of ``fields`` with its type, else :class:`DamagedFileError` says which."""
    if not isinstance(values, dict):
        raise DamagedFileError(f"{what} should be a mapping, it holds a {type(values).__name__}")
    for name, kind in fields.items():
        if name not in values:
            raise DamagedFileError(f"{what} has no {name!r}")
        if not isinstance(values[name], kind) or (kind is int and isinstance(values[name], bool)):
            raise DamagedFileError(f"{what}'s {name!r} should be a {kind.__name__}, it is a "
                                   f"{type(values[name]).__name__}")


def check_record(record, key: str) -> None:
    """A run record as the engine writes it, for the run ``key``: its fields, its ``key``, and a config whose key is
    ``key`` (a record copied or renamed under another run's key is caught here), else :class:`DamagedFileError`."""
    _check_fields("the record", record, RECORD_FIELDS)
    if record["key"] != key:
        raise DamagedFileError(f"the record is run {record['key']!r}'s, not {key!r}'s")
    try:
        config_key = RunConfig.from_dict(record["config"]).key()
    except (TypeError, ValueError) as error:
        raise DamagedFileError(f"the record's config is not a run config: {error}") from None
    if config_key != key:
        raise DamagedFileError(f"the record's config has the key {config_key!r}, not {key!r}")
    if not all(isinstance(entry, dict) and isinstance(entry.get("epoch"), int) for entry in record["history"]):
        raise DamagedFileError("the record's history should be a list of epochs, each with its 'epoch' number")
    _check_fields("the record's test", record["test"], {"top": dict, "macro_top": dict})


def computed(record: dict) -> dict:
    """What a run computed, as two runs of one config are compared: the record without its provenance (where, when,
    by what) and without its epochs' timings."""
    history = [{name: value for name, value in epoch.items() if not name.endswith("_seconds")}
               for epoch in record["history"]]
    return {**{name: value for name, value in record.items() if name != "provenance"}, "history": history}


def unusable_store(root: str | Path) -> str | None:
    """Why ``root`` cannot hold a results store (None: it can; a missing folder is made)."""
    if Path(root).exists() and not Path(root).is_dir():
        return f"the results store {root} is a file: give a folder (it is made if missing)"
    return None


class ResultsStore:
    """``root/runs/<key>.json`` (finished runs), ``root/checkpoints/<key>.pt`` and ``<key>.previous.pt`` (the last
    two epochs of unfinished ones), and ``root/diverged/<training key>.json`` (trainings whose loss became NaN)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def record_path(self, key: str) -> Path:
        return self.root / "runs" / f"{key}.json"

    def checkpoint_path(self, key: str) -> Path:
        return self.root / "checkpoints" / f"{key}.pt"

    def previous_checkpoint_path(self, key: str) -> Path:
        return self.root / "checkpoints" / f"{key}.previous.pt"

    def finished(self, key: str) -> dict | None:
        """The finished run's record, or None (also for a damaged record, which is set aside: the run is redone)."""
        path = self.record_path(key)
        if not path.exists():
            return None
        return self._read_record(path, "the run will be trained again")

    def save_record(self, key: str, record: dict) -> None:
        """``record`` as strict JSON (``NaN`` refused: the engine writes a value that does not exist as null)."""
        text = json.dumps(record, indent=1, sort_keys=True, allow_nan=False)
        atomic_write(self.record_path(key), lambda tmp: tmp.write_text(text))
        self.checkpoint_path(key).unlink(missing_ok=True)
        self.previous_checkpoint_path(key).unlink(missing_ok=True)

    def divergence_path(self, training_key: str) -> Path:
        return self.root / "diverged" / f"{training_key}.json"

    def save_divergence(self, training_key: str, message: str, commit: str) -> None:
        """That the training ``training_key`` became NaN, with the engine's ``message`` and the ``commit`` that trained
        it (:func:`experiments.provenance.git_commit`, as a record's provenance names it): an outcome, as a record is,
        so that no reader trains it again (its checkpoint at the last good epoch is kept)."""
        text = json.dumps({"training_key": training_key, "error": message, "git_commit": commit}, indent=1)
        atomic_write(self.divergence_path(training_key), lambda tmp: tmp.write_text(text))

    def divergence(self, training_key: str) -> str | None:
        """The engine's message for the training ``training_key`` that became NaN, or None (also for a damaged file,
        which is set aside: the run is trained again)."""
        outcome = self._divergence(training_key)
        return None if outcome is None else outcome["error"]

    def divergence_commit(self, training_key: str) -> str | None:
        """The commit that trained ``training_key`` into its NaN; None where there is no divergence or it names none
        (kept before divergences named their commit)."""
        outcome = self._divergence(training_key)
        return None if outcome is None else outcome.get("git_commit")

    def outcome_commit(self, config: RunConfig) -> str | None:
        """The commit that trained ``config``'s stored outcome: its record's (:meth:`finished`), else its NaN's
        (:meth:`divergence_commit`); None where the store holds neither or the outcome names no commit."""
        record = self.finished(config.key())
        return record["provenance"]["git_commit"] if record is not None else \
            self.divergence_commit(config.training_key())

    def _divergence(self, training_key: str) -> dict | None:
        path = self.divergence_path(training_key)
        if not path.exists():
            return None
        try:
            outcome = json.loads(path.read_text())
            _check_fields("the divergence", outcome, {"training_key": str, "error": str})
            if outcome["training_key"] != training_key:
                raise DamagedFileError(f"it is training {outcome['training_key']!r}'s, not {training_key!r}'s")
            if not isinstance(outcome.get("git_commit", ""), str):
                raise DamagedFileError(f"its 'git_commit' should be a str, it is a "
                                       f"{type(outcome['git_commit']).__name__}")
            return outcome
        except (OSError, ValueError) as error:
            _set_aside(path, error, "the run will be trained again")
            return None

    def holds_outcome(self, config: RunConfig) -> bool:
        """Whether ``config``'s run needs no more training: finished (:meth:`finished`: a damaged record is set aside
        and the run counts as not trained) or diverged (:meth:`divergence`)."""
        return self.finished(config.key()) is not None or self.divergence(config.training_key()) is not None

    def save_checkpoint(self, key: str, state: dict) -> None:
        """The epoch's checkpoint (``state``: the :data:`CHECKPOINT_PARTS` but ``key``); the one it replaces is kept as
        the previous checkpoint."""
        current = self.checkpoint_path(key)
        if current.exists():
            current.replace(self.previous_checkpoint_path(key))
        atomic_write(current, lambda tmp: torch.save({"key": key, **state}, tmp))

    def load_checkpoint(self, key: str, check: Callable[[dict], None] | None = None) -> dict | None:
        """The last usable checkpoint (the last epoch's, else the previous one), or None to start afresh. Usable: read
        as data only (``weights_only``), written for ``key``, with every part of :data:`CHECKPOINT_PARTS`, and passing
        ``check`` (the caller's own test that it fits its model, raising ``ValueError`` if not)."""
        last, previous = self.checkpoint_path(key), self.previous_checkpoint_path(key)
        for path, fallback in ((last, "the run resumes from the previous checkpoint" if previous.exists() else
                                "the run starts again from its first epoch"),
                               (previous, "the run starts again from its first epoch")):
            if not path.exists():
                continue
            try:
                checkpoint = torch.load(path, map_location="cpu", weights_only=True)
                _check_fields("the checkpoint", checkpoint, CHECKPOINT_PARTS)
                if checkpoint["key"] != key:
                    raise DamagedFileError(f"the checkpoint is run {checkpoint['key']!r}'s, not {key!r}'s")
                if check is not None:
                    check(checkpoint)
                return checkpoint
            except Exception as error:  # torch.load raises many kinds: a cut file, a forbidden global, a directory
                _set_aside(path, error, fallback)
        return None

    def epochs_kept(self, key: str) -> int:
        """The epochs held by the run's last checkpoint (else its previous one), for a display beside the trainer:
        read without loading the tensors (``mmap``) and without setting anything aside; 0 when there is none, or none
        that reads as this run's now (the trainer's own :meth:`load_checkpoint` judges a damaged one)."""
        for path in (self.checkpoint_path(key), self.previous_checkpoint_path(key)):
            try:
                checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                if checkpoint["key"] == key and isinstance(epoch := checkpoint["state"]["epoch"], int):
                    return epoch
            except Exception:  # absent, being replaced, or damaged: nothing to show from it
                continue
        return 0

    def records(self) -> list[dict]:
        """Every finished run's record (a damaged one is set aside and left out: its run will be trained again)."""
        paths = sorted((self.root / "runs").glob("*.json"))
        return [record for path in paths
                if (record := self._read_record(path, "it is left out, and its run will be trained again")) is not None]

    @staticmethod
    def _read_record(path: Path, consequence: str) -> dict | None:
        try:
            record = json.loads(path.read_text())
            check_record(record, path.stem)
            return record
        except (OSError, ValueError) as error:  # JSONDecodeError, UnicodeDecodeError and DamagedFileError included
            _set_aside(path, error, consequence)
            return None
