"""What the Fig. 3 benchmarks share: the paper's CIFAR-100 model and optimiser, the losses timed, the common options."""

from __future__ import annotations

import argparse

import torch

from experiments.engine.models import build_model
from experiments.spec.profiles import PAPER

#: The noise scale of the noised losses timed (it does not change the work done).
EPSILON = 1.0


def points(ks: list[int], samples: list[int], backends: list[str]) -> list[dict]:
    """Cross-entropy once (it has no K), then for each K the smoothed hinge (tau = 1) and the noised loss."""
    chosen = [{"loss": "cross_entropy", "registered": "cross_entropy", "backend": "", "K": "", "B": "", "options": {}}]
    for k in ks:
        chosen.append({"loss": "smooth_hinge", "registered": "smooth_hinge", "backend": "", "K": k, "B": "",
                       "options": {"k": k, "tau": 1.0}})
        chosen += [{"loss": f"noised_balanced B={b}", "registered": "noised_balanced", "backend": backend, "K": k,
                    "B": b, "options": {"k": k, "epsilon": EPSILON, "n_samples": b, "backend": backend}}
                   for b in samples for backend in backends]
    return chosen


def add_setup_arguments(parser: argparse.ArgumentParser, ks: list[int]) -> None:
    """``--device --model --batch-size --ks --samples --backends``, defaulting to the paper's set-up on CUDA."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--model", default=PAPER.cifar.model)
    parser.add_argument("--batch-size", type=int, default=PAPER.cifar.batch_size)
    parser.add_argument("--ks", type=int, nargs="+", default=ks)
    parser.add_argument("--samples", type=int, nargs="+", default=[3, 10, 50], help="values of B")
    parser.add_argument("--backends", nargs="+", default=["auto", "torch"], choices=["auto", "torch", "triton"],
                        help="implementations of the noised loss (auto: the fused kernel on CUDA)")


def checked_device(parser: argparse.ArgumentParser, choice: str) -> torch.device:
    device = torch.device(choice)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: use --device cpu (with a small --model) to check the script")
    return device


def paper_model(model_name: str, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """The model for 100 classes initialised from ``seed``, on ``device`` (channels-last on CUDA)."""
    torch.manual_seed(seed)
    model = build_model(model_name, 100).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def paper_optimiser(parameters) -> torch.optim.Optimizer:
    """The paper's SGD with Nesterov momentum and weight decay."""
    return torch.optim.SGD(parameters, lr=PAPER.cifar.lr, momentum=0.9, nesterov=True,
                           weight_decay=PAPER.cifar.weight_decay)


def paper_model_and_optimiser(model_name: str, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (seed 0) and its optimiser."""
    model = paper_model(model_name, device)
    return model, paper_optimiser(model.parameters())
