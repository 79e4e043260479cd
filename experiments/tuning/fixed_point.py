"""Each stand-in's difficulty and the learning rates chosen on it, alternated until cross-entropy's rate agrees.

The difficulty is fitted with cross-entropy at a learning rate (:mod:`experiments.tuning.calibration`); each loss's
learning rate, CE's included, is then chosen on the calibrated stand-in (:mod:`experiments.tuning.learning_rates`).
Where CE chooses another rate than the one it was calibrated at, the tables show CE on data fitted for a rate they do
not use. So each setup alternates: calibrate (first at the grid's rate, from the stand-in's start; where only the search
or the training's code has changed since the setup's stored calibration, at the rates and from the knobs that one ended
at), choose, and while CE's choice for the runs behind its calibration numbers differs from the rates they were
calibrated at, calibrate again at the chosen rates from the knobs found, and choose again: at most :data:`MAX_ROUNDS`
calibrations. Where the rounds run out (the choice goes back and forth), the last calibration and the choice made on
it are kept, and a verdict quotes CE's numbers at both rates (:func:`experiments.tuning.learning_rates.summary_line`).

``make calibrate`` (:mod:`experiments.scale.calibrate`, run first by ``make paper-figures``; each move's runs side by
side with ``EXECUTOR=local`` or ``slurm``) does what is left: a setup whose stored calibration and choice are
current, trained by today's code (:func:`experiments.tuning.calibration.todays`) and agree (or that used its rounds) is
not touched; each step is stored (:func:`experiments.spec.tuned.keep`) as soon as it is done, so an interrupted run
resumes from the last one. A calibration searched again reads no run of earlier training code from the store
(:func:`trained`).
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from experiments.engine.run_claim import train_once
from experiments.provenance import short_commit
from experiments.spec import tuned
from experiments.spec.profiles import Profile, recalibrated
from experiments.tuning import calibration, learning_rates

MAX_ROUNDS = 3  #: calibrations of a setup at most: the grid's rate, then CE's choices


@dataclass(frozen=True)
class Step:
    """What a setup needs next: a calibration (at ``rates``, from ``start``, as round ``round_``) or a choice."""

    action: str  #: "calibrate" or "choose"
    rates: dict = field(default_factory=dict)
    start: dict | None = None
    round_: int = 1


def next_step(profile: Profile, setup: str) -> Step | None:
    """The step ``setup`` needs, from what is stored (``profile`` as :func:`experiments.spec.profiles.recalibrated`
    reads it); None when its calibration and choice agree on CE's rate or the rounds are used."""
    fitted = calibration.todays(calibration.current_entry(profile, setup))
    if fitted is None:
        earlier = calibration.earlier_search(profile, setup)
        if earlier is None:
            return Step("calibrate")
        start = calibration.STAND_INS[setup].start
        return Step("calibrate", calibration.calibrated_rates(earlier, profile, setup),
                    {**start, **{knob: value for knob, value in earlier.knobs.items() if knob in start}})
    if len(profile.lr_multipliers) == 1:
        return None
    chosen = calibration.todays(learning_rates.current_entry(profile, setup))
    if chosen is None:
        return Step("choose")
    if learning_rates.agrees(chosen, fitted, profile, setup) or fitted.round >= MAX_ROUNDS:
        return None
    return Step("calibrate", learning_rates.ce_rates(chosen, profile, setup), fitted.knobs, fitted.round + 1)


def unsettled(profile: Profile) -> list[str]:
    """The stand-ins of ``profile`` with a step still to take (:func:`next_step`): what ``make calibrate`` would do."""
    return [setup for setup in profile.calibrated_setups if next_step(profile, setup) is not None]


def settle(profile: Profile, setup: str, train, say=lambda line: print(line, flush=True), ahead=None) -> Profile:
    """Take ``setup``'s steps (:func:`next_step`) until none is left, storing each; ``train(config)`` gives a run's
    record, and ``ahead(configs)``, if given, hears the runs of each step of the calibration and of the learning-rate
    choice first (:func:`experiments.scale.calibrate.executor_ahead`). Returns the profile as stored at the end."""
    profile = _reread(profile)
    while (step := next_step(profile, setup)) is not None:
        dataset = getattr(profile, setup).dataset
        if step.action == "calibrate":
            say(f"{setup}: calibrating {dataset} on cross-entropy at {calibration.rate_text(step.rates)}"
                f" (round {step.round_}) ...")
            entry = calibration.calibrate(profile, setup, train, rates=step.rates, start=step.start,
                                          round_=step.round_, ahead=ahead)
            tuned.keep(profile.name, setup, entry)
            say(calibration.table(entry).to_string())
        else:
            say(f"{setup}: choosing each loss's learning rate on validation data ({dataset}) ...")
            entry = learning_rates.choose(profile, setup, train, ahead)
            if ahead is not None:
                ahead(calibration.ce_configs(profile, setup, {}, calibration.STAND_INS[setup].targets, entry.scales))
            entry = replace(entry, cross_entropy=learning_rates.cross_entropy_numbers(profile, setup, entry.scales,
                                                                                      train))
            tuned.keep(profile.name, setup, entry)
            say(json.dumps(entry.scales, indent=1))
        profile = _reread(profile)
    return profile


#: ``warnings.catch_warnings`` changes the process's filters: one thread at a time (stand-ins calibrated side by side).
_REREADING = threading.Lock()


def _reread(profile: Profile) -> Profile:
    """:func:`experiments.spec.profiles.recalibrated`, without its warnings about steps this module is about to take."""
    with _REREADING, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return recalibrated(profile)


def status(profile: Profile, setup: str) -> dict:
    """Where ``setup`` stands: the round of its calibration, CE's rates there and as chosen, whether they agree."""
    fitted, chosen = calibration.current_entry(profile, setup), learning_rates.current_entry(profile, setup)
    if fitted is None:
        state = ("calibrated by an earlier search: run `make calibrate`" if calibration.earlier_search(profile, setup)
                 else "not calibrated: run `make calibrate`")
    elif earlier := learning_rates.earlier_engines([entry for entry in (fitted, chosen) if entry is not None]):
        state = f"trained by an earlier engine ({', '.join(earlier)}): run `make calibrate`"
    elif len(profile.lr_multipliers) == 1:
        state = "calibrated at the grid's learning rate (this profile chooses none)"
    elif chosen is None:
        state = "learning rates not chosen: run `make calibrate`"
    elif learning_rates.agrees(chosen, fitted, profile, setup):
        state = "settled: CE chose the learning rate it was calibrated at"
    else:
        state = f"not settled after {fitted.round} calibrations: CE chose another rate"
    return {"data": getattr(profile, setup).dataset, "round": fitted.round if fitted else None,
            "CE calibrated at": _rates(calibration.calibrated_rates(fitted, profile, setup) if fitted else None),
            "CE chose": _rates(learning_rates.ce_rates(chosen, profile, setup) if chosen else None), "state": state}


def _rates(rates: dict | None) -> str:
    return "" if rates is None else ", ".join(f"{key} x{m:g}" for key, m in sorted(rates.items()))


def table(profile: Profile) -> pd.DataFrame:
    """:func:`status` of every calibrated setup of ``profile``."""
    return pd.DataFrame([status(profile, setup) for setup in profile.calibrated_setups],
                        columns=["data", "round", "CE calibrated at", "CE chose", "state"]).set_index("data")


def no_stand_in(profile: Profile) -> str:
    """Why ``profile`` has nothing to calibrate."""
    return (f"the {profile.name} profile has no stand-in to calibrate "
            f"({'real data' if not profile.cifar.synthetic else 'it trains too little for its numbers to mean anything'})")


def trained(config, store, device: str, profile: str, setup: str, compile_mode: str | None = None) -> dict:
    """A calibration run's record: read back, or trained on ``device``; a clear stop where that device is missing."""
    if (device.startswith("cuda") and not torch.cuda.is_available() and store.finished(config.key()) is None
            and store.divergence(config.training_key()) is None):
        raise SystemExit(f"error: calibrating the {profile} profile's {setup} stand-in trains on {device}, but torch "
                         f"sees no CUDA device here: run `make calibrate PROFILE={profile} DEVICE=cuda` on a machine "
                         "with a GPU (on a cluster: inside srun or salloc), then this again")
    if (commit := _earlier_code(config, store)) is not None:
        raise SystemExit(f"error: calibrating the {profile} profile's {setup} stand-in read run {config.key()} from the "
                         f"store {store.root}, trained at commit {short_commit(commit)} by earlier training code: its "
                         "numbers are not today's. Calibrate with a store that holds none of the earlier code's runs: "
                         f"`make clean-results PROFILE={profile}` (the whole store goes), or --store a new folder")
    return train_once(config, store, device=device, compile_mode=compile_mode)


def _earlier_code(config, store) -> str | None:
    """The commit that trained ``config``'s stored outcome (its record, or its NaN), where that was earlier training
    code than today's (:func:`experiments.tuning.calibration.trained_by_todays_code`); else None."""
    commit = store.outcome_commit(config)
    return commit if commit and not calibration.trained_by_todays_code(commit) else None
