"""Timing, peak-memory and CSV helpers shared by the benchmark scripts.

Peak extra memory is the peak during one call minus the memory held before it: on CUDA from the caching
allocator's statistics; on CPU from the peak resident set (VmHWM, reset through /proc/self/clear_refs;
Linux only) of a child process run with MALLOC_MMAP_THRESHOLD_=65536, so that glibc maps every block over
64 KiB separately and returns it on free (the timing process keeps glibc's defaults).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

MMAP_THRESHOLD = 65536


def median_seconds(call: Callable[[], object], device: torch.device, min_repeats: int = 5, budget_s: float = 2.0) -> float:
    """Median wall time of ``call`` after one warm-up, repeated within about ``budget_s`` (5 to 50 times)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    call()
    sync()
    start = time.perf_counter()
    call()
    sync()
    first = time.perf_counter() - start
    repeats = int(max(min_repeats, min(50, budget_s / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_median_seconds(calls: dict[str, Callable[[], object]], device: torch.device, min_rounds: int = 5,
                               budget_s: float = 2.0, warmup_rounds: int = 3) -> dict[str, float]:
    """Median wall time of each of ``calls``, measured in rounds that run every call once in turn, so that a change in
    the machine's speed during the measurement reaches every call alike. ``warmup_rounds`` rounds are discarded (the
    first call of a compiled kernel loads it, and the next few still run slow); the last of them sizes the measurement:
    about ``budget_s`` per call, 5 to 50 rounds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one_round(times):
        for name, call in calls.items():
            sync()
            start = time.perf_counter()
            call()
            sync()
            times[name].append(time.perf_counter() - start)

    warmup: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(warmup_rounds):
        one_round(warmup)
    last = sum(seconds[-1] for seconds in warmup.values())
    rounds = int(max(min_rounds, min(50, budget_s * len(calls) / max(last, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        one_round(times)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def selected_devices(choice: str) -> list[torch.device]:
    """The devices of a ``--device cpu|cuda|all`` choice (CUDA only where present), announced on stdout."""
    devices = [torch.device("cpu")] if choice in ("cpu", "all") else []
    if choice in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, devices {[d.type for d in devices]}")
    return devices


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def in_memory_child() -> bool:
    """Whether this process was started by :func:`peak_extra_bytes` to measure CPU memory."""
    return os.environ.get("MALLOC_MMAP_THRESHOLD_") == str(MMAP_THRESHOLD)


def peak_extra_bytes(call: Callable[[], object], device: torch.device, module: str, spec: dict) -> float:
    """Peak extra bytes of ``call``. On CPU, unless already in a measuring child, runs
    ``python -m module --memory-of json(spec)`` in a child process (``module``: the calling script's
    ``__spec__.name``; the child starts in the parent's directory) and reads the last line it prints."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - before)
    if not in_memory_child():
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
        child = subprocess.run([sys.executable, "-m", module, "--memory-of", json.dumps(spec)],
                               env=env, capture_output=True, text=True)
        if child.returncode:
            raise RuntimeError(f"memory child failed for {spec}:\n{child.stderr[-2000:]}")
        return float(child.stdout.strip().splitlines()[-1])
    if not Path("/proc/self/clear_refs").exists():
        return float("nan")
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    call()
    return (_status_kb("VmHWM") - before) * 1024.0


def append_csv_row(row: dict, fields: list[str], out: Path) -> None:
    """Append one row (with a header if the file is new): a finished measurement survives an interrupted run. A file
    written with other columns is first rewritten under ``fields`` and its own extra columns, the old rows left empty
    where they have no value."""
    new = not out.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not new:
        with out.open(newline="") as handle:
            reader = csv.DictReader(handle)
            old_fields, rows = reader.fieldnames or [], list(reader)
        if old_fields != fields:
            fields = [*fields, *(name for name in old_fields if name not in fields)]
            with out.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
    with out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerow(row)
