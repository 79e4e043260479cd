"""The real loaders on tiny files in the real formats (CIFAR-100 python archive, Pl@ntNet-300K Zenodo tree, ImageNet
folders and ImageNet-LT split files), built here since no dataset can be downloaded on CI."""

import json
import pickle
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import data_prep
from data_prep import cifar100
from data_prep.__main__ import main as data_prep_main
from data_prep.common import MissingDataError

N_FINE, N_COARSE = 100, 20


def _coarse_of_fine():
    """A superclass map unlike blocks of 5 consecutive labels (as the real one is)."""
    return torch.randperm(N_FINE, generator=torch.Generator().manual_seed(3)) % N_COARSE


def _cifar_archive(root, n_train=2000, n_test=300):
    rng = np.random.default_rng(0)
    coarse_of_fine = _coarse_of_fine()
    with tarfile.open(root / cifar100.ARCHIVE, "w:gz") as tar:
        for part, n in (("train", n_train), ("test", n_test)):
            fine = (np.arange(n) % N_FINE).tolist()
            batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": fine,
                     b"coarse_labels": coarse_of_fine[fine].tolist()}
            path = root / part
            path.write_bytes(pickle.dumps(batch, protocol=2))  # the official files' protocol
            tar.add(path, arcname=f"{cifar100.FOLDER}/{part}")
    return coarse_of_fine


def test_cifar100_archive_is_extracted_split_and_noised_within_true_superclasses(tmp_path):
    coarse_of_fine = _cifar_archive(tmp_path)
    with pytest.raises(MissingDataError, match="md5"):
        cifar100.prepare(tmp_path)  # not the official archive
    cifar100.prepare(tmp_path, expected_md5=None)
    clean = cifar100.load(tmp_path, expected_sizes=None, expected_md5=None)
    noisy = cifar100.load(tmp_path, noise=0.5, noise_seed=1, expected_sizes=None, expected_md5=None)
    assert (len(clean.train), len(clean.val), len(clean.test)) == (1800, 200, 300)
    assert clean.train.images[0].shape == (3, 32, 32) and clean.num_classes == 100
    true, changed = clean.train.labels, noisy.train.labels
    assert torch.equal(coarse_of_fine[true], coarse_of_fine[changed])  # always within the true superclass
    assert 0.3 < noisy.info["flip_rate"] < 0.5  # 4p/5 = 0.4 in expectation
    assert noisy.info["flip_rate"] == pytest.approx((true != changed).float().mean().item())
    assert torch.equal(noisy.val.labels, clean.val.labels) and torch.equal(noisy.test.labels, clean.test.labels)
    assert torch.equal(noisy.info["clean_train_labels"], true) and "clean_train_labels" not in clean.info
    again = cifar100.load(tmp_path, noise=0.5, noise_seed=1, expected_sizes=None, expected_md5=None)
    assert torch.equal(again.train.labels, changed)  # fixed per image
    assert "realised flip rate" in noisy.description and not noisy.synthetic


def test_cifar100_missing_files_and_wrong_sizes_say_what_to_do(tmp_path):
    with pytest.raises(MissingDataError, match=r"(?s)cifar-100-python.tar.gz.*cs.toronto.edu.*python -m data_prep cifar100"):
        cifar100.prepare(tmp_path)
    with pytest.raises(MissingDataError, match="python -m data_prep cifar100 --root"):
        data_prep.load("cifar100", tmp_path)
    _cifar_archive(tmp_path)
    cifar100.prepare(tmp_path, expected_md5=None)
    with pytest.raises(MissingDataError, match=r"(?s)train has md5 [0-9a-f]{32}, the official archive's train file "
                                               r"has 16019d7e3df5f24257cddd939b257f8d.*extract it again"):
        cifar100.load(tmp_path)
    with pytest.raises(MissingDataError, match="found 2000, the published dataset has 50000"):
        cifar100.load(tmp_path, expected_md5=None)
    with pytest.raises(ValueError, match="label-noise probability should be in"):
        cifar100.load(tmp_path, noise=1.5, expected_sizes=None, expected_md5=None)


def leave_marker(path: str) -> None:
    """What a crafted batch file runs if it is unpickled: it leaves a file, so the test sees whether it ran."""
    open(path, "w").close()


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return leave_marker, (self.marker,)


def test_a_cifar100_batch_file_carrying_a_callable_is_refused_before_it_runs(tmp_path):
    _cifar_archive(tmp_path)
    cifar100.prepare(tmp_path, expected_md5=None)
    train, marker = tmp_path / cifar100.FOLDER / "train", tmp_path / "ran"
    batch = pickle.loads(train.read_bytes())
    for crafted in ({**batch, b"filenames": [_Payload(marker)]}, _Payload(marker)):
        train.write_bytes(pickle.dumps(crafted, protocol=2))
        pickle.loads(train.read_bytes())  # the payload is live: a plain unpickling runs it
        assert marker.exists()
        marker.unlink()
        with pytest.raises(MissingDataError, match=r"(?s)not a CIFAR-100 batch file .*leave_marker.*extract it again"):
            cifar100.load(tmp_path, expected_sizes=None, expected_md5=None)
        assert not marker.exists()
    train.write_bytes(pickle.dumps(batch, protocol=2)[:1000])  # cut short
    with pytest.raises(MissingDataError, match="not a CIFAR-100 batch file"):
        cifar100.load(tmp_path, expected_sizes=None, expected_md5=None)


def _jpeg(path, colour):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 30), colour).save(path)


def _plantnet_tree(root, species=("1355868", "1355920", "1356022"), per_split=(4, 2, 1), layout="images/{}"):
    for s_index, name in enumerate(species):
        for split, n in zip(("train", "val", "test"), per_split):
            for i in range(n * (s_index + 1)):
                _jpeg(root / layout.format(split) / name / f"{split}{i}.jpg", (20 * s_index, 0, 0))
    (root / "plantnet300K_species_id_2_name.json").write_text(json.dumps({s: f"Species {s}" for s in species}))
    (root / "plantnet300K_metadata.json").write_text("{}")


@pytest.mark.parametrize("layout", ["images/{}", "images_{}"])
def test_plantnet_official_splits_and_class_counts(tmp_path, layout):
    _plantnet_tree(tmp_path, layout=layout)
    splits = data_prep.load("plantnet", tmp_path, expected_sizes=None, num_classes=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (24, 12, 6)
    assert splits.class_counts.tolist() == [4, 8, 12]
    image, label = splits.val[0]
    assert image.shape == (3, 224, 224) and label.dtype == torch.long
    assert splits.info["species_names"][0] == "Species 1355868"


def test_plantnet_missing_or_wrong_files_are_named(tmp_path):
    _plantnet_tree(tmp_path)
    with pytest.raises(MissingDataError, match="species folders in train: found 3, the published dataset has 1081"):
        data_prep.load("plantnet", tmp_path, expected_sizes=None)
    with pytest.raises(MissingDataError, match="train images: found 24, the published dataset has 243916"):
        data_prep.load("plantnet", tmp_path, num_classes=3)
    (tmp_path / "plantnet300K_metadata.json").unlink()
    with pytest.raises(MissingDataError, match=r"(?s)metadata file not found.*zenodo.*python -m data_prep plantnet"):
        data_prep.load("plantnet", tmp_path, expected_sizes=None, num_classes=3)


def _imagenet_tree(root, wnids=("n01440764", "n01443537"), n=6):
    for c, wnid in enumerate(wnids):
        for i in range(n):
            _jpeg(root / "train" / wnid / f"{wnid}_{i}.JPEG", (0, 40 * c, 0))
        for i in range(2):
            _jpeg(root / "val" / wnid / f"ILSVRC2012_val_{c}{i}.JPEG", (0, 40 * c, 0))


def test_imagenet_holds_out_a_validation_part_of_train(tmp_path):
    _imagenet_tree(tmp_path)
    splits = data_prep.load("imagenet", tmp_path, expected_sizes=None, num_classes=2, held_out=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (9, 3, 4)
    assert splits.class_counts.sum() == 9 and splits.test.labels.tolist() == [0, 0, 1, 1]


def test_imagenet_lt_reads_the_published_split_files(tmp_path):
    _imagenet_tree(tmp_path)
    lines = {"train": ["train/n01440764/n01440764_0.JPEG 0", "train/n01443537/n01443537_1.JPEG 1",
                       "train/n01443537/n01443537_2.JPEG 1"],
             "val": ["train/n01440764/n01440764_3.JPEG 0"], "test": ["val/n01443537/ILSVRC2012_val_10.JPEG 1"]}
    for split, rows in lines.items():
        (tmp_path / f"ImageNet_LT_{split}.txt").write_text("\n".join(rows) + "\n")
    splits = data_prep.load("imagenet_lt", tmp_path, expected_sizes=None, num_classes=2)
    assert splits.class_counts.tolist() == [1, 2] and len(splits.test) == 1
    with pytest.raises(MissingDataError, match="found 1, the published dataset has 20000"):
        data_prep.load("imagenet_lt", tmp_path, num_classes=2)
    (tmp_path / "ImageNet_LT_val.txt").write_text("train/n01440764/missing.JPEG 0\n")
    with pytest.raises(MissingDataError, match="1 images listed in ImageNet_LT_val.txt are not under"):
        data_prep.load("imagenet_lt", tmp_path, expected_sizes=None, num_classes=2)


def test_command_line_reports_a_missing_dataset_and_fails(tmp_path, capsys):
    assert data_prep_main(["plantnet", "--root", str(tmp_path)]) == 1
    assert "python -m data_prep plantnet --root" in capsys.readouterr().err


def test_unknown_dataset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="the datasets are .*cifar100_like.*plantnet"):
        data_prep.load("cifar10")
