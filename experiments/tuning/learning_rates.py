"""Each loss's learning rate at a profile's short schedule, chosen on the validation set alone.

The paper trains every loss of a table at one learning rate for hundreds of epochs, long enough for a loss whose
gradient is small to converge: the smoothed hinge's is about 1/K of cross-entropy's (its softplus takes the scores
divided by K tau, then is multiplied by tau: Berrada et al., 2018, Eqs. 10-11). At a short schedule, one rate for all
would judge such a loss before it has learnt.

So a profile with ``lr_multipliers`` trains, on each setup, the first seed of each loss and model-selection metric
(:func:`experiments.spec.grids.choice_key`) of the setup's table, without label noise, at the grid's learning rate times
each multiplier, and keeps the multiplier whose run reaches the best validation value of its selection metric (ties:
the one nearest 1, the grid's own rate). Every loss is chosen the same way, cross-entropy included, on validation
data only; the choice applies to every run of that loss and metric on the setup, all seeds and noise levels
(:mod:`experiments.spec.grids`). CE's calibration numbers at the rate it chose (:func:`cross_entropy_numbers`) are
stored with the choice, and a verdict quotes them where that rate is not the one CE's difficulty was fitted at
(:func:`summary_line`, :mod:`experiments.tuning.fixed_point`).

The choices are a :class:`experiments.spec.tuned.LearningRates` per setup, stored in
``experiments/calibrated/<profile>_learning_rates.json``. Runs go through the results store, so the chosen runs are
the tables' own while the code that trained them is today's: a choice made before the training's code last changed
is made again (:func:`experiments.tuning.calibration.trained_by_todays_code`), and its numbers are marked stale until
then (:func:`stale_text`).
"""

from __future__ import annotations

import math
import time

import pandas as pd

from experiments.engine.train import selection_value
from experiments.paths import CALIBRATION_SEEDS
from experiments.provenance import git_commit, short_commit
from experiments.spec import grids, tuned
from experiments.spec.profiles import Profile, untuned
from experiments.spec.tuned import AtChosenRate, Calibration, Choice, LearningRates
from experiments.tuning import calibration

#: the table each setup's learning rates are chosen on
SELECTION_GRIDS = {"cifar": grids.label_noise, "plantnet": grids.plantnet, "imagenet_lt": grids.imagenet_lt,
                   "imagenet": grids.imagenet}


def base_cells(profile: Profile, setup: str) -> list[grids.Cell]:
    """One cell per :func:`experiments.spec.grids.choice_key` of the setup's table: its first seed, without label noise,
    at the grid's own learning rate."""
    first_seed = getattr(profile, setup).seeds[0]
    cells = {}
    for cell in SELECTION_GRIDS[setup](untuned(profile, setup)):
        if cell.labels["seed"] == first_seed and not cell.labels.get("p"):
            cells.setdefault(grids.choice_key(cell.config), cell)
    return list(cells.values())


def best_validation(record: dict) -> float:
    """The best value, over the epochs of ``record``'s run, of the validation metric its model is selected on."""
    metric = record["config"]["selection_metric"]
    return max(selection_value(epoch["val"], metric) for epoch in record["history"])


def choose(profile: Profile, setup: str, train, ahead=None) -> LearningRates:
    """Train each :func:`base_cells` run at each of the profile's multipliers (``train(config)`` gives a run's record;
    ``ahead(configs)``, if given, hears them all first, so that an executor can train them side by side) and keep, per
    choice key, the multiplier of the best validation value (ties: the one nearest 1; a run whose loss became NaN is
    never chosen, its value stored as None); CE's numbers at the chosen rates are left to
    :func:`cross_entropy_numbers`."""
    started, choices = time.time(), []
    if ahead is not None:
        ahead([grids.scaled_lr(cell.config, multiplier) for cell in base_cells(profile, setup)
               for multiplier in sorted(profile.lr_multipliers)])
    for cell in base_cells(profile, setup):
        values = {}
        for multiplier in sorted(profile.lr_multipliers):
            try:
                values[multiplier] = best_validation(train(grids.scaled_lr(cell.config, multiplier)))
            except FloatingPointError:
                values[multiplier] = None
        best = max((m for m in values if values[m] is not None), key=lambda m: (values[m], -abs(math.log(m))), default=None)
        if best is None:
            raise FloatingPointError(f"{grids.choice_key(cell.config)} on {setup}: the loss became NaN at every "
                                     f"learning-rate multiplier {sorted(values)} of {cell.config.lr:g}")
        choices.append(Choice(grids.choice_key(cell.config), cell.config.lr, best,
                              {f"{m:g}": value for m, value in values.items()}, cell.config.key()))
    return LearningRates(dataset=getattr(profile, setup).dataset, multipliers=tuple(profile.lr_multipliers),
                         scales={c.choice: c.multiplier for c in choices}, choices=tuple(choices),
                         setup_fingerprint=getattr(profile, setup).tuned_fingerprint(), commit=git_commit(),
                         seconds=round(time.time() - started, 1))


def cross_entropy_numbers(profile: Profile, setup: str, scales: dict, train) -> dict[str, AtChosenRate]:
    """Cross-entropy's calibration numbers (percent, :data:`experiments.tuning.calibration.STAND_INS`) on the calibrated
    stand-in at the learning rates it chose (``scales``), each with its multiplier and the seeds it is the mean of: the
    tables' own CE runs, averaged as the calibration averages them."""
    values = calibration.measure_seeds(profile, setup, {}, calibration.STAND_INS[setup].targets, train, scales)
    seeds = tuple(getattr(profile, setup).seeds)
    return {label: AtChosenRate(values[label], scales[key], seeds)
            for label, key in calibration.ce_keys(profile, setup).items()}


def ce_rates(entry: LearningRates, profile: Profile, setup: str) -> dict:
    """The multipliers a choice gives the CE runs behind ``setup``'s calibration numbers, by choice key."""
    return {key: entry.scales[key] for key in set(calibration.ce_keys(profile, setup).values())}


def agrees(chosen: LearningRates, fitted: Calibration, profile: Profile, setup: str) -> bool:
    """Whether CE chose the learning rates its calibration (``fitted``) was made at: the alternation of
    :mod:`experiments.tuning.fixed_point` has settled."""
    return ce_rates(chosen, profile, setup) == calibration.calibrated_rates(fitted, profile, setup)


def is_current(entry: LearningRates | None, profile: Profile, setup: str) -> bool:
    """Whether a stored choice was made for this setup (its difficulty included), these multipliers and the runs its
    table has now (:meth:`experiments.spec.tuned.LearningRates.is_current`)."""
    if entry is None:
        return False
    runs = {grids.choice_key(c.config): c.config.key() for c in base_cells(profile, setup)}
    return entry.is_current(getattr(profile, setup).tuned_fingerprint(), profile.lr_multipliers, runs,
                            getattr(profile, setup).seeds)


def current_entry(profile: Profile, setup: str) -> LearningRates | None:
    """The stored choice of ``setup``, if it is the one the profile uses."""
    entry = tuned.learning_rates(profile.name).get(setup)
    return entry if is_current(entry, profile, setup) else None


def _ce_frame(rows: list[dict], profile: Profile) -> pd.DataFrame:
    """Rows per (data, CE number), or one row saying that no setup of ``profile`` has both its stand-in calibrated and
    CE's learning rate chosen on it."""
    return pd.DataFrame(rows).set_index(["data", "CE number"]) if rows else pd.DataFrame(
        {"CE numbers": [f"no learning rate chosen on a calibrated stand-in at the {profile.name} profile"]})


def cross_entropy_table(profile: Profile) -> pd.DataFrame:
    """Per calibrated setup and CE number: the paper's, the calibration's and the learning-rate search's (at the rate
    CE chose for the tables), each with its learning-rate multiplier, and whether their runs are stale
    (:func:`stale_text`)."""
    rows = []
    for setup in profile.calibrated_setups:
        fitted, chosen = calibration.current_entry(profile, setup), current_entry(profile, setup)
        if fitted is None or chosen is None:
            continue
        rates, keys = calibration.calibrated_rates(fitted, profile, setup), calibration.ce_keys(profile, setup)
        trained_by = _engine_text([fitted, chosen])
        for target in fitted.targets:
            at_chosen, calibrated_at = chosen.cross_entropy[target.label], rates[keys[target.label]]
            rows.append({"data": fitted.dataset, "CE number": target.label,
                         "role": "fitted" if target.fitted else "held out", "paper (%)": target.published,
                         "calibration (%)": round(target.ours, 1), "calibrated at": f"x{calibrated_at:g}",
                         "search, chosen lr (%)": round(at_chosen.ours, 1), "chosen": f"x{at_chosen.multiplier:g}",
                         "gap at chosen lr (points)": round(at_chosen.ours - target.published, 1),
                         "trained by": trained_by})
    return _ce_frame(rows, profile)


def cross_entropy_seeds_table(profile: Profile, train) -> pd.DataFrame:
    """Per calibrated setup and CE number: the tables' own CE runs at every seed of the profile (the calibrated
    stand-in, the rate CE chose; ``train(config)`` gives a run's record), their mean and range, and the mean's gap to
    the paper's. The calibration fits the seeds' mean: this shows how far apart the seeds are."""
    rows = []
    for setup in profile.calibrated_setups:
        fitted, chosen = calibration.current_entry(profile, setup), current_entry(profile, setup)
        if fitted is None or chosen is None:
            continue
        targets = calibration.STAND_INS[setup].targets
        by_seed = calibration.measure_each_seed(profile, setup, {}, targets, train, chosen.scales)
        means = calibration.seeds_mean(by_seed)
        for target in targets:
            values, mean = [numbers[target.label] for numbers in by_seed], means[target.label]
            rows.append({"data": fitted.dataset, "CE number": target.label,
                         "role": "fitted" if target.fitted else "held out", "paper (%)": target.published,
                         "each seed (%)": ", ".join(f"{value:.1f}" for value in values), "mean (%)": round(mean, 1),
                         "seeds' range (points)": round(max(values) - min(values), 1),
                         "gap of the mean (points)": round(mean - target.published, 1)})
    return _ce_frame(rows, profile)


def fitted_gap_at_chosen_rate(fitted: Calibration | dict,
                              chosen: LearningRates | dict) -> tuple[float, str, float, str]:
    """CE's fitted numbers at the learning rates it chose (``chosen``) against the paper's (``fitted``: the setup's
    calibration), each typed or its stored JSON: the RMS gap in points, the number furthest from the paper's and its
    gap, and the multipliers ("x3" or "x1, x3")."""
    fitted, chosen = Calibration.of(fitted), LearningRates.of(chosen)
    gaps = {t.label: chosen.cross_entropy[t.label].ours - t.published for t in fitted.fitted}
    worst = max(gaps, key=lambda label: abs(gaps[label]))
    multipliers = sorted({chosen.cross_entropy[label].multiplier for label in gaps})
    return (math.sqrt(sum(gap * gap for gap in gaps.values()) / len(gaps)), worst, gaps[worst],
            ", ".join(f"x{m:g}" for m in multipliers))


def earlier_engines(entries: list[Calibration | LearningRates]) -> list[str]:
    """The commits (short) of those ``entries`` whose runs were trained with other code than today's
    (:data:`experiments.paths.TRAINING_CODE` changed since): their numbers are not what the same runs give now, the
    tables' own included."""
    return sorted({short_commit(entry.commit) for entry in entries
                   if not calibration.trained_by_todays_code(entry.commit)})


def stale_text(entries: list[Calibration | LearningRates]) -> str | None:
    """Why the CE numbers of ``entries`` (a setup's calibration and learning-rate choice) are stale, or None."""
    earlier = earlier_engines(entries)
    return (f"stale: these CE numbers come from runs trained at commit {', '.join(earlier)} by an earlier engine "
            f"(`make calibrate` searches again); the tables' own CE runs are in the table {CALIBRATION_SEEDS}") \
        if earlier else None


def _engine_text(entries: list[Calibration | LearningRates]) -> str:
    """The engine that trained the runs of ``entries``, for a table's cell."""
    earlier = earlier_engines(entries)
    return f"an earlier engine ({', '.join(earlier)}): stale" if earlier else "today's engine"


def summary_line(profile: Profile, setup: str) -> str:
    """What a verdict on ``setup``'s data says about its difficulty: the calibration's line
    (:func:`experiments.tuning.calibration.summary_line`), then CE's fitted numbers at the learning rates it chose for
    the tables where these are not the ones it was calibrated at (:mod:`experiments.tuning.fixed_point` not settled),
    then :func:`stale_text` where their runs were trained by an earlier engine."""
    line, chosen, fitted = (calibration.summary_line(profile, setup), current_entry(profile, setup),
                            calibration.current_entry(profile, setup))
    if chosen is not None and fitted is not None and not agrees(chosen, fitted, profile, setup):
        rms, worst, gap, multipliers = fitted_gap_at_chosen_rate(fitted, chosen)
        line += (f"; at the learning rate CE chose for the tables ({multipliers}): {rms:.1f} points RMS, largest gap "
                 f"{gap:+.1f} ({worst})")
    stale = stale_text([entry for entry in (fitted, chosen) if entry is not None])
    return line if stale is None else f"{line} ({stale})"


def table(profile: Profile) -> pd.DataFrame:
    """Every choice the profile uses: the setup, the loss and selection metric, the grid's learning rate, the best
    validation value (percent) at each multiplier, the multiplier chosen; or one row saying why there is none."""
    if len(profile.lr_multipliers) == 1:
        return pd.DataFrame({"learning rates": [f"the grids' own (the paper's, scaled to the profile's schedule): the "
                                                f"{profile.name} profile chooses none"]})
    rows = []
    for setup in profile.calibrated_setups:
        entry = current_entry(profile, setup)
        if entry is None:
            rows.append({"data": getattr(profile, setup).dataset, "loss, selected on": "",
                         "chosen": "not chosen for this setup: run `make calibrate`"})
            continue
        rows += [{"data": entry.dataset, "loss, selected on": c.choice, "grid's lr": c.lr,
                  **{f"val x{m:g}": _percent(c.validation[f"{m:g}"]) for m in entry.multipliers},
                  "chosen": f"x{c.multiplier:g}", "lr": float(f"{c.lr * c.multiplier:.4g}")}
                 for c in entry.choices]
    return pd.DataFrame(rows).set_index(["data", "loss, selected on"])


def _percent(value: float | None) -> float | str:
    return "diverged" if value is None else round(100 * value, 1)
