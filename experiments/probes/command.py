"""The probes' command line: ``PROFILE [--store DIR] [--device D] [--data-root DIR]``, checked before anything
trains, and the trainer it gives: each run under the store's claim (:func:`experiments.engine.run_claim.train_once`),
so that a probe beside a notebook or ``train`` on the same store never trains a run they train; a run that diverged
ends the probe with one line (exit 1)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from experiments.engine.config import RunConfig
from experiments.engine.run_claim import train_once
from experiments.scale import executors
from experiments.scale.plan import missing_dataset_text
from experiments.spec.profiles import SETUPS, Profile
from experiments.tuning import profile_steps

Trainer = Callable[[RunConfig], dict]  #: a run's record, read back from the store or trained


def parse(prog: str, description: str, argv: list[str] | None, configs_of: Callable[[Profile], list[RunConfig]],
          refusal: Callable[[Profile], str | None] = lambda profile: None) -> tuple[Profile, Trainer] | None:
    """The profile and its trainer; None (after saying why on stderr) for a store, device or profile that cannot
    serve (the probe's own ``refusal``), or real datasets of the probe's runs (``configs_of``) not found."""
    command = profile_steps.parse_command(prog, description, argv, _data_root_option)
    if command is None:
        return None
    profile, store, device, args = command
    folders = _real_data_folders(profile, args.data_root)
    checks = (lambda: executors.device_refusal(device), lambda: refusal(profile),
              lambda: _missing_data(profile, {config.dataset: folders[config.dataset] for config in configs_of(profile)
                                              if config.dataset in folders}))
    for check in checks:  # in turn: the probe's runs are listed once its refusal has passed
        if problem := check():
            print(f"error: {problem}", file=sys.stderr)
            return None

    def train(config: RunConfig) -> dict:
        try:
            return train_once(config, store, device=device, data_root=folders.get(config.dataset))
        except FloatingPointError as error:  # kept in the store (run_claim.train_once): a rerun raises it again
            raise SystemExit(f"error: {error}; its NaN is kept in {store.root}/diverged/ (delete the file to train it "
                             "again), and the probe's rows need every run") from None

    return profile, train


def _real_data_folders(profile: Profile, root: str | None) -> dict[str, Path | None]:
    """Each real dataset of ``profile`` and its folder under the datasets' ``root`` (None without one), as the
    notebooks and ``train`` read it."""
    setups = [getattr(profile, name) for name in SETUPS]
    return {setup.dataset: Path(root).resolve() / setup.data_subdir if root else None
            for setup in setups if setup.data_subdir}


def _missing_data(profile: Profile, folders: dict[str, Path | None]) -> str | None:
    if folders and None in folders.values():
        return (f"the probe's runs of the {profile.name} profile read the real {', '.join(sorted(folders))}: pass "
                "the datasets' root (--data-root, as make DATA=)")
    for dataset, folder in sorted(folders.items()):
        if not folder.is_dir():
            return missing_dataset_text(dataset, folder)
    return None


def _data_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", help="the real datasets' root, as given to make DATA= (the paper profile)")
