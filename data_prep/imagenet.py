"""ImageNet (ILSVRC 2012; the paper's Table 9) and ImageNet-LT (Liu et al., CVPR 2019; Table 6) over one ImageNet root.

The root holds ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG`` (the validation images sorted into class folders,
as torchvision's ImageNet does).

ImageNet follows Berrada et al. (2018, Section 5.2), whose procedure the paper takes: the official validation set is
the test set, and a balanced part of the training set, 50 images of each class (50,000), is held out for model
selection. Training images: shorter side to 256, a random 224 x 224 crop, a horizontal flip with probability 1/2.
Evaluation: the centre crop, where Berrada et al. average ten crops (a difference of this package: the engine scores
one view of an image).

ImageNet-LT: the published split files ``ImageNet_LT_{train,val,test}.txt`` (lines ``<path relative to the root>
<label>``), read from the root or from the ``ImageNet_LT/`` folder the OLTR release keeps them in. The paper does not
give its preprocessing; training uses the random resized crop and flip usual for ImageNet-LT.
"""

from __future__ import annotations

from pathlib import Path

import torch

from data_prep.common import MissingDataError, ImageFiles, check_count, image_files, require_file
from data_prep.splits import Splits, class_counts
from data_prep.transforms import IMAGENET_MEAN, IMAGENET_STD, imagenet_eval, imagenet_train

IMAGENET_SOURCE = "https://image-net.org/download (ILSVRC2012 train and val, val sorted into class folders)"
LT_SOURCE = "https://github.com/zhmiao/OpenLongTailRecognition-OLTR (ImageNet_LT split files)"
IMAGENET_SIZES = {"train": 1_281_167, "val": 50_000}
LT_SIZES = {"train": 115_846, "val": 20_000, "test": 50_000}
#: Where the ImageNet-LT split files are looked for, relative to the ImageNet root, in this order.
LT_SPLIT_FOLDERS = (".", "ImageNet_LT")
HELD_OUT_PER_CLASS, SPLIT_SEED = 50, 0


def berrada_train_transform():
    """Shorter side to 256, a random 224 x 224 crop, a horizontal flip, ImageNet's normalisation (Berrada et al.
    2018, Section 5.2)."""
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(256), transforms.RandomCrop(224), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _class_items(folder: Path, root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    index = {wnid: i for i, wnid in enumerate(classes)}
    return classes, [(str(path.relative_to(root)), index[path.parent.name]) for path in image_files(folder)]


def balanced_hold_out(labels: list[int], per_class: int, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """Positions of ``labels`` split into those kept for training and ``per_class`` drawn at random from each class
    (all of a class that has fewer), both in ascending order; the draw is fixed by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    by_class: dict[int, list[int]] = {}
    for position, label in enumerate(labels):
        by_class.setdefault(label, []).append(position)
    held = sorted(members[i] for _, members in sorted(by_class.items())
                  for i in torch.randperm(len(members), generator=generator)[:per_class].tolist())
    kept = sorted(set(range(len(labels))) - set(held))
    return kept, held


def load_imagenet(root: Path, expected_sizes: dict | None = IMAGENET_SIZES, num_classes: int | None = 1000,
                  held_out_per_class: int = HELD_OUT_PER_CLASS) -> Splits:
    root = Path(root)
    command = f"python -m data_prep imagenet --root {root}"
    folders = {}
    for split in ("train", "val"):
        folders[split] = require_file(root / split, f"the ImageNet {split} folder", IMAGENET_SOURCE, command, root)
    classes, train_items = _class_items(folders["train"], root)
    val_classes, test_items = _class_items(folders["val"], root)
    check_count("ImageNet classes", len(classes), num_classes, command)
    if val_classes != classes:
        raise MissingDataError(f"ImageNet val/ and train/ have different class folders: sort the validation images "
                               f"into one folder per class ({IMAGENET_SOURCE})")
    for split, items in (("train", train_items), ("val", test_items)):
        check_count(f"ImageNet {split} images", len(items), (expected_sizes or {}).get(split), command)
    kept, held = balanced_hold_out([label for _, label in train_items], held_out_per_class)
    train = ImageFiles(root, [train_items[i] for i in kept], berrada_train_transform())
    return Splits("imagenet", train, ImageFiles(root, [train_items[i] for i in held], imagenet_eval()),
                  ImageFiles(root, test_items, imagenet_eval()), num_classes=len(classes),
                  class_counts=class_counts(train.labels, len(classes)), synthetic=False,
                  description=f"ImageNet (real), {len(kept)}/{len(held)}/{len(test_items)} images")


def _read_split_file(path: Path, root: Path) -> list[tuple[str, int]]:
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


def _split_file(root: Path, split: str, command: str) -> Path:
    name = f"ImageNet_LT_{split}.txt"
    for folder in LT_SPLIT_FOLDERS:
        if (root / folder / name).exists():
            return root / folder / name
    return require_file(root / name, f"the ImageNet-LT split file {name} (in the root or its ImageNet_LT/ folder)",
                        LT_SOURCE, command)


def load_imagenet_lt(root: Path, expected_sizes: dict | None = LT_SIZES, num_classes: int | None = 1000) -> Splits:
    """ImageNet-LT over the ImageNet ``root``, its split files in one of :data:`LT_SPLIT_FOLDERS`."""
    root = Path(root)
    command = f"python -m data_prep imagenet_lt --root {root}"
    items = {split: _read_split_file(_split_file(root, split, command), root)
             for split in ("train", "val", "test")}
    for split, split_items in items.items():
        check_count(f"ImageNet-LT {split} images", len(split_items), (expected_sizes or {}).get(split), command)
    n_classes = 1 + max(label for part in items.values() for _, label in part)
    check_count("ImageNet-LT classes", n_classes, num_classes, command)
    train = ImageFiles(root, items["train"], imagenet_train())
    return Splits("imagenet_lt", train, ImageFiles(root, items["val"], imagenet_eval()),
                  ImageFiles(root, items["test"], imagenet_eval()), num_classes=n_classes,
                  class_counts=class_counts(train.labels, n_classes), synthetic=False,
                  description=f"ImageNet-LT (real), {len(items['train'])}/{len(items['val'])}/{len(items['test'])} images")
