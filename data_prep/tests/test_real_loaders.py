"""The real loaders on tiny files in the real formats (CIFAR-100 python archive, Pl@ntNet-300K Zenodo tree, ImageNet
folders and ImageNet-LT split files), built here since no dataset can be downloaded on CI."""

import json
import pickle
import struct
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import data_prep
from data_prep import cifar100, imagenet, plantnet
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


def test_cifar100_noise_within_blocks_of_5_labels_as_the_authors_code_draws_it(tmp_path):
    coarse_of_fine = _cifar_archive(tmp_path)
    cifar100.prepare(tmp_path, expected_md5=None)
    clean = cifar100.load(tmp_path, expected_sizes=None, expected_md5=None)
    blocks = cifar100.load(tmp_path, noise=0.5, noise_seed=1, noise_groups="blocks_of_5", expected_sizes=None,
                           expected_md5=None)
    true, changed = clean.train.labels, blocks.train.labels
    assert torch.equal(true // 5, changed // 5) and 0.3 < blocks.info["flip_rate"] < 0.5
    assert not torch.equal(coarse_of_fine[true], coarse_of_fine[changed])  # blocks of labels, not superclasses
    assert "within blocks of 5 labels" in blocks.description and blocks.info["noise_groups"] == "blocks_of_5"
    with pytest.raises(ValueError, match=r"noise_groups should be one of \['blocks_of_5', 'superclass'\], got 'coarse'"):
        cifar100.load(tmp_path, noise_groups="coarse", expected_sizes=None, expected_md5=None)


def _python2_batch(fine: list[int], coarse: list[int], data: bytes) -> bytes:
    """A batch file as the official archive's were written: Python 2's pickle, protocol 2, byte strings as
    ``SHORT_BINSTRING``/``BINSTRING``, the images a numpy 1 ``uint8`` array rebuilt by ``numpy.core.multiarray``."""
    def string(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def integer(i: int) -> bytes:
        return b"K" + bytes([i]) if 0 <= i < 256 else b"J" + struct.pack("<i", i)

    def int_list(values: list[int]) -> bytes:
        return b"](" + b"".join(integer(v) for v in values) + b"e"

    n = len(fine)
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + integer(0) + b"\x85" + string(b"b")
             + b"\x87R" + b"(" + integer(1) + integer(n) + integer(3072) + b"\x86" + b"cnumpy\ndtype\n" + string(b"u1")
             + integer(0) + integer(1) + b"\x87R" + b"(" + integer(3) + string(b"|") + b"NNN" + integer(-1)
             + integer(-1) + integer(0) + b"tb" + b"\x89" + string(data) + b"tb")
    return (b"\x80\x02}(" + string(b"filenames") + b"](" + string(b"a_0.png") * n + b"e" + string(b"batch_label")
            + string(b"training batch 1 of 1") + string(b"fine_labels") + int_list(fine) + string(b"coarse_labels")
            + int_list(coarse) + string(b"data") + array + b"u.")


def test_cifar100_batch_files_written_by_python_2_load_and_an_extracted_folder_needs_no_archive(tmp_path):
    folder = tmp_path / cifar100.FOLDER
    folder.mkdir()
    data = bytes(range(256)) * (4 * 3072 // 256)
    for part in cifar100.SIZES:
        (folder / part).write_bytes(_python2_batch([0, 1, 2, 3], [4, 1, 14, 8], data))
    assert cifar100.prepare(tmp_path) == folder  # extracted before, the archive since removed
    images, fine, coarse = cifar100._read(folder, "train", None, tmp_path, None)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert images.flatten().tolist() == list(data) and fine.tolist() == [0, 1, 2, 3] and coarse.tolist() == [4, 1, 14, 8]
    with pytest.raises(MissingDataError, match="the CIFAR-100 archive not found"):
        cifar100.prepare(tmp_path / "empty")


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


#: The two releases on Zenodo: the current one (record 5645731) and the first (record 4726653).
PLANTNET_RELEASES = {"current": ("images/{}", "plantnet300K_species_id_2_name.json"),
                     "first": ("images_{}", "plantnet300K_species_names.json")}


def _plantnet_tree(root, species=("1355868", "1355920", "1356022"), per_split=(4, 2, 1), release="current"):
    layout, names_file = PLANTNET_RELEASES[release]
    for s_index, name in enumerate(species):
        for split, n in zip(("train", "val", "test"), per_split):
            for i in range(n * (s_index + 1)):
                _jpeg(root / layout.format(split) / name / f"{split}{i}.jpg", (20 * s_index, 0, 0))
    (root / names_file).write_text(json.dumps({s: f"Species {s}" for s in species}))
    (root / "plantnet300K_metadata.json").write_text("{}")


@pytest.mark.parametrize("release", sorted(PLANTNET_RELEASES))
def test_plantnet_official_splits_and_class_counts(tmp_path, release):
    _plantnet_tree(tmp_path, release=release)
    (tmp_path / PLANTNET_RELEASES[release][0].format("train") / "1355868" / ".DS_Store").write_text("")  # skipped
    splits = data_prep.load("plantnet", tmp_path, expected_sizes=None, num_classes=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (24, 12, 6)
    assert splits.class_counts.tolist() == [4, 8, 12]
    image, label = splits.val[0]
    assert image.shape == (3, 224, 224) and label.dtype == torch.long
    assert splits.info["species_names"][0] == "Species 1355868"


def test_plantnet_trains_on_the_thesis_crops():
    steps = [type(step).__name__ for step in plantnet.train_transform().transforms]
    assert steps == ["Resize", "RandomCrop", "ToTensor", "Normalize"]  # shorter side 256, a random 224 crop, no flip
    assert plantnet.train_transform().transforms[0].size == 256
    image = Image.new("RGB", (400, 300), (90, 20, 200))
    assert plantnet.train_transform()(image).shape == (3, 224, 224)


def test_plantnet_missing_or_wrong_files_are_named(tmp_path):
    _plantnet_tree(tmp_path)
    with pytest.raises(MissingDataError, match="species folders in train: found 3, the published dataset has 1081"):
        data_prep.load("plantnet", tmp_path, expected_sizes=None)
    with pytest.raises(MissingDataError, match="train images: found 24, the published dataset has 243916"):
        data_prep.load("plantnet", tmp_path, num_classes=3)
    _jpeg(tmp_path / "images" / "test" / "9999999" / "x.jpg", (0, 0, 0))
    with pytest.raises(MissingDataError, match=r"images/test has species folders that train has not: \['9999999'\]"):
        data_prep.load("plantnet", tmp_path, expected_sizes=None, num_classes=3)


def test_plantnet_extracted_one_folder_down_is_pointed_to(tmp_path):
    _plantnet_tree(tmp_path / "plantnet_300K")
    with pytest.raises(MissingDataError, match=r"(?s)species-name file \(plantnet300K_species_id_2_name.json or "
                                               r"plantnet300K_species_names.json\) not found.*found it one level down: "
                                               r"use --root .*plantnet_300K\n.*zenodo"):
        data_prep.load("plantnet", tmp_path, expected_sizes=None, num_classes=3)


def _imagenet_tree(root, wnids=("n01440764", "n01443537"), n=6):
    for c, wnid in enumerate(wnids):
        for i in range(n):
            _jpeg(root / "train" / wnid / f"{wnid}_{i}.JPEG", (0, 40 * c, 0))
        for i in range(2):
            _jpeg(root / "val" / wnid / f"ILSVRC2012_val_{c}{i}.JPEG", (0, 40 * c, 0))


def test_imagenet_holds_out_a_balanced_validation_part_of_train(tmp_path):
    _imagenet_tree(tmp_path)
    (tmp_path / "train" / "n01440764" / ".DS_Store").write_text("")  # not an image: skipped
    splits = data_prep.load("imagenet", tmp_path, expected_sizes=None, num_classes=2, held_out_per_class=2)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 4, 4)
    assert splits.val.labels.tolist() == [0, 0, 1, 1] and splits.class_counts.tolist() == [4, 4]
    assert {path for path, _ in splits.train.items}.isdisjoint(path for path, _ in splits.val.items)
    assert splits.test.labels.tolist() == [0, 0, 1, 1]
    again = data_prep.load("imagenet", tmp_path, expected_sizes=None, num_classes=2, held_out_per_class=2)
    assert again.val.items == splits.val.items  # fixed by the split's seed
    steps = [type(step).__name__ for step in splits.train.transform.transforms]
    assert steps == ["Resize", "RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]  # Berrada et al.'s


def test_a_balanced_hold_out_takes_all_of_a_class_smaller_than_its_share():
    kept, held = imagenet.balanced_hold_out([0, 1, 1, 1, 0, 2, 1], per_class=2)
    labels = [0, 1, 1, 1, 0, 2, 1]
    assert sorted(labels[i] for i in held) == [0, 0, 1, 1, 2] and sorted(kept + held) == list(range(7))


def test_imagenet_lt_reads_the_published_split_files(tmp_path):
    _imagenet_tree(tmp_path)
    lines = {"train": ["train/n01440764/n01440764_0.JPEG 0", "train/n01443537/n01443537_1.JPEG 1",
                       "train/n01443537/n01443537_2.JPEG 1"],
             "val": ["train/n01440764/n01440764_3.JPEG 0"], "test": ["val/n01443537/ILSVRC2012_val_10.JPEG 1"]}
    (tmp_path / "ImageNet_LT").mkdir()
    for split, rows in lines.items():  # where the OLTR release keeps them
        (tmp_path / "ImageNet_LT" / f"ImageNet_LT_{split}.txt").write_text("\n".join(rows) + "\n")
    splits = data_prep.load("imagenet_lt", tmp_path, expected_sizes=None, num_classes=2)
    assert splits.class_counts.tolist() == [1, 2] and len(splits.test) == 1
    with pytest.raises(MissingDataError, match="ImageNet-LT train images: found 3, the published dataset has 115846"):
        data_prep.load("imagenet_lt", tmp_path, num_classes=2)
    with pytest.raises(MissingDataError, match="found 1, the published dataset has 20000"):
        data_prep.load("imagenet_lt", tmp_path, expected_sizes={"val": 20_000}, num_classes=2)
    for split, rows in lines.items():  # in the root, they are read first
        (tmp_path / f"ImageNet_LT_{split}.txt").write_text("\n".join(rows) + "\n")
    (tmp_path / "ImageNet_LT_val.txt").write_text("train/n01440764/missing.JPEG 0\n")
    with pytest.raises(MissingDataError, match="1 images listed in ImageNet_LT_val.txt are not under"):
        data_prep.load("imagenet_lt", tmp_path, expected_sizes=None, num_classes=2)


def test_command_line_reports_a_missing_dataset_and_fails(tmp_path, capsys):
    assert data_prep_main(["plantnet", "--root", str(tmp_path)]) == 1
    assert "python -m data_prep plantnet --root" in capsys.readouterr().err


def test_the_plantnet_command_names_the_missing_imagenet_weights(tmp_path, capsys, monkeypatch):
    _plantnet_tree(tmp_path)
    monkeypatch.setattr(data_prep, "REAL", {**data_prep.REAL, "plantnet": lambda root: plantnet.load(root, None, 3)})
    assert data_prep_main(["plantnet", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 species" in out and "resnet50-imagenet.pth" in out and "resnet50-0676ba61.pth" in out
    (tmp_path / plantnet.WEIGHTS).write_bytes(b"")
    assert data_prep_main(["plantnet", "--root", str(tmp_path)]) == 0
    assert "weights" not in capsys.readouterr().out


def test_unknown_dataset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="the datasets are .*cifar100_like.*plantnet"):
        data_prep.load("cifar10")


def test_image_files_hold_their_paths_in_one_byte_array_and_read_any_name(tmp_path):
    from data_prep.common import ImageFiles

    _jpeg(tmp_path / "n01" / "é ü.JPEG", (200, 0, 0))
    _jpeg(tmp_path / "n02" / "b.jpg", (0, 200, 0))
    files = ImageFiles(tmp_path, [("n01/é ü.JPEG", 0), ("n02/b.jpg", 1)], lambda image: image.getpixel((0, 0)))
    assert files.paths.dtype.kind == "S" and files.paths.shape == (2,)  # no Python string per path in workers' memory
    assert files.items == [("n01/é ü.JPEG", 0), ("n02/b.jpg", 1)] and len(files) == 2
    (red, _, _), label = files[0]
    assert red > 150 and label == 0 and files[1][0][1] > 150 and files[1][1] == 1  # JPEG rounds the colours
    loader = torch.utils.data.DataLoader(files, batch_size=None, num_workers=2, collate_fn=lambda item: item)
    assert [label.item() for _, label in loader] == [0, 1]
