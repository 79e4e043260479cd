"""A profile's hours at measured rates (:mod:`experiments.scale.hours`): the plan's groups scheduled as the ``local``
executor schedules them, each group at the rates of the largest stack measured within its size, its tests at a lone
run's validation rate, its compilation at the measured warm-up, each part counted where it was measured; every
expected time below is worked out by hand."""

import pytest

from experiments.engine.config import RunConfig
from experiments.scale.hours import (Estimate, Part, Rates, calibration_first_then, counted_text, estimate,
                                    estimate_moves, fastest, makespan, setting_text)
from experiments.scale.plan import CalibrationFirst, PlannedRun
from experiments.tests.test_scale import TINY

HOUR = 3600.0


def planned(seed: int, train: int, val: int, test: int, notebook: str = "test", **changes) -> PlannedRun:
    """A planned run of ``train``, ``val`` and ``test`` images; runs with the same ``changes`` stack together."""
    return PlannedRun(RunConfig(**{**TINY, "seed": seed, **changes}), (notebook,), None, train, val, test)


#: Three runs that stack together, one at another rate (its own group), one trained alone (Fig. 3's).
RUNS = [planned(0, 3600, 800, 200), planned(1, 3600, 800, 200), planned(2, 3600, 800, 200),
        planned(3, 3600, 800, 200, lr=0.2), planned(4, 720, 0, 0, notebook="fig3_epoch_time")]
RATES = Rates(train={(1, 1): 100.0, (1, 2): 150.0, (2, 1): 160.0},
              validation={(1, 1): 1000.0, (1, 2): 1500.0, (2, 1): 1600.0},
              warmup_s={(1, 1): 10.0, (1, 2): 20.0, (2, 1): 12.0})
#: A lone run of RUNS[:4] at (1, 1): 3600 / 100 + 800 / 1000 + 200 / 1000 + 10 s; RUNS[4] alone: 720 / 100 + 10 s.
LONE, ALONE = 47.0, 17.2


def test_rates_are_read_from_one_invocations_rows_where_measured():
    rows = [{"concurrency": "1", "stack": "", "aggregate_images_per_s": "100.0", "eval_images_per_s": "1000.0",
             "warmup_s": "10.0"},
            {"concurrency": "1", "stack": "2", "aggregate_images_per_s": "150.0", "eval_images_per_s": "",
             "warmup_s": "20.0"},
            {"concurrency": "2", "aggregate_images_per_s": "160.0"}]  # a row from before stacks, validation, warm-up
    assert Rates.from_rows(rows) == Rates({(1, 1): 100.0, (1, 2): 150.0, (2, 1): 160.0}, {(1, 1): 1000.0},
                                          {(1, 1): 10.0, (1, 2): 20.0})


def test_one_gpu_trains_group_after_group_then_the_runs_that_train_alone():
    # stack 2: [0, 1] at (1, 2): 7200 / 150 + 1600 / 1500 + 20 s, tested alone at (1, 1): 400 / 1000; [2], [3] lone
    found = estimate(RUNS, RATES, per_gpu=1, stack=2, gpus=1)
    assert found == Estimate(1, 2, 1, pytest.approx((48 + 1600 / 1500 + 20 + 0.4 + 2 * LONE + ALONE) / HOUR), ())
    assert estimate(RUNS, RATES, per_gpu=1, stack=1, gpus=1).hours == pytest.approx((4 * LONE + ALONE) / HOUR)


def test_a_group_larger_than_any_measured_stack_takes_the_largest_measured_stacks_rates():
    # stack 4: [0, 1, 2] at (1, 2): 10800 / 150 + 2400 / 1500 + 20 s, tested at (1, 1): 600 / 1000; [3] lone
    assert estimate(RUNS, RATES, per_gpu=1, stack=4, gpus=1).hours == pytest.approx(
        (72 + 1.6 + 20 + 0.6 + LONE + ALONE) / HOUR)


def test_gpus_and_workers_take_the_next_group_when_free_and_the_last_one_sets_the_end():
    # two GPUs, stack 2: [0, 1] (69.47 s) on one, [2] then [3] (47 s each) on the other: 94 s, then run 4
    assert estimate(RUNS, RATES, per_gpu=1, stack=2, gpus=2).hours == pytest.approx((94 + ALONE) / HOUR)
    # two workers on one GPU share (2, 1)'s rates, halved: 3600 / 80 + 800 / 800 + 200 / 800 + 12 s a run, two rounds
    assert estimate(RUNS, RATES, per_gpu=2, stack=1, gpus=1).hours == pytest.approx((2 * 58.25 + ALONE) / HOUR)


def test_a_worker_left_alone_on_its_gpu_gets_the_rate_measured_for_fewer_processes():
    # two workers on one GPU, three lone groups: the first two at (2, 1)'s rates, halved, 58.25 s as above; then the
    # third alone at (1, 1)'s, whole: 12 s of warm-up (its setting's), 3600 / 100 + 800 / 1000 + 200 / 1000 s
    assert estimate(RUNS[:3], RATES, per_gpu=2, stack=1, gpus=1).hours == pytest.approx((58.25 + 12 + 37) / HOUR)


def test_the_first_groups_go_to_every_gpu_in_turn():
    # two workers on each of two GPUs, two groups: one on each GPU, alone there: 12 + 36 + 0.8 + 0.2 s
    assert estimate(RUNS[:2], RATES, per_gpu=2, stack=1, gpus=2).hours == pytest.approx(49 / HOUR)


def test_a_setting_without_a_rate_for_some_group_is_not_estimated_and_the_fastest_is_chosen():
    assert estimate(RUNS, RATES, per_gpu=2, stack=2, gpus=1) is not None  # (2, 1) stands for groups of two
    assert estimate(RUNS, RATES, per_gpu=3, stack=1, gpus=1) is None
    assert estimate(RUNS, Rates({(1, 2): 150.0}, {}, {}), per_gpu=1, stack=2, gpus=1) is None  # [3] has no rate
    best = fastest(RUNS, RATES, gpus=1)
    assert (best.per_gpu, best.stack) == (2, 1)  # 133.7 s against 180.7 (stack 2) and 205.2 (one run)
    assert setting_text(best) == "`PER_GPU=2 STACK=1`"
    assert fastest(RUNS, Rates({}, {}, {}), gpus=1) is None


def test_a_part_not_measured_is_left_out_and_said_to_be_and_complete_estimates_come_first():
    training_only = estimate(RUNS, Rates(RATES.train, {}, {}), per_gpu=1, stack=1, gpus=1)
    assert training_only.hours == pytest.approx((4 * 36 + 7.2) / HOUR)
    assert training_only.left_out == ("compilation", "validation", "testing")
    assert counted_text(training_only) == "training counted; compilation, validation and testing not measured"
    assert counted_text(estimate(RUNS, RATES, per_gpu=1, stack=1, gpus=1)) == (
        "training, compilation, validation and testing counted")
    # groups of two at (1, 2) are tested at (1, 1), whose validation was not timed
    partly = estimate(RUNS, Rates(RATES.train, {(1, 2): 1500.0}, RATES.warmup_s), per_gpu=1, stack=2, gpus=1)
    assert partly.left_out == ("validation", "testing")
    # two workers without validation rates would be faster (131.2 s), but count less: the complete stack of 2 wins
    rates = Rates(RATES.train, {(1, 1): 1000.0, (1, 2): 1500.0}, RATES.warmup_s)
    assert estimate(RUNS, rates, per_gpu=2, stack=1, gpus=1).hours == pytest.approx((2 * 57 + ALONE) / HOUR)
    assert (fastest(RUNS, rates, gpus=1).per_gpu, fastest(RUNS, rates, gpus=1).stack) == (1, 2)


def test_a_gpus_rate_for_a_count_not_measured_is_interpolated_from_none_at_zero():
    part = Part(1000.0, {(2, 1): 100.0, (4, 1): 160.0, (4, 2): 999.0}, stack=1)  # the stack of 2's rate is not read
    # 1 busy: half of 2's aggregate; 3 busy: between 2's and 4's, 130 in all; the measured counts as measured
    assert [part.rate(busy) for busy in (1, 2, 3, 4)] == pytest.approx([50.0, 50.0, 130 / 3, 40.0])
    assert Part(12.0, None, stack=1).rate(3) == 1.0  # a compilation's seconds pass as seconds


def test_a_group_with_nothing_to_do_leaves_its_worker_free_for_the_next():
    work = [Part(10.0, None, stack=1)]  # ten seconds of compilation
    assert makespan([[], work, work, work], per_gpu=2, gpus=1) == pytest.approx(20.0)
    assert makespan([[], [], work], per_gpu=2, gpus=1) == pytest.approx(10.0)


def test_runs_trained_move_by_move_wait_for_the_last_moves_runs_and_train_alone():
    """The calibration's moves: on two GPUs, two moves of one lone run each take two runs' time, where the two runs
    side by side would take one; a stack's rate is never used, and a move without a measured rate gives none."""
    moves = [[RUNS[0]], [RUNS[1], RUNS[2]]]
    found = estimate_moves(moves, RATES, per_gpu=1, gpus=2)
    assert found == Estimate(1, 1, 2, pytest.approx(2 * LONE / HOUR), ())
    assert estimate(RUNS[:3], RATES, per_gpu=1, stack=1, gpus=2).hours == pytest.approx(2 * LONE / HOUR)
    assert estimate_moves([RUNS[:1]], RATES, per_gpu=1, gpus=1).hours == pytest.approx(LONE / HOUR)
    assert estimate_moves(moves, Rates({(1, 2): 150.0}, {}, {}), per_gpu=1, gpus=1) is None


def test_a_calibration_first_then_the_notebooks_runs_it_left():
    """The calibration's moves (lone runs), then the notebooks' runs it did not train, at the notebooks' setting: on
    one GPU, RUNS[0] then RUNS[1] alone, then RUNS[2] and RUNS[3] (their learning rates differ: no stack), then
    RUNS[4], which trains alone."""
    notebooks = estimate(RUNS, RATES, per_gpu=1, stack=2, gpus=1)
    first = CalibrationFirst("cifar", [[RUNS[0]], [RUNS[1]]], RUNS[2:], RUNS[:2])
    found = calibration_first_then(notebooks, first, RATES)
    assert found == Estimate(1, 2, 1, pytest.approx((2 * LONE + 2 * LONE + ALONE) / HOUR), ())
    assert found.hours > notebooks.hours  # [0, 1] no longer stacked: the calibration trains them alone
    assert calibration_first_then(notebooks, first, Rates({(1, 2): 150.0}, {}, {})) is None
