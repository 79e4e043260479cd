"""The README's two set-up commands timed as a newcomer runs them: a fresh clone of this commit, ``make venv`` (the
install: the pinned stack into a new ``.venv``) and ``make test`` (the whole suite, the README's test command), on this
machine with nothing else running.

    python -m benchmarks.bench_setup_time            # about 15 minutes on 2 cores

One row per step goes to ``benchmarks/results/setup_time.csv`` with the processor (``device_name``) and core
count; ``make test`` runs twice (``--test-runs``): the README's set-up block gives the install's time and the
range of the test runs. Not a test: times depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from experiments.engine.store import write_csv
from experiments.paths import BENCHMARK_RESULTS, PROJECT_ROOT
from experiments.provenance import STAMP_FIELDS, stamp

FIELDS = [*STAMP_FIELDS, "cores", "step", "command", "seconds", "passed"]
INSTALL, TEST = ("install", "make venv"), ("test", "make test")


def timed(command: str, cwd: Path) -> tuple[float, bool]:
    """Wall seconds of ``command`` in ``cwd`` and whether it exited 0."""
    start = time.perf_counter()
    done = subprocess.run(command, shell=True, cwd=cwd, env={**os.environ, "MAKEFLAGS": ""})
    return time.perf_counter() - start, done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_setup_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=BENCHMARK_RESULTS / "setup_time.csv")
    parser.add_argument("--test-runs", type=int, default=2, help="times `make test` runs after the install "
                        "(default 2): the README gives the range")
    args = parser.parse_args()
    if args.test_runs < 1:
        parser.error(f"--test-runs should be at least 1, got {args.test_runs}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        clone = Path(scratch) / "topk"
        subprocess.run(["git", "clone", "--quiet", str(PROJECT_ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True,
                                check=True).stdout.strip()  # what was timed: the clone, never this checkout's edits
        for step, command in [INSTALL] + [TEST] * args.test_runs:
            seconds, passed = timed(command, clone)
            rows.append({**stamp("cpu"), "commit": commit, "cores": len(os.sched_getaffinity(0)),
                         "step": step, "command": command, "seconds": round(seconds, 1), "passed": passed})
            print(f"{command}: {seconds / 60:.1f} min, {'passed' if passed else 'FAILED'}")
    write_csv(rows, FIELDS, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
