"""Image transforms: CIFAR's (pad 4, random crop, horizontal flip, per-channel normalisation; Berrada et al. 2018
and Garcin et al. 2022 use the same) on uint8 tensors, and ImageNet's on PIL images for the folder datasets.
Random choices come from torch's global RNG, which the training loop seeds and checkpoints."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CIFAR_MEAN = (125.3 / 255, 123.0 / 255, 113.9 / 255)
CIFAR_STD = (63.0 / 255, 62.1 / 255, 66.7 / 255)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class normalise:
    """uint8 [C, H, W] -> float32 in [0, 1], then ``(x - mean) / std`` per channel."""

    def __init__(self, mean=CIFAR_MEAN, std=CIFAR_STD):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return (image.float() / 255 - self.mean) / self.std


class augment_and_normalise(normalise):
    """Pad with black by ``size // 8`` pixels (4 for 32 px), crop a random ``size`` square, flip with probability 1/2,
    normalise (torchvision's ``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip``)."""

    def __init__(self, size: int, mean=CIFAR_MEAN, std=CIFAR_STD):
        super().__init__(mean, std)
        self.size, self.pad = size, max(1, size // 8)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        padded = F.pad(image, (self.pad,) * 4)
        top, left = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
        x = super().__call__(padded[:, top:top + self.size, left:left + self.size])
        return x.flip(-1) if torch.rand(()) < 0.5 else x


def imagenet_train():
    from torchvision import transforms

    return transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def imagenet_eval():
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                               transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
