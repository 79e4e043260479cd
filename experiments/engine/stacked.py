"""Several runs of one architecture trained as one model: the parameters and buffers of ``N`` models stacked along a
new first dimension (:func:`torch.func.stack_module_state`) and the forward mapped over it (:func:`torch.func.vmap` of
:func:`torch.func.functional_call`). Each convolution of the ``N`` runs becomes one grouped convolution, each batch
normalisation one over ``N`` times the channels (still per run: its statistics are per channel), each linear layer
one batched matrix product; a step launches the kernels of one run with ``N`` times the work in each.

The runs stay independent. The gradient of the sum of their losses with respect to run ``n``'s slice is run ``n``'s
own gradient, and SGD with momentum and weight decay acts element by element, so one optimiser over the stacked
tensors takes every run's own step (equal up to rounding), as long as the runs share the optimiser's settings.

Layout: the images of the ``N`` runs side by side along the channels, ``[B, N * C, H, W]`` (run-major; a
channels-last batch on CUDA as the engine's), which is the layout of a grouped convolution's input; scores come back
as ``[B, N, classes]`` and labels go in as ``[B, N]``.

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
from torch import nn
from torch.func import functional_call, stack_module_state, vmap


def _tensor_shapes(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(tensor.shape)) for name, tensor in (*model.named_parameters(), *model.named_buffers())]


class StackedModels(nn.Module):
    """``N`` models of one architecture (same class, same tensors by name and shape) as one module whose forward
    maps ``[B, N * C, H, W]`` images to ``[B, N, classes]`` scores, run ``n``'s from its own weights and images."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        if len(models) < 1:
            raise ValueError("'models' should hold at least one model to stack, got none")
        first = models[0]
        for index, model in enumerate(models[1:], start=1):
            if type(model) is not type(first) or _tensor_shapes(model) != _tensor_shapes(first):
                differ = sorted(set(_tensor_shapes(model)) ^ set(_tensor_shapes(first)))[:3]
                raise ValueError(f"model {index} ({type(model).__name__}) is not model 0's architecture "
                                 f"({type(first).__name__}); tensors that differ: {differ}")
        if any(module.training != first.training for model in models for module in model.modules()):
            raise ValueError("the models to stack should all be in training mode or all in evaluation mode")
        parameters, buffers = stack_module_state(list(models))  # [N, *shape] each; copies, not the models' own
        self.runs = len(models)
        self._parameter_names, self._buffer_names = list(parameters), list(buffers)
        for name, tensor in parameters.items():
            self.register_parameter(self._attribute(name), nn.Parameter(tensor.detach()))
        for name, tensor in buffers.items():
            self.register_buffer(self._attribute(name), tensor)
        # the architecture without tensors; kept out of the module's children, whose parameters it would add
        self._template = [copy.deepcopy(first).to("meta")]

    @staticmethod
    def _attribute(name: str) -> str:
        return name.replace(".", "__")  # a module attribute's name cannot hold a dot

    def train(self, mode: bool = True) -> "StackedModels":
        self._template[0].train(mode)  # batch normalisation reads the template's mode
        return super().train(mode)

    def _one_run(self, parameters: dict, buffers: dict, images: torch.Tensor) -> torch.Tensor:
        return functional_call(self._template[0], (parameters, buffers), (images,))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] % self.runs:
            raise ValueError(f"'images' should be [B, {self.runs} * C, H, W] (the runs' images side by side along the "
                             f"channels), got shape {tuple(images.shape)}")
        parameters = {name: getattr(self, self._attribute(name)) for name in self._parameter_names}
        buffers = {name: getattr(self, self._attribute(name)) for name in self._buffer_names}
        per_run = images.unflatten(1, (self.runs, -1))  # [B, N * C, H, W] -> [B, N, C, H, W], a view
        return vmap(self._one_run, in_dims=(0, 0, 1), out_dims=1)(parameters, buffers, per_run)

    def run_state_dict(self, run: int) -> dict[str, torch.Tensor]:
        """Run ``run``'s tensors under the single model's names: what ``load_state_dict`` of one model takes."""
        if not 0 <= run < self.runs:
            raise ValueError(f"'run' should be in [0, {self.runs}), got {run}")
        names = (*self._parameter_names, *self._buffer_names)
        return {name: getattr(self, self._attribute(name))[run].detach().clone() for name in names}


class StackedLosses(nn.Module):
    """One loss per run over stacked scores ``[B, N, classes]`` and labels ``[B, N]``: the sum of the runs' losses,
    whose gradient with respect to run ``n``'s scores is run ``n``'s own loss gradient."""

    def __init__(self, losses: Sequence[nn.Module]):
        super().__init__()
        self.losses = nn.ModuleList(losses)

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if scores.dim() != 3 or scores.shape[1] != len(self.losses) or tuple(labels.shape) != tuple(scores.shape[:2]):
            raise ValueError(f"'scores' should be [B, {len(self.losses)}, classes] and 'labels' [B, {len(self.losses)}], "
                             f"got {tuple(scores.shape)} and {tuple(labels.shape)}")
        return sum(loss(scores[:, run], labels[:, run]) for run, loss in enumerate(self.losses))


def side_by_side_batches(loaders: Sequence[Iterable]) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The runs' batches, step by step, as one stacked batch: images ``[B, N * C, H, W]`` (run-major channels) and
    labels ``[B, N]``. Ends with the shortest loader; every run's batch at a step should hold ``B`` images."""
    for step in zip(*loaders):
        images, labels = zip(*step)
        if len({len(batch) for batch in labels}) != 1:
            raise ValueError(f"the runs' batches at one step should be equally long, got {[len(b) for b in labels]}")
        yield torch.cat(images, dim=1), torch.stack(labels, dim=1)
