"""The training step's profile (:mod:`benchmarks.profile_training_step`): its summary by hand, and a run on the CPU."""

import csv

import pytest

from benchmarks.profile_training_step import FIELDS, heaviest, main, summarise


def test_the_summary_is_per_step_with_the_share_of_short_items():
    items = [("a", 5.0), ("b", 20.0), ("a", 100.0), ("c", 875.0)]  # 1000 us over 2 steps of 1 ms
    assert summarise(items, steps=2, step_ms=1.0) == {
        "step_ms": 1.0, "items_per_step": 2.0, "items_ms_per_step": 0.5, "busy": 0.5,
        "share_under_10us": 0.005, "share_under_50us": 0.025, "share_under_200us": 0.125}
    assert heaviest(items, steps=2, rows=2) == [("c", 0.5, 875.0, 0.875), ("a", 1.0, 52.5, 0.105)]


def test_a_profile_without_device_work_is_an_error_not_a_row_of_zeros():
    with pytest.raises(ValueError, match="recorded no device work"):
        summarise([], steps=3, step_ms=2.0)


def test_a_cpu_run_appends_one_stamped_row(tmp_path, capsys):
    out = tmp_path / "step_profile.csv"
    arguments = ["--device", "cpu", "--model", "small_cnn", "--batch-size", "8", "--steps", "1", "--warmup", "0",
                 "--no-compile", "--rows", "3", "--out", str(out)]
    main(arguments)
    main(arguments)
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and list(rows[0]) == FIELDS
    assert rows[0]["device"] == "cpu" and rows[0]["compile"] == "eager" and rows[0]["commit"]
    assert float(rows[0]["step_ms"]) > 0 and float(rows[0]["items_per_step"]) > 0
    assert 0 <= float(rows[0]["share_under_10us"]) <= float(rows[0]["share_under_200us"]) <= 1
    assert "aten::" in capsys.readouterr().out  # the heaviest operators are listed


def test_bad_counts_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--steps", "0"])
    assert "--steps 0" in capsys.readouterr().err
