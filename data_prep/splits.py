"""What a training reads of a dataset: the splits container, images held in memory as a tensor (CIFAR-100 and the
synthetic stand-ins), and the class counts. Training code (``experiments.paths.TRAINING_CODE``): a change here makes
the committed results stale."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset


@dataclass
class Splits:
    """A dataset ready for training: train/val/test datasets and what the metrics need about the classes."""

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    class_counts: torch.Tensor  #: training images per class, for margins and few/medium/many-shot groups
    synthetic: bool  #: True for a synthetic stand-in, False for the real data
    description: str  #: one line for figures and reports: which data, which size
    #: dataset-specific facts, e.g. the realised label-flip rate and, under label noise, the true training labels
    #: (``clean_train_labels``)
    info: dict = field(default_factory=dict)


class TensorImages(Dataset):
    """Images held in memory as a uint8 tensor [N, C, H, W] with int64 labels; ``transform`` maps a uint8 image
    to the float tensor the model sees."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images should be uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels should have shape ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images, self.labels, self.transform = images, labels.long(), transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(self.images[index]), self.labels[index]


def class_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.bincount(labels, minlength=num_classes)
