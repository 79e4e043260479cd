"""Pl@ntNet-300K (Garcin et al., NeurIPS Datasets and Benchmarks 2021), the paper's heavy-tailed dataset (Table 5, 8).

The Zenodo archive (https://zenodo.org/records/5645731) extracts to a folder holding ``images/{train,val,test}/``
(older releases: ``images_train`` ...), each with one sub-folder per species id (1,081 of them), plus
``plantnet300K_species_id_2_name.json`` and ``plantnet300K_metadata.json``. The official splits are used as they
are; classes are the species ids in sorted order (as torchvision's ImageFolder orders them).
"""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.common import MissingDataError, ImageFiles, Splits, check_count, class_counts, require_file
from data_prep.transforms import imagenet_eval, imagenet_train

SOURCE = "https://zenodo.org/records/5645731 (plantnet_300K.zip, extract it)"
SPECIES_NAMES = "plantnet300K_species_id_2_name.json"
METADATA = "plantnet300K_metadata.json"
SIZES = {"train": 243_916, "val": 31_118, "test": 31_112}
NUM_CLASSES = 1081
COMMAND = "python -m data_prep plantnet --root {root}"
EXTENSIONS = (".jpg", ".jpeg", ".png")


def _split_folder(root: Path, split: str) -> Path:
    for candidate in (root / "images" / split, root / f"images_{split}"):
        if candidate.is_dir():
            return candidate
    raise MissingDataError(f"Pl@ntNet-300K {split} images not found: expected {root / 'images' / split}/<species id>/"
                           f"\n  get them from {SOURCE}\n  then run: {COMMAND.format(root=root)}")


def load(root: Path, expected_sizes: dict | None = SIZES, num_classes: int | None = NUM_CLASSES) -> Splits:
    """The official train/val/test splits under ``root``, checked against the published sizes (``None`` skips a check)."""
    root = Path(root)
    command = COMMAND.format(root=root)
    names = json.loads(require_file(root / SPECIES_NAMES, "the species-name file", SOURCE, command).read_text())
    require_file(root / METADATA, "the metadata file", SOURCE, command)
    folders = {split: _split_folder(root, split) for split in ("train", "val", "test")}
    species = sorted(p.name for p in folders["train"].iterdir() if p.is_dir())
    check_count("Pl@ntNet-300K species folders in train", len(species), num_classes, command)
    unnamed = sorted(set(species) - set(names))
    if unnamed:
        raise MissingDataError(f"species folders {unnamed[:5]} are not in {SPECIES_NAMES}: the files do not belong together")
    index = {name: i for i, name in enumerate(species)}
    items = {}
    for split, folder in folders.items():
        items[split] = [(str(path.relative_to(root)), index[path.parent.name])
                        for path in sorted(folder.glob("*/*")) if path.suffix.lower() in EXTENSIONS]
        check_count(f"Pl@ntNet-300K {split} images", len(items[split]), (expected_sizes or {}).get(split), command)
    train = ImageFiles(root, items["train"], imagenet_train())
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
