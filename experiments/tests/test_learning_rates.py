"""Learning rates chosen on validation data: the choice, its reach (every run of a loss and selection metric on its
setup, but Figs. 2 and 3), the stored choice reaching the profile only for the setup it was made on, and the committed
choice current."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import pytest

from experiments.engine.store import ResultsStore
from experiments.engine.train import run
from experiments.spec import grids, profiles, tuned
from experiments.spec.profiles import QUICK, SMOKE
from experiments.spec.tuned import AtChosenRate, Calibration, LearningRates, Number
from experiments.tuning import calibration, learning_rates


def _record(config, best: float):
    """A fake run whose validation selection metric peaks at ``best`` in its second epoch."""
    metric = config.selection_metric.removeprefix("macro_")[3:]
    group = "macro_top" if config.selection_metric.startswith("macro_") else "top"
    return {"config": config.to_dict(),
            "history": [{"val": {group: {metric: value}}} for value in (best / 2, best, best - 0.1)]}


def test_each_loss_keeps_the_multiplier_of_its_best_validation_value_ties_to_the_nearest_1_nan_runs_aside():
    trained = []
    best = {("cross_entropy", 0.3): 0.90, ("cross_entropy", 1.0): 0.90, ("cross_entropy", 3.0): 0.90,
            ("cross_entropy", 10.0): 0.50, ("smooth_hinge", 0.3): 0.60, ("smooth_hinge", 1.0): 0.70,
            ("smooth_hinge", 3.0): 0.80, ("smooth_hinge", 10.0): 0.85, ("noised_balanced", 0.3): 0.80,
            ("noised_balanced", 1.0): 0.88, ("noised_balanced", 3.0): 0.89, ("noised_balanced", 10.0): None}

    def train(config):
        base_lr = QUICK.cifar.lr
        multiplier = round(config.lr / base_lr, 6)
        trained.append((config, multiplier))
        assert config.seed == QUICK.cifar.seeds[0] and "noise" not in config.dataset_options
        if best[config.loss, multiplier] is None:
            raise FloatingPointError("the training loss became NaN in epoch 2")
        return _record(config, best[config.loss, multiplier])

    announced = []
    entry = learning_rates.choose(QUICK, "cifar", train, ahead=announced.append)
    assert entry.scales == {"cross_entropy top5": 1.0, "smooth_hinge top5": 10.0, "noised_balanced top5": 3.0}
    assert len(trained) == 12 and sorted({m for _, m in trained}) == [0.3, 1.0, 3.0, 10.0]
    assert [[config.key() for config in batch] for batch in announced] == [[config.key() for config, _ in trained]]
    noised = next(c for c in entry.choices if c.choice == "noised_balanced top5")
    assert noised.validation == {"0.3": 0.8, "1": 0.88, "3": 0.89, "10": None}
    assert entry.setup_fingerprint == QUICK.cifar.tuned_fingerprint()


def test_a_loss_that_diverges_at_every_rate_is_an_error_naming_it():
    def train(config):
        if config.loss == "smooth_hinge":
            raise FloatingPointError("the training loss became NaN in epoch 1")
        return _record(config, 0.5)

    with pytest.raises(FloatingPointError, match=r"smooth_hinge top5 on cifar: the loss became NaN at every"):
        learning_rates.choose(QUICK, "cifar", train)


def test_a_choice_reaches_every_seed_and_noise_level_of_its_loss_and_metric_but_not_figures_2_and_3():
    scales = {"smooth_hinge top5": 10.0, "noised_balanced top5": 3.0}
    profile = replace(QUICK, cifar=replace(QUICK.cifar, lr_scales=scales))
    lr = QUICK.cifar.lr
    for cell in grids.label_noise(profile) + grids.table2(profile) + grids.table3(profile):
        expected = lr * scales.get(grids.choice_key(cell.config), 1.0)
        assert cell.config.lr == expected, cell.labels
    assert {c.config.lr for c in grids.label_noise(profile) if c.labels["loss"] == "smooth_hinge"} == {lr * 10}
    assert all(c.config.lr == lr for c in grids.figure2(profile) + grids.figure3(profile))
    untuned = {c.config.key() for c in grids.label_noise(replace(QUICK, cifar=replace(QUICK.cifar, lr_scales={})))}
    tuned_ce = [c.config.key() for c in grids.label_noise(profile) if c.labels["loss"] == "cross_entropy"]
    assert set(tuned_ce) <= untuned  # x1: the very runs (and store keys) of the grid's own rate


def test_choice_is_made_on_real_runs_and_the_profile_takes_it_only_for_the_setup_it_was_made_on(tmp_path, monkeypatch):
    profile = replace(SMOKE, judges_training=True, lr_multipliers=(1.0, 3.0))
    store = ResultsStore(tmp_path / "store")
    entry = learning_rates.choose(profile, "imagenet", lambda config: run(config, store))
    assert set(entry.scales) == {f"{loss} top{k}" for loss in ("cross_entropy", "smooth_hinge", "noised_balanced")
                                 for k in (1, 5)}
    numbers = learning_rates.cross_entropy_numbers(profile, "imagenet", entry.scales, lambda c: run(c, store))
    for target in calibration.STAND_INS["imagenet"].targets:  # CE's calibration numbers at the rate it chose
        config = calibration.ce_config(profile, "imagenet", target, {})
        multiplier = entry.scales[grids.choice_key(config)]
        test = store.finished(grids.scaled_lr(config, multiplier).key())["test"]
        assert numbers[target.label] == AtChosenRate(100 * test[target.metric[0]][target.metric[1]], multiplier,
                                                     profile.imagenet.seeds)  # one seed: its own
    tried = [grids.scaled_lr(cell.config, m) for cell in learning_rates.base_cells(profile, "imagenet") for m in (1, 3)]
    assert len(tried) == 12 and all(store.finished(config.key()) for config in tried)
    assert len({config.training_key() for config in tried}) == 10  # cross-entropy top-1 and top-5: one training
    monkeypatch.setattr(tuned, "CALIBRATED", tmp_path)
    entry = replace(entry, cross_entropy=numbers)
    tuned.keep("smoke", "imagenet", entry)
    assert tuned.learning_rates("smoke") == {"imagenet": entry}  # as kept, read back
    with pytest.warns(UserWarning, match="cifar setup has no learning rates chosen"):
        chosen = profiles.with_learning_rates(profile)
    assert chosen.imagenet.lr_scales == entry.scales and chosen.cifar.lr_scales == {}
    assert learning_rates.is_current(entry, chosen, "imagenet")
    shown = learning_rates.table(chosen)
    assert len(shown.loc["imagenet_like"]) == 6 and set(shown.loc["imagenet_like", "chosen"]) <= {"x1", "x3"}
    assert [c for c in shown.columns if c.startswith("val")] == ["val x1", "val x3"]
    assert shown.loc["cifar100_like", "chosen"].str.contains("make calibrate").all()
    assert "chooses none" in learning_rates.table(SMOKE).iloc[0, 0]
    harder = replace(profile, imagenet=replace(profile.imagenet, difficulty={"pixel_noise": 3.0}))
    with pytest.warns(UserWarning, match="imagenet setup has no learning rates chosen"):
        assert profiles.with_learning_rates(harder).imagenet.lr_scales == {}
    with pytest.warns(UserWarning, match="imagenet setup has no learning rates chosen"):
        profiles.with_learning_rates(replace(profile, lr_multipliers=(1.0, 2.0)))
    assert profiles.with_learning_rates(replace(profile, lr_multipliers=(1.0,))) == replace(profile, lr_multipliers=(1.0,))


def test_the_chosen_rates_leave_the_calibration_fingerprint_as_it_was():
    setup = QUICK.cifar
    assert replace(setup, lr_scales={"cross_entropy top5": 3.0}).fingerprint() == setup.fingerprint()
    assert replace(setup, difficulty={}).fingerprint() == setup.fingerprint()
    assert replace(setup, difficulty={}).tuned_fingerprint() != setup.tuned_fingerprint()


def test_the_committed_quick_choice_is_the_one_the_quick_profile_uses():
    stored = tuned.learning_rates("quick")
    for setup in QUICK.calibrated_setups:
        assert learning_rates.is_current(stored.get(setup), QUICK, setup), (
            f"experiments/calibrated/quick_learning_rates.json is stale for {setup}: run `make calibrate`")
        assert getattr(QUICK, setup).lr_scales == stored[setup].scales
        for choice in stored[setup].choices:
            values = {float(m): v for m, v in choice.validation.items() if v is not None}
            best = [m for m, v in values.items() if v == max(values.values())]
            assert choice.multiplier == min(best, key=lambda m: abs(math.log(m)))  # ties: the nearest 1


def test_a_verdict_quotes_ce_s_difficulty_at_the_one_it_chose_where_it_was_calibrated_at_another(monkeypatch):
    monkeypatch.setattr(calibration, "summary_line", lambda profile, setup: "calibrated at x1")
    fitted = Calibration(targets=tuple(Number(**asdict(t), ours=0.0)
                                       for t in calibration.STAND_INS["imagenet"].targets))
    monkeypatch.setattr(calibration, "current_entry", lambda profile, setup: fitted)
    chosen = LearningRates(scales={"cross_entropy top1": 3.0, "cross_entropy top5": 1.0},
                           cross_entropy={"top-1": AtChosenRate(74.24, 3.0),  # the paper's: 72.24 and 90.6
                                          "top-5 (selected on top-1)": AtChosenRate(90.6, 3.0)})
    monkeypatch.setattr(learning_rates, "current_entry", lambda profile, setup: chosen)
    assert learning_rates.summary_line(QUICK, "imagenet") == (
        "calibrated at x1; at the learning rate CE chose for the tables (x3): 1.4 points RMS, largest gap +2.0 (top-1)")
    assert learning_rates.fitted_gap_at_chosen_rate(fitted.to_json(), chosen.to_json()) == \
        learning_rates.fitted_gap_at_chosen_rate(fitted, chosen)  # their stored JSON: the same
    fitted = replace(fitted, ce_multipliers={"cross_entropy top1": 3.0})  # calibrated at the rate it chose: one line
    assert learning_rates.summary_line(QUICK, "imagenet") == "calibrated at x1"
    monkeypatch.setattr(learning_rates, "current_entry", lambda profile, setup: None)
    assert learning_rates.summary_line(QUICK, "imagenet") == "calibrated at x1"


def test_the_seeds_table_reads_the_tables_own_ce_runs_at_every_seed(monkeypatch):
    fitted = Calibration(dataset="imagenet_like", targets=tuple(Number(**asdict(t), ours=0.0)
                                                                for t in calibration.STAND_INS["imagenet"].targets))
    chosen = LearningRates(scales=QUICK.imagenet.lr_scales)
    monkeypatch.setattr(calibration, "current_entry", lambda profile, setup: fitted if setup == "imagenet" else None)
    monkeypatch.setattr(learning_rates, "current_entry", lambda profile, setup: chosen)
    trained = []

    def train(config):  # a fake run whose test top-1 and top-5 are set by its seed
        trained.append(config.key())
        return {"test": {"top": {"1": 0.5 + 0.1 * config.seed, "5": 0.8 + 0.05 * config.seed}}}

    shown = learning_rates.cross_entropy_seeds_table(QUICK, train).loc["imagenet_like"]
    tables_runs = {cell.config.key() for cell in grids.imagenet(QUICK) if cell.labels["loss"] == "cross_entropy"
                   and cell.labels["K"] == 1}
    assert set(trained) == tables_runs and len(tables_runs) == len(QUICK.imagenet.seeds) == 2
    assert shown.loc["top-1", "each seed (%)"] == "50.0, 60.0" and shown.loc["top-1", "mean (%)"] == 55.0
    assert shown.loc["top-1", "seeds' range (points)"] == 10.0
    assert shown.loc["top-1", "gap of the mean (points)"] == round(55.0 - shown.loc["top-1", "paper (%)"], 1)
    assert shown.loc["top-5 (selected on top-1)", "each seed (%)"] == "80.0, 85.0"


def test_a_stored_choice_is_stale_once_a_losss_options_change(monkeypatch):
    """A choice names the run it was made from: change a loss's options in the grid (here LDAM's largest margin) and
    the stored choice no longer applies, so ``make calibrate`` chooses again."""
    entry = tuned.learning_rates("quick")["plantnet"]
    assert learning_rates.is_current(entry, QUICK, "plantnet")
    grid = learning_rates.SELECTION_GRIDS["plantnet"]

    def changed(profile):
        return [replace(cell, config=cell.config.replace(loss_options={**cell.config.loss_options, "max_margin": 0.3}))
                if cell.config.loss == "ldam" else cell for cell in grid(profile)]

    monkeypatch.setitem(learning_rates.SELECTION_GRIDS, "plantnet", changed)
    assert not learning_rates.is_current(entry, QUICK, "plantnet")


def test_a_stored_choice_whose_ce_numbers_are_not_every_seeds_mean_is_stale():
    """CE's numbers at the chosen rate are the mean of the setup's seeds, as the calibration's: numbers measured on
    fewer seeds (as before the calibration fitted the mean) make ``make calibrate`` measure them again."""
    entry = tuned.learning_rates("quick")["plantnet"]
    assert learning_rates.is_current(entry, QUICK, "plantnet")
    first_seed = replace(entry, cross_entropy={label: replace(number, seeds=number.seeds[:1])
                                               for label, number in entry.cross_entropy.items()})
    assert not learning_rates.is_current(first_seed, QUICK, "plantnet")
    assert not learning_rates.is_current(replace(entry, cross_entropy={}), QUICK, "plantnet")
