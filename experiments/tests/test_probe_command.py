"""The probes' command line (:mod:`experiments.probes.command`): bad input ends in one error line before anything
trains, the real datasets are read from ``--data-root``, and each run trains under the store's claim."""

from __future__ import annotations

import json
import threading
import time

import pytest

from experiments.engine import run_claim
from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
from experiments.probes import command, crowding, label_noise_capacity
from experiments.scale import executors
from experiments.tests.test_experiments import TINY

BAD_DEVICE = (["smoke", "--device", "gpu"], "error: --device should be cpu, cuda or cuda:N, got 'gpu'\n")
REFUSED = [(crowding, *BAD_DEVICE), (label_noise_capacity, *BAD_DEVICE),
           (crowding, ["paper"], "error: the real dataset 'cifar100' needs a data root: run `python -m data_prep "),
           (crowding, ["paper", "--data-root", "{tmp}/none"], "error: the "),  # a file of {tmp}/none, named below
           (label_noise_capacity, ["gpu"], "error: the gpu profile's CIFAR-100 runs train densenet40_40, which has "
                                           "no width to vary")]


@pytest.mark.parametrize("probe,arguments,message", REFUSED, ids=lambda value: getattr(value, "__name__", None))
def test_bad_input_ends_in_one_error_not_a_traceback(probe, arguments, message, tmp_path, capsys):
    arguments = [part.format(tmp=tmp_path) for part in arguments] + ["--store", str(tmp_path / "store")]
    assert executors.command_status(lambda: probe.main(arguments)) == 2
    error = capsys.readouterr().err
    assert error.startswith(message) and "Traceback" not in error, error
    if "--data-root" in arguments:
        assert f"--root {tmp_path}/none" in error  # the data root given, not the default
    assert not list((tmp_path / "store").rglob("*.claim*")) and not list((tmp_path / "store").rglob("*.pt"))


def test_a_probes_run_held_by_another_process_is_waited_for_not_trained_beside_it(tmp_path, monkeypatch):
    """A notebook or ``train`` on the same store holds the run: the probe trains it only once the claim is gone."""
    store, config = tmp_path / "store", RunConfig(**TINY)
    _, train = command.parse("probe", "", ["smoke", "--store", str(store)])
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
