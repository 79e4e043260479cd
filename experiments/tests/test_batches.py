"""The batches of the training loop: in memory (on the device, augmented per batch) and from image files (worker
processes); both reproducible from (seed, epoch) alone."""

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

from data_prep.common import ImageFiles
from data_prep.splits import TensorImages
from data_prep.transforms import augment_and_normalise, imagenet_train, normalise
from experiments.engine.batches import FileBatches, InMemoryBatches, batches, epoch_order


def _images(n=40, size=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=generator),
            torch.randint(0, 10, (n,), generator=generator))


def test_epoch_order_is_the_data_loaders_and_the_distributed_samplers():
    dataset = TensorImages(*_images(), normalise())
    loader = DataLoader(dataset, batch_size=len(dataset), shuffle=True, generator=torch.Generator().manual_seed(7))
    assert torch.equal(epoch_order(len(dataset), 7), torch.tensor(list(iter(loader.sampler))))
    for rank in range(3):
        sampler = DistributedSampler(dataset, num_replicas=3, rank=rank, seed=7, drop_last=True)
        assert epoch_order(len(dataset), 7, rank, 3).tolist() == list(iter(sampler))


def test_a_batch_is_augmented_as_each_of_its_images_would_be():
    """The batch gather crops and flips exactly as padding, slicing and ``flip`` do one image at a time."""
    images, _ = _images(6)
    transform = augment_and_normalise(32)
    offsets, flips = transform.draw(6, torch.Generator().manual_seed(1), images.device)
    assert flips.any() and not flips.all()
    crops = transform.crop_and_flip(images, offsets, flips)
    for image, (top, left), flip, crop in zip(images, offsets.tolist(), flips, crops):
        expected = F.pad(image, (4,) * 4)[:, top:top + 32, left:left + 32]
        assert torch.equal(crop, expected.flip(-1) if flip else expected)


def test_in_memory_epochs_depend_only_on_their_seed():
    dataset = TensorImages(*_images(), augment_and_normalise(32))
    batches_of = InMemoryBatches(dataset, torch.device("cpu"))
    first = list(batches_of.shuffled(seed=11, batch_size=16))
    assert len(first) == 2 and first[0][0].shape == (16, 3, 32, 32) and first[0][0].dtype == torch.float32
    again = list(InMemoryBatches(dataset, torch.device("cpu")).shuffled(seed=11, batch_size=16))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    other = list(batches_of.shuffled(seed=12, batch_size=16))
    assert not torch.equal(first[0][1], other[0][1])
    in_order = torch.cat([labels for _, labels in batches_of.in_order(batch_size=16)])
    assert torch.equal(in_order, dataset.labels)


def test_in_memory_batches_hold_the_normalisation_on_their_device():
    """Moved there once: a copy from the host's memory at every batch would wait for the device each time."""
    transform = augment_and_normalise(32)
    on_meta = InMemoryBatches(TensorImages(*_images(4), transform), torch.device("meta")).transform
    assert (on_meta.mean.device.type, on_meta.std.device.type) == ("meta", "meta")
    assert isinstance(on_meta, augment_and_normalise) and on_meta.size == transform.size
    assert transform.mean.device.type == "cpu"  # the dataset's own transform is left as it was


def test_in_memory_evaluation_batches_equal_the_per_image_transform():
    dataset = TensorImages(*_images(10), normalise())
    batched = torch.cat([images for images, _ in InMemoryBatches(dataset, torch.device("cpu")).in_order(4)])
    torch.testing.assert_close(batched, torch.stack([dataset[i][0] for i in range(10)]))


def _image_folder(root, n=12):
    images, labels = _images(n, size=24, seed=3)
    items = []
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(root / f"{i}.png")
        items.append((f"{i}.png", label))
    return ImageFiles(root, items, imagenet_train())


def test_image_folder_epochs_are_the_same_with_any_number_of_workers_and_persist(tmp_path):
    """Each image's augmentation is seeded by the epoch and its position: 0 or 2 worker processes give the same
    batches, the same epoch twice gives them again, and one loader (its workers persistent) serves every epoch."""
    dataset = _image_folder(tmp_path)
    assert not isinstance(batches(dataset, torch.device("cpu"), 0), InMemoryBatches)
    in_process, workers = FileBatches(dataset, torch.device("cpu"), 0), FileBatches(dataset, torch.device("cpu"), 2)
    epoch = list(in_process.shuffled(seed=5, batch_size=4))
    assert len(epoch) == 3 and epoch[0][0].shape == (4, 3, 224, 224)
    for other in (list(workers.shuffled(seed=5, batch_size=4)), list(in_process.shuffled(seed=5, batch_size=4))):
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(epoch, other))
    loader = workers._loaders[("shuffled", 4, 0, 1)]
    next_epoch = list(workers.shuffled(seed=6, batch_size=4))
    assert workers._loaders[("shuffled", 4, 0, 1)] is loader and loader.persistent_workers
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(epoch, next_epoch))
    state = torch.get_rng_state()
    list(in_process.shuffled(seed=5, batch_size=4))
    assert torch.equal(torch.get_rng_state(), state), "reading images in the main process must not move its RNG"
