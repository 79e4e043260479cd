"""The stand-ins' calibration from an empty store, through one pool of local workers, twice in one script run: the
stand-ins one after another (the baseline: how ``make calibrate JOBS=N`` trained them before) and side by side (each
search in a thread of its own, their moves sharing the workers), with the wall time of each and whether the stored
calibrations are the same.

    python -m benchmarks.bench_calibration --jobs 2

The profile is the smoke profile made to judge training, so that its four tiny stand-ins are calibrated (the smoke
profile itself calibrates none, and the quick profile's searches take hours on a CPU): the runs are short, so the
workers' waits between moves weigh more than they would at the quick or ``gpu`` profile's scale. The calibrations go
to a temporary folder, not ``experiments/calibrated/``. Rows go to ``benchmarks/results/calibration_side_by_side.csv``.
Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from experiments.engine.store import ResultsStore, write_csv
from experiments.paths import BENCHMARK_RESULTS
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.scale import calibrate, executors
from experiments.spec import tuned
from experiments.spec.profiles import SMOKE

FIELDS = [*STAMP_FIELDS, "cores", "profile", "stand_ins", "order", "jobs", "runs", "seconds",
          "ratio_to_one_after_another", "calibrations_identical"]
#: The smoke profile's stand-ins, calibrated: its schedule and seeds, judged as a training profile.
PROFILE = replace(SMOKE, name="smoke-calibrated", judges_training=True)


def calibrate_all(root: Path, jobs: int, side_by_side: bool) -> tuple[float, int]:
    """Seconds to calibrate every stand-in of :data:`PROFILE` into ``root`` (its store and calibrations), and the runs
    trained; one pool of ``jobs`` workers either way."""
    tuned.CALIBRATED = root / "calibrated"  # read at each call: the committed calibrations stay untouched
    tuned.CALIBRATED.mkdir(parents=True)
    store = ResultsStore(root / "store")
    args = argparse.Namespace(executor="local", compile_mode=None)
    start = time.perf_counter()
    with executors.WorkerPool.of(executors.TrainOptions(str(store.root), threads=1), jobs=jobs) as pool:
        setups = PROFILE.calibrated_setups
        batches = [setups] if side_by_side else [(setup,) for setup in setups]
        for batch in batches:
            if calibrate._calibrate(PROFILE, store, "cpu", args, dict.fromkeys(batch, pool.train_runs)) != 0:
                raise SystemExit(f"the calibration of {', '.join(batch)} failed: see the lines above")
    return time.perf_counter() - start, len(list((root / "store" / "runs").iterdir()))


def stored(root: Path) -> dict:
    """The stored calibrations, without what differs by nature (the commit, the seconds)."""
    entries = json.loads((root / "calibrated" / f"{PROFILE.name}.json").read_text())["setups"]
    return {setup: {key: value for key, value in entry.items() if key not in ("commit", "seconds")}
            for setup, entry in entries.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of the pool (default 2)")
    parser.add_argument("--out", type=Path, default=BENCHMARK_RESULTS / "calibration_side_by_side.csv")
    args = parser.parse_args()
    provenance = stamp("cpu")
    with tempfile.TemporaryDirectory() as scratch:
        roots = {order: Path(scratch) / order for order in ("one after another", "side by side")}
        measured = {order: calibrate_all(root, args.jobs, order == "side by side") for order, root in roots.items()}
        identical = stored(roots["one after another"]) == stored(roots["side by side"])
    baseline = measured["one after another"][0]
    rows = [{**provenance, "cores": len(os.sched_getaffinity(0)), "profile": PROFILE.name,
             "stand_ins": len(PROFILE.calibrated_setups), "order": order, "jobs": args.jobs, "runs": runs,
             "seconds": round(seconds, 1), "ratio_to_one_after_another": round(baseline / seconds, 3),
             "calibrations_identical": identical} for order, (seconds, runs) in measured.items()]
    write_csv(rows, FIELDS, args.out)
    for row in rows:
        print(f"{row['order']:>17s}: {row['runs']} runs in {row['seconds']:.1f} s, "
              f"x{row['ratio_to_one_after_another']:.2f}")
    print(f"stored calibrations identical: {identical}; {args.out}")


if __name__ == "__main__":
    executors.run_as_command(main)
