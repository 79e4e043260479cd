"""The crowding probe (:mod:`experiments.probes.crowding`): at the paper's eps its runs are the tables' own, at the other eps
nothing else changes, its rows come from real trainings, and the README's block reads its CSV."""

from __future__ import annotations

from dataclasses import replace

import pytest

from experiments.engine.store import ResultsStore, write_csv
from experiments.engine.train import run
from experiments.probes import crowding
from experiments.publishing import readme
from experiments.spec import grids
from experiments.spec.profiles import QUICK, SMOKE

LABEL_NOISE, IMAGENET_LT, PLANTNET = crowding.PROBES


@pytest.mark.parametrize("probe", crowding.PROBES, ids=["label_noise", "imagenet_lt", "plantnet"])
def test_the_probe_trains_the_tables_runs_and_changes_only_eps(probe):
    found = probe.configs(QUICK)
    table = {cell.config.key() for cell in getattr(grids, probe.grid)(QUICK)}
    papers = [config for epsilon, _, config in found if epsilon == probe.epsilons[0]]
    assert papers and all(config.key() in table for epsilon, _, config in found
                          if epsilon in (None, probe.epsilons[0]))
    assert {config.loss for epsilon, _, config in found if epsilon is None} == {"cross_entropy"}
    for epsilon in probe.epsilons[1:]:
        others = [config for e, _, config in found if e == epsilon]
        assert [c.replace(loss_options={**c.loss_options, "epsilon": probe.epsilons[0]}) for c in others] == papers
        assert {c.loss_options["epsilon"] for c in others} == {epsilon}


def test_the_imagenet_lt_probe_keeps_the_runs_selected_on_their_own_k():
    found = IMAGENET_LT.configs(QUICK)
    assert {(level, config.selection_metric) for _, level, config in found} == {(3, "top3"), (5, "top5")}
    assert {config.loss_options["k"] for epsilon, _, config in found if epsilon is not None} == {3, 5}


def test_the_plantnet_probe_keeps_the_runs_selected_on_their_own_macro_average_top_k():
    found = PLANTNET.configs(QUICK)
    assert {(level, config.selection_metric) for _, level, config in found} == {
        (1, "macro_top1"), (3, "macro_top3"), (5, "macro_top5")}


def _one_epoch_on_fewer_images(setup):
    return replace(setup, epochs=1, milestones=(), dataset_options={**setup.dataset_options, "n_classes": 10, "n_images": 700})


@pytest.fixture(scope="module")
def smoke_rows(tmp_path_factory) -> list[dict]:
    """Real trainings of both long-tailed probes, at the smoke profile shortened to one epoch on fewer images."""
    store = ResultsStore(tmp_path_factory.mktemp("store"))
    short = replace(SMOKE, imagenet_lt=_one_epoch_on_fewer_images(SMOKE.imagenet_lt),
                    plantnet=_one_epoch_on_fewer_images(SMOKE.plantnet))
    return crowding.measure(short, lambda config: run(config, store), (IMAGENET_LT, PLANTNET))


def test_rows_come_from_trainings_with_their_crowded_classes(smoke_rows):
    assert len(smoke_rows) == len(IMAGENET_LT.configs(SMOKE)) + len(PLANTNET.configs(SMOKE))
    for probe in (IMAGENET_LT, PLANTNET):
        rows = [r for r in smoke_rows if r["probe"] == probe.name]
        assert {r["epsilon"] for r in rows} == {"", *probe.epsilons} and {r["metric"] for r in rows} == {probe.metric}
    for r in smoke_rows:
        assert 0 <= float(r["top1"]) <= float(r["topk"]) <= 100 and r["device"].startswith("cpu")
        assert 0 <= r["crowded_top1"] < 2 and 0 <= r["crowded_topk"] < 2 * r["k"]  # top-K shares sum to K
        assert r["k"] == r["level"]


def test_readme_block_reads_the_csv_with_each_seed_and_the_provenance(smoke_rows, tmp_path):
    assert "run `python -m experiments.probes.crowding quick`" in readme.crowding(tmp_path)
    shown = [(LABEL_NOISE.name, "cross_entropy", "", 1, "30.0", 0), (LABEL_NOISE.name, "cross_entropy", "", 0, "40.0", 0),
             (LABEL_NOISE.name, "noised_balanced", 0.2, 1, "3.0", 4), (LABEL_NOISE.name, "noised_balanced", 0.2, 0, "5.0", 3)]
    rows = [{**r, "probe": probe, "loss": loss, "epsilon": epsilon, "level": 0.4, "k": 5, "seed": seed, "top1": top1,
             "topk": "80.0", "crowded_topk": crowded}
            for r, (probe, loss, epsilon, seed, top1, crowded) in zip(smoke_rows, shown)]
    write_csv(rows + smoke_rows[len(shown):], crowding.FIELDS, crowding.path_for("quick", tmp_path))
    text = readme.crowding(tmp_path)
    assert f"| {LABEL_NOISE.name}: loss | p = 0.4 |" in text and "| CE | 35.0 / 80.0 (0, 0) |" in text
    assert "| noised_balanced, eps = 0.2 (the paper's) | 4.0 / 80.0 (3, 4) |" in text  # seeds in order
    assert f"| {IMAGENET_LT.name}: loss | K = 3 (top-1 / top-3) | K = 5 (top-1 / top-5) |" in text
    assert f"| {PLANTNET.name}: loss | K = 1 (macro top-1 / macro top-1) | K = 3 (macro top-1 / macro top-3) |" in text
    assert f"commit {smoke_rows[0]['commit'][:10]}" in text and "crowding_quick.csv" in text
