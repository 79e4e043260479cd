"""The training step's profile (:mod:`benchmarks.profile_training_step`): its summary by hand, and a run on the CPU."""

import csv
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from benchmarks.profile_training_step import FIELDS, device_items, heaviest, main, origin_of, summarise
from experiments.analysis.timings import library_bound_text


def test_the_summary_is_per_step_with_the_share_of_short_items():
    items = [("a", 5.0), ("b", 20.0), ("a", 100.0), ("c", 875.0)]  # 1000 us over 2 steps of 1 ms
    assert summarise(items, steps=2, step_ms=1.0) == {
        "step_ms": 1.0, "items_per_step": 2.0, "items_ms_per_step": 0.5, "busy": 0.5,
        "share_under_10us": 0.005, "share_under_50us": 0.025, "share_under_200us": 0.125,
        "share_library": 0.0, "share_triton": 0.0, "share_other": 1.0}
    assert heaviest(items, steps=2, rows=2) == [("c", 0.5, 875.0, 0.875), ("a", 1.0, 52.5, 0.105)]


def test_kernels_are_told_apart_by_who_wrote_them_and_bound_what_max_autotune_can_gain():
    # names from the H200's reduce-overhead profile of 2026-11-27 (results/h200-2026-11-27/call3_step_profile/)
    library = ["sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize32x128x32_stage4",
               "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816dgrad_optimized_bf16_128x64_32x6_nhwc",
               "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_splitK_NTT"]
    triton = ["triton_red_fused__native_batch_norm_legit_functional_native_batch_norm_backward_threshold_backward_70"]
    other = ["void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy",
             "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"]
    assert [origin_of(name) for name in library + triton + other] == ["library"] * 3 + ["triton"] + ["other"] * 2
    items = [(library[0], 40.0), (triton[0], 35.0), (other[0], 25.0)]
    row = summarise(items, steps=1, step_ms=0.1)
    assert (row["share_library"], row["share_triton"], row["share_other"]) == (0.4, 0.35, 0.25)
    assert "step at most x1.67 faster" in library_bound_text(row)


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
