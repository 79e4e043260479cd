"""The training step's profile (:mod:`benchmarks.profile_training_step`): its summary by hand, and a run on the CPU."""

import csv
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from benchmarks.profile_training_step import FIELDS, device_items, heaviest, main, summarise


def test_the_summary_is_per_step_with_the_share_of_short_items():
    items = [("a", 5.0), ("b", 20.0), ("a", 100.0), ("c", 875.0)]  # 1000 us over 2 steps of 1 ms
    assert summarise(items, steps=2, step_ms=1.0) == {
        "step_ms": 1.0, "items_per_step": 2.0, "items_ms_per_step": 0.5, "busy": 0.5,
        "share_under_10us": 0.005, "share_under_50us": 0.025, "share_under_200us": 0.125}
    assert heaviest(items, steps=2, rows=2) == [("c", 0.5, 875.0, 0.875), ("a", 1.0, 52.5, 0.105)]


def _event(name, device_type, us, annotation=False):
    return SimpleNamespace(name=name, device_type=device_type, is_user_annotation=annotation, self_cpu_time_total=us,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_named_ranges_drawn_over_the_kernels_are_not_counted_as_items():
    # the H200 profile of 2026-11-26 counted the optimiser's range (500 us over its own kernels) as a kernel
    events = [_event("sm90_xmma_fprop", DeviceType.CUDA, 60.0), _event("multi_tensor_apply", DeviceType.CUDA, 9.0),
              _event("Optimizer.step#SGD.step", DeviceType.CUDA, 500.0, annotation=True),
              _event("aten::add_", DeviceType.CPU, 7.0)]
    assert device_items(events, torch.device("cuda")) == [("sm90_xmma_fprop", 60.0), ("multi_tensor_apply", 9.0)]
    events += [_event("Optimizer.step#SGD.step", DeviceType.CPU, 40.0, annotation=True),
               _event("aten::empty", DeviceType.CPU, 0.0)]
    assert device_items(events, torch.device("cpu")) == [("aten::add_", 7.0)]


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
