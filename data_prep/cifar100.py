"""CIFAR-100 from the official python-format archive, with the paper's 45,000 / 5,000 train/validation split and
its superclass label noise (Garcin et al. 2022, Section 5.2; Berrada et al. 2018, Section 5.1).

Label noise: with probability ``p``, an image's label is redrawn uniformly among the 5 fine classes of its true
superclass (the archive's ``coarse_labels``), so a label actually changes with probability ``4p / 5``. The
authors' public code (and Berrada et al.'s, which it follows) redraws it within blocks of 5 consecutive fine labels
instead, which are alphabetical, not superclasses: ``noise_groups="blocks_of_5"`` does that, to compare with the
numbers that code made. The noisy labels are fixed per image by ``noise_seed`` and touch the training part only.
"""

from __future__ import annotations

import codecs
import pickle
import tarfile
import urllib.request
from pathlib import Path

import numpy as np
import numpy._core.multiarray as np_multiarray
import torch

from data_prep.common import MissingDataError, check_count, md5sum, require_file
from data_prep.label_noise import label_noise_within_groups
from data_prep.splits import Splits, TensorImages, class_counts
from data_prep.transforms import augment_and_normalise, normalise

URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE = "cifar-100-python.tar.gz"
MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
#: The md5 of the archive's extracted batch files, checked before they are read.
FILE_MD5 = {"train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc"}
FOLDER = "cifar-100-python"
SIZES = {"train": 50_000, "test": 10_000}
VAL_SIZE, SPLIT_SEED = 5_000, 0
COMMAND = "python -m data_prep cifar100 --root {root} [--download]"
#: The groups of 5 fine labels within which ``noise_groups`` redraws a noisy label, as each group of a fine label.
NOISE_GROUPS = {"superclass": lambda fine, coarse: coarse, "blocks_of_5": lambda fine, coarse: fine // 5}


def prepare(root: Path, download: bool = False, expected_md5: str | None = MD5) -> Path:
    """Check (and with ``download``, fetch) the archive under ``root`` and extract it; returns the extracted folder
    (as it is where the archive is gone and the folder holds both batch files)."""
    root = Path(root)
    archive = root / ARCHIVE
    if not archive.exists() and not download and all((root / FOLDER / part).exists() for part in SIZES):
        return root / FOLDER  # extracted before, the archive since removed: load checks each file's md5
    if not archive.exists() and download:
        root.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".part")
        urllib.request.urlretrieve(URL, partial)
        partial.replace(archive)
    require_file(archive, "the CIFAR-100 archive", URL, COMMAND.format(root=root))
    if expected_md5 is not None and (found := md5sum(archive)) != expected_md5:
        raise MissingDataError(f"{archive} has md5 {found}, the official archive has {expected_md5}: download it "
                               f"again from {URL}")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root / FOLDER


#: The globals of the official files (pickled by Python 2 with numpy 1) and of the same files written by Python 3
#: with numpy 2 (protocol 2: bytes by ``_codecs.encode``): numpy's array rebuilding and the codec, nothing that acts.
_BATCH_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): np_multiarray._reconstruct,
                  ("numpy._core.multiarray", "_reconstruct"): np_multiarray._reconstruct,
                  ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode}


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles what the official batch files hold and nothing else: a dict of byte strings, lists of ints and one
    uint8 numpy array. Any other global (a function a crafted file would call) is refused before it is looked up."""

    def find_class(self, module: str, name: str):
        if (found := _BATCH_GLOBALS.get((module, name))) is None:
            raise pickle.UnpicklingError(f"a CIFAR-100 batch file holds no {module}.{name}: this file is not one "
                                         f"of the official archive's")
        return found


def _read(folder: Path, part: str, expected: int | None, root: Path, expected_md5: str | None):
    path = require_file(folder / part, f"the CIFAR-100 {part} file", URL, COMMAND.format(root=root))
    if expected_md5 is not None and (found := md5sum(path)) != expected_md5:
        raise MissingDataError(f"{path} has md5 {found}, the official archive's {part} file has {expected_md5}: "
                               f"extract it again ({COMMAND.format(root=root)})")
    with path.open("rb") as handle:
        try:
            batch = _BatchUnpickler(handle, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as error:
            raise MissingDataError(f"{path} is not a CIFAR-100 batch file ({error}): extract it again "
                                   f"({COMMAND.format(root=root)})") from None
    images = torch.from_numpy(batch[b"data"]).reshape(-1, 3, 32, 32)  # rows of 3072 bytes: R, G, B planes
    fine, coarse = torch.tensor(batch[b"fine_labels"]), torch.tensor(batch[b"coarse_labels"])
    check_count(f"CIFAR-100 {part} images", len(fine), expected, COMMAND.format(root=root))
    return images, fine, coarse


def load(root: Path, noise: float = 0.0, noise_seed: int = 0, noise_groups: str = "superclass", augment: bool = True,
         expected_sizes: dict | None = SIZES, expected_md5: dict | None = FILE_MD5) -> Splits:
    """The prepared CIFAR-100 under ``root``: 45,000 train (noisy when ``noise > 0``, redrawn within the
    :data:`NOISE_GROUPS` named by ``noise_groups``) / 5,000 val / 10,000 test. The batch files are checked against
    ``expected_md5`` (None: files made for a test), then read as data only."""
    if noise_groups not in NOISE_GROUPS:
        raise ValueError(f"noise_groups should be one of {sorted(NOISE_GROUPS)}, got {noise_groups!r}")
    root = Path(root)
    folder = require_file(root / FOLDER, "the extracted CIFAR-100 folder", URL, COMMAND.format(root=root), root)
    expected = expected_sizes or {}
    md5 = expected_md5 or {}
    images, fine, coarse = _read(folder, "train", expected.get("train"), root, md5.get("train"))
    test_images, test_fine, _ = _read(folder, "test", expected.get("test"), root, md5.get("test"))
    check_count("CIFAR-100 classes", len(torch.unique(fine)), 100 if expected_sizes else None, COMMAND.format(root=root))
    val_size = VAL_SIZE if expected_sizes else len(fine) // 10
    order = torch.randperm(len(fine), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train_rows, val_rows = order[val_size:], order[:val_size]
    groups = NOISE_GROUPS[noise_groups](fine[train_rows], coarse[train_rows])
    train_labels = label_noise_within_groups(fine[train_rows], groups, noise, noise_seed)
    flip_rate = (train_labels != fine[train_rows]).float().mean().item()
    num_classes = int(fine.max()) + 1
    train_transform = augment_and_normalise(32) if augment else normalise()
    return Splits(
        "cifar100",
        TensorImages(images[train_rows], train_labels, train_transform),
        TensorImages(images[val_rows], fine[val_rows], normalise()),
        TensorImages(test_images, test_fine, normalise()),
        num_classes=num_classes,
        class_counts=class_counts(train_labels, num_classes),
        synthetic=False,
        description=f"CIFAR-100 (real), label noise p = {noise}"
                    f"{'' if noise_groups == 'superclass' else ' within blocks of 5 labels'} "
                    f"(realised flip rate {flip_rate:.3f}), "
                    f"{len(train_rows)}/{val_size}/{len(test_fine)} images",
        info={"noise": noise, "noise_groups": noise_groups, "flip_rate": flip_rate, "coarse_of_fine": _coarse_of_fine(fine, coarse),
              **({"clean_train_labels": fine[train_rows]} if noise > 0 else {})},
    )


def _coarse_of_fine(fine: torch.Tensor, coarse: torch.Tensor) -> torch.Tensor:
    table = torch.zeros(int(fine.max()) + 1, dtype=torch.long)
    table[fine] = coarse
    return table
