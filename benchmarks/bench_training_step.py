"""Milliseconds per training step of the paper's CIFAR-100 set-up, eager and compiled, by loss, and each loss's
overhead over cross-entropy measured in the same run.

The step is the one a user should write (docs/library.md, "Training on a GPU"): DenseNet-BC 40-40 on a batch of 64
images of 32 x 32 pixels, bfloat16 autocast and channels-last on CUDA, the loss in float32, backward, SGD with
Nesterov momentum. ``compiled`` compiles model + loss as one graph (``torch.compile(fullgraph=True)``, with
``mode="reduce-overhead"``, i.e. CUDA graphs, on CUDA); its backward is compiled with it. The losses are Fig. 3's:
cross-entropy, the smoothed hinge (tau = 1) and the noised hinge (eps = 1, B in ``--samples``) at each K, the
latter on the fused kernel (``auto``) and on the PyTorch path (``torch``) on CUDA. Synthetic images already on the
device: timing does not depend on their content. Each point runs ``--warmup`` untimed steps (compilation
included), then times ``--steps`` steps between two CUDA events (one synchronisation per point).

    python -m benchmarks.bench_training_step                      # on CUDA: DenseNet-40-40, K in {5, 50}
    python -m benchmarks.bench_training_step --device cpu --model small_cnn --steps 3 --warmup 2   # check the script

Rows are appended to ``--out`` as they finish (device, versions, commit); the overheads are printed at the end.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks._fig3_setup import add_setup_arguments, checked_device, paper_model_and_optimiser, points
from benchmarks._measure import append_csv_row
from experiments.provenance import STAMP_FIELDS, stamp
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "model", "mode", "compiler", "loss", "backend", "K", "B", "batch_size", "steps", "ms_per_step",
          "overhead_vs_ce"]


def make_step(model, loss_fn, optimiser, device: torch.device, mode: str, compiler: str):
    """One training step: forward under autocast (CUDA), the loss in float32, backward, the optimiser's step."""

    def forward(images, labels):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            scores = model(images)
        return loss_fn(scores.float(), labels)

    if mode == "compiled":
        options = {"mode": "reduce-overhead"} if device.type == "cuda" and compiler == "inductor" else {}
        forward = torch.compile(forward, fullgraph=True, backend=compiler, **options)

    def step(images, labels):
        torch.compiler.cudagraph_mark_step_begin()  # a new step for compiled CUDA graphs (a no-op otherwise)
        loss = forward(images, labels)
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def time_steps(step, batches: list, warmup: int, steps: int, device: torch.device) -> float:
    """Milliseconds per step over ``steps`` steps after ``warmup`` untimed ones, the batches taken in turn."""
    for index in range(warmup):
        step(*batches[index % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for index in range(steps):
            step(*batches[index % len(batches)])
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / steps
    start = time.perf_counter()
    for index in range(steps):
        step(*batches[index % len(batches)])
    return 1e3 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_arguments(parser, ks=[5, 50])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before each point (compilation included)")
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--compiler", default="inductor", help="torch.compile backend (aot_eager: to check the script)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "training_step.csv")
    args = parser.parse_args()
    device = checked_device(parser, args.device)
    provenance = stamp(device)
    name = provenance["device_name"]
    generator = torch.Generator(device).manual_seed(0)
    batches = [(torch.randn(args.batch_size, 3, 32, 32, device=device, generator=generator),
                torch.randint(0, 100, (args.batch_size,), device=device, generator=generator)) for _ in range(8)]
    if device.type == "cuda":
        batches = [(images.contiguous(memory_format=torch.channels_last), labels) for images, labels in batches]
    backends = args.backends if device.type == "cuda" else ["torch"]
    print(f"{name}: {args.model}, batch {args.batch_size}, {args.steps} timed steps per point, torch {torch.__version__}",
          flush=True)
    summary = []
    for mode in args.modes:
        ce_ms = None
        for point in points(args.ks, args.samples, backends):
            torch._dynamo.reset()
            model, optimiser = paper_model_and_optimiser(args.model, device)
            loss_fn = build_loss(point["registered"], **point["options"]).to(device)
            step = make_step(model, loss_fn, optimiser, device, mode, args.compiler)
            ms = time_steps(step, batches, args.warmup, args.steps, device)
            ce_ms = ms if point["loss"] == "cross_entropy" else ce_ms
            overhead = ms / ce_ms - 1
            row = {**provenance, "model": args.model, "mode": mode,
                   "compiler": args.compiler if mode == "compiled" else "", "batch_size": args.batch_size,
                   "steps": args.steps, "ms_per_step": round(ms, 4), "overhead_vs_ce": round(overhead, 4),
                   **{key: point[key] for key in ("loss", "backend", "K", "B")}}
            append_csv_row(row, FIELDS, args.out)
            line = (f"{mode:8s} {row['loss']:24s} {row['backend']:5s} K={str(row['K']):3s} {ms:9.3f} ms/step  "
                    f"{100 * overhead:+7.1f}% vs CE")
            summary.append(line)
            print(line, flush=True)
    print(f"\nsummary ({name}, {args.model}, batch {args.batch_size}):\n" + "\n".join(summary))
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
