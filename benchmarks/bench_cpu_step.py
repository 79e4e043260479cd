"""What changes to how a training step runs on a CPU, not to what it trains, would save: the default profile's CIFAR-100
step (its model on 16 px images, batch 64, 100 classes, SGD with Nesterov momentum and the setup's weight decay,
cross-entropy) timed as the engine runs it, and

- ``channels_last``: the images and the model in channels-last memory format (oneDNN's preferred layout);
- ``compiled``: the model compiled by ``torch.compile`` (inductor's C++ code on a CPU);
- ``1 thread``: the engine's step on one torch thread, what each worker of ``local --jobs 2`` has on 2 cores; its
  ratio is per process, so two side by side give at most twice it.

Each variant's median ms per step is measured in rounds (every variant once per round, in one process) and printed
with its ratio to the engine's step; a variant that changes the numbers says by how much its first step's loss
differs. The rows replace ``benchmarks/results/cpu_step.csv``. Not a test: timings depend on the machine.

    python -m benchmarks.bench_cpu_step
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from benchmarks._measure import interleaved_median_seconds
from experiments.analysis.timings import engine_code
from experiments.engine.config import RunConfig
from experiments.engine.models import build_model
from experiments.engine.store import write_csv
from experiments.engine.train import train_epoch
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.spec.profiles import get_profile
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "engine_code", "profile", "model", "image_size", "batch", "threads", "variant", "ms_per_step",
          "ratio_to_engine", "first_loss_difference"]
#: The variants measured against the engine's step, which is always measured first.
VARIANTS = ("channels_last", "compiled", "1 thread")


def step_of(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, config: RunConfig):
    """One step of the engine (its epoch, :func:`experiments.engine.train.train_epoch`, over one fixed batch) with
    ``config``'s optimiser and loss; the step returns the loss."""
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, nesterov=True,
                                weight_decay=config.weight_decay)  # the engine's (experiments.engine.train.run)
    loss_fn, cpu = build_loss(config.loss), torch.device("cpu")
    return lambda: train_epoch(model, loss_fn, [(images, labels)], optimiser, cpu, False, 0)[2]


def variants(names, model: torch.nn.Module, images, labels, config: RunConfig, compiler: str, threads: int) -> dict:
    """The engine's step, then that of each variant in ``names``, each on its own copy of ``model``, with ``config``'s
    optimiser and loss."""
    def on_threads(step, count):
        def call():
            torch.set_num_threads(count)
            try:
                return step()
            finally:
                torch.set_num_threads(threads)
        return call

    made = {}
    for name in ("engine", *names):
        copied = copy.deepcopy(model)
        if name == "engine":
            made[name] = step_of(copied, images, labels, config)
        elif name == "channels_last":
            copied = copied.to(memory_format=torch.channels_last)
            made[name] = step_of(copied, images.contiguous(memory_format=torch.channels_last), labels, config)
        elif name == "compiled":
            made[name] = step_of(torch.compile(copied, backend=compiler), images, labels, config)
        elif name == "1 thread":
            made[name] = on_threads(step_of(copied, images, labels, config), 1)
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cpu_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--compiler", default="inductor", help="torch.compile backend (aot_eager: to check the script)")
    parser.add_argument("--budget-s", type=float, default=3.0, help="timing budget per variant")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cpu_step.csv")
    args = parser.parse_args(argv)
    setup = get_profile(args.profile).cifar
    size, classes = setup.dataset_options.get("image_size", 32), 100
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    images, labels = torch.randn(setup.batch_size, 3, size, size), torch.randint(0, classes, (setup.batch_size,))
    model = build_model(setup.model, classes, **setup.model_options)
    steps = variants(args.variants, model, images, labels, setup.config("cross_entropy", seed=0), args.compiler, threads)
    first = {name: float(step()) for name, step in steps.items()}  # also compiles
    seconds = interleaved_median_seconds(steps, torch.device("cpu"), budget_s=args.budget_s)
    provenance, rows = {**stamp("cpu"), "engine_code": engine_code()}, []
    for name, value in seconds.items():
        ratio, difference = round(seconds["engine"] / value, 3), abs(first[name] - first["engine"])
        rows.append({**provenance, "profile": args.profile, "model": f"{setup.model} {setup.model_options}",
                     "image_size": size, "batch": setup.batch_size, "threads": 1 if name == "1 thread" else threads,
                     "variant": name, "ms_per_step": round(value * 1e3, 3), "ratio_to_engine": ratio,
                     "first_loss_difference": difference})
        print(f"{name:>14s}: {value * 1e3:8.2f} ms per step, x{ratio:.2f} the engine's speed"
              + (f", first loss differs by {difference:.1e}" if difference else ""), flush=True)
    write_csv(rows, FIELDS, args.out)
    print(f"{provenance['device_name']}, {threads} threads; rows in {args.out}")


if __name__ == "__main__":
    main()
