"""What the real datasets' modules share: images read from files, and the checks that turn a missing or damaged
download into a message saying which file and where to get it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

# Training code (data_prep/splits.py), imported from here too by the engine, whose files' bytes fingerprint its
# timings (experiments.analysis.timings.engine_code).
from data_prep.splits import TensorImages

__all__ = ["IMAGE_EXTENSIONS", "MissingDataError", "ImageFiles", "TensorImages", "require_file", "image_files", "md5sum",
           "check_count"]


#: The suffixes of the image files the folder datasets list (any case): other files in a class folder are skipped.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


class MissingDataError(FileNotFoundError):
    """A dataset file is missing or damaged; the message names it, where to get it and the command to run."""


class ImageFiles(Dataset):
    """Images read from files under ``root``: ``items`` is a sequence of (relative path, label).

    The paths are held in one numpy array of byte strings, not a list of Python strings: a data-loader worker forked
    from the training process reads them without writing to each string's reference count, which would copy the
    pages of a million-path list into every worker one by one (PyTorch issue 13246)."""

    def __init__(self, root: Path, items: Sequence[tuple[str, int]], transform: Callable):
        self.root, self.transform, items = Path(root), transform, list(items)
        self.paths = np.array([os.fsencode(path) for path, _ in items], dtype=bytes)
        self.labels = torch.tensor([label for _, label in items], dtype=torch.long)

    @property
    def items(self) -> list[tuple[str, int]]:
        """The (relative path, label) pairs, as given."""
        return [(os.fsdecode(path), label) for path, label in zip(self.paths.tolist(), self.labels.tolist())]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        from PIL import Image

        with Image.open(self.root / os.fsdecode(self.paths[index])) as image:
            return self.transform(image.convert("RGB")), self.labels[index]


def require_file(path: Path, what: str, source: str, command: str, root: Path | None = None) -> Path:
    """``path`` if it exists, else a :class:`MissingDataError` naming it, its source and the command to run; given the
    data ``root`` it lies under, the message also names a folder of ``root`` that holds it one level down (an archive
    extracted into a folder of its own name)."""
    if not path.exists():
        below = _one_level_down(root, path) if root is not None else None
        hint = f"\n  found it one level down: use --root {below}" if below is not None else ""
        raise MissingDataError(f"{what} not found: {path}{hint}\n  get it from {source}\n  then run: {command}")
    return path


def _one_level_down(root: Path, path: Path) -> Path | None:
    """The one folder ``root/<child>`` that holds ``path``'s place under ``root``, if exactly one does."""
    try:
        relative = path.relative_to(root)
        holders = [child for child in root.iterdir() if child.is_dir() and (child / relative).exists()]
    except (ValueError, OSError):
        return None
    return holders[0] if len(holders) == 1 else None


def image_files(folder: Path) -> list[Path]:
    """The image files (:data:`IMAGE_EXTENSIONS`) of ``folder``'s class folders, ``folder/<class>/<image>``, sorted."""
    return [path for path in sorted(folder.glob("*/*")) if path.suffix.lower() in IMAGE_EXTENSIONS]


def md5sum(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.md5()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_count(what: str, found: int, expected: int | None, command: str) -> None:
    """Refuse a dataset whose size differs from the published one (``expected=None`` skips the check)."""
    if expected is not None and found != expected:
        raise MissingDataError(f"{what}: found {found}, the published dataset has {expected}; "
                               f"the download is incomplete or not the right one.\n  run: {command}")
