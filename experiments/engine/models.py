"""The paper's models: the CIFAR DenseNet-BC "40-40" (Berrada et al. 2018; Garcin et al. 2022, Section 5), torchvision
ResNets with optional ImageNet weights from a local file, the cosine classifier head (Table 5's LDAM and noised
imbalanced runs), and small models for CPU runs. ``build_model(name, num_classes, **options)``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from topk.layers import CosineClassifier


def _head(in_features: int, num_classes: int, cosine_scale: float | None) -> nn.Module:
    """A linear layer (bias 0), or with ``cosine_scale`` the cosine classifier with that score scale."""
    if cosine_scale is not None:
        return CosineClassifier(in_features, num_classes, scale=cosine_scale)
    linear = nn.Linear(in_features, num_classes)
    nn.init.zeros_(linear.bias)
    return linear


class _Bottleneck(nn.Module):
    """BN-ReLU-conv1x1 to 4 * growth channels, BN-ReLU-conv3x3 to growth channels, concatenated to the input."""

    def __init__(self, channels: int, growth: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.layers(x)], dim=1)


class DenseNetBC(nn.Module):
    """DenseNet-BC for 32x32 images: 3 dense blocks of ``(depth - 4) / 6`` bottleneck layers, transitions with
    compression 0.5 and 2x2 average pooling, no dropout. ``depth = 40, growth = 40`` is the papers' "40-40"
    (1,941,620 parameters for 100 classes). He-normal convolutions, BN weight 1 bias 0, linear bias 0."""

    def __init__(self, num_classes: int, depth: int = 40, growth: int = 40, cosine_scale: float | None = None):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"a DenseNet-BC depth should be 6n + 4, got {depth}")
        per_block = (depth - 4) // 6
        channels = 2 * growth
        layers: list[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1, bias=False)]
        for block in range(3):
            for _ in range(per_block):
                layers.append(_Bottleneck(channels, growth))
                channels += growth
            if block < 2:
                out = channels // 2
                layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, out, 1, bias=False),
                           nn.AvgPool2d(2)]
                channels = out
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        self.classifier = _head(channels, num_classes, cosine_scale)

    def forward(self, x):
        return self.classifier(self.features(x))


def resnet(name: str, num_classes: int, weights: str | Path | None = None, cosine_scale: float | None = None) -> nn.Module:
    """torchvision's ResNet ``name`` (resnet18/34/50); ``weights``: a local ImageNet state-dict file (e.g.
    torchvision's ``resnet50-*.pth``) loaded before the last layer is replaced by a ``num_classes`` head."""
    import torchvision

    model = getattr(torchvision.models, name)(weights=None)
    if weights is not None:
        path = Path(weights)
        if not path.exists():
            raise FileNotFoundError(f"ImageNet weights file not found: {path} (torchvision's {name} weights, "
                                    f"e.g. from https://download.pytorch.org/models/)")
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.fc = _head(model.fc.in_features, num_classes, cosine_scale)
    return model


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU stages (widths w, 2w, 4w) with 2x2 max pooling, global average pooling and a head:
    a model a 2-core CPU trains on a synthetic CIFAR-100-like set in seconds per epoch."""

    def __init__(self, num_classes: int, width: int = 32, cosine_scale: float | None = None):
        super().__init__()
        stages, channels = [], 3
        for out in (width, 2 * width, 4 * width):
            stages += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*stages, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = _head(channels, num_classes, cosine_scale)

    def forward(self, x):
        return self.classifier(self.features(x))


MODELS: dict[str, Callable[..., nn.Module]] = {
    "densenet40_40": functools.partial(DenseNetBC, depth=40, growth=40),
    "densenet_bc": DenseNetBC,
    "resnet18": functools.partial(resnet, "resnet18"),
    "resnet34": functools.partial(resnet, "resnet34"),
    "resnet50": functools.partial(resnet, "resnet50"),
    "small_cnn": SmallCNN,
}


def model_options(name: str) -> list[str]:
    """The options a model of :data:`MODELS` takes beside the number of classes (those its name fixes excluded)."""
    builder = MODELS[name]
    fixed = builder.keywords if isinstance(builder, functools.partial) else {}
    return sorted(parameter for parameter in inspect.signature(builder).parameters
                  if parameter not in ("num_classes", *fixed))


def build_model(name: str, num_classes: int, **options) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the models are {sorted(MODELS)}")
    return MODELS[name](num_classes, **options)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

