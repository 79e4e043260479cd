"""The results store: one JSON record per finished run, keyed by its config, and the checkpoints of unfinished runs.

Every write goes to a temporary file first and is renamed into place, so a killed process never leaves half a file.
A file damaged some other way (a full disk, a copy cut short) never stops a run with a traceback: it is set aside
as ``<name>.damaged`` (kept, never deleted), a :class:`DamagedStoreWarning` names it and says what happens next, and
the run goes on from the last good state. Two checkpoints are kept, the last epoch's and the one before, so a
damaged last checkpoint costs one epoch; a damaged record means the run is trained again.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from pathlib import Path

import torch


class DamagedStoreWarning(UserWarning):
    """A file of the results store could not be read; it was set aside and the run goes on without it."""


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then renamed onto it: an interrupted write leaves the
    previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
    damaged = path.with_name(path.name + ".damaged")
    path.replace(damaged)
    warnings.warn(f"{path} is damaged ({type(error).__name__}: {str(error)[:200]}); kept as {damaged.name}; "
                  f"{consequence}", DamagedStoreWarning, stacklevel=3)


class ResultsStore:
    """``root/runs/<key>.json`` (finished runs) and ``root/checkpoints/<key>.pt`` and ``<key>.previous.pt`` (the last
    two epochs of unfinished ones)."""

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
        atomic_write(self.record_path(key), lambda tmp: tmp.write_text(json.dumps(record, indent=1, sort_keys=True)))
        self.checkpoint_path(key).unlink(missing_ok=True)
        self.previous_checkpoint_path(key).unlink(missing_ok=True)

    def save_checkpoint(self, key: str, state: dict) -> None:
        """The epoch's checkpoint; the one it replaces is kept as the previous checkpoint."""
        current = self.checkpoint_path(key)
        if current.exists():
            current.replace(self.previous_checkpoint_path(key))
        atomic_write(current, lambda tmp: torch.save(state, tmp))

    def load_checkpoint(self, key: str) -> dict | None:
        """The last readable checkpoint (the last epoch's, else the previous one), or None to start afresh."""
        last, previous = self.checkpoint_path(key), self.previous_checkpoint_path(key)
        for path, fallback in ((last, "the run resumes from the previous checkpoint" if previous.exists() else
                                "the run starts again from its first epoch"),
                               (previous, "the run starts again from its first epoch")):
            if not path.exists():
                continue
            try:
                return torch.load(path, map_location="cpu", weights_only=False)
            except Exception as error:  # torch.load raises many kinds on a cut file: RuntimeError, EOFError, ...
                _set_aside(path, error, fallback)
        return None

    def records(self) -> list[dict]:
        """Every finished run's record (a damaged one is set aside and left out: its run will be trained again)."""
        paths = sorted((self.root / "runs").glob("*.json"))
        return [record for path in paths
                if (record := self._read_record(path, "it is left out, and its run will be trained again")) is not None]

    @staticmethod
    def _read_record(path: Path, consequence: str) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            _set_aside(path, error, consequence)
            return None
