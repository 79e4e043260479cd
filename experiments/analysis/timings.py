"""Fig. 3 measured on a GPU by ``python -m benchmarks.bench_epoch_time``, read back for the ``fig3_epoch_time``
notebook; the fingerprint of the engine's epoch code that such timings (and ``bench_concurrency``'s) carry; what a
profile of the training step (``python -m benchmarks.profile_training_step``) bounds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from experiments import paths

EPOCH_TIME_CSV = paths.BENCHMARK_RESULTS / "fig3_epoch_time.csv"
TRAIN_IMAGES = 45_000  #: the paper's CIFAR-100 training part: the images of one timed epoch
#: The targets of trainings side by side on one GPU (``benchmarks.bench_concurrency``, the docs' concurrency block):
#: the best aggregate at least x3 one run's on an H100, and the ``gpu`` profile's CIFAR-100 notebooks in 8 h on one
#: GPU and 1 h on :data:`GPUS` (taken at eight times one GPU's rate: the runs are independent).
RATIO_TARGET, ONE_GPU_HOURS_TARGET, EIGHT_GPUS_HOURS_TARGET = 3.0, 8.0, 1.0
GPUS = 8


#: The code a timing of runs stacked into one model runs besides (``benchmarks.bench_concurrency --stack``).
STACKED_CODE = "experiments/engine/stacked.py"


def engine_code(stacked: bool = False) -> str:
    """A fingerprint of :data:`experiments.paths.ENGINE_EPOCH_CODE`'s contents, with :data:`STACKED_CODE`'s for a
    timing of stacked runs (12 hex digits of their SHA-256)."""
    digest = hashlib.sha256()
    for name in (*paths.ENGINE_EPOCH_CODE, *(STACKED_CODE,) * stacked):
        digest.update((paths.PROJECT_ROOT / name).read_bytes())
    return digest.hexdigest()[:12]


def stacked_runs(row: dict) -> int:
    """The runs stacked into one model in a ``concurrency.csv`` row (1 in other CSVs and in rows from before)."""
    return int(row.get("stack") or 1)


def repeat_of(row: dict) -> int:
    """Which measurement of its point a ``fig3_epoch_time.csv`` row is: 1 for cross-entropy measured again last, 0
    otherwise and in rows from before the column."""
    return int(row.get("repeat") or 0)


def baseline_drift(rows: list[dict]) -> float | None:
    """How much cross-entropy's epoch time moved between its first and its closing measurement in ``rows`` (as
    ``fig3_epoch_time.csv`` holds them: last / first - 1), or None without both."""
    seconds = {repeat_of(row): row["epoch_seconds"] for row in rows if row["loss"] == "cross_entropy"}
    return seconds[1] / seconds[0] - 1 if {0, 1} <= set(seconds) else None


def made_with_todays_engine(row: dict) -> bool:
    """Whether an engine timing's row was made with today's code (:func:`engine_code`, with the stacking's for
    stacked runs)."""
    return row.get("engine_code") == engine_code(stacked=stacked_runs(row) > 1)


def sharing_text(row: dict) -> str:
    """How a ``concurrency.csv`` row's runs were compiled and shared the GPU: its compile mode, with MPS where an MPS
    daemon shared the GPU (:func:`experiments.scale.gpu_sharing.gpu_sharing`) and cuDNN's benchmark mode where it chose the
    convolutions' algorithms: "`reduce-overhead` under MPS, `cudnn.benchmark`"."""
    return (f"`{row['compile']}`" + " under MPS" * (row.get("gpu_sharing") == "mps")
            + ", `cudnn.benchmark`" * (row.get("cudnn_benchmark") == "True"))


def runs_text(concurrency: int, stack: int) -> str:
    """How the runs of a measurement shared the GPU: "2 runs side by side", "4 runs stacked", "2 x 4 runs stacked"."""
    if stack == 1:
        return f"{concurrency} run{'s side by side' * (concurrency > 1)}"
    return f"{f'{concurrency} x ' * (concurrency > 1)}{stack} runs stacked"


def load_epoch_times(path: Path = EPOCH_TIME_CSV, device: str = "cuda") -> pd.DataFrame | None:
    """The rows measured on ``device`` in the last measurement (its device name, compile mode, commit, engine code,
    model, batch, images and epochs), or None if there are none.

    Columns: loss (the PyTorch path of the noised loss is labelled "(torch path)"), K (NaN for cross-entropy),
    epoch_seconds and loss_seconds (of one whole epoch), repeat (1 for cross-entropy measured again last), and the
    measurement's provenance. Cross-entropy has two rows where it was measured first and last.
    """
    if not Path(path).exists():
        return None
    rows = pd.read_csv(path)
    rows = rows[rows["device"] == device]
    if rows.empty:
        return None
    last = rows.iloc[-1]
    same = [column for column in ("device_name", "compile", "commit", "engine_code", "model", "batch_size", "images",
                                  "epochs") if column in rows]
    rows = rows[(rows[same] == last[same]).all(axis=1)].copy()  # one measurement: its baseline's drift is its own
    torch_path = rows["backend"].fillna("") == "torch"
    rows.loc[torch_path, "loss"] = rows.loc[torch_path, "loss"] + " (torch path)"
    return rows.reset_index(drop=True)


def describe(rows: pd.DataFrame) -> str:
    """Which data and which measurement: the line stamped under the GPU figure, table and verdict."""
    first = rows.iloc[0]
    return (f"synthetic CIFAR-100-shaped uint8 images ({first['images']:,}, augmented on the device) on "
            f"{first['device_name']}, {first['model']}, batch {first['batch_size']}, the last of {first['epochs']} whole "
            f"epochs of the training engine ({first['compile']}; python -m benchmarks.bench_epoch_time, "
            f"torch {first['torch']}, commit {str(first['commit'])[:8]})")


def library_bound_text(row: dict) -> str:
    """The most a faster choice of library kernels could gain (Amdahl: the step without their share of its kernels'
    time, taking the step as its kernels), which bounds what ``max-autotune``'s templates can give."""
    share = float(row["share_library"])
    bound = f"at most x{1 / (1 - share):.2f}" if share < 1 else "without bound"
    return (f"of the kernels' time, {share:.0%} in the vendor libraries' kernels (convolutions, matrix products), "
            f"{float(row['share_triton']):.0%} in inductor's Triton kernels, {float(row['share_other']):.0%} in "
            f"others: faster library kernels (max-autotune's templates) would make the step {bound} faster")
