"""The crowding probe (:mod:`experiments.label_noise_crowding`): at the paper's eps its runs are the tables' own, at
the other eps nothing else changes, its rows come from real trainings, and the README's block reads its CSV."""

from __future__ import annotations

import pytest

from experiments import grids, label_noise_crowding, readme
from experiments.label_noise_crowding import EPSILONS
from experiments.profiles import QUICK, SMOKE
from experiments.store import ResultsStore, write_csv
from experiments.train import run


def test_the_probe_trains_the_tables_runs_and_changes_only_eps():
    pairs = label_noise_crowding.configs(QUICK)
    table = [cell.config for cell in grids.label_noise(QUICK) if cell.labels["loss"] != "smooth_hinge"]
    at_papers_eps = [config for epsilon, config in pairs if epsilon in (None, EPSILONS[0])]
    assert sorted(c.key() for c in at_papers_eps) == sorted(c.key() for c in table)
    papers = [config for epsilon, config in pairs if epsilon == EPSILONS[0]]
    for epsilon in EPSILONS[1:]:
        others = [config for e, config in pairs if e == epsilon]
        assert [c.replace(loss_options={**c.loss_options, "epsilon": EPSILONS[0]}) for c in others] == papers
        assert {c.loss_options["epsilon"] for c in others} == {epsilon}


@pytest.fixture(scope="module")
def smoke_rows(tmp_path_factory) -> list[dict]:
    store = ResultsStore(tmp_path_factory.mktemp("store"))
    return label_noise_crowding.measure(SMOKE, lambda config: run(config, store))


def test_rows_come_from_trainings_with_their_crowded_classes(smoke_rows):
    assert len(smoke_rows) == len(label_noise_crowding.configs(SMOKE))
    assert {r["epsilon"] for r in smoke_rows} == {"", *EPSILONS}
    for r in smoke_rows:
        assert 0 <= float(r["top1"]) <= float(r["top5"]) <= 100 and r["device"].startswith("cpu")
        assert 0 <= r["crowded_top1"] < 2 and 0 <= r["crowded_top5"] < 10  # top-K shares sum to K


def test_readme_block_reads_the_csv_with_each_seed_and_the_provenance(smoke_rows, tmp_path):
    assert "run `python -m experiments.label_noise_crowding quick`" in readme.label_noise_crowding(tmp_path)
    rows = [{**r, "p": p, "seed": seed, "top1": top1, "top5": "80.0", "crowded_top5": crowded}
            for r, p, seed, top1, crowded in zip(smoke_rows, (0.4, 0.4, 0.4, 0.4), (1, 0, 1, 0), ("30.0", "40.0", "3.0", "5.0"),
                                                 (0, 0, 4, 3))]
    rows = [{**r, "epsilon": epsilon, "loss": loss} for r, (loss, epsilon) in
            zip(rows, [("cross_entropy", "")] * 2 + [("noised_balanced", EPSILONS[0])] * 2)]
    write_csv(rows, label_noise_crowding.FIELDS, label_noise_crowding.path_for("quick", tmp_path))
    text = readme.label_noise_crowding(tmp_path)
    assert "| CE | 35.0 / 80.0 (0, 0) |" in text
    assert f"| noised, eps = {EPSILONS[0]:g} (the paper's) | 4.0 / 80.0 (3, 4) |" in text  # seeds in order
    assert f"commit {smoke_rows[0]['commit'][:10]}" in text and "label_noise_crowding_quick.csv" in text
