"""The results store: one JSON record per finished run, keyed by its config, and one checkpoint per unfinished run.
Every write goes to a temporary file first and is renamed into place, so a killed process never leaves half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    tmp.replace(path)


class ResultsStore:
    """``root/runs/<key>.json`` (finished runs) and ``root/checkpoints/<key>.pt`` (the last epoch of unfinished ones)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def record_path(self, key: str) -> Path:
        return self.root / "runs" / f"{key}.json"

    def checkpoint_path(self, key: str) -> Path:
        return self.root / "checkpoints" / f"{key}.pt"

    def finished(self, key: str) -> dict | None:
        path = self.record_path(key)
        return json.loads(path.read_text()) if path.exists() else None

    def save_record(self, key: str, record: dict) -> None:
        _atomic_write(self.record_path(key), lambda tmp: tmp.write_text(json.dumps(record, indent=1, sort_keys=True)))
        self.checkpoint_path(key).unlink(missing_ok=True)

    def save_checkpoint(self, key: str, state: dict) -> None:
        _atomic_write(self.checkpoint_path(key), lambda tmp: torch.save(state, tmp))

    def load_checkpoint(self, key: str) -> dict | None:
        path = self.checkpoint_path(key)
        return torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None

    def records(self) -> list[dict]:
        """Every finished run's record."""
        return [json.loads(p.read_text()) for p in sorted((self.root / "runs").glob("*.json"))]
