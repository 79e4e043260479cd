"""The probes' command line: ``PROFILE [--store DIR] [--device D] [--data-root DIR]``, checked before anything
trains, and the trainer it gives: each run under the store's claim (:func:`experiments.engine.run_claim.train_once`),
so that a probe beside a notebook or ``train`` on the same store never trains a run they train."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from experiments.engine.config import RunConfig
from experiments.engine.run_claim import train_once
from experiments.scale import executors
from experiments.spec.profiles import Profile
from experiments.tuning import profile_steps

Trainer = Callable[[RunConfig], dict]  #: a run's record, read back from the store or trained


def parse(prog: str, description: str, argv: list[str] | None) -> tuple[Profile, Trainer] | None:
    """The profile and its trainer; None (after saying why on stderr) for a store or device that cannot serve."""
    command = profile_steps.parse_command(prog, description, argv, _data_root_option)
    if command is None:
        return None
    profile, store, device, args = command
    if problem := executors.device_refusal(device):
        print(f"error: {problem}", file=sys.stderr)
        return None
    data_root = str(Path(args.data_root).resolve()) if args.data_root else None
    return profile, lambda config: train_once(config, store, device=device, data_root=data_root)


def _data_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", help="folder of the real datasets, as given to `python -m data_prep` (the "
                        "paper profile)")
