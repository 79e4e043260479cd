"""What the generated blocks (:mod:`experiments.publishing.readme` and the modules of its blocks) share: the profile
they summarise, the benchmarks' headline configurations, and the reading of committed benchmark rows (the rows of a
CSV, their stamps, their grouping by measurement, the rows at a headline configuration)."""

from __future__ import annotations

import csv
from pathlib import Path

from experiments.provenance import short_commit

#: The profile whose outputs are committed and summarised.
DEFAULT_PROFILE = "quick"
#: The configuration of the CPU headline (``python -m benchmarks.bench_noised_losses --headline``).
NOISED_HEADLINE = {"logit_scale": "2.0", "epsilon": "0.2", "batch": "128", "n_classes": "1000", "k": "5", "n_samples": "10"}
#: The smoothed hinge's headline (``python -m benchmarks.bench_smooth_hinge --headline``).
SMOOTH_HEADLINE = {"batch": "128", "n_classes": "1000", "k": "5"}


def read_rows(path: Path) -> list[dict]:
    """The rows of the CSV at ``path``, none if it does not exist."""
    if not path.exists():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def stamp_text(row: dict) -> str:
    """A benchmark row's device, versions and commit, as the documents quote them."""
    return (f"{row['device_name']} ({row['device']}), torch {row['torch']}, triton {row['triton']}, "
            f"commit {short_commit(row['commit'])}")


def split_by(rows: list[dict], *keys: str) -> list[list[dict]]:
    """``rows`` split by their values of ``keys``, in the order each group first appears."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return list(groups.values())


def by_measurement(rows: list[dict]) -> list[list[dict]]:
    """``rows`` split by measurement (device name and commit): what one stamp truthfully describes."""
    return split_by(rows, "device_name", "commit")


def short_stamp_text(row: dict) -> str:
    """The device, torch and commit of a row."""
    return f"{row['device_name']}, torch {row['torch']}, commit {short_commit(row['commit'])}"


def headline_rows(path: Path, configuration: dict[str, str], order: tuple[str, ...],
                  device: str = "cpu") -> tuple[dict, list[str], list[str]]:
    """The rows of ``path`` on ``device`` at ``configuration`` by method, the methods present in ``order``, and the
    table's first lines (time and memory of each method)."""
    rows = [r for r in read_rows(path) if r["status"] == "ok" and r["device"] == device
            and all(r[key] == value for key, value in configuration.items())]
    by_method = {r["method"]: r for r in rows}
    methods = [m for m in order if m in by_method]
    lines = ["| | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods),
             "| forward + backward (ms) | " + " | ".join(f"{float(by_method[m]['ms']):.2f}" for m in methods) + " |",
             "| peak extra memory (MB) | " + " | ".join(by_method[m]["peak_extra_mb"] for m in methods) + " |"]
    return by_method, methods, lines
