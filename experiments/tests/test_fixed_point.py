"""The calibration and the learning-rate choice alternated until CE's rate agrees: the steps taken, the rates each
calibration trains at, the stop when the rounds are used, and a resumed run taking up where it stopped."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from experiments.scale import calibrate
from experiments.spec import profiles, tuned
from experiments.spec.profiles import QUICK
from experiments.tuning import calibration, fixed_point, learning_rates

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the setups not settled here keep their defaults


@pytest.fixture
def calibrations(tmp_path, monkeypatch) -> list[dict]:
    """Stored choices and calibrations kept in ``tmp_path``; the rates and start of each calibration, in order."""
    monkeypatch.setattr(tuned, "CALIBRATED", tmp_path)
    calls, calibrate = [], calibration.calibrate

    def spy(profile, setup, train, **options):
        calls.append({name: value for name, value in options.items() if name != "ahead"})
        return calibrate(profile, setup, train, **options)

    monkeypatch.setattr(calibration, "calibrate", spy)
    return calls


class FakeTraining:
    """Runs whose CE test accuracies follow the stand-in's knobs, and whose validation value peaks, for every loss, at
    the learning-rate multiplier ``preferred(n)`` of the ``n``-th choice (counted by its CE runs at x0.3, which no
    calibration trains)."""

    def __init__(self, preferred):
        self.preferred, self.choices, self.trained = preferred, 0, []

    def __call__(self, config):
        multiplier = round(config.lr / QUICK.cifar.lr, 6)
        if config.loss == "cross_entropy" and multiplier == 0.3:
            self.choices += 1
        self.trained.append((config, multiplier, self.choices))
        knobs = config.dataset_options
        top1 = max(0.0, min(1.0, 1.2 - 0.25 * knobs["pixel_noise"] - 0.3 / knobs["class_contrast"])) - 0.03 * multiplier
        top5 = max(0.0, min(1.0, 1.3 - 0.2 * knobs["pixel_noise"])) - 0.1 * knobs.get("noise", 0.0) - 0.03 * multiplier
        best = self.preferred(self.choices)
        val = 0.9 - 0.1 * abs(multiplier - best)
        return {"config": config.to_dict(), "history": [{"val": {"top": {"5": val}}}],
                "test": {"top": {"1": top1 - 0.2 * knobs.get("noise", 0.0), "5": top5}}}


def _rates(calibrations: list[dict]) -> list[dict]:
    return [call["rates"] for call in calibrations]


def test_ce_calibrated_again_at_the_rate_it_chose_until_it_chooses_that_rate(calibrations):
    training, said = FakeTraining(lambda n: 3.0), []
    profile = fixed_point.settle(QUICK, "cifar", training, say=said.append)
    assert _rates(calibrations) == [{}, {"cross_entropy top5": 3.0}]  # the grid's rate, then CE's choice: settled
    assert training.choices == 2
    fitted = calibration.current_entry(profile, "cifar")
    assert fitted.round == 2 and fitted.ce_multipliers == {"cross_entropy top5": 3.0}
    assert calibrations[1]["start"] == fitted.start != QUICK.cifar.difficulty  # where round 1 ended
    noisy = {m for c, m, _ in training.trained if c.loss == "cross_entropy" and c.dataset_options.get("noise") == 0.4}
    assert noisy == {1.0, 3.0}  # CE's calibration runs (the only ones with label noise) at each round's rate
    assert profile.cifar.difficulty == fitted.knobs and profile.cifar.lr_scales["cross_entropy top5"] == 3.0
    assert fixed_point.status(profile, "cifar")["state"].startswith("settled")
    assert "at x3 the grid's learning rate" in calibration.summary_line(profile, "cifar")
    assert learning_rates.summary_line(profile, "cifar") == calibration.summary_line(profile, "cifar")
    chosen = learning_rates.current_entry(profile, "cifar").cross_entropy  # the calibration's own runs again
    assert {label: number.ours for label, number in chosen.items()} == {t.label: t.ours for t in fitted.targets}
    assert [line for line in said if "calibrating" in line][1].endswith("at x3 the grid's learning rate (round 2) ...")
    assert fixed_point.next_step(profile, "cifar") is None  # a second run does nothing
    assert fixed_point.settle(profile, "cifar", training) == profile and training.choices == 2


def test_a_choice_that_keeps_moving_stops_after_the_last_round_and_the_verdicts_quote_both_rates(calibrations):
    training = FakeTraining(lambda n: 3.0 if n % 2 else 10.0)
    profile = fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    assert _rates(calibrations) == [{}, {"cross_entropy top5": 3.0}, {"cross_entropy top5": 10.0}]
    assert [call["round_"] for call in calibrations] == [1, 2, 3]
    assert training.choices == fixed_point.MAX_ROUNDS
    status = fixed_point.status(profile, "cifar")
    assert status["round"] == 3 and status["CE calibrated at"] == "cross_entropy top5 x10"
    assert status["CE chose"] == "cross_entropy top5 x3" and status["state"].startswith("not settled after 3")
    assert "at the learning rate CE chose for the tables (x3)" in learning_rates.summary_line(profile, "cifar")


def test_an_interrupted_run_resumes_at_the_step_it_stopped_in(calibrations):
    class Interrupted(Exception):
        pass

    training = FakeTraining(lambda n: 3.0)

    def interrupted(config):
        if training.choices:  # the first choice: the run is killed
            raise Interrupted
        return training(config)

    with pytest.raises(Interrupted):
        fixed_point.settle(QUICK, "cifar", interrupted, say=lambda line: None)
    profile = profiles.recalibrated(QUICK)
    assert fixed_point.next_step(profile, "cifar") == fixed_point.Step("choose")
    fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    assert _rates(calibrations) == [{}, {"cross_entropy top5": 3.0}]  # round 1 was not searched again
    assert training.choices == 3  # the interrupted choice, made again, then the one on round 2's knobs


def test_a_changed_search_starts_from_the_knobs_and_rates_the_setups_last_calibration_ended_at(calibrations,
                                                                                                  monkeypatch):
    training = FakeTraining(lambda n: 3.0)
    fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    ended = tuned.calibrations("quick")["cifar"]
    stand_in = calibration.STAND_INS["cifar"]
    monkeypatch.setitem(calibration.STAND_INS, "cifar",
                        replace(stand_in, steps={knob: step / 2 for knob, step in stand_in.steps.items()}))
    assert calibration.current_entry(QUICK, "cifar") is None and calibration.earlier_search(QUICK, "cifar") == ended
    calibrations.clear()
    profile = fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    assert calibrations == [{"rates": ended.ce_multipliers, "start": ended.knobs, "round_": 1}]
    assert fixed_point.status(profile, "cifar")["state"].startswith("settled")
    changed = replace(QUICK, cifar=replace(QUICK.cifar, epochs=3, milestones=(2,)))
    assert calibration.earlier_search(changed, "cifar") is None  # a changed setup starts afresh
    assert fixed_point.next_step(changed, "cifar") == fixed_point.Step("calibrate")


def test_a_calibration_trained_by_earlier_code_is_searched_again_from_its_knobs_and_its_rates_chosen_again(
        calibrations, monkeypatch):
    """Fingerprints cover the setup and the search, not the code that trains: after the training's code changed, the
    stored calibration and choice are an earlier engine's numbers, so ``make calibrate`` makes both again, from the
    knobs and at the rates the earlier one ended at (round 1), and says why."""
    commit = {"now": "before"}
    for module in (calibration, learning_rates):
        monkeypatch.setattr(module, "git_commit", lambda: commit["now"])
    monkeypatch.setattr(calibration, "changed_since",
                        lambda made_at, files, uncommitted: commit["now"] == "after" != made_at)
    training = FakeTraining(lambda n: 3.0)
    settled = fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    assert fixed_point.next_step(settled, "cifar") is None
    commit["now"] = "after"  # the training's code changed since
    ended, chosen = tuned.calibrations("quick")["cifar"], tuned.learning_rates("quick")["cifar"]
    assert ended.commit == chosen.commit == "before" and ended.round == 2
    assert calibration.current_entry(settled, "cifar") == ended  # still the one the profile uses, shown stale
    assert learning_rates.current_entry(settled, "cifar") == chosen
    assert calibration.todays(ended) is None and calibration.todays(chosen) is None
    assert calibration.earlier_search(settled, "cifar") == ended
    assert fixed_point.next_step(settled, "cifar") == fixed_point.Step("calibrate", ended.ce_multipliers, ended.knobs)
    assert fixed_point.status(settled, "cifar")["state"] == ("trained by an earlier engine (before): run "
                                                           "`make calibrate`")
    assert "`make calibrate` searches again" in learning_rates.stale_text([ended, chosen])
    assert "`make calibrate` searches again" in learning_rates.summary_line(settled, "cifar")
    calibrations[:], choices = [], training.choices
    profile = fixed_point.settle(QUICK, "cifar", training, say=lambda line: None)
    assert calibrations == [{"rates": ended.ce_multipliers, "start": ended.knobs, "round_": 1}]
    assert training.choices == choices + 1  # the learning rates chosen again, on today's runs
    assert tuned.calibrations("quick")["cifar"].commit == tuned.learning_rates("quick")["cifar"].commit == "after"
    assert fixed_point.status(profile, "cifar")["state"].startswith("settled")
    assert learning_rates.stale_text([calibration.current_entry(profile, "cifar"),
                                      learning_rates.current_entry(profile, "cifar")]) is None


def test_a_calibration_refuses_a_stored_run_of_earlier_training_code(tmp_path, monkeypatch):
    """Searched again after the training's code changed, a calibration must not read back the earlier code's runs
    (a run's key holds no code): it stops, naming the run, its commit and how to get a store without them."""
    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore
    from experiments.engine.train import run
    from experiments.tests.test_experiments import TINY

    store, config = ResultsStore(tmp_path), RunConfig(**TINY)
    run(config, store)
    made_at = store.finished(config.key())["provenance"]["git_commit"]
    monkeypatch.setattr(calibration, "changed_since", lambda commit, files, uncommitted: commit == made_at)
    with pytest.raises(SystemExit, match=fr"calibrating the quick profile's cifar stand-in read run {config.key()} "
                                         fr"from the store {tmp_path}, trained at commit .* by earlier training code: "
                                         r".*`make clean-results PROFILE=quick` \(the whole store goes\), or --store"):
        fixed_point.trained(config, store, "cpu", "quick", "cifar")
    monkeypatch.setattr(calibration, "changed_since", lambda commit, files, uncommitted: False)  # today's: read back
    assert fixed_point.trained(config, store, "cpu", "quick", "cifar") == store.finished(config.key())


def test_a_profile_that_chooses_no_learning_rate_stops_after_the_first_calibration(calibrations):
    profile = replace(QUICK, lr_multipliers=(1.0,))
    training = FakeTraining(lambda n: 3.0)
    settled = fixed_point.settle(profile, "cifar", training, say=lambda line: None)
    assert training.choices == 0 and _rates(calibrations) == [{}]
    assert fixed_point.status(settled, "cifar")["state"].startswith("calibrated at the grid's learning rate")


def test_the_committed_quick_calibration_is_settled_or_says_why_not():
    for setup in QUICK.calibrated_setups:
        status = fixed_point.status(QUICK, setup)
        assert status["state"].startswith(("settled", "not settled after 3")), (setup, status)
        assert fixed_point.next_step(QUICK, setup) is None, f"{setup}: run `make calibrate`"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_calibrating_on_cuda_without_a_gpu_stops_with_what_to_do(tmp_path):
    """``make paper-figures DEVICE=cuda`` on a cluster's login node calibrates first: one line saying where to run it."""
    with pytest.raises(SystemExit, match=r"error: calibrating the gpu profile's cifar stand-in trains on cuda, but "
                                         r"torch sees no CUDA device here: run `make calibrate PROFILE=gpu DEVICE=cuda` "
                                         r"on a machine with a GPU \(on a cluster: inside srun or salloc\)"):
        calibrate.main(["gpu", "--device", "cuda", "--store", str(tmp_path)])

