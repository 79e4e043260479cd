"""Fig. 3 in device seconds: whole training epochs of the paper's CIFAR-100 set-up against K, by loss.

The training engine itself (``experiments.engine.train.train_epoch``, its ``compile_step`` and its in-memory batches,
:mod:`experiments.engine.batches`) trains the paper's model and optimiser (DenseNet-BC 40-40, SGD with Nesterov momentum,
batch 64; bfloat16 autocast and channels-last on CUDA) on a CIFAR-100-shaped set of ``--images`` uint8 images kept
on the device and augmented there (pad, crop, flip, normalise), as the paper's runs are: data and augmentation are
included. The images are synthetic, which is honest for timing: it does not depend on their content. Each point
(a fresh model) trains ``--epochs`` whole epochs, compiled with ``--compile MODE`` (``eager``: not compiled); the last
epoch is the one reported, the first ones absorb compilation and warm-up. Cross-entropy, the baseline, is measured
first and again last (``repeat`` 1): on an H200 the first point was 8 to 21% slower than the next ones in two
sessions (NOTES section 15), more than the 2% an overhead is judged against, so the overheads are taken against the
mean of the two and no verdict is given while they differ by more than that.

    python -m benchmarks.bench_epoch_time                                  # on CUDA, the paper's K grid
    python -m benchmarks.bench_epoch_time --device cpu --model small_cnn --images 256 --ks 1 5 --compile eager

Rows are appended to ``--out`` as they finish, with the device's name; a rerun at the same commit skips the rows
already there. At the end it prints cross-entropy's epoch time (the mean of its two measurements) and each loss's
overhead over it, with the targets (an epoch in at most
5 s on an H100/H200, so 300 epochs in 25 minutes; the noised loss within 2% of cross-entropy). The
``fig3_epoch_time`` notebook draws the CUDA rows next to its own CPU runs.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

from benchmarks._fig3_setup import add_setup_arguments, checked_device, paper_model_and_optimiser, points
from benchmarks._measure import append_csv_row
from data_prep.splits import TensorImages
from data_prep.transforms import augment_and_normalise, normalise
from experiments.engine.batches import InMemoryBatches, order_seed
from experiments.spec.profiles import PAPER
from experiments.analysis.timings import TRAIN_IMAGES, baseline_drift, engine_code, repeat_of
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.engine.train import COMPILE_MODES, compile_step, train_epoch
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "engine_code", "model", "compile", "loss", "backend", "K", "B", "batch_size", "images",
          "repeat", "epochs", "epoch_seconds", "loss_seconds"]
#: The targets printed at the end (issue: the paper's experiments at GPU speed).
EPOCH_TARGET_S, OVERHEAD_TARGET = 5.0, 0.02


def _identity(row: dict) -> tuple:
    """What makes a point done: its set-up, the code that measured it and its :func:`repeat_of`. Rows of another
    commit or engine are measured again, so that a baseline is never paired with another code's."""
    return (*(str(row.get(name) or "") for name in ("device_name", "commit", "engine_code", "model", "compile", "loss",
                                                    "backend", "K", "batch_size", "images")), repeat_of(row))


def bracketed(chosen: list[dict]) -> list[dict]:
    """``chosen`` (cross-entropy first), each with ``repeat`` 0, then cross-entropy again with ``repeat`` 1."""
    return [*({**point, "repeat": 0} for point in chosen),
            *({**point, "repeat": 1} for point in chosen if point["loss"] == "cross_entropy")]


def cifar_shaped(images: int, device: torch.device, augment: bool = True) -> InMemoryBatches:
    """``images`` random uint8 32 x 32 colour images of 100 classes on ``device``, with the paper's augmentation (for
    training) or without it (``augment`` False: for evaluation)."""
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 100, (images,), generator=generator)
    return InMemoryBatches(TensorImages(pixels, labels, augment_and_normalise(32) if augment else normalise()), device)


def time_point(point: dict, args, data: InMemoryBatches, device: torch.device) -> tuple[float, float]:
    """Seconds of the last of ``args.epochs`` whole epochs of a fresh model, and the seconds in its loss."""
    torch._dynamo.reset()
    model, optimiser = paper_model_and_optimiser(args.model, device)
    loss = build_loss(point["registered"], **point["options"]).to(device)
    if args.compile != "eager":
        model, loss = compile_step(model, loss, args.compile)
    for epoch in range(args.epochs):
        batches = data.shuffled(order_seed(0, epoch), args.batch_size)
        seconds, loss_seconds, _, _ = train_epoch(model, loss, batches, optimiser, device, progress=False, epoch=epoch)
    return seconds, loss_seconds


def print_targets(rows: list[dict], on_gpu: bool) -> None:
    """Cross-entropy's epoch time (the mean of its measurements) against :data:`EPOCH_TARGET_S`, then each loss's
    overhead over it, judged against :data:`OVERHEAD_TARGET` only when the baseline moved less than that between its
    first and last measurement (:func:`baseline_drift`)."""
    baselines = [row for row in rows if row["loss"] == "cross_entropy"]
    if not baselines:
        return
    ce = sum(row["epoch_seconds"] for row in baselines) / len(baselines)
    verdict = ("met" if ce <= EPOCH_TARGET_S else "not met") if on_gpu else "not judged on a CPU"
    measured = " and ".join(f"{row['epoch_seconds']:.2f} s" for row in baselines) + ", first and last" * (
        len(baselines) > 1)
    print(f"\ncross-entropy: {ce:.2f} s per epoch of {baselines[0]['images']:,} images ({measured}; "
          f"target <= {EPOCH_TARGET_S} s on an H100/H200: {verdict})")
    drift = baseline_drift(rows)
    judged = drift is not None and abs(drift) <= OVERHEAD_TARGET
    if not judged:
        print("no overhead verdict: " + (f"cross-entropy moved {100 * drift:+.1f}% between its first and last "
                                         f"measurement, more than the {OVERHEAD_TARGET:.0%} an overhead is judged against"
                                         if drift is not None else "cross-entropy was not measured both first and last"))
    for row in rows:
        if row["loss"] != "cross_entropy":
            overhead = row["epoch_seconds"] / ce - 1
            target = f"  (target <= +{OVERHEAD_TARGET:.0%})" * (judged and row["loss"].startswith("noised"))
            print(f"{row['loss']:24s} {row['backend'] or '':6s} K={str(row['K']):3s} {row['epoch_seconds']:8.2f} s  "
                  f"{100 * overhead:+6.1f}% over cross-entropy{target}")


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_arguments(parser, ks=list(PAPER.figure3_ks))
    parser.add_argument("--images", type=int, default=TRAIN_IMAGES, help="training images per epoch")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per point; the last one is reported")
    parser.add_argument("--compile", default="default", choices=["eager", *COMPILE_MODES],
                        help="torch.compile mode of the engine's step, or eager")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fig3_epoch_time.csv")
    args = parser.parse_args()
    device = checked_device(parser, args.device)
    provenance = {**stamp(device), "engine_code": engine_code()}
    name = provenance["device_name"]
    data = cifar_shaped(args.images, device)
    done = set()
    if args.out.exists():
        with args.out.open() as handle:
            done = {_identity(row) for row in csv.DictReader(handle)}
    print(f"{name}: {args.model}, batch {args.batch_size}, {args.images:,} images, {args.epochs} epochs per point, "
          f"compile: {args.compile}", flush=True)
    measured = []
    for point in bracketed(points(args.ks, args.samples, args.backends)):
        row = {**provenance, "model": args.model, "compile": args.compile,
               "batch_size": args.batch_size, "images": args.images,
               **{key: point[key] for key in ("loss", "backend", "K", "B", "repeat")}}
        if _identity(row) in done:
            continue
        start = time.perf_counter()
        seconds, loss_seconds = time_point(point, args, data, device)
        row.update(epochs=args.epochs, epoch_seconds=round(seconds, 3), loss_seconds=round(loss_seconds, 4))
        append_csv_row(row, FIELDS, args.out)
        measured.append(row)
        print(f"{row['loss'] + ' (again)' * row['repeat']:24s} {row['backend']:6s} K={str(row['K']):3s}: "
              f"{seconds:8.2f} s/epoch, "
              f"loss {loss_seconds:7.3f} s ({time.perf_counter() - start:.0f} s)", flush=True)
    print_targets(measured, device.type == "cuda")
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
