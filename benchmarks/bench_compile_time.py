"""How long ``torch.compile`` takes before a loss's first compiled training step runs, on this machine: for each loss
of the engine's grids, a small model and the loss compiled as the engine compiles them
(:func:`experiments.engine.train.compile_step`), the first step at batch ``B`` (a compilation), the second at ``B``
(none), then one at ``B - 1``, a short last batch (a recompilation unless shapes are dynamic). Every loss in one
process, each after a reset of the compiler and with its caches disabled, so that no loss reuses another's kernels.

    python -m benchmarks.bench_compile_time [--device cpu] [--batch 64] [--losses smooth_hinge noised_balanced ...]

Rows go to ``benchmarks/results/compile_time_<device>.csv`` with the machine's stamp; the docs' block on compiling a
step is generated from it. Not a test: times depend on the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from experiments.engine.models import build_model
from experiments.engine.store import write_csv
from experiments.engine.train import compile_step
from experiments.paths import BENCHMARK_RESULTS
from experiments.provenance import STAMP_FIELDS, stamp
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "cpu_threads", "model", "loss", "options", "batch", "backend", "first_step_s", "second_step_s",
          "short_batch_step_s"]
#: The engine's losses at the options of the paper's grids (K 5).
LOSSES = {"cross_entropy": {}, "smooth_hinge": {"k": 5, "tau": 1.0},
          "noised_balanced": {"k": 5, "epsilon": 0.2, "n_samples": 10}}


def step_seconds(model, loss_fn, images, labels, optimiser) -> float:
    """Seconds of one training step, compilation included when it triggers one."""
    start = time.perf_counter()
    optimiser.zero_grad(set_to_none=True)
    scores = model(images).float()
    loss_fn(scores, labels).backward()
    optimiser.step()
    if images.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(loss: str, options: dict, device: torch.device, batch: int, classes: int = 100,
            backend: str = "inductor") -> dict:
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # each loss compiles everything, the model included
        torch.manual_seed(0)
        model = build_model("small_cnn", classes, width=16).to(device)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_module = build_loss(loss, **options).to(device)
        if backend == "inductor":
            compiled, loss_fn = compile_step(model, loss_module, "default")
        else:  # Dynamo's tracing alone, without code generation: what the script's test runs
            compiled, loss_fn = torch.compile(model, backend=backend), torch.compile(loss_module, backend=backend)
        images = torch.randn(batch, 3, 16, 16, device=device)
        labels = torch.randint(0, classes, (batch,), device=device)
        times = [step_seconds(compiled, loss_fn, images, labels, optimiser) for _ in range(2)]
        times.append(step_seconds(compiled, loss_fn, images[1:], labels[1:], optimiser))
    return {"model": "small_cnn (width 16, 16 px, 100 classes)", "loss": loss, "options": options, "batch": batch,
            "backend": backend,
            **dict(zip(("first_step_s", "second_step_s", "short_batch_step_s"), (round(t, 4) for t in times)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_compile_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--losses", nargs="+", choices=sorted(LOSSES), default=list(LOSSES))
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default: inductor, as the "
                        "engine compiles; eager: tracing alone)")
    parser.add_argument("--out", type=Path, help="CSV (default: benchmarks/results/compile_time_<device>.csv)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for loss in args.losses:
        row = {**stamp(device), "cpu_threads": torch.get_num_threads(), **measure(loss, LOSSES[loss], device, args.batch,
                                                                                   backend=args.backend)}
        rows.append(row)
        print(f"{loss}: first step {row['first_step_s']} s, second {row['second_step_s']} s, a batch of "
              f"{args.batch - 1} {row['short_batch_step_s']} s", flush=True)
    write_csv(rows, FIELDS, args.out or BENCHMARK_RESULTS / f"compile_time_{device.type}.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
