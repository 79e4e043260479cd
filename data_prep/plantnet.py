"""Pl@ntNet-300K (Garcin et al., NeurIPS Datasets and Benchmarks 2021), the paper's heavy-tailed dataset (Table 5, 8).

The Zenodo archive (https://zenodo.org/records/5645731) extracts to a folder holding ``images/{train,val,test}/``,
each with one sub-folder per species id (1,081 of them), and ``plantnet300K_species_id_2_name.json``; the first
release (Zenodo record 4726653) has ``images_train/`` ... and ``plantnet300K_species_names.json`` instead. Both are
read. The official splits are used as they are; classes are the species ids in sorted order (as torchvision's
ImageFolder orders them).

Preprocessing as the thesis (Section 3.3.2) and the authors' public code give it: resize the shorter side to 256,
then a random 224 x 224 crop for training (no flip) and the centre crop for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.common import MissingDataError, ImageFiles, check_count, image_files, require_file
from data_prep.splits import Splits, class_counts
from data_prep.transforms import IMAGENET_MEAN, IMAGENET_STD, imagenet_eval

SOURCE = "https://zenodo.org/records/5645731 (plantnet_300K.zip, extract it)"
#: The species-name file of the current release, then the first release's.
SPECIES_NAMES = ("plantnet300K_species_id_2_name.json", "plantnet300K_species_names.json")
SIZES = {"train": 243_916, "val": 31_118, "test": 31_112}
NUM_CLASSES = 1081
COMMAND = "python -m data_prep plantnet --root {root}"
#: The paper profile's ResNet-50 starts from these ImageNet weights, kept in the dataset's folder
#: (experiments.spec.profiles: ``{data_root}/resnet50-imagenet.pth``).
WEIGHTS = "resnet50-imagenet.pth"
WEIGHTS_SOURCE = "https://download.pytorch.org/models/resnet50-0676ba61.pth (torchvision's IMAGENET1K_V1)"


def train_transform():
    """Shorter side to 256, a random 224 x 224 crop, ImageNet's normalisation (thesis, Section 3.3.2)."""
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(256), transforms.RandomCrop(224), transforms.ToTensor(),
                               transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _species_names(root: Path, command: str) -> dict:
    found = [root / name for name in SPECIES_NAMES if (root / name).exists()]
    path = found[0] if found else require_file(root / SPECIES_NAMES[0], f"the species-name file "
                                               f"({' or '.join(SPECIES_NAMES)})", SOURCE, command, root)
    return json.loads(path.read_text())


def _split_folder(root: Path, split: str) -> Path:
    for candidate in (root / "images" / split, root / f"images_{split}"):
        if candidate.is_dir():
            return candidate
    return require_file(root / "images" / split, f"Pl@ntNet-300K {split} images (<species id>/<image>.jpg)", SOURCE,
                        COMMAND.format(root=root), root)


def load(root: Path, expected_sizes: dict | None = SIZES, num_classes: int | None = NUM_CLASSES) -> Splits:
    """The official train/val/test splits under ``root``, checked against the published sizes (``None`` skips a check)."""
    root = Path(root)
    command = COMMAND.format(root=root)
    names = _species_names(root, command)
    folders = {split: _split_folder(root, split) for split in ("train", "val", "test")}
    species = sorted(p.name for p in folders["train"].iterdir() if p.is_dir())
    check_count("Pl@ntNet-300K species folders in train", len(species), num_classes, command)
    unnamed = sorted(set(species) - set(names))
    if unnamed:
        raise MissingDataError(f"species folders {unnamed[:5]} are not in the species-name file: the files do not "
                               f"belong together")
    index = {name: i for i, name in enumerate(species)}
    items = {}
    for split, folder in folders.items():
        files = image_files(folder)
        strangers = sorted({path.parent.name for path in files} - set(index))
        if strangers:
            raise MissingDataError(f"{folder} has species folders that train has not: {strangers[:5]}"
                                   f"{' ...' if len(strangers) > 5 else ''} ({len(strangers)}); the splits do not "
                                   f"belong together\n  run: {command}")
        items[split] = [(str(path.relative_to(root)), index[path.parent.name]) for path in files]
        check_count(f"Pl@ntNet-300K {split} images", len(items[split]), (expected_sizes or {}).get(split), command)
    train = ImageFiles(root, items["train"], train_transform())
    return Splits(
        "plantnet",
        train,
        ImageFiles(root, items["val"], imagenet_eval()),
        ImageFiles(root, items["test"], imagenet_eval()),
        num_classes=len(species),
        class_counts=class_counts(train.labels, len(species)),
        synthetic=False,
        description=f"Pl@ntNet-300K (real), {len(species)} species, "
                    f"{len(items['train'])}/{len(items['val'])}/{len(items['test'])} images",
        info={"species_names": [names[s] for s in species]},
    )
