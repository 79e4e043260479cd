"""The probes' command line (:mod:`experiments.probes.command`): bad input ends in one error line before anything
trains, the real datasets are read from ``--data-root``, and each run trains under the store's claim."""

from __future__ import annotations

import json
import threading
import time

import pytest

from experiments.engine import run_claim
from experiments.engine import train as engine
from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
from experiments.probes import command, crowding, label_noise_capacity
from experiments.scale import executors
from experiments.tests.test_experiments import TINY
from experiments.tests.test_stacked_runs import _nan_for

BAD_DEVICE = (["smoke", "--device", "gpu"], "error: --device should be cpu, cuda or cuda:N, got 'gpu'\n")
REFUSED = [(crowding, *BAD_DEVICE), (label_noise_capacity, *BAD_DEVICE),
           (crowding, ["paper"], "error: the probe's runs of the paper profile read the real cifar100, imagenet_lt, "
                                 "plantnet: pass the datasets' root (--data-root, as make DATA=)\n"),
           (crowding, ["paper", "--data-root", "{tmp}/none"], "error: the cifar100 dataset is not in {tmp}/none/cifar100: "
                                                              "`python -m data_prep cifar100 --root {tmp}/none/cifar100` "
                                                              "prepares it\n"),
           (label_noise_capacity, ["gpu"], "error: the gpu profile's CIFAR-100 runs train densenet40_40, which has "
                                           "no width to vary")]


@pytest.mark.parametrize("probe,arguments,message", REFUSED, ids=lambda value: getattr(value, "__name__", None))
def test_bad_input_ends_in_one_error_before_anything_trains(probe, arguments, message, tmp_path, capsys):
    arguments = [part.format(tmp=tmp_path) for part in arguments] + ["--store", str(tmp_path / "store")]
    assert executors.command_status(lambda: probe.main(arguments)) == 2
    error = capsys.readouterr().err
    assert error.startswith(message.format(tmp=tmp_path)) and "Traceback" not in error, error
    assert not (tmp_path / "store" / "claims").exists()


def test_each_real_dataset_is_read_from_its_own_folder_under_the_data_root(tmp_path, capsys):
    """As the notebooks and ``train`` read them (``make DATA=``): the root's cifar100/, imagenet/, plantnet_300K/."""
    for folder in ("cifar100", "imagenet", "plantnet_300K"):
        (tmp_path / "data" / folder).mkdir(parents=True)
    arguments = ["paper", "--data-root", str(tmp_path / "data"), "--store", str(tmp_path / "store")]
    assert executors.command_status(lambda: crowding.main(arguments)) == 2  # the first run finds an empty folder
    error = capsys.readouterr().err
    assert error.startswith("error: ") and f"{tmp_path}/data/cifar100/" in error and "Traceback" not in error, error


def test_a_probes_run_held_by_another_process_is_waited_for_not_trained_beside_it(tmp_path, monkeypatch):
    """A notebook or ``train`` on the same store holds the run: the probe trains it only once the claim is gone."""
    store, config = tmp_path / "store", RunConfig(**TINY)
    _, train = command.parse("probe", "", ["smoke", "--store", str(store)], lambda profile: [])
    started, real_run = [], run_claim.run
    monkeypatch.setattr(run_claim, "run", lambda *args, **kwargs: started.append(time.time()) or real_run(*args,
                                                                                                         **kwargs))
    claim = run_claim.claim_path(store, config.training_key())
    claim.parent.mkdir(parents=True)
    claim.write_text(json.dumps({"host": "another-node", "pid": 1, "since": time.time()}))  # fresh: live
    records = []
    probe = threading.Thread(target=lambda: records.append(train(config)))
    probe.start()
    probe.join(2.5)
    assert probe.is_alive() and not started
    released = time.time()
    claim.unlink()
    probe.join(120)
    assert records and records[0]["key"] == config.key()
    assert started and started[0] >= released  # trained by this process, once the holder had gone


def test_a_probes_run_that_diverged_ends_the_probe_in_one_line_and_is_not_trained_again(tmp_path, monkeypatch):
    """Exit 1 with the message, no traceback (``SystemExit`` of a text); the store keeps the NaN, read back after."""
    store, config = tmp_path / "store", RunConfig(**TINY)
    _, train = command.parse("probe", "", ["smoke", "--store", str(store)], lambda profile: [])
    monkeypatch.setattr(engine, "build_loss", _nan_for(config.loss))
    message = f"^error: the training loss became NaN .*; its NaN is kept in {store}/diverged/ .delete the file"
    with pytest.raises(SystemExit, match=message):
        train(config)
    monkeypatch.undo()  # the loss as it is: a run trained again would now finish
    with pytest.raises(SystemExit, match=message):
        train(config)  # read back from the store
    assert not ResultsStore(store).record_path(config.key()).exists()
