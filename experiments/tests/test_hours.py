"""A profile's hours at measured rates (:mod:`experiments.scale.hours`): the plan's groups scheduled as the ``local``
executor schedules them, each group at the rate of the largest stack measured within its size, evaluation counted
where it was measured; every expected time below is worked out by hand."""

import pytest

from experiments.engine.config import RunConfig
from experiments.scale.hours import Estimate, Rates, estimate, fastest, setting_text
from experiments.scale.plan import PlannedRun
from experiments.tests.test_scale import TINY

HOUR = 3600.0


def _run(seed: int, train: int = 3600, evaluated: int = 1000, notebook: str = "test", **changes) -> PlannedRun:
    return PlannedRun(RunConfig(**{**TINY, "seed": seed, **changes}), (notebook,), None, train, evaluated)


#: Three runs that stack together, one at another rate (its own group), one trained alone (Fig. 3's).
RUNS = [_run(0), _run(1), _run(2), _run(3, lr=0.2), _run(4, train=720, evaluated=0, notebook="fig3_epoch_time")]
RATES = Rates(train={(1, 1): 100.0, (1, 2): 150.0, (2, 1): 160.0},
              evaluation={(1, 1): 1000.0, (1, 2): 1500.0, (2, 1): 1600.0})


def test_rates_are_read_from_one_invocations_rows_with_evaluation_where_timed():
    rows = [{"concurrency": "1", "stack": "", "aggregate_images_per_s": "100.0", "eval_images_per_s": "1000.0"},
            {"concurrency": "1", "stack": "2", "aggregate_images_per_s": "150.0", "eval_images_per_s": ""},
            {"concurrency": "2", "aggregate_images_per_s": "160.0"}]  # a row from before stacks and evaluation
    assert Rates.from_rows(rows) == Rates({(1, 1): 100.0, (1, 2): 150.0, (2, 1): 160.0}, {(1, 1): 1000.0})


def test_one_gpu_trains_group_after_group_then_the_runs_that_train_alone():
    # stack 2: [0, 1] at (1, 2): 7200 / 150 + 2000 / 1500; [2] and [3] at (1, 1): 36 + 1 each; run 4 alone: 7.2
    found = estimate(RUNS, RATES, per_gpu=1, stack=2, gpus=1)
    assert found == Estimate(1, 2, 1, pytest.approx((48 + 4 / 3 + 2 * 37 + 7.2) / HOUR), True)
    # stack 1: four groups at (1, 1), then run 4
    assert estimate(RUNS, RATES, per_gpu=1, stack=1, gpus=1).hours == pytest.approx((4 * 37 + 7.2) / HOUR)


def test_a_group_larger_than_any_measured_stack_takes_the_largest_measured_stacks_rate():
    # stack 4: [0, 1, 2] at (1, 2)'s rate: 10800 / 150 + 3000 / 1500; [3] at (1, 1); run 4 alone
    assert estimate(RUNS, RATES, per_gpu=1, stack=4, gpus=1).hours == pytest.approx((72 + 2 + 37 + 7.2) / HOUR)


def test_gpus_and_workers_take_the_next_group_when_free_and_the_last_one_sets_the_end():
    # two GPUs, stack 2: [0, 1] (49.33 s) on one, [2] then [3] (37 s each) on the other: 74 s, then run 4
    assert estimate(RUNS, RATES, per_gpu=1, stack=2, gpus=2).hours == pytest.approx((74 + 7.2) / HOUR)
    # two workers on one GPU share (2, 1)'s rate, 80 images/s each: 45 + 1.25 s a run, two rounds; run 4 alone
    assert estimate(RUNS, RATES, per_gpu=2, stack=1, gpus=1).hours == pytest.approx((2 * 46.25 + 7.2) / HOUR)


def test_a_setting_without_a_rate_for_some_group_is_not_estimated_and_the_fastest_is_chosen():
    assert estimate(RUNS, RATES, per_gpu=2, stack=2, gpus=1) is not None  # (2, 1) stands for groups of two
    assert estimate(RUNS, RATES, per_gpu=3, stack=1, gpus=1) is None
    assert estimate(RUNS, Rates({(1, 2): 150.0}, {}), per_gpu=1, stack=2, gpus=1) is None  # [3] has no rate
    best = fastest(RUNS, RATES, gpus=1)
    assert (best.per_gpu, best.stack) == (2, 1)  # 99.7 s against 123.2 (stack 2) and 155.2 (one run)
    assert setting_text(best) == "`PER_GPU=2 STACK=1`"
    assert fastest(RUNS, Rates({}, {}), gpus=1) is None


def test_evaluation_counts_only_where_it_was_measured():
    training_only = Rates(RATES.train, {})
    found = estimate(RUNS, training_only, per_gpu=1, stack=1, gpus=1)
    assert found.hours == pytest.approx((4 * 36 + 7.2) / HOUR) and not found.evaluated
    partly = Rates(RATES.train, {(1, 2): 1500.0})  # [2] and [3] train at (1, 1), whose evaluation was not timed
    assert not estimate(RUNS, partly, per_gpu=1, stack=2, gpus=1).evaluated
