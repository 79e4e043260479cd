"""The command line of the steps run once per profile before its notebooks (:mod:`experiments.tuning.fixed_point`) and
of the probes run beside them: ``PROFILE [--store DIR] [--device D]``, and each command's own options. What the steps
choose is read and written by :mod:`experiments.spec.tuned`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from experiments.engine.store import ResultsStore, unusable_store
from experiments.paths import RESULTS
from experiments.spec.profiles import PROFILES, Profile, get_profile


def parse_command(prog: str, description: str, argv: list[str] | None,
                  options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
                  ) -> tuple[Profile, ResultsStore, str, argparse.Namespace] | None:
    """``PROFILE [--store DIR] [--device D]`` and the command's own ``options``: the profile, its results store, the
    device and every argument; None (after saying why on stderr) for a store that cannot be one."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("profile", choices=PROFILES)
    parser.add_argument("--store", help="results store (default: results/PROFILE)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    options(parser)
    args = parser.parse_args(argv)
    store = Path(args.store) if args.store else RESULTS / args.profile
    if problem := unusable_store(store):
        print(f"error: {problem}", file=sys.stderr)
        return None
    return get_profile(args.profile), ResultsStore(store), args.device, args
