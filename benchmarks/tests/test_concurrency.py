"""``benchmarks.bench_concurrency`` on CPU with a small model: its rows, its ratios to the same invocation's one run,
its validation pass, a profile's hours at the measured rates (:mod:`experiments.scale.hours`), and a failing run
reported instead of left waiting at the barrier. The timings themselves are meaningless here."""

import csv
import multiprocessing
import os
import threading
import time
from dataclasses import replace

import pytest
import torch

from benchmarks._measure import append_csv_row
from benchmarks._fig3_setup import paper_model
from benchmarks.bench_concurrency import (FIELDS, GPUS, Training, _collect, main, print_hours,
                                         process_training, side_by_side, timed_evaluation)
from experiments.analysis.timings import engine_code
from experiments.provenance import git_commit
from experiments.scale.hours import Rates, fastest, runs_measured_by, setting_text
from experiments.scale.plan import plan
from experiments.spec.profiles import get_profile

COLUMNS = ["device", "device_name", "commit", "python", "torch", "triton", "topk", "engine_code", "date", "model", "compile",
           "gpu_sharing", "cudnn_benchmark", "batch_size", "warmup", "steps", "concurrency", "stack", "warmup_s",
           "run_images_per_s_mean", "run_images_per_s_min",
           "aggregate_images_per_s", "ratio_to_one_run", "run_peak_mib", "device_used_mib", "device_total_mib",
           "eval_images", "eval_images_per_s"]


def _earlier_invocation() -> dict:
    """A row of an earlier invocation, far faster than anything measured here: neither a baseline nor a best."""
    return {**dict.fromkeys(FIELDS, ""), "device": "cpu", "date": "2000-01-01T00:00:00+0000", "model": "small_cnn",
            "concurrency": 1, "aggregate_images_per_s": 1e9, "ratio_to_one_run": 1.0}


def test_rows_ratios_and_profile_hours(tmp_path, capsys):
    out = tmp_path / "concurrency.csv"
    earlier_fields = [name for name in FIELDS if name != "engine_code"]  # a file from before rows named the code
    append_csv_row({k: v for k, v in _earlier_invocation().items() if k in earlier_fields}, earlier_fields, out)
    commit = git_commit()  # the stamp's, though another commit may land while the runs train
    main(["--device", "cpu", "--model", "small_cnn", "--concurrency", "2", "--steps", "3", "--warmup", "1",
          "--no-compile", "--profile", "smoke", "--eval-images", "96", "--out", str(out)])
    with out.open() as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS  # the earlier file rewritten under today's columns, its row kept
        earlier, *rows = list(reader)
    assert (earlier["date"], earlier["engine_code"]) == (_earlier_invocation()["date"], "")
    assert [int(row["concurrency"]) for row in rows] == [1, 2]  # one run measured first, though not asked for
    assert len({row["date"] for row in rows}) == 1 and rows[0]["date"] != _earlier_invocation()["date"]
    for row in rows:
        assert (row["device"], row["commit"], row["torch"], row["compile"], row["engine_code"], row["gpu_sharing"],
                row["stack"], row["cudnn_benchmark"]) == ("cpu", commit, torch.__version__, "eager", engine_code(), "",
                                                          "1", "False")
        assert 0 < float(row["run_images_per_s_min"]) <= float(row["run_images_per_s_mean"])
        assert float(row["aggregate_images_per_s"]) == pytest.approx(
            int(row["concurrency"]) * float(row["run_images_per_s_mean"]), rel=1e-3)
        assert float(row["ratio_to_one_run"]) == pytest.approx(
            float(row["aggregate_images_per_s"]) / float(rows[0]["aggregate_images_per_s"]), rel=1e-3)
        assert float(row["run_peak_mib"]) > 0 and row["device_used_mib"] == row["device_total_mib"] == ""
        assert row["eval_images"] == "96" and float(row["eval_images_per_s"]) > 0  # every process's, summed
        assert float(row["warmup_s"]) > 0  # the warm-up's step, there being no compilation

    # the gpu profile's plan takes a while: the smoke one is planned and scheduled the same way
    runs, rates = runs_measured_by(plan(get_profile("smoke"), ("cifar",)), rows[0]), Rates.from_rows(rows)
    assert len(runs) == len(plan(get_profile("smoke"), ("cifar",)))  # all train small_cnn at batch 64
    assert rates.validation.keys() == rates.warmup_s.keys() == rates.train.keys() == {(1, 1), (2, 1)}
    printed = capsys.readouterr().out
    assert f"x{float(rows[1]['ratio_to_one_run']):.2f} one run" in printed
    for gpus in (1, GPUS):
        found = fastest(runs, rates, gpus)
        assert not found.left_out and (f"notebooks ({len(runs)} runs) on {gpus} GPU{'s' * (gpus > 1)}: "
                                       f"{found.hours:.2f} h with {setting_text(found)}, training, compilation, "
                                       "validation and testing counted (target") in printed


def test_runs_stacked_into_one_model_count_every_runs_images(tmp_path, capsys):
    out = tmp_path / "concurrency.csv"
    main(["--device", "cpu", "--model", "small_cnn", "--concurrency", "1", "--stack", "3", "--steps", "2", "--warmup",
          "1", "--no-compile", "--profile", "smoke", "--eval-images", "64", "--out", str(out)])
    with out.open() as handle:
        alone, stacked = list(csv.DictReader(handle))
    assert [(row["concurrency"], row["stack"]) for row in (alone, stacked)] == [("1", "1"), ("1", "3")]
    assert (alone["engine_code"], stacked["engine_code"]) == (engine_code(), engine_code(stacked=True))
    assert engine_code() != engine_code(stacked=True)  # a change of the stacking stales the stacked rows only
    # a run's rate is the process's over 3, rounded to 0.1 images/s
    assert float(stacked["aggregate_images_per_s"]) == pytest.approx(3 * float(stacked["run_images_per_s_mean"]),
                                                                     abs=0.16)
    assert float(stacked["ratio_to_one_run"]) == pytest.approx(
        float(stacked["aggregate_images_per_s"]) / float(alone["aggregate_images_per_s"]), rel=1e-3)
    printed = capsys.readouterr().out
    assert "3 runs stacked:" in printed
    assert "no hours: no run of the smoke profile's CIFAR-100 notebooks trains small_cnn at batch 64" not in printed
    print_hours([{**row, "batch_size": "256"} for row in (alone, stacked)], "smoke", on_gpu=False)
    assert capsys.readouterr().out.endswith(
        "no hours: no run of the smoke profile's CIFAR-100 notebooks trains small_cnn at batch 256\n")
    assert float(stacked["eval_images_per_s"]) > 0  # every run's images, as the engine's stacked validation gives them


def test_no_validation_pass_is_timed_when_no_images_are_asked_for():
    training = Training("cpu", "small_cnn", batch_size=4, warmup=0, steps=1, compile_mode=None, eval_images=0)
    model = process_training(0, training, torch.device("cpu"))[0]
    assert timed_evaluation(model, training, torch.device("cpu"), barrier=None) == (0.0, "")


def test_a_failed_validation_keeps_the_barriers_and_the_training_figures():
    """The pass fails (a model that cannot take the images), yet both barriers are kept, so the other processes are
    not left waiting, and the error is returned instead of raised."""
    training = Training("cpu", "small_cnn", batch_size=4, warmup=0, steps=1, compile_mode=None, eval_images=8)
    passed = []

    class Barrier:
        def wait(self):
            passed.append(True)

    broken = torch.nn.Linear(1, 1)
    rate, error = timed_evaluation(broken, training, torch.device("cpu"), Barrier())
    assert rate is None and error.startswith("RuntimeError: ") and len(passed) == 2


def test_stacked_runs_train_from_their_own_seeds_on_their_own_data_orders():
    """Process 1 of 2-run stacks holds runs 2 and 3: their initial weights and first batches are theirs alone."""
    training = Training("cpu", "small_cnn", batch_size=4, warmup=0, steps=1, compile_mode=None, stack=2)
    model, _, losses, batches = process_training(1, training, torch.device("cpu"))
    images, labels = next(batches)
    assert images.shape == (4, 2 * 3, 32, 32) and labels.shape == (4, 2) and len(losses.losses) == 2
    for column, seed in enumerate((2, 3)):
        alone = replace(training, stack=1)
        own_images, own_labels = next(process_training(seed, alone, torch.device("cpu"))[3])  # a lone run's order
        torch.testing.assert_close(images[:, 3 * column:3 * column + 3], own_images)
        torch.testing.assert_close(labels[:, column], own_labels)
        torch.testing.assert_close(model.run_state_dict(column), paper_model("small_cnn", torch.device("cpu"),
                                                                             seed).state_dict())


def test_a_failing_run_is_reported_with_its_traceback():
    training = Training("cpu", "no_such_model", batch_size=4, warmup=0, steps=1, compile_mode=None)
    with pytest.raises(RuntimeError, match=r"2 of 2 runs failed(.|\n)*no_such_model"):
        side_by_side(training, 2)


def _waits_at_the_barrier(barrier, sender) -> None:
    try:
        barrier.wait(timeout=300)
        sender.send({"images_per_s": 1.0})
    except threading.BrokenBarrierError:
        sender.send("broken barrier")


def _dies(barrier, sender) -> None:
    os._exit(3)


def test_a_run_that_dies_breaks_the_barrier_for_the_others():
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    processes = [context.Process(target=target, args=(barrier, sender))
                 for target, (_, sender) in zip((_waits_at_the_barrier, _dies), pipes)]
    start = time.monotonic()
    for process in processes:
        process.start()
    for _, sender in pipes:
        sender.close()
    messages = _collect([receiver for receiver, _ in pipes], barrier)
    for process in processes:
        process.join()
    assert messages == ["broken barrier", "run 1: its process died without a result"]
    assert time.monotonic() - start < 150  # long before the barrier's own timeout
