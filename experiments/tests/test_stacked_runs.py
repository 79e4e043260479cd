"""Runs trained stacked into one model by the engine (:func:`experiments.engine.train.run_stacked`): the records of
runs trained alone up to rounding, each run's checkpoints in a lone run's form, an interrupted group resumed to the
same records, runs at other epochs trained as other stacks, a diverging run named while the others keep their epoch,
a run held by another process left to it, and what cannot be stacked refused."""

import json
from pathlib import Path

import pytest
import torch

from experiments.engine import run_claim, train
from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore, computed
from experiments.engine.train import run, run_stacked
from experiments.provenance import git_commit
from experiments.scale import executors
from experiments.scale.plan import PlannedRun
from experiments.scale.progress import Progress
from experiments.tests.test_experiments import TINY
from topk.losses import build_loss

#: Two runs that differ in their loss, seed and selection, as a table's runs do; deterministic losses, so that alone
#: and stacked they differ by rounding only.
RUNS = [RunConfig(**{**TINY, "loss": "cross_entropy", "loss_options": {}, "seed": 1}),
        RunConfig(**{**TINY, "loss": "smooth_hinge", "loss_options": {"k": 5, "tau": 1.0}, "seed": 2,
                     "selection_metric": "macro_top5"})]
TIMINGS = ("epoch_seconds", "loss_seconds")


@pytest.fixture(autouse=True)
def one_convolution_algorithm():
    """Grouped and plain convolutions by one algorithm (oneDNN off): with oneDNN they take other paths on some
    processors (AVX-512), and the rounding apart grows over three epochs of training to 1e-4 of the loss. (Not through
    ``monkeypatch``, which a test undoes midway.)"""
    enabled, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
    yield
    torch.backends.mkldnn.enabled = enabled


#: One image of TINY's validation and test sets (one per class of 100): the most a borderline image moves an accuracy.
ONE_IMAGE = 1 / 100


def _within_one_image(measured, expected) -> bool:
    """Whether two evaluations (nested mappings of accuracies and class counts) agree up to one borderline image per
    accuracy, which rounding may flip (with oneDNN on, on AVX-512, a top-5 count moved by one image)."""
    if isinstance(expected, dict):
        return measured.keys() == expected.keys() and all(_within_one_image(measured[name], expected[name])
                                                          for name in expected)
    if isinstance(expected, float) and isinstance(measured, float):
        return abs(measured - expected) <= ONE_IMAGE + 1e-9
    return measured == expected


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
            assert _within_one_image(epoch_together["val"], epoch_alone["val"])
            assert epoch_together["stack"] == 2 and "stack" not in epoch_alone
        assert _within_one_image(together["test"], own["test"])
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


def test_runs_that_cannot_share_a_step_are_refused_with_what_differs(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    other = RUNS[0].replace(lr=0.1)
    with pytest.raises(ValueError, match=f"share their data, model, batches and optimiser settings; run {other.key()} "
                                         f"differs from run {RUNS[1].key()} in lr 0.1 against 0.05$"):
        run_stacked([RUNS[1], other], store)
    with pytest.raises(ValueError, match="'compile_mode' should be None or one of"):
        run_stacked(RUNS, store, compile_mode="fast")
    monkeypatch.setattr(train, "InMemoryBatches", type("NoSuchBatches", (), {}))  # as if read from files
    with pytest.raises(ValueError, match="stacked on in-memory datasets only: 'cifar100_like' is read from files"):
        run_stacked(RUNS, store)


def test_runs_at_other_epochs_train_as_other_stacks(tmp_path):
    """One run fresh (its noised loss draws from its own seed's stream, though another run was built after it), one
    resumed at epoch 1: each trains as a stack of one, to the lone runs' records bit for bit."""
    store, alone = ResultsStore(tmp_path / "mixed"), ResultsStore(tmp_path / "alone")
    configs = [RunConfig(**TINY), RUNS[1]]
    run(configs[1], store, stop_after_epochs=1)
    records = run_stacked(configs, store)
    for config, record in zip(configs, records):
        assert computed(record) == computed(run(config, alone))
        assert "stacked_with" not in record["provenance"]


def _nan_for(loss_name: str):
    """A ``build_loss`` whose ``loss_name`` gives NaN from the second step on, the others as they are."""
    class Diverging(torch.nn.Module):
        def __init__(self, loss):
            super().__init__()
            self.loss, self.steps = loss, 0

        def forward(self, scores, labels):
            self.steps += 1
            return self.loss(scores, labels) * (float("nan") if self.steps > 1 else 1.0)

    def build(name, **options):
        loss = build_loss(name, **options)
        return Diverging(loss) if name == loss_name else loss
    return build


def test_a_run_whose_loss_becomes_nan_is_named_and_the_others_keep_their_epoch(tmp_path, monkeypatch):
    """The runs of a stack are independent: one diverging does not spoil the others' weights, which save the epoch
    and then train on alone."""
    store, alone = ResultsStore(tmp_path / "stack"), ResultsStore(tmp_path / "alone")
    monkeypatch.setattr(train, "build_loss", _nan_for("smooth_hinge"))
    with pytest.raises(FloatingPointError, match=fr"the training of run {RUNS[1].key()} became NaN \(its loss or its "
                                                 r"scores\) in epoch 1; the 1 other runs of its stack saved that epoch"):
        run_stacked(RUNS, store)
    assert store.load_checkpoint(RUNS[0].key())["state"]["epoch"] == 1 and store.load_checkpoint(RUNS[1].key()) is None
    monkeypatch.undo()
    survivor = run(RUNS[0], store)
    expected = run(RUNS[0], alone)
    for epoch, lone in zip(survivor["history"], expected["history"], strict=True):
        assert epoch["train_loss"] == pytest.approx(lone["train_loss"], rel=1e-4)
        assert _within_one_image(epoch["val"], lone["val"])


def test_a_run_another_process_holds_is_left_to_it_and_the_rest_trains(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # in a Slurm task, its own claims would read as stale
    store = ResultsStore(tmp_path)
    assert run_claim.try_claim(store.root, RUNS[1].training_key())  # held by this live process, as by another
    first, second = run_claim.train_stacked_once(RUNS, store, wait=False)
    assert second is None and store.finished(RUNS[1].key()) is None
    assert first["key"] == RUNS[0].key() and "stacked_with" not in first["provenance"]  # trained alone


def test_a_stack_whose_run_another_host_takes_over_stops_and_its_own_runs_go_on_alone(tmp_path, monkeypatch):
    """A stack paused past its claims' staleness: another host took one run over meanwhile. The stack writes no
    checkpoint of either run; the run still held here trains alone to its record, the other is left to its holder."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    store, other = ResultsStore(tmp_path), {"host": "node-b", "pid": 2}
    real_run_stacked = run_claim.run_stacked

    def taken_over_while_paused(configs, *args, **kwargs):
        run_claim.claim_path(tmp_path, RUNS[1].training_key()).write_text(json.dumps(other))
        return real_run_stacked(configs, *args, **kwargs)

    monkeypatch.setattr(run_claim, "run_stacked", taken_over_while_paused)
    first, second = run_claim.train_stacked_once(RUNS, store, wait=False)
    assert second is None and not store.checkpoint_path(RUNS[1].key()).exists()
    assert first["key"] == RUNS[0].key() and "stacked_with" not in first["provenance"]  # trained alone
    assert run_claim.read_claim(run_claim.claim_path(tmp_path, RUNS[1].training_key())) == other


def test_a_failed_stack_leaves_the_run_another_process_holds_to_it_not_failed(tmp_path, monkeypatch):
    """``train``'s executors pass over a run another process claimed (``leave_held``): where the stack's own run
    diverges, the other is reported running elsewhere, to be followed, not failed."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    planned = [PlannedRun(config, ("test",), None, 0) for config in RUNS]
    assert run_claim.try_claim(tmp_path, RUNS[1].training_key())  # held by this live process, as by another
    monkeypatch.setattr(train, "build_loss", _nan_for("cross_entropy"))
    progress = Progress(planned)
    threads = torch.get_num_threads()
    try:
        executors.inline(planned, executors.TrainOptions(str(tmp_path), threads=1, stack=2, leave_held=True), progress)
    finally:
        torch.set_num_threads(threads)
        run_claim.release(tmp_path, RUNS[1].training_key())
    assert list(progress.diverged) == [RUNS[0].key()] and not progress.failed
    assert progress.left_to_others(planned) == planned[1:]


def test_a_failed_group_counts_the_runs_it_finished_as_finished(tmp_path, monkeypatch):
    """A group whose runs were at two epochs trains as two stacks: the first finished, the second diverged. The
    executor names the diverged run diverged (not failed) and the other finished."""
    planned = [PlannedRun(config, ("test",), None, 0) for config in RUNS]
    run(RUNS[0], ResultsStore(tmp_path), stop_after_epochs=1)
    monkeypatch.setattr(executors, "stacks", lambda runs, size, store: [runs])  # one group whatever their epochs
    monkeypatch.setattr(train, "build_loss", _nan_for("smooth_hinge"))
    progress = Progress(planned)
    threads = torch.get_num_threads()
    try:
        executors.inline(planned, executors.TrainOptions(str(tmp_path), threads=1, stack=2), progress)
    finally:
        torch.set_num_threads(threads)
    assert progress.done == 1 and list(progress.diverged) == [RUNS[1].key()] and not progress.failed
    assert "became NaN" in Path(progress.diverged[RUNS[1].key()]).read_text()


def test_a_stack_whose_run_becomes_nan_finishes_the_others_and_keeps_the_nan_for_every_later_reader(tmp_path,
                                                                                                     monkeypatch):
    """The survivor trains on alone to its record; the diverged run meets its NaN alone too, which the store keeps:
    asked again, with a loss that would now train, it raises the same error without training."""
    store = ResultsStore(tmp_path)
    monkeypatch.setattr(train, "build_loss", _nan_for("smooth_hinge"))
    with pytest.raises(FloatingPointError, match="the training loss became NaN in epoch 1") as raised:
        run_claim.train_stacked_once(RUNS, store)
    assert store.finished(RUNS[0].key()) is not None and store.finished(RUNS[1].key()) is None
    assert store.divergence(RUNS[1].training_key()) == str(raised.value)
    assert store.divergence_commit(RUNS[1].training_key()) == git_commit()  # as a record's provenance names it
    monkeypatch.undo()
    monkeypatch.setattr(run_claim, "run", lambda *args, **kwargs: pytest.fail("a diverged run was trained again"))
    with pytest.raises(FloatingPointError, match=f"^{str(raised.value)}$"):
        run_claim.train_once(RUNS[1], store)


def test_a_stack_is_evaluated_in_one_pass_as_each_run_alone_at_its_own_ks(monkeypatch):
    """The scores each run's metrics see, not only the metrics (near chance for untrained models)."""
    import data_prep
    from experiments.engine.batches import batches
    from experiments.engine.models import build_model
    from experiments.engine.stacked import StackedModels

    splits = data_prep.load(TINY["dataset"], None, **TINY["dataset_options"])
    val = batches(splits.val, torch.device("cpu"))
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(build_model(TINY["model"], splits.num_classes, **TINY["model_options"]))
    ks_of_runs = [(1, 5), (1, 3)]
    seen = {}  # the scores each metrics object was given, by its Ks
    update = train._Metrics.update
    monkeypatch.setattr(train._Metrics, "update", lambda metrics, scores, labels: (
        seen.setdefault(metrics.top.ks, []).append(scores.clone()), update(metrics, scores, labels)))
    together = train.evaluate_stacked(StackedModels(models), val, ks_of_runs, splits.class_counts, 7)
    stacked_scores, seen = seen, {}
    alone = [train.evaluate(model, val, ks, splits.class_counts, 7) for model, ks in zip(models, ks_of_runs)]
    assert together == alone and set(together[1]["top"]) == {"1", "3"}
    for ks in ks_of_runs:
        torch.testing.assert_close(torch.cat(stacked_scores[ks]), torch.cat(seen[ks]), rtol=1e-5, atol=1e-6)
