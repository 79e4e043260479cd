"""Fig. 3 in device seconds: the epoch time of the paper's CIFAR-100 set-up against K, by loss.

The paper's model and optimiser (DenseNet-BC 40-40, SGD with Nesterov momentum, batch 64; the ``paper``
profile of ``experiments/profiles.py``) are trained by the training engine's own epoch function
(``experiments.train.train_epoch``: bfloat16 autocast and channels-last on CUDA) on CIFAR-100-shaped
synthetic tensors already on the device. Timing does not depend on the images' content, so synthetic
tensors are honest here; data loading is not included. Each point times ``--batches`` batches after
``--warmup`` untimed ones and is scaled to the paper's epoch of 45,000 training images.

    python benchmarks/bench_epoch_time.py                        # on CUDA, the paper's K grid
    python benchmarks/bench_epoch_time.py --device cpu --model small_cnn --batches 2 --ks 1 5   # check the script

Rows are appended to ``--out`` as they finish, with the device's name; a rerun skips the rows already there.
The ``fig3_epoch_time`` notebook draws the CUDA rows next to its own CPU runs.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _fig3_setup import add_setup_arguments, checked_device, paper_model_and_optimiser, points  # noqa: E402
from _measure import append_csv_row  # noqa: E402

from experiments.profiles import PAPER  # noqa: E402
from experiments.timings import batches_per_epoch  # noqa: E402
from experiments.train import device_name, git_commit, train_epoch  # noqa: E402
from topk.losses import build_loss  # noqa: E402

FIELDS = ["device", "device_name", "model", "loss", "backend", "K", "B", "batch_size", "batches", "seconds_per_batch",
          "loss_ms_per_batch", "epoch_seconds", "torch", "commit"]


def _identity(row: dict) -> tuple:
    return tuple(str(row[name]) for name in ("device_name", "model", "loss", "backend", "K", "batch_size"))


def time_point(point: dict, model, device: torch.device, batches: list, warmup: int, optimiser) -> tuple[float, float]:
    """Seconds per batch and loss milliseconds per batch of the engine's training epoch over ``batches``."""
    loss = build_loss(point["registered"], **point["options"]).to(device)
    train_epoch(model, loss, batches[:warmup], optimiser, device, progress=False, epoch=0)
    seconds, loss_seconds, _, _ = train_epoch(model, loss, batches[warmup:], optimiser, device, progress=False, epoch=0)
    timed = len(batches) - warmup
    return seconds / timed, 1e3 * loss_seconds / timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_arguments(parser, ks=list(PAPER.figure3_ks))
    parser.add_argument("--batches", type=int, default=100, help="timed batches per point")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches before each point")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fig3_epoch_time.csv")
    args = parser.parse_args()
    device = checked_device(parser, args.device)
    name = device_name(device)
    model, optimiser = paper_model_and_optimiser(args.model, device)
    batches = [(torch.randn(args.batch_size, 3, 32, 32, device=device),
                torch.randint(0, 100, (args.batch_size,), device=device)) for _ in range(args.warmup + args.batches)]
    done = set()
    if args.out.exists():
        with args.out.open() as handle:
            done = {_identity(row) for row in csv.DictReader(handle)}
    per_epoch = batches_per_epoch(args.batch_size)
    print(f"{name}: {args.model}, batch {args.batch_size}, {args.batches} timed batches per point, "
          f"scaled to {per_epoch} batches per epoch", flush=True)
    for point in points(args.ks, args.samples, args.backends):
        row = {"device": device.type, "device_name": name, "model": args.model, "batch_size": args.batch_size,
               **{key: point[key] for key in ("loss", "backend", "K", "B")}}
        if _identity(row) in done:
            continue
        start = time.perf_counter()
        seconds, loss_ms = time_point(point, model, device, batches, args.warmup, optimiser)
        row.update(batches=args.batches, seconds_per_batch=round(seconds, 6), loss_ms_per_batch=round(loss_ms, 4),
                   epoch_seconds=round(seconds * per_epoch, 2), torch=torch.__version__, commit=git_commit())
        append_csv_row(row, FIELDS, args.out)
        print(f"{row['loss']:24s} {row['backend']:6s} K={str(row['K']):3s}: {row['epoch_seconds']:8.2f} s/epoch, "
              f"loss {loss_ms:7.3f} ms/batch ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
