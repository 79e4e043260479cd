"""Runs stacked into one model (:mod:`experiments.engine.stacked`) take each run's own steps: the same scores, the same
gradients, the same SGD updates and batch-normalisation statistics as the runs trained one by one (float64, up to
rounding)."""

from __future__ import annotations

import copy
import doctest

import pytest
import torch

from experiments.engine import stacked as stacked_module
from experiments.engine.models import MODELS, build_model
from experiments.engine.stacked import (StackedLosses, StackedModels, run_optimiser_state, side_by_side_batches,
                                        stack_optimiser_states)
from topk.losses import build_loss

ARCHITECTURES = {"small_cnn": ("small_cnn", {"width": 4}),
                 "densenet_bc": ("densenet_bc", {"depth": 10, "growth": 4}),  # concatenations under the map
                 "cosine head": ("small_cnn", {"width": 4, "cosine_scale": 2.0})}  # ResNets: every model's test
CLASSES, BATCH, SIZE = 6, 8, 16


def _models(architecture: str, runs: int) -> list[torch.nn.Module]:
    """``runs`` models of one architecture, each initialised from its own seed, in float64."""
    name, options = ARCHITECTURES[architecture]
    models = []
    for seed in range(runs):
        torch.manual_seed(seed)
        models.append(build_model(name, CLASSES, **options).double())
    return models


def _optimiser(parameters) -> torch.optim.SGD:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)


def _losses() -> list[torch.nn.Module]:
    return [build_loss("cross_entropy"), build_loss("smooth_hinge", k=2, tau=1.0), build_loss("cross_entropy")]


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_stacked_training_takes_each_runs_own_steps(architecture):
    separate = _models(architecture, 3)
    stacked = StackedModels(copy.deepcopy(separate))
    stacked_optimiser, separate_optimisers = _optimiser(stacked.parameters()), [_optimiser(m.parameters()) for m in separate]
    losses = _losses()
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):  # momentum enters from the second step
        images = [torch.randn(BATCH, 3, SIZE, SIZE, generator=generator, dtype=torch.float64) for _ in separate]
        labels = [torch.randint(0, CLASSES, (BATCH,), generator=generator) for _ in separate]
        stacked_images, stacked_labels = next(iter(side_by_side_batches([[pair] for pair in zip(images, labels)])))
        scores = stacked(stacked_images)
        stacked_optimiser.zero_grad()
        StackedLosses(losses)(scores, stacked_labels).sum().backward()
        stacked_optimiser.step()
        for run, model in enumerate(separate):
            own = model(images[run])
            torch.testing.assert_close(scores[:, run], own, rtol=1e-10, atol=1e-12)
            separate_optimisers[run].zero_grad()
            losses[run](own, labels[run]).backward()
            separate_optimisers[run].step()
    for run, model in enumerate(separate):  # the weights, the running statistics and the batch counts; the momenta
        torch.testing.assert_close(stacked.run_state_dict(run), model.state_dict(), rtol=1e-10, atol=1e-12)
        own = run_optimiser_state(stacked_optimiser.state_dict(), run, len(separate))
        torch.testing.assert_close(own, separate_optimisers[run].state_dict(), rtol=1e-10, atol=1e-12)
    restacked = _optimiser(stacked.parameters())  # the runs' own optimisers stacked again: the same state
    restacked.load_state_dict(stack_optimiser_states([optimiser.state_dict() for optimiser in separate_optimisers]))
    torch.testing.assert_close(restacked.state_dict(), stacked_optimiser.state_dict(), rtol=1e-10, atol=1e-12)


def test_in_evaluation_mode_each_run_uses_its_running_statistics():
    separate = _models("densenet_bc", 2)
    for model in separate:  # statistics of their own
        model(torch.randn(BATCH, 3, SIZE, SIZE, dtype=torch.float64))
    stacked = StackedModels(copy.deepcopy(separate)).eval()
    images = torch.randn(BATCH, 2 * 3, SIZE, SIZE, dtype=torch.float64)
    scores = stacked(images)
    for run, model in enumerate(separate):
        torch.testing.assert_close(scores[:, run], model.eval()(images[:, 3 * run:3 * run + 3]), rtol=1e-10, atol=1e-12)
    assert not stacked.model.training


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_under_autocast_every_run_computes_in_its_dtype_as_alone(memory_format):
    """bfloat16 on a CPU as on CUDA: the grouped layers are ordinary layers, which autocast reaches; in channels-last
    memory (the engine's on CUDA) as well, where the runs' concatenations keep the layout."""
    separate = [model.float().to(memory_format=memory_format) for model in _models("densenet_bc", 2)]
    stacked = StackedModels(copy.deepcopy(separate))
    images = torch.randn(BATCH, 2 * 3, SIZE, SIZE).contiguous(memory_format=memory_format)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = stacked(images)
        alone = [model(images[:, 3 * run:3 * run + 3]) for run, model in enumerate(separate)]
    assert scores.dtype == alone[0].dtype == torch.bfloat16
    for run in range(2):
        torch.testing.assert_close(scores[:, run], alone[run], rtol=0.05, atol=0.05)
    trunk = stacked.model.features[:2](images)  # a bottleneck's output: the runs' concatenation
    assert trunk.is_contiguous(memory_format=memory_format)


def test_a_layer_used_twice_in_a_model_is_one_grouped_layer_used_twice():
    relu = torch.nn.ReLU()
    shared = [torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), relu, torch.nn.Conv2d(4, 4, 1), relu) for _ in range(2)]
    stacked = StackedModels(shared)
    assert stacked.model[1] is stacked.model[3]
    images = torch.randn(2, 2 * 3, 4, 4)
    for run, model in enumerate(shared):
        torch.testing.assert_close(stacked(images)[:, 4 * run:4 * run + 4], model(images[:, 3 * run:3 * run + 3]))


def test_a_runs_state_loads_into_its_single_model():
    stacked = StackedModels(_models("small_cnn", 2))
    alone = _models("small_cnn", 1)[0]
    alone.load_state_dict(stacked.run_state_dict(1))
    images = torch.randn(BATCH, 3, SIZE, SIZE, dtype=torch.float64)
    torch.testing.assert_close(alone(images), _models("small_cnn", 2)[1](images))
    with pytest.raises(ValueError, match=r"'run' should be in \[0, 2\), got 2"):
        stacked.run_state_dict(2)


def test_side_by_side_batches_put_run_n_in_channels_and_column_n():
    loaders = [[(torch.full((4, 3, 2, 2), float(run)), torch.full((4,), run))] * 2 for run in range(3)]
    batches = list(side_by_side_batches(loaders))
    assert len(batches) == 2
    images, labels = batches[0]
    assert images.shape == (4, 9, 2, 2) and labels.shape == (4, 3)
    assert [images[:, 3 * run:3 * run + 3].unique().item() for run in range(3)] == [0.0, 1.0, 2.0]
    assert labels[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_of_the_engine_stacks_into_the_lone_models_scores(name):
    """Each architecture the engine builds, at a small input (float64: a ResNet's last normalisation sees 2 values a
    channel, which float32 rounding would swamp): the stacked scores are each lone model's, and the stacked model
    shares nothing with the models it was built from (a hook on it does not reach them)."""
    separate = []
    for seed in range(2):
        torch.manual_seed(seed)
        separate.append(build_model(name, CLASSES).double())
    stacked = StackedModels(separate)
    images = torch.randn(2, 2 * 3, 32, 32, dtype=torch.float64)
    calls = []
    stacked.model.register_forward_hook(lambda *arguments: calls.append("stacked"))
    scores = stacked(images)
    for run, model in enumerate(separate):
        torch.testing.assert_close(scores[:, run], model(images[:, 3 * run:3 * run + 3]), rtol=1e-8, atol=1e-10)
    assert calls == ["stacked"]


def test_bad_stacks_and_shapes_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="at least one model"):
        StackedModels([])
    with pytest.raises(ValueError, match=r"model 1 \(SmallCNN\) is not model 0's architecture"):
        StackedModels([build_model("small_cnn", CLASSES, width=4), build_model("small_cnn", CLASSES, width=8)])
    with pytest.raises(ValueError, match="all be in training mode or all in evaluation mode"):
        StackedModels([build_model("small_cnn", CLASSES, width=4), build_model("small_cnn", CLASSES, width=4).eval()])
    class Mixing(torch.nn.Module):  # a forward the grouping cannot know to keep per run
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.conv(x).mean(1, keepdim=True)

    with pytest.raises(ValueError, match="cannot be stacked through a Mixing layer: only through convolutions"):
        StackedModels([Mixing(), Mixing()])

    class Averaging(torch.nn.Sequential):  # a container of a known kind, with a forward of its own
        def forward(self, x):
            return super().forward(x).mean(1, keepdim=True)

    with pytest.raises(ValueError, match="cannot be stacked through a Averaging layer"):
        StackedModels([Averaging(torch.nn.Conv2d(3, 4, 1)) for _ in range(2)])

    counted = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1))
    counted.register_buffer("calls", torch.zeros(1), persistent=False)
    with pytest.raises(ValueError, match=r"through a Sequential holding tensors of its own: \['calls'\]"):
        StackedModels([copy.deepcopy(counted) for _ in range(2)])
    stacked = StackedModels(_models("small_cnn", 2))
    with pytest.raises(ValueError, match=r"'images' should be \[B, 2 \* C, H, W\].*got shape \(8, 3, 16, 16\)"):
        stacked(torch.randn(BATCH, 3, SIZE, SIZE, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"'labels' \[B, 3\], got \(8, 3, 6\) and \(8, 2\)"):
        StackedLosses(_losses())(torch.randn(BATCH, 3, CLASSES), torch.zeros(BATCH, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"equally long, got \[4, 3\]"):
        list(side_by_side_batches([[(torch.zeros(4, 3, 2, 2), torch.zeros(4))], [(torch.zeros(3, 3, 2, 2), torch.zeros(3))]]))


def test_a_compiled_stacked_step_is_the_eager_one_up_to_rounding():
    """Traced whole by ``torch.compile`` as one graph (the grouped layers, the runs' concatenations, the statistics
    updated in place) through AOT autograd; inductor's code generation, a minute on a CPU for a DenseNet, is left to the
    GPU's measurements (``benchmarks.bench_concurrency --stack``)."""
    eager = StackedModels([model.float() for model in _models("densenet_bc", 2)])
    compiled = copy.deepcopy(eager)
    compiled_model = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    images, labels = torch.randn(BATCH, 2 * 3, SIZE, SIZE), torch.randint(0, CLASSES, (BATCH, 2))
    expected = StackedLosses(_losses()[:2])(eager(images), labels).sum()
    expected.backward()
    found = StackedLosses(_losses()[:2])(compiled_model(images), labels).sum()
    found.backward()
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)
    for (name, tensor), (_, reference) in zip(compiled.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(tensor.grad, reference.grad, rtol=1e-4, atol=1e-6, msg=name)
    for (name, tensor), (_, reference) in zip(compiled.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(tensor, reference, rtol=1e-5, atol=1e-6, msg=name)  # updated in the graph too
    counts = [tensor.item() for name, tensor in compiled.named_buffers() if name.endswith("num_batches_tracked")]
    assert counts and set(counts) == {1}  # one step, not zero (lost) or two (twice)


def test_the_module_example_runs():
    assert doctest.testmod(stacked_module).failed == 0
