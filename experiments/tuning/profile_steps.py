"""The command line of the steps run once per profile before its notebooks (:mod:`experiments.tuning.fixed_point`) and
of the probes run beside them: ``PROFILE [--store DIR] [--device D]``, and each command's own options. What the steps
choose is read and written by :mod:`experiments.spec.tuned`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from experiments.engine.store import ResultsStore
from experiments.paths import RESULTS
from experiments.spec.profiles import Profile, get_profile


def parse_command(prog: str, description: str, argv: list[str] | None,
                  options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
                  ) -> tuple[Profile, ResultsStore, str, argparse.Namespace] | None:
    """``PROFILE [--store DIR] [--device D]`` and the command's own ``options``: the profile, its results store, the
    device and every argument; None (after saying why on stderr) for an unknown profile."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("profile")
    parser.add_argument("--store", help="results store (default: results/<profile>)")
    parser.add_argument("--device", default="cpu")
    options(parser)
    args = parser.parse_args(argv)
    try:
        profile = get_profile(args.profile)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    return profile, ResultsStore(Path(args.store) if args.store else RESULTS / profile.name), args.device, args
