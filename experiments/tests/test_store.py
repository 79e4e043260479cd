"""The results store's promises: a damaged file never ends in a traceback and never passes for a run's result; a
store file is read as data, never run as code (a crafted checkpoint is refused before anything in it runs); records
are strict JSON. Each damage is one a crashed disk, a copy, a hand edit or another writer of a shared store makes."""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.engine.config import RunConfig
from experiments.engine.store import DamagedStoreWarning, ResultsStore, UnreadableStoreFile, computed
from experiments.engine.models import build_model
from experiments.engine.train import _fits, run
from experiments.tests.conftest import deterministic_algorithms
from experiments.tests.test_experiments import TINY

MARKER = "ran.txt"


def _cut(path: Path) -> None:
    """Damage a file as a full disk or a copy cut short would: keep its first half."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _same_run(record: dict, other: dict) -> bool:
    """Two records of one run that computed the same (:func:`experiments.engine.store.computed`)."""
    return computed(record) == computed(other)


def leave_marker(path: str) -> None:
    """What a crafted file runs if it is unpickled: it leaves a file, so the test sees whether it ran."""
    Path(path).write_text("code from the store ran")


class Payload:
    """An object whose unpickling calls :func:`leave_marker`: a callable hidden in a checkpoint or a batch file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return leave_marker, (self.marker,)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """TINY trained without interruption: what every resumed or retrained run must give."""
    with deterministic_algorithms():
        return run(RunConfig(**TINY), ResultsStore(tmp_path_factory.mktemp("whole")))


@pytest.fixture(scope="module")
def killed_once(tmp_path_factory) -> Path:
    """TINY stopped after two of its three epochs, trained once: a store with a last and a previous checkpoint."""
    root = tmp_path_factory.mktemp("killed_once")
    with deterministic_algorithms():
        assert run(RunConfig(**TINY), ResultsStore(root), stop_after_epochs=2) is None
    return root


@pytest.fixture
def killed(tmp_path, killed_once, deterministic) -> tuple[RunConfig, ResultsStore]:
    """A copy of :func:`killed_once`'s store, for a test to damage."""
    shutil.copytree(killed_once, tmp_path / "killed")
    return RunConfig(**TINY), ResultsStore(tmp_path / "killed")


def test_records_are_strict_json_and_state_each_epoch_s_own_learning_rate(whole):
    # TINY's classes are all few-shot: the medium and many groups are empty, with no accuracy to give
    assert whole["test"]["macro_top_by_group"]["many"] == {"n_classes": 0, "1": None, "5": None}
    store_text = json.dumps(whole)

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    assert json.loads(store_text, parse_constant=refuse) == whole
    # lr 0.05, divided by 10 at the milestone (after 2 epochs): the third epoch is trained at 0.005
    assert [entry["lr"] for entry in whole["history"]] == pytest.approx([0.05, 0.05, 0.005])


def test_a_cut_record_is_set_aside_and_its_run_trained_again(tmp_path, whole, deterministic):
    config, store = RunConfig(**TINY), ResultsStore(tmp_path)
    path, other = store.record_path(config.key()), store.record_path(config.replace(seed=2).key())
    for record_path, record in ((path, whole), (other, {**whole, "key": other.stem,
                                                        "config": config.replace(seed=2).to_dict()})):
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record))
    _cut(other)
    with pytest.warns(DamagedStoreWarning, match=f"{other.name} is damaged .*kept as {other.name}.damaged.*trained again"):
        assert [r["key"] for r in store.records()] == [config.key()]
    assert other.with_name(other.name + ".damaged").exists() and not other.exists()
    _cut(path)
    with pytest.warns(DamagedStoreWarning, match="trained again"):  # run() itself meets the damaged record
        assert _same_run(run(config, store), whole)


def test_a_record_another_reader_set_aside_first_is_none_without_a_traceback(tmp_path, whole):
    """Two followers of one store meet the same damaged record: the second finds it gone when it reads (or when it
    renames it) and counts it as no record, leaving the first's ``.damaged`` copy and warning as the only ones."""
    config, store = RunConfig(**TINY), ResultsStore(tmp_path)
    path = store.record_path(config.key())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(whole)[:40])
    real_read = Path.read_text

    def set_aside_by_another_reader_first(self, *args, **kwargs):
        text = real_read(self, *args, **kwargs)
        if self == path:
            self.replace(self.with_name(self.name + ".damaged"))
        return text

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Path, "read_text", set_aside_by_another_reader_first)
            assert store.finished(config.key()) is None
        assert store.finished(config.key()) is None  # gone before the read: none too
    assert [p.name for p in path.parent.iterdir()] == [path.name + ".damaged"]


def _damages(record: dict, other: dict) -> dict:
    """Records that parse but are not this run's: each must be set aside, never returned nor a traceback."""
    without_test = {k: v for k, v in record.items() if k != "test"}
    return {
        "a list": [record],
        "an empty object": {},
        "no test metrics": without_test,
        "an epoch as text": {**record, "selected_epoch": str(record["selected_epoch"])},
        "a history of numbers": {**record, "history": [1, 2, 3]},
        "test without top": {**record, "test": {"macro_top": record["test"]["macro_top"]}},
        "another run's record": other,
        "another run's config under this key": {**other, "key": record["key"]},
        "a config that is no config": {**record, "config": {**record["config"], "loss": "no_such_loss"}},
        "a config with an unknown field": {**record, "config": {**record["config"], "colour": "red"}},
        "a boolean epoch": {**record, "selected_epoch": True},
    }


def test_a_record_that_parses_but_is_not_this_run_s_is_set_aside_and_the_run_trained_again(tmp_path, whole):
    config = RunConfig(**TINY)
    other = json.loads(json.dumps({**whole, "key": config.replace(seed=2).key(),
                                   "config": config.replace(seed=2).to_dict()}))
    for name, damaged in _damages(whole, other).items():
        store = ResultsStore(tmp_path / name.replace(" ", "_").replace("'", ""))
        path = store.record_path(config.key())
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(damaged))
        with pytest.warns(DamagedStoreWarning, match=f"{path.name} is damaged .*trained again"):
            assert store.finished(config.key()) is None, name
        assert path.with_name(path.name + ".damaged").exists() and not path.exists(), name


def test_a_record_that_is_a_folder_or_not_text_is_set_aside(tmp_path, whole):
    config, store = RunConfig(**TINY), ResultsStore(tmp_path)
    path = store.record_path(config.key())
    path.mkdir(parents=True)
    with pytest.warns(DamagedStoreWarning, match="IsADirectoryError"):
        assert store.finished(config.key()) is None
    path.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.warns(DamagedStoreWarning, match=f"UnicodeDecodeError.*kept as {path.name}.damaged.2"):
        assert store.records() == []
    assert path.with_name(path.name + ".damaged").is_dir()  # the first damaged file is kept too


def test_a_record_or_checkpoint_this_user_may_not_read_is_left_whole_and_named_not_set_aside(killed, whole,
                                                                                            monkeypatch, capsys):
    """In a group's store, a file a writer made private (umask 077) is refused by the system to the others: it is not
    damaged, so it is neither renamed aside nor its run trained again; the error names it and the mend. (The tests run
    as root, which no permission stops: the system's refusal is made at the read.)"""
    config, store = killed
    record = store.record_path(config.replace(seed=2).key())
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({**whole, "key": record.stem, "config": config.replace(seed=2).to_dict()}))
    checkpoint = store.checkpoint_path(config.key())
    private = {record, checkpoint}
    real_read_text, real_load = Path.read_text, torch.load

    def refused(path):
        if Path(path) in private:
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "read_text", lambda path, *a, **k: refused(path) or real_read_text(path, *a, **k))
    monkeypatch.setattr(torch, "load", lambda path, *a, **k: refused(path) or real_load(path, *a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedStoreWarning)
        with pytest.raises(UnreadableStoreFile, match=f"{record} cannot be read by this user .Permission denied.: "
                           r"left as it is.*chmod -R g\+rwX"):
            store.records()
        with pytest.raises(UnreadableStoreFile, match=f"{checkpoint} cannot be read by this user"):
            run(config, store)
        from experiments.scale import cli, executors
        from experiments.scale.plan import PlannedRun

        monkeypatch.setattr(cli, "plan", lambda profile: [PlannedRun.outside_plan(config.replace(seed=2))])
        command = lambda: cli.main(["plan", "smoke", "--store", str(store.root)])  # noqa: E731
        assert executors.command_status(command) == 2  # one line, no traceback
        assert capsys.readouterr().err == f"error: {record} cannot be read by this user (Permission denied): left " \
            "as it is. Its writer made it private (a umask of 077); in a store shared by a group, give it to the " \
            f"group (chmod -R g+rwX {store.root}) and have its writers use umask 002 " \
            "(docs/reproducing.md#sharing-a-store)\n"
    assert record.exists() and checkpoint.exists() and not list(store.root.rglob("*.damaged*"))


def test_a_cut_checkpoint_resumes_from_the_previous_one_to_the_same_result(killed, whole):
    config, store = killed
    last = store.checkpoint_path(config.key())
    _cut(last)
    with pytest.warns(DamagedStoreWarning, match=f"{last.name} is damaged .*resumes from the previous checkpoint"):
        assert _same_run(run(config, store), whole)
    assert last.with_name(last.name + ".damaged").exists()


def test_two_cut_checkpoints_start_the_run_again(killed, whole):
    config, store = killed
    _cut(store.checkpoint_path(config.key()))
    _cut(store.previous_checkpoint_path(config.key()))
    with pytest.warns(DamagedStoreWarning) as warned:
        resumed = run(config, store)
    assert ["resumes from the previous checkpoint" in str(w.message) for w in warned] == [True, False]
    assert "starts again from its first epoch" in str(warned[1].message)
    assert _same_run(resumed, whole)


def test_a_checkpoint_carrying_a_callable_is_refused_before_it_runs(killed, whole, tmp_path):
    config, store = killed
    last, marker = store.checkpoint_path(config.key()), tmp_path / MARKER
    checkpoint = torch.load(last, weights_only=True)
    torch.save({**checkpoint, "state": {**checkpoint["state"], "note": Payload(marker)}}, last)
    torch.load(last, weights_only=False, map_location="cpu")  # the payload is live: a plain load runs it
    assert marker.exists()
    marker.unlink()
    with pytest.warns(DamagedStoreWarning, match=f"{last.name} is damaged .it holds the Python object "
                                                 f"{__name__}.leave_marker, .*resumes from the previous"):
        resumed = run(config, store)
    assert not marker.exists()
    assert _same_run(resumed, whole)


def _checkpoint_damages(checkpoint: dict, config: RunConfig) -> dict:
    """Checkpoints that load as data but cannot resume this run: each must be set aside before any part is loaded."""
    state = checkpoint["state"]
    wider = run_model_state(config.replace(model_options={"width": 16}))
    return {
        "no rng": {k: v for k, v in checkpoint.items() if k != "rng"},
        "no model": {k: v for k, v in checkpoint.items() if k != "model"},
        "another run's key": {**checkpoint, "key": config.replace(seed=2).key()},
        "another model's weights": {**checkpoint, "model": wider},
        "an epoch past the run's": {**checkpoint, "state": {**state, "epoch": config.epochs + 1}},
        "a history shorter than its epoch": {**checkpoint, "state": {**state, "history": state["history"][:1]}},
        "a selection without its model": {**checkpoint, "state": {**state, "models": {}}},
        "numpy's state missing": {**checkpoint, "rng": {k: v for k, v in checkpoint["rng"].items() if k != "numpy"}},
        "a list": [checkpoint],
    }


def run_model_state(config: RunConfig) -> dict:
    return build_model(config.model, 100, **config.model_options).state_dict()


def test_a_checkpoint_that_loads_but_cannot_resume_this_run_is_set_aside(killed, whole):
    config, store = killed
    last, previous = store.checkpoint_path(config.key()), store.previous_checkpoint_path(config.key())
    good = torch.load(last, weights_only=True)
    kept = previous.read_bytes()
    for name, damaged in _checkpoint_damages(good, config).items():
        torch.save(damaged, last)
        with pytest.warns(DamagedStoreWarning, match=f"{last.name} is damaged .*resumes from the previous"):
            assert store.load_checkpoint(config.key(), _fits_for(config))["state"]["epoch"] == 1, name
        assert last.with_name(last.name + ".damaged").exists(), name
        previous.write_bytes(kept)
    torch.save({k: v for k, v in good.items() if k != "rng"}, last)
    with pytest.warns(DamagedStoreWarning, match="has no 'rng'"):
        assert _same_run(run(config, store), whole)


def _fits_for(config: RunConfig):
    """The engine's own check of a checkpoint against ``config``'s model and optimiser."""
    model = build_model(config.model, 100, **config.model_options)
    return _fits(model, torch.optim.SGD(model.parameters(), lr=config.lr), config)


def test_a_checkpoint_written_before_checkpoints_were_data_only_starts_the_run_again(killed, whole):
    config, store = killed
    for path in (store.checkpoint_path(config.key()), store.previous_checkpoint_path(config.key())):
        checkpoint = torch.load(path, weights_only=True)
        legacy = {k: v for k, v in checkpoint.items() if k != "key"}  # no key, numpy's state as numpy's tuple
        legacy["rng"] = {**checkpoint["rng"], "numpy": np.random.get_state()}
        torch.save(legacy, path)
    with pytest.warns(DamagedStoreWarning) as warned:
        resumed = run(config, store)
    assert "starts again from its first epoch" in str(warned[-1].message)
    assert _same_run(resumed, whole)


def test_a_checkpoint_that_is_a_folder_is_set_aside(killed, whole):
    config, store = killed
    last = store.checkpoint_path(config.key())
    last.unlink()
    last.mkdir()
    with pytest.warns(DamagedStoreWarning, match="resumes from the previous"):
        assert _same_run(run(config, store), whole)


def test_a_crafted_pickle_is_refused_by_every_reader_of_the_store(tmp_path):
    # the store never unpickles anything but torch's data-only format: a plain pickle as a checkpoint is refused
    config, store = RunConfig(**TINY), ResultsStore(tmp_path)
    path, marker = store.checkpoint_path(config.key()), tmp_path / MARKER
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.warns(DamagedStoreWarning, match="starts again from its first epoch"):
        assert store.load_checkpoint(config.key()) is None
    assert not marker.exists()


def test_a_divergence_is_kept_under_its_training_and_a_damaged_one_is_set_aside(tmp_path):
    """A training whose loss became NaN is an outcome the store keeps (its message, under its training key); a file
    that is not one (cut, another training's, a folder) is set aside with a warning, and the run trained again."""
    store, key = ResultsStore(tmp_path), RunConfig(**TINY).training_key()
    assert store.divergence(key) is None
    store.save_divergence(key, "the training loss became NaN in epoch 2", "a" * 40)
    assert store.divergence(key) == "the training loss became NaN in epoch 2"
    assert store.divergence_commit(key) == "a" * 40  # the commit that trained it, for a notebook's manifest
    path = store.divergence_path(key)
    path.write_text(json.dumps({"training_key": key, "error": "NaN"}))  # kept before divergences named their commit
    assert store.divergence(key) == "NaN" and store.divergence_commit(key) is None
    damages = {"cut": lambda: _cut(path),
               "another training's": lambda: path.write_text(json.dumps({"training_key": "other", "error": "x"})),
               "a folder": lambda: (path.unlink(), path.mkdir()),
               "a commit that is not text": lambda: path.write_text(json.dumps({"training_key": key, "error": "x",
                                                                                 "git_commit": 3}))}
    for name, damage in damages.items():
        store.save_divergence(key, "the training loss became NaN in epoch 2", "a" * 40)
        damage()
        with pytest.warns(DamagedStoreWarning, match="the run will be trained again"):
            assert store.divergence(key) is None, name
        assert not path.exists()
