"""Image transforms: CIFAR's (pad 4, random crop, horizontal flip, per-channel normalisation; Berrada et al. 2018
and Garcin et al. 2022 use the same) on uint8 tensors, one image or a whole batch on its device, and ImageNet's on
PIL images for the folder datasets. Random choices come from the generator given to a batch, else from torch's
global RNG."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

CIFAR_MEAN = (125.3 / 255, 123.0 / 255, 113.9 / 255)
CIFAR_STD = (63.0 / 255, 62.1 / 255, 66.7 / 255)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class normalise:
    """uint8 [C, H, W] -> float32 in [0, 1], then ``(x - mean) / std`` per channel; :meth:`batch` does it to a batch
    [N, C, H, W] on the batch's device, and :meth:`plain` too, never augmenting (a model's view of its training
    images at evaluation)."""

    def __init__(self, mean=CIFAR_MEAN, std=CIFAR_STD):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def on(self, device: torch.device) -> "normalise":
        """This transform with its mean and std held on ``device``. A batch there then copies nothing from the host:
        such a copy waits for the device, so at every batch it would stop the host from queueing ahead."""
        moved = copy.copy(self)
        moved.mean, moved.std = self.mean.to(device), self.std.to(device)
        return moved

    def plain(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return (images.float() / 255 - mean) / std

    def batch(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.plain(images)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.batch(image[None])[0]


class augment_and_normalise(normalise):
    """Pad with black by ``size // 8`` pixels (4 for 32 px), crop a random ``size`` square, flip with probability 1/2,
    normalise (torchvision's ``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip``). :meth:`batch` augments a
    whole uint8 batch on its device in one gather, its random choices drawn from ``generator`` (default: the global
    RNG); one image is a batch of one."""

    def __init__(self, size: int, mean=CIFAR_MEAN, std=CIFAR_STD):
        super().__init__(mean, std)
        self.size, self.pad = size, max(1, size // 8)

    def draw(self, n: int, generator: torch.Generator | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each image's crop offset (row, column) in the padded image, [n, 2], and whether it is flipped, [n]."""
        offsets = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=generator, device=device)
        return offsets, torch.rand(n, generator=generator, device=device) < 0.5

    def crop_and_flip(self, images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        """uint8 [N, C, H, W] -> [N, C, size, size]: the crops at ``offsets`` of the padded images, mirrored where
        ``flips``."""
        padded = F.pad(images, (self.pad,) * 4)  # [N, C, H + 2 pad, W + 2 pad], black border
        steps = torch.arange(self.size, device=images.device)
        rows = offsets[:, :1] + steps  # [N, size]
        columns = offsets[:, 1:] + torch.where(flips[:, None], self.size - 1 - steps, steps)  # [N, size]
        n, channels = images.shape[:2]
        return padded[torch.arange(n, device=images.device)[:, None, None, None],
                      torch.arange(channels, device=images.device)[None, :, None, None],
                      rows[:, None, :, None], columns[:, None, None, :]]

    def batch(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        offsets, flips = self.draw(len(images), generator, images.device)
        return self.plain(self.crop_and_flip(images, offsets, flips))


def imagenet_train():
    from torchvision import transforms

    return transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def imagenet_eval():
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                               transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
