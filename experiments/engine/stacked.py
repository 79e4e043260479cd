"""Several runs of one architecture trained as one model: each layer of ``N`` models becomes one layer with ``N``
groups. A convolution becomes one grouped convolution (group ``n``: run ``n``'s filters on run ``n``'s channels), a
batch normalisation one over ``N`` times the channels (its statistics are per channel, so still per run), a linear
head one batched product; a step launches the kernels of one run with ``N`` times the work in each.

The runs stay independent. The gradient of the sum of their losses with respect to run ``n``'s weights is run
``n``'s own gradient, and SGD with momentum and weight decay acts element by element, so one optimiser over the
grouped tensors takes every run's own step (equal up to rounding), as long as the runs share the optimiser's
settings. Autocast reaches every layer as in a single model.

Layout: the images of the ``N`` runs side by side along the channels, ``[B, N * C, H, W]``, run-major (a
channels-last batch on CUDA as the engine's), which is a grouped convolution's input; scores come back as
``[B, N, classes]`` and labels go in as ``[B, N]``. Every tensor of the grouped model is its runs' tensors
concatenated along the first dimension (a scalar, the batch count, is shared).

    >>> import torch
    >>> from experiments.engine.models import build_model
    >>> stacked = StackedModels([build_model("small_cnn", 10, width=4) for _ in range(3)])
    >>> stacked(torch.randn(8, 3 * 3, 16, 16)).shape
    torch.Size([8, 3, 10])
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from experiments.engine.models import DenseNetBC, SmallCNN, _Bottleneck
from topk.layers import CosineClassifier

#: Layers that hold no tensors and act on each channel, or on each image, alone: the same for grouped channels.
_CHANNELWISE = (nn.ReLU, nn.AvgPool2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Identity)
#: Containers whose forward chains, adds or flattens what their children give, which grouped children keep per run
#: (torchvision's, named rather than imported: importing torchvision costs a second).
_CONTAINERS = (nn.Sequential, DenseNetBC, SmallCNN)
_TORCHVISION_CONTAINERS = {("torchvision.models.resnet", name) for name in ("ResNet", "BasicBlock", "Bottleneck")}


class _GroupedLinear(nn.Module):
    """``runs`` linear layers (weights ``[runs * out, in]``): ``[B, runs * in]`` features to ``[B, runs, out]``."""

    def __init__(self, runs: int, in_features: int, out_features: int, bias: bool, cosine_scale: float | None = None):
        super().__init__()
        self.runs, self.cosine_scale = runs, cosine_scale
        self.weight = nn.Parameter(torch.empty(runs * out_features, in_features))
        self.bias = nn.Parameter(torch.empty(runs * out_features)) if bias else None

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features = features.unflatten(1, (self.runs, -1))  # [B, N * in] -> [B, N, in]
        weight = self.weight.unflatten(0, (self.runs, -1))  # [N * out, in] -> [N, out, in]
        if self.cosine_scale is not None:  # topk.layers.CosineClassifier of each run
            features, weight = F.normalize(features, dim=-1), F.normalize(weight, dim=-1)
        scores = torch.einsum("bni,noi->bno", features, weight)
        if self.bias is not None:
            scores = scores + self.bias.unflatten(0, (self.runs, -1)).to(scores.dtype)  # autocast's cast, as addmm's
        return scores if self.cosine_scale is None else self.cosine_scale * scores


def cat_runs(first: torch.Tensor, second: torch.Tensor, runs: int) -> torch.Tensor:
    """Each run's channels of ``first`` then of ``second``, run after run: the grouped form of ``torch.cat(dim=1)``.
    In the inputs' memory layout (channels-last stays channels-last)."""
    if first.is_contiguous(memory_format=torch.channels_last) and not first.is_contiguous():
        last = [t.permute(0, 2, 3, 1).unflatten(3, (runs, -1)) for t in (first, second)]  # [B, H, W, N, C], a view
        return torch.cat(last, dim=4).flatten(3).permute(0, 3, 1, 2)
    return torch.cat([t.unflatten(1, (runs, -1)) for t in (first, second)], dim=2).flatten(1, 2)


class _GroupedBottleneck(nn.Module):
    """:class:`experiments.engine.models._Bottleneck` of ``runs`` runs: its new channels after each run's own."""

    def __init__(self, layers: nn.Module, runs: int):
        super().__init__()
        self.layers, self.runs = layers, runs

    def forward(self, x):
        return cat_runs(x, self.layers(x), self.runs)


def _grouped(module: nn.Module, runs: int, done: dict | None = None) -> nn.Module:
    """``module`` with ``runs`` groups in every layer (tensors left unset: :class:`StackedModels` fills them); a
    module met twice (``done``: by id) is grouped once and shared as it was."""
    done = {} if done is None else done
    if id(module) not in done:
        done[id(module)] = _grouped_once(module, runs, done)
    return done[id(module)]


def _grouped_once(module: nn.Module, runs: int, done: dict) -> nn.Module:
    if isinstance(module, nn.Conv2d):
        return nn.Conv2d(runs * module.in_channels, runs * module.out_channels, module.kernel_size, module.stride,
                         module.padding, module.dilation, runs * module.groups, module.bias is not None,
                         module.padding_mode)
    if isinstance(module, nn.BatchNorm2d):
        return nn.BatchNorm2d(runs * module.num_features, module.eps, module.momentum, module.affine,
                              module.track_running_stats)
    if isinstance(module, nn.Linear):
        return _GroupedLinear(runs, module.in_features, module.out_features, module.bias is not None)
    if isinstance(module, CosineClassifier):
        return _GroupedLinear(runs, module.in_features, module.num_classes, False, module.scale)
    if isinstance(module, _Bottleneck):
        return _GroupedBottleneck(_grouped(module.layers, runs, done), runs)
    if isinstance(module, _CHANNELWISE):
        return copy.deepcopy(module)
    kind = type(module)  # the very class: a subclass may have a forward of its own
    if not (kind in _CONTAINERS or (kind.__module__, kind.__name__) in _TORCHVISION_CONTAINERS):
        raise ValueError(f"runs cannot be stacked through a {kind.__name__} layer: only through convolutions, batch "
                         "normalisations, linear and cosine heads, ReLU, pooling, DenseNet-BC, SmallCNN and "
                         "torchvision's ResNets")
    if own := [name for name, tensor in (*module._parameters.items(), *module._buffers.items()) if tensor is not None]:
        raise ValueError(f"runs cannot be stacked through a {kind.__name__} holding tensors of its own: {own[:3]}")
    children = {name: child for name, child in module._modules.items() if child is not None}  # repeats included
    grouped = copy.deepcopy(module, {id(child): None for child in children.values()})  # the container alone
    for name, child in children.items():
        setattr(grouped, name, _grouped(child, runs, done))
    return grouped


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


class StackedModels(nn.Module):
    """``N`` models of one architecture (same class, same tensors by name and shape) as one grouped model whose
    forward maps ``[B, N * C, H, W]`` images to ``[B, N, classes]`` scores, run ``n``'s from its own weights and
    images. The models are copied, not shared."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        if len(models) < 1:
            raise ValueError("'models' should hold at least one model to stack, got none")
        first, shapes = models[0], _shapes(models[0])
        for index, model in enumerate(models[1:], start=1):
            found = _shapes(model)
            if type(model) is not type(first) or found != shapes:
                differ = sorted(set(found.items()) ^ set(shapes.items()))[:3]
                raise ValueError(f"model {index} ({type(model).__name__}) is not model 0's architecture "
                                 f"({type(first).__name__}); tensors that differ: {differ}")
        if any(module.training != first.training for model in models for module in model.modules()):
            raise ValueError("the models to stack should all be in training mode or all in evaluation mode")
        self.runs = len(models)
        with torch.device("meta"):  # no tensors made (nor random numbers drawn) for the grouped layers' own init
            self.model = _grouped(first, self.runs)
        self.model.train(first.training)
        states = [model.state_dict() for model in models]
        grouped = {}
        for name, tensor in self.model.state_dict().items():
            own = [state[name] for state in states]
            if tensor.dim() == 0:  # batch normalisation's count of batches: the same in every run
                if len({value.item() for value in own}) != 1:
                    raise ValueError(f"the runs' {name} differ ({[value.item() for value in own]}): stacked runs "
                                     "should have trained as many steps")
                grouped[name] = own[0].clone()
            else:
                grouped[name] = torch.cat(own)  # in the runs' dtype, device and memory layout
        self.model.load_state_dict(grouped, assign=True)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] % self.runs:
            raise ValueError(f"'images' should be [B, {self.runs} * C, H, W] (the runs' images side by side along the "
                             f"channels), got shape {tuple(images.shape)}")
        return self.model(images)

    def run_state_dict(self, run: int) -> dict[str, torch.Tensor]:
        """Run ``run``'s tensors under the single model's names: what ``load_state_dict`` of one model takes."""
        if not 0 <= run < self.runs:
            raise ValueError(f"'run' should be in [0, {self.runs}), got {run}")
        return {name: (tensor.unflatten(0, (self.runs, -1))[run] if tensor.dim() else tensor).detach().clone()
                for name, tensor in self.model.state_dict().items()}


class StackedLosses(nn.Module):
    """One loss per run over stacked scores ``[B, N, classes]`` and labels ``[B, N]``: the runs' losses ``[N]``; the
    gradient of their sum with respect to run ``n``'s scores is run ``n``'s own loss gradient."""

    def __init__(self, losses: Sequence[nn.Module]):
        super().__init__()
        self.losses = nn.ModuleList(losses)

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if scores.dim() != 3 or scores.shape[1] != len(self.losses) or tuple(labels.shape) != tuple(scores.shape[:2]):
            raise ValueError(f"'scores' should be [B, {len(self.losses)}, classes] and 'labels' [B, {len(self.losses)}], "
                             f"got {tuple(scores.shape)} and {tuple(labels.shape)}")
        return torch.stack([loss(scores[:, run].contiguous(), labels[:, run].contiguous())  # as a lone run's
                            for run, loss in enumerate(self.losses)])


def stack_optimiser_states(states: Sequence[dict]) -> dict:
    """The state dict of an optimiser over stacked runs' tensors from the runs' own optimisers' (same settings, the
    parameters in one order): each per-parameter tensor (SGD's momentum) concatenated as the parameters are."""
    return {"state": {index: {name: torch.cat([state["state"][index][name] for state in states])
                              if isinstance(value, torch.Tensor) and value.dim() else value
                              for name, value in values.items()} for index, values in states[0]["state"].items()},
            "param_groups": copy.deepcopy(states[0]["param_groups"])}


def run_optimiser_state(state: dict, run: int, runs: int) -> dict:
    """Run ``run``'s part of the state dict of an optimiser over ``runs`` stacked runs' tensors: what its own
    optimiser's ``load_state_dict`` takes (:func:`stack_optimiser_states` undone)."""
    return {"state": {index: {name: value.unflatten(0, (runs, -1))[run].clone()
                              if isinstance(value, torch.Tensor) and value.dim() else value
                              for name, value in values.items()} for index, values in state["state"].items()},
            "param_groups": copy.deepcopy(state["param_groups"])}


def side_by_side_batches(loaders: Sequence[Iterable]) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The runs' batches, step by step, as one stacked batch: images ``[B, N * C, H, W]`` (run-major channels) and
    labels ``[B, N]``. Ends with the shortest loader; every run's batch at a step should hold ``B`` images."""
    for step in zip(*loaders):
        images, labels = zip(*step)
        if len({len(batch) for batch in labels}) != 1:
            raise ValueError(f"the runs' batches at one step should be equally long, got {[len(b) for b in labels]}")
        yield torch.cat(images, dim=1), torch.stack(labels, dim=1)
