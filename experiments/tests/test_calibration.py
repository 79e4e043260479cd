"""The calibration of the stand-ins on cross-entropy: the search, the wiring from the paper's CE numbers to our runs,
the stored knobs reaching the profile only for the setup they were fitted on, and the committed calibration current."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from experiments import calibration, profiles
from experiments.profiles import QUICK, SMOKE
from experiments.store import ResultsStore
from experiments.train import run


def test_compass_search_finds_the_minimum_to_its_last_step_and_keeps_knobs_positive():
    seen = []

    def bowl(knobs):
        seen.append(dict(knobs))
        return (knobs["pixel_noise"] - 2.3) ** 2 + (knobs["class_contrast"] - 0.05) ** 2

    chosen = calibration.compass_search(bowl, {"pixel_noise": 1.0, "class_contrast": 1.0},
                                          {"pixel_noise": 0.4, "class_contrast": 0.4}, halvings=2)
    assert abs(chosen["pixel_noise"] - 2.3) <= 0.1 and abs(chosen["class_contrast"] - 0.05) <= 0.1
    assert min(k["class_contrast"] for k in seen) >= calibration.SMALLEST_KNOB


def test_rms_gap_is_in_points_and_infinite_when_a_number_is_undefined():
    targets = [calibration.Target("a", 50.0, (), ()), calibration.Target("b", 80.0, (), ())]
    assert calibration.rms_gap({"a": 53.0, "b": 76.0}, targets) == pytest.approx(math.sqrt((9 + 16) / 2))
    assert calibration.rms_gap({"a": float("nan"), "b": 80.0}, targets) == math.inf


def _knob_response(config):
    """A fake training run whose CE accuracies are a known function of the stand-in's knobs."""
    knobs = config.dataset_options
    top1 = max(0.0, min(1.0, 1.2 - 0.25 * knobs["pixel_noise"] - 0.3 / knobs["class_contrast"]))
    top5 = max(0.0, min(1.0, 1.3 - 0.2 * knobs["pixel_noise"]))
    noise = knobs.get("noise", 0.0)
    return {"test": {"top": {"1": top1 - 0.2 * noise, "5": top5 - 0.1 * noise}}}


def test_calibration_fits_the_papers_ce_numbers_and_measures_the_held_out_ones_at_the_chosen_knobs():
    trained = []

    def train(config):
        trained.append(config)
        assert config.loss == "cross_entropy" and config.seed == QUICK.cifar.seeds[0]
        return _knob_response(config)

    entry = calibration.calibrate(QUICK, "cifar", train)
    fitted = [t for t in entry["targets"] if t["fitted"]]
    held_out = [t for t in entry["targets"] if not t["fitted"]]
    assert [t["label"] for t in held_out] == ["top-1, p = 0.2", "top-5, p = 0.2"]
    assert {t["published"] for t in fitted} == {76.6, 94.2, 61.8, 83.6}  # Tables 7 and 4, CE at p = 0 and 0.4
    assert entry["rms_gap_fitted"] == min(point["rms_gap"] for point in entry["points"])
    chosen = [c for c in trained if c.dataset_options.get("noise") == 0.2]  # held out: measured once, at the choice
    assert len(chosen) == 1 and {k: chosen[0].dataset_options[k] for k in calibration.KNOBS} == entry["knobs"]
    assert entry["setup_fingerprint"] == QUICK.cifar.fingerprint()


def test_calibration_trains_real_ce_runs_and_the_profile_takes_the_knobs_only_for_the_setup_they_fit(tmp_path, monkeypatch):
    profile = replace(SMOKE, judges_training=True)  # smoke-sized runs, treated as a calibrated profile
    store = ResultsStore(tmp_path / "store")
    entry = calibration.calibrate(profile, "imagenet", lambda config: run(config, store), halvings=0)
    assert entry["points"] and all(0 <= v <= 100 for p in entry["points"] for v in p["values"].values())
    assert len(list((tmp_path / "store" / "runs").glob("*.json"))) == len(entry["points"])  # top-1 and top-5: one run
    monkeypatch.setattr(profiles, "CALIBRATED", tmp_path)
    monkeypatch.setattr(calibration, "CALIBRATED", tmp_path)
    (tmp_path / "smoke.json").write_text(json.dumps({"profile": "smoke", "setups": {"imagenet": entry}}))
    with pytest.warns(UserWarning, match="cifar setup has no calibration"):
        calibrated = profiles.calibrated(profile)
    assert calibrated.imagenet.difficulty == entry["knobs"]
    assert calibrated.imagenet.config("cross_entropy", 0).dataset_options["pixel_noise"] == entry["knobs"]["pixel_noise"]
    assert "calibrated on CE alone" in calibration.summary_line(calibrated, "imagenet")
    changed = replace(profile, imagenet=replace(profile.imagenet, epochs=3, milestones=(2,)))
    with pytest.warns(UserWarning, match="imagenet setup has no calibration"):
        assert profiles.calibrated(changed).imagenet.difficulty == {}
    assert "uncalibrated" in calibration.summary_line(changed, "imagenet")
    held_out = {**entry, "targets": [*entry["targets"], {"label": "top-5 at p = 0.2", "fitted": False,
                                                         "ours": 1099.0, "published": 100.0}]}
    monkeypatch.setattr(calibration, "current_entry", lambda *_: held_out)
    assert calibration.summary_line(calibrated, "imagenet").endswith("largest gap +999.0 (top-5 at p = 0.2, held out)")


def test_the_committed_quick_calibration_is_the_one_the_quick_profile_uses():
    stored = calibration.stored("quick")["setups"]
    for setup in QUICK.calibrated_setups:
        assert calibration.is_current(stored.get(setup), QUICK, setup), (
            f"experiments/calibrated/quick.json is stale for {setup}: run `make calibrate`")
        assert getattr(QUICK, setup).difficulty == stored[setup]["knobs"]
        assert stored[setup]["rms_gap_fitted"] == min(p["rms_gap"] for p in stored[setup]["points"])
