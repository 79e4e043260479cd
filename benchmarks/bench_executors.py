"""A profile's runs trained from an empty store by two executors in one script run: ``inline`` (the baseline, one run
after another in one process) and ``local --jobs N`` (N worker processes, the cores split between them), with the
wall time of each, its images per second, and whether the two stores hold the same records (what the notebooks'
tables and verdicts are made of).

    python -m benchmarks.bench_executors quick --jobs 2

Records are compared on what a run computes (losses, validation and test metrics, selected epoch), not on timings.
Inline trains with torch's default threads and a worker with its share of the cores: CPU kernels sum in an order
that depends on the thread count, so the two can differ in their last bits. Rows go to
``benchmarks/results/executors_<profile>.csv``. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.engine.store import ResultsStore, computed, write_csv
from experiments.paths import BENCHMARK_RESULTS, PROJECT_ROOT
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.scale import executors
from experiments.scale.plan import plan
from experiments.spec.profiles import get_profile

FIELDS = [*STAMP_FIELDS, "cores", "profile", "executor", "jobs", "runs", "train_images", "seconds", "images_per_s",
          "ratio_to_inline", "records_identical", "records_differing"]


def train(profile: str, store: Path, executor: str, jobs: int) -> float:
    """Seconds of ``python -m experiments train`` from an empty ``store``; fails loudly if a run failed."""
    command = [sys.executable, "-m", "experiments", "train", profile, "--executor", executor, "--store", str(store),
               "--figures", str(store.with_name(f"{store.name}_figures"))]  # its manifest, not in the committed figures
    if executor == "local":
        command += ["--jobs", str(jobs)]
    start = time.perf_counter()
    subprocess.run(command, cwd=PROJECT_ROOT, check=True)
    return time.perf_counter() - start


def compare(first: Path, second: Path, keys: list[str]) -> tuple[int, int]:
    """(identical, differing) records of ``keys`` between two stores."""
    one, other = ResultsStore(first), ResultsStore(second)
    same = sum(computed(one.finished(key)) == computed(other.finished(key)) for key in keys)
    return same, len(keys) - same


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_executors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of the local executor (default 2)")
    parser.add_argument("--out", type=Path, help="CSV (default: benchmarks/results/executors_PROFILE.csv)")
    parser.add_argument("--keep", type=Path, help="keep the two stores in DIR/inline and DIR/local (default: a "
                        "temporary folder, removed): the notebooks can then be run on each and their tables compared "
                        "(python -m experiments.analysis.compare)")
    args = parser.parse_args()
    provenance = stamp("cpu")  # the commit that trains, whatever is committed while it does
    runs = plan(get_profile(args.profile))
    images = sum(run.train_images or 0 for run in runs)
    keys = [sibling.key() for run in runs for sibling in run.config.siblings()]
    with tempfile.TemporaryDirectory() as scratch:
        stores = {name: (args.keep or Path(scratch)) / name for name in ("inline", "local")}
        if any(store.exists() for store in stores.values()):
            parser.error(f"{args.keep} already holds a store: the runs must train from an empty one")
        seconds = {name: train(args.profile, stores[name], name, args.jobs) for name in stores}
        same, differing = compare(stores["inline"], stores["local"], [key for key in keys
                                                                      if ResultsStore(stores["inline"]).record_path(key).exists()])
    rows = [{**provenance, "cores": len(os.sched_getaffinity(0)), "profile": args.profile, "executor": name, "jobs": args.jobs if name == "local" else 1,
             "runs": len(runs), "train_images": images, "seconds": round(seconds[name], 1),
             "images_per_s": round(images / seconds[name], 1), "ratio_to_inline": round(seconds["inline"] / seconds[name], 3),
             "records_identical": same, "records_differing": differing} for name in stores]
    out = args.out or BENCHMARK_RESULTS / f"executors_{args.profile}.csv"
    write_csv(rows, FIELDS, out)
    for row in rows:
        print(f"{row['executor']:>6s} x{row['jobs']}: {row['seconds']:8.1f} s, {row['images_per_s']:9.1f} images/s, "
              f"x{row['ratio_to_inline']:.2f} against inline")
    print(f"records: {same} identical, {differing} differing; {out}")


if __name__ == "__main__":
    executors.run_as_command(main)
