"""What the generated blocks (:mod:`experiments.publishing.readme` and the modules of its blocks) share: the profile
they summarise, the benchmarks' headline configurations, and the reading of committed benchmark rows (the rows of a
CSV, their stamps, their grouping by measurement, the rows at a headline configuration)."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

from experiments.analysis import timings
from experiments.paths import ENGINE_EPOCH_CODE, LIBRARY_CODE
from experiments.provenance import changed_since, short_commit

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


@functools.lru_cache(maxsize=None)
def _library_changed_since(commit: str) -> bool:
    return changed_since(commit, LIBRARY_CODE, uncommitted=False) is True


def library_is_current(row: dict) -> bool:
    """Whether a benchmark row of the library was made with today's :data:`~experiments.paths.LIBRARY_CODE` (as
    committed; true where git cannot tell, a shallow clone or no checkout)."""
    return not _library_changed_since(row["commit"])


def library_staleness(row: dict, command: str) -> str:
    """A warning to put before the numbers of a benchmark row of the library made before ``topk/`` last changed,
    naming the ``command`` that measures them again, or nothing."""
    return "" if library_is_current(row) else stale_text(row["commit"], "`topk/`", command)


def stale_text(commit: str, what: str, command: str) -> str:
    """The warning before a result made at ``commit`` when ``what`` changed since, naming the ``command`` that
    measures it again."""
    return f"**Stale:** made at commit {short_commit(commit)}, and {what} changed since; rerun `{command}`. "


def newest_current(rows: list[dict]) -> dict | None:
    """The last of ``rows`` (a CSV appends) made with today's library, else the last of them, else None."""
    return next((row for row in reversed(rows) if library_is_current(row)), rows[-1] if rows else None)


def engine_staleness(row: dict, command: str, where: str = "") -> str:
    """A warning to put before an engine timing made with other code than today's (:data:`ENGINE_EPOCH_CODE`, and
    :data:`~experiments.analysis.timings.STACKED_CODE` for stacked runs), naming the ``command`` that measures it
    again (``where``: on what), or nothing."""
    if timings.made_with_todays_engine(row):
        return ""
    why = ("it was made before the rows named the engine's code" if not row.get("engine_code") else
           "the engine's epoch changed since")
    stacking = (timings.STACKED_CODE,) * (timings.stacked_runs(row) > 1)
    files = ", ".join(f"`{name}`" for name in (*ENGINE_EPOCH_CODE, *stacking))
    return f"**Stale:** {why} ({files}); rerun `{command}`{where}.\n\n"
