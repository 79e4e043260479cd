"""The label-noise capacity probe (:mod:`experiments.probes.label_noise_capacity`): the runs it varies are the tables' CE
runs, its rows come from real trainings, and the README's block reads its CSV with the runs' provenance."""

from __future__ import annotations

from dataclasses import replace

import pytest

from experiments.engine.store import ResultsStore, write_csv
from experiments.engine.train import run
from experiments.probes import label_noise_capacity
from experiments.probes.label_noise_capacity import NOISE, Variant
from experiments.publishing import readme
from experiments.spec import grids
from experiments.spec.profiles import QUICK, SMOKE

SHORT = replace(SMOKE, cifar=replace(SMOKE.cifar, epochs=1, milestones=(),
                                     dataset_options={**SMOKE.cifar.dataset_options, "per_class_train": 3}))


@pytest.mark.parametrize("loss", ["cross_entropy", *label_noise_capacity.COMPARED])
def test_the_probe_starts_from_the_tables_runs_at_their_chosen_rate(loss):
    configs = label_noise_capacity.table_configs(QUICK, loss)
    table = [c.config for c in grids.label_noise(QUICK) if c.labels["loss"] == loss
             and c.labels["seed"] == QUICK.cifar.seeds[0]]
    assert sorted(configs) == [0, NOISE] and {config.loss for config in configs.values()} == {loss}
    assert all(config in table for config in configs.values())
    assert configs[NOISE].dataset_options["noise"] == NOISE and "noise" not in configs[0].dataset_options
    assert configs[0].lr == pytest.approx(QUICK.cifar.lr * QUICK.cifar.lr_scales.get(f"{loss} top5", 1.0))


def test_a_variant_scales_the_schedule_and_the_width_and_nothing_else():
    config = label_noise_capacity.table_configs(QUICK)[NOISE]
    longer = Variant("test", 4, 2).apply(config)
    assert longer.epochs == 4 * config.epochs and longer.milestones == tuple(4 * m for m in config.milestones)
    assert longer.model_options["width"] == 2 * config.model_options["width"]
    assert longer.replace(epochs=config.epochs, milestones=config.milestones,
                          model_options=config.model_options) == config
    assert Variant("same", 1, 1).apply(config) == config


@pytest.fixture(scope="module")
def smoke_rows(tmp_path_factory) -> list[dict]:
    """Real trainings of the probe, at the smoke profile shortened to one epoch on fewer images."""
    store = ResultsStore(tmp_path_factory.mktemp("store"))
    train = lambda config: run(config, store)  # noqa: E731
    return (label_noise_capacity.measure(SHORT, train, (Variant("as is", 1, 1), Variant("longer", 2, 1)))
            + label_noise_capacity.measure(SHORT, train, (Variant("longer", 2, 1),), "smooth_hinge"))


def test_rows_come_from_trainings_at_both_noise_levels(smoke_rows):
    assert [(r["loss"], r["variant"], r["p"]) for r in smoke_rows] == [
        ("cross_entropy", "as is", 0), ("cross_entropy", "as is", NOISE), ("cross_entropy", "longer", 0),
        ("cross_entropy", "longer", NOISE), ("smooth_hinge", "longer", 0), ("smooth_hinge", "longer", NOISE)]
    assert [r["epochs"] for r in smoke_rows] == [SHORT.cifar.epochs] * 2 + [2 * SHORT.cifar.epochs] * 4
    for r in smoke_rows:
        assert 0 <= float(r["top1"]) <= float(r["top5"]) <= 100 and r["device"].startswith("cpu")
    clean, noisy = smoke_rows[:2]
    assert clean["flipped_fit_noisy"] == "" and 0 <= float(noisy["flipped_fit_noisy"]) <= 100
    assert float(noisy["flipped_fit_noisy"]) + float(noisy["flipped_fit_true"]) <= 100


def test_readme_block_reads_the_csv_with_the_drops_and_the_provenance(smoke_rows, tmp_path):
    assert "run `python -m experiments.probes.label_noise_capacity quick`" in readme.label_noise_capacity(tmp_path)
    rows = [{**r, "top1": top1, "top5": top5} for r, top1, top5 in
            zip(smoke_rows, ("50.0", "40.5", "60.0", "45.0", "30.0", "29.0"), ("80.0", "77.0", "90.0", "70.0", "85.0", "84.0"))]
    write_csv(rows, label_noise_capacity.FIELDS, label_noise_capacity.path_for("quick", tmp_path))
    text = readme.label_noise_capacity(tmp_path)
    assert "| as is |" in text and "50.0 -> 40.5 (-9.5)" in text and "80.0 -> 77.0 (-3.0)" in text
    assert "60.0 -> 45.0 (-15.0)" in text and "(drop; paper -14.8)" in text and "(drop; paper -10.6)" in text
    assert "| longer: loss |" in text and "| as is: loss |" not in text
    assert "| smooth_hinge | 85.0 -> 84.0 (-1.0) | 93.3 -> 87.4 (-5.9) | 30.0 -> 29.0 (-1.0) |" in text
    crowded = [r["crowded_top5"] for r in smoke_rows if r["loss"] == "smooth_hinge"]
    assert all(isinstance(n, int) for n in crowded) and f"| {crowded[0]} -> {crowded[1]} |" in text
    old_csv = [{k: v for k, v in r.items() if k != "crowded_top5"} for r in rows]  # written before it was recorded
    write_csv(old_csv, [f for f in label_noise_capacity.FIELDS if f != "crowded_top5"],
              label_noise_capacity.path_for("quick", tmp_path))
    assert "| - -> - |" in readme.label_noise_capacity(tmp_path)
    assert "| cross_entropy | 90.0 -> 70.0 (-20.0) | 94.2 -> 83.6 (-10.6) |" in text
    assert f"commit {smoke_rows[0]['commit'][:10]}" in text and "label_noise_capacity_quick.csv" in text
