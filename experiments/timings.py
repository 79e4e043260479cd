"""Fig. 3 measured on a GPU by ``benchmarks/bench_epoch_time.py``, read back for the ``fig3_epoch_time`` notebook."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments import paths

EPOCH_TIME_CSV = paths.BENCHMARK_RESULTS / "fig3_epoch_time.csv"
TRAIN_IMAGES = 45_000  #: the paper's CIFAR-100 training part, to which the timed batches are scaled


def batches_per_epoch(batch_size: int) -> int:
    """Batches in one epoch of the paper's CIFAR-100 training part."""
    return math.ceil(TRAIN_IMAGES / batch_size)


def load_epoch_times(path: Path = EPOCH_TIME_CSV, device: str = "cuda") -> pd.DataFrame | None:
    """The rows measured on ``device`` (on the last device name measured), or None if there are none.

    Columns: loss (the PyTorch path of the noised loss is labelled "(torch path)"), K (NaN for cross-entropy),
    epoch_seconds and loss_seconds (per epoch of 45,000 images), and the measurement's provenance.
    """
    if not Path(path).exists():
        return None
    rows = pd.read_csv(path)
    rows = rows[rows["device"] == device]
    if rows.empty:
        return None
    rows = rows[rows["device_name"] == rows["device_name"].iloc[-1]].copy()
    torch_path = rows["backend"].fillna("") == "torch"
    rows.loc[torch_path, "loss"] = rows.loc[torch_path, "loss"] + " (torch path)"
    rows["loss_seconds"] = rows["loss_ms_per_batch"] * rows["batch_size"].map(batches_per_epoch) / 1e3
    return rows.reset_index(drop=True)


def describe(rows: pd.DataFrame) -> str:
    """Which data and which measurement: the line stamped under the GPU figure, table and verdict."""
    first = rows.iloc[0]
    return (f"synthetic CIFAR-100-shaped tensors on {first['device_name']}, {first['model']}, batch "
            f"{first['batch_size']}, {first['batches']} timed batches per point scaled to {TRAIN_IMAGES:,} images "
            f"(benchmarks/bench_epoch_time.py, torch {first['torch']}, commit {str(first['commit'])[:8]})")
