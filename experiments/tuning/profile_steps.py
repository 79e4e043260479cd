"""What the steps run once per profile before its notebooks (:mod:`experiments.tuning.fixed_point`: the calibration and the
learning rates) share: their command line and how they keep what they chose."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.paths import RESULTS
from experiments.spec.profiles import Profile, get_profile
from experiments.engine.store import ResultsStore, atomic_write


def parse_command(prog: str, description: str, argv: list[str] | None) -> tuple[Profile, ResultsStore, str] | None:
    """``PROFILE [--store DIR] [--device D]``: the profile, its results store and the device; None (after saying why
    on stderr) for an unknown profile."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("profile")
    parser.add_argument("--store", help="results store (default: results/<profile>)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        profile = get_profile(args.profile)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    return profile, ResultsStore(Path(args.store) if args.store else RESULTS / profile.name), args.device


def stored(path: Path) -> dict:
    """What a step stored for a profile in ``path`` ({} if nothing): {"profile", "setups": {setup: entry}}."""
    return json.loads(path.read_text()) if path.exists() else {}


def stored_entry(path: Path, setup: str) -> dict | None:
    """The entry a step stored for ``setup`` in ``path`` (:func:`stored`), or None."""
    return stored(path).get("setups", {}).get(setup)


def keep(path: Path, profile_name: str, setup: str, entry: dict) -> None:
    """Store ``entry`` as ``setup``'s in ``path``, as JSON written in one step: an interrupted write leaves the
    previous file whole."""
    kept = stored(path) or {"profile": profile_name, "setups": {}}
    kept["setups"][setup] = entry
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n"))
