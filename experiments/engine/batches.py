"""The batches the training loop and the evaluation iterate over, already on the device.

- In-memory datasets (:class:`data_prep.common.TensorImages`: CIFAR-100 and the synthetic stand-ins) are moved to the
  device once, as uint8, and each batch is gathered, augmented and normalised there by the dataset's transform (its
  ``batch`` method, :mod:`data_prep.transforms`): no worker process, no host-to-device copy per batch. On a CPU the
  same code runs on CPU tensors.
- Image-folder datasets (Pl@ntNet-300K, ImageNet) go through a ``DataLoader``: ``num_workers`` processes (default:
  the machine's cores), pinned memory on CUDA, persistent workers, prefetching.

Epoch ``e`` depends only on the run's seed and ``e``: with the order seed ``o = seed * 100_003 + e`` the training set
is visited in the order ``torch.randperm(n, generator=torch.Generator().manual_seed(o))`` (under DDP,
``DistributedSampler``'s order for that seed, each process its share), and the augmentation is drawn from a
generator seeded by ``o`` (in memory: one per process, on the device; from files: one per image, seeded by ``o`` and
the image's position). A resumed run therefore reaches the uninterrupted run's result.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from data_prep.common import TensorImages


def default_workers() -> int:
    """The machine's cores available to this process."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def order_seed(seed: int, epoch: int) -> int:
    return seed * 100_003 + epoch


def epoch_order(n: int, seed: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """This process's indices of ``n`` items for the epoch with order seed ``seed``: ``RandomSampler``'s order, or
    under DDP ``DistributedSampler(drop_last=True)``'s share."""
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if world == 1:
        return permutation
    return permutation[: n // world * world][rank::world]


class InMemoryBatches:
    """A :class:`TensorImages` dataset on ``device``; batches gathered and transformed there."""

    def __init__(self, dataset: TensorImages, device: torch.device):
        self.images, self.labels = dataset.images.to(device), dataset.labels.to(device)
        self.transform, self.device = dataset.transform.on(device), device

    def __len__(self) -> int:
        return len(self.labels)

    def shuffled(self, seed: int, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[tuple]:
        """Full batches in the epoch's order, augmented from a generator seeded by ``(seed, rank)``."""
        indices = epoch_order(len(self), seed, rank, world).to(self.device)
        generator = torch.Generator(self.device).manual_seed(seed * 1_009 + rank)
        for start in range(0, len(indices) - batch_size + 1, batch_size):
            chosen = indices[start:start + batch_size]
            yield self.transform.batch(self.images[chosen], generator), self.labels[chosen]

    def in_order(self, batch_size: int) -> Iterator[tuple]:
        """Every item once, in order (evaluation)."""
        for start in range(0, len(self), batch_size):
            yield (self.transform.batch(self.images[start:start + batch_size]),
                   self.labels[start:start + batch_size])


class _SeededItems(Dataset):
    """Items asked for as ``(seed, index)``: the transform of item ``index`` draws from torch's RNG seeded by ``seed``
    (in a worker, or in the main process with its RNG state restored after)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, seeded_index: tuple[int, int]):
        seed, index = seeded_index
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.dataset[index]


class _EpochOrder(Sampler):
    """``(item seed, index)`` in the order of the epoch set by :meth:`set_epoch_seed` (one sampler for every epoch, so
    that the workers persist)."""

    def __init__(self, n: int, rank: int, world: int):
        self.n, self.rank, self.world, self.seed = n, rank, world, 0

    def set_epoch_seed(self, seed: int) -> None:
        self.seed = seed

    def __len__(self) -> int:
        return self.n // self.world

    def __iter__(self):
        for index in epoch_order(self.n, self.seed, self.rank, self.world).tolist():
            yield self.seed * 1_000_003 + index, index


class FileBatches:
    """A dataset read from files by ``num_workers`` persistent worker processes; batches moved to ``device``."""

    def __init__(self, dataset: Dataset, device: torch.device, num_workers: int):
        self.dataset, self.device, self.num_workers = dataset, device, num_workers
        self._loaders: dict = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def _loader(self, key: tuple, dataset: Dataset, batch_size: int, **options) -> DataLoader:
        """One loader per use, made once, so that its workers persist from epoch to epoch."""
        if key not in self._loaders:
            workers = {"num_workers": self.num_workers, "pin_memory": self.device.type == "cuda"}
            if self.num_workers > 0:
                workers.update(persistent_workers=True, prefetch_factor=4)
            # its own generator: a loader draws a seed for its workers each epoch, which would move the global RNG
            self._loaders[key] = DataLoader(dataset, batch_size=batch_size, generator=torch.Generator(), **options,
                                            **workers)
        return self._loaders[key]

    def _on_device(self, loader: DataLoader) -> Iterator[tuple]:
        for images, labels in loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def shuffled(self, seed: int, batch_size: int, rank: int = 0, world: int = 1) -> Iterator[tuple]:
        key = ("shuffled", batch_size, rank, world)
        if key not in self._loaders:
            self._loader(key, _SeededItems(self.dataset), batch_size, sampler=_EpochOrder(len(self), rank, world),
                         drop_last=True)
        self._loaders[key].sampler.set_epoch_seed(seed)
        return self._on_device(self._loaders[key])

    def in_order(self, batch_size: int) -> Iterator[tuple]:
        return self._on_device(self._loader(("in_order", batch_size), self.dataset, batch_size))


def batches(dataset: Dataset, device: torch.device, num_workers: int | None = None) -> InMemoryBatches | FileBatches:
    """The batches of ``dataset`` on ``device``: in memory for a :class:`TensorImages`, else read by workers."""
    if isinstance(dataset, TensorImages):
        return InMemoryBatches(dataset, device)
    return FileBatches(dataset, device, default_workers() if num_workers is None else num_workers)
