"""Runs trained stacked into one model by the engine (:func:`experiments.engine.train.run_stacked`): the records of
runs trained alone up to rounding, each run's checkpoints in a lone run's form, an interrupted group resumed to the
same records, and what cannot be stacked refused."""

import pytest

from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
from experiments.engine.train import run, run_stacked
from experiments.tests.test_experiments import TINY

#: Two runs that differ in their loss, seed and selection, as a table's runs do; deterministic losses, so that alone
#: and stacked they differ by rounding only.
RUNS = [RunConfig(**{**TINY, "loss": "cross_entropy", "loss_options": {}, "seed": 1}),
        RunConfig(**{**TINY, "loss": "smooth_hinge", "loss_options": {"k": 5, "tau": 1.0}, "seed": 2,
                     "selection_metric": "macro_top5"})]
TIMINGS = ("epoch_seconds", "loss_seconds")


def _without_timings(record: dict) -> dict:
    history = [{name: value for name, value in epoch.items() if name not in TIMINGS} for epoch in record["history"]]
    return {**{name: value for name, value in record.items() if name != "provenance"}, "history": history}


def test_stacked_runs_get_the_records_of_runs_trained_alone_up_to_rounding(tmp_path):
    alone = [run(config, ResultsStore(tmp_path / "alone")) for config in RUNS]
    stacked = run_stacked(RUNS, ResultsStore(tmp_path / "stacked"))
    for own, together in zip(alone, stacked):
        assert together["key"] == own["key"] and together["selected_epoch"] == own["selected_epoch"]
        for epoch_alone, epoch_together in zip(own["history"], together["history"], strict=True):
            assert epoch_together["train_loss"] == pytest.approx(epoch_alone["train_loss"], rel=1e-4)
            assert epoch_together["grad_nonzero"] == pytest.approx(epoch_alone["grad_nonzero"], rel=1e-4)
            assert epoch_together["val"] == epoch_alone["val"]  # counts of images: rounding does not move them
            assert epoch_together["stack"] == 2 and "stack" not in epoch_alone
        assert together["test"] == own["test"]
        assert together["provenance"]["stacked_with"] == [config.training_key() for config in RUNS]
        assert "stacked_with" not in own["provenance"]
    store = ResultsStore(tmp_path / "stacked")  # the siblings' records too, and no checkpoint left
    assert all(store.finished(sibling.key()) for config in RUNS for sibling in config.siblings())
    assert not any(store.checkpoint_path(config.key()).exists() for config in RUNS)
    assert run_stacked(RUNS, store) == stacked  # finished: read back, never recomputed


def test_an_interrupted_stack_resumes_to_the_same_records_and_its_runs_can_finish_alone(tmp_path):
    noised = [RunConfig(**TINY), RUNS[1]]  # the noised loss draws from the random stream the checkpoints hold
    whole = run_stacked(noised, ResultsStore(tmp_path / "whole"))
    interrupted = ResultsStore(tmp_path / "interrupted")
    assert run_stacked(noised, interrupted, stop_after_epochs=1) == [None, None]
    checkpoint = interrupted.load_checkpoint(noised[0].key())  # a lone run's form: its own weights and momenta
    assert checkpoint["state"]["epoch"] == 1 and {"model", "optimiser", "schedule", "state", "rng"} <= set(checkpoint)
    assert checkpoint["model"]["features.0.weight"].shape == (8, 3, 3, 3)
    resumed = run_stacked(noised, interrupted)
    assert [_without_timings(record) for record in resumed] == [_without_timings(record) for record in whole]

    alone = ResultsStore(tmp_path / "alone")  # a run checkpointed by a stack goes on alone
    run_stacked(noised, alone, stop_after_epochs=1)
    record = run(noised[1], alone)
    assert [epoch.get("stack") for epoch in record["history"]] == [2, None, None]
    assert "stacked_with" not in record["provenance"]


def test_runs_that_cannot_share_a_step_are_refused_with_what_differs(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(ValueError, match=f"share their data, model, batches and optimiser settings; "
                                         f"\\['{RUNS[0].replace(lr=0.1).key()}'\\] differ"):
        run_stacked([RUNS[1], RUNS[0].replace(lr=0.1)], store)
    run(RUNS[0], store, stop_after_epochs=1)
    with pytest.raises(ValueError, match=r"resume from one epoch, got checkpoints at epochs \[0, 1\]"):
        run_stacked(RUNS, store)
    with pytest.raises(ValueError, match="'compile_mode' should be None or one of"):
        run_stacked(RUNS, store, compile_mode="fast")
