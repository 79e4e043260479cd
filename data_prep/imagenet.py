"""ImageNet (ILSVRC 2012; the paper's Table 9) and ImageNet-LT (Liu et al., CVPR 2019; Table 6) over one ImageNet root.

The root holds ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG`` (the validation images sorted into class folders,
as torchvision's ImageNet does). ImageNet: the official validation set is the test set, and 10,000 training
images held out with a fixed seed are the validation set used for model selection. ImageNet-LT: the published
split files ``ImageNet_LT_{train,val,test}.txt`` (lines ``<path relative to the root> <label>``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from data_prep.common import MissingDataError, ImageFiles, Splits, check_count, class_counts, require_file
from data_prep.transforms import imagenet_eval, imagenet_train

IMAGENET_SOURCE = "https://image-net.org/download (ILSVRC2012 train and val, val sorted into class folders)"
LT_SOURCE = "https://github.com/zhmiao/OpenLongTailRecognition-OLTR (ImageNet_LT split files)"
IMAGENET_SIZES = {"train": 1_281_167, "val": 50_000}
LT_SIZES = {"val": 20_000, "test": 50_000}  # the training list holds about 115.8k images; its size is reported
HELD_OUT, SPLIT_SEED = 10_000, 0


def _class_items(folder: Path, root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    index = {wnid: i for i, wnid in enumerate(classes)}
    items = [(str(p.relative_to(root)), index[p.parent.name]) for p in sorted(folder.glob("*/*")) if p.is_file()]
    return classes, items


def load_imagenet(root: Path, expected_sizes: dict | None = IMAGENET_SIZES, num_classes: int | None = 1000,
                  held_out: int = HELD_OUT) -> Splits:
    root = Path(root)
    command = f"python -m data_prep imagenet --root {root}"
    folders = {}
    for split in ("train", "val"):
        folders[split] = require_file(root / split, f"the ImageNet {split} folder", IMAGENET_SOURCE, command)
    classes, train_items = _class_items(folders["train"], root)
    val_classes, test_items = _class_items(folders["val"], root)
    check_count("ImageNet classes", len(classes), num_classes, command)
    if val_classes != classes:
        raise MissingDataError(f"ImageNet val/ and train/ have different class folders: sort the validation images "
                               f"into one folder per class ({IMAGENET_SOURCE})")
    for split, items in (("train", train_items), ("val", test_items)):
        check_count(f"ImageNet {split} images", len(items), (expected_sizes or {}).get(split), command)
    order = torch.randperm(len(train_items), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    selection = [train_items[i] for i in order[:held_out]]
    training = [train_items[i] for i in sorted(order[held_out:])]
    train = ImageFiles(root, training, imagenet_train())
    return Splits("imagenet", train, ImageFiles(root, selection, imagenet_eval()),
                  ImageFiles(root, test_items, imagenet_eval()), num_classes=len(classes),
                  class_counts=class_counts(train.labels, len(classes)), synthetic=False,
                  description=f"ImageNet (real), {len(training)}/{held_out}/{len(test_items)} images")


def _read_split_file(path: Path, root: Path, command: str) -> list[tuple[str, int]]:
    require_file(path, f"the ImageNet-LT split file {path.name}", LT_SOURCE, command)
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            relative, label = line.rsplit(maxsplit=1)
            items.append((relative, int(label)))
        except ValueError:
            raise MissingDataError(f"{path}:{number}: expected '<image path> <label>', got {line!r}") from None
    missing = [relative for relative, _ in items if not (root / relative).exists()]
    if missing:
        raise MissingDataError(f"{len(missing)} images listed in {path.name} are not under {root}, e.g. {missing[0]}"
                               f"\n  get ImageNet from {IMAGENET_SOURCE}")
    return items


def load_imagenet_lt(root: Path, split_dir: Path | None = None, expected_sizes: dict | None = LT_SIZES,
                     num_classes: int | None = 1000) -> Splits:
    """ImageNet-LT over the ImageNet ``root``; the split files are in ``split_dir`` (default: the root)."""
    root = Path(root)
    split_dir = Path(split_dir) if split_dir else root
    command = f"python -m data_prep imagenet_lt --root {root} --split-dir {split_dir}"
    items = {split: _read_split_file(split_dir / f"ImageNet_LT_{split}.txt", root, command)
             for split in ("train", "val", "test")}
    for split in ("val", "test"):
        check_count(f"ImageNet-LT {split} images", len(items[split]), (expected_sizes or {}).get(split), command)
    n_classes = 1 + max(label for part in items.values() for _, label in part)
    check_count("ImageNet-LT classes", n_classes, num_classes, command)
    train = ImageFiles(root, items["train"], imagenet_train())
    return Splits("imagenet_lt", train, ImageFiles(root, items["val"], imagenet_eval()),
                  ImageFiles(root, items["test"], imagenet_eval()), num_classes=n_classes,
                  class_counts=class_counts(train.labels, n_classes), synthetic=False,
                  description=f"ImageNet-LT (real), {len(items['train'])}/{len(items['val'])}/{len(items['test'])} images")
