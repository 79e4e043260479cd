"""What a profile trains, counted before it runs (:mod:`experiments.analysis.workload`)."""

import pytest

import data_prep
from experiments.analysis import workload
from experiments.spec import grids
from experiments.spec.profiles import GPU, PAPER, QUICK, SMOKE
from experiments.tuning import learning_rates


def test_a_stand_in_size_is_its_generator_s_at_any_image_size():
    size = workload.stand_in_size(SMOKE.plantnet)
    splits = data_prep.load("plantnet_like", **SMOKE.plantnet.dataset_options)
    assert (size.train, size.val, size.test, size.num_classes) == (
        len(splits.train), len(splits.val), len(splits.test), splits.num_classes)
    assert size.image_size == splits.info["image_size"] == 16
    images = (splits.train.images, splits.val.images, splits.test.images)
    assert size.image_bytes == sum(part.numel() * part.element_size() for part in images)  # what it holds in memory


def test_a_run_shared_by_two_notebooks_is_counted_once():
    rows = {(row.notebook, row.setup): row for row in workload.profile_work(QUICK)}
    table3, label_noise = len(grids.table3(QUICK)), len(grids.label_noise(QUICK))
    shared = len({c.config.training_key() for c in grids.table3(QUICK)}
                 & {c.config.training_key() for c in grids.label_noise(QUICK)})
    assert shared > 0
    assert rows[("table3_samples", "cifar")].runs == table3
    assert rows[("table4_table7_label_noise", "cifar")].runs == label_noise - shared


def test_images_count_full_batches_every_epoch_and_evaluations():
    row = next(r for r in workload.profile_work(SMOKE) if r.notebook == "table3_samples")
    size, setup = workload.stand_in_size(SMOKE.cifar), SMOKE.cifar
    assert row.train_images == row.runs * setup.epochs * (size.train // setup.batch_size * setup.batch_size)
    siblings = len(setup.config("cross_entropy", 0).siblings())  # a test pass at most for each selection metric
    assert siblings == 4 and row.eval_images == row.runs * (setup.epochs * size.val + siblings * size.test)


def test_one_calibration_point_per_calibrated_setup_trains_each_of_its_seeds():
    points = [row for row in workload.profile_work(QUICK) if row.notebook == workload.CALIBRATION_POINT]
    assert [row.setup for row in points] == list(QUICK.calibrated_setups)
    assert [row.runs for row in points] == [len(getattr(QUICK, row.setup).seeds) for row in points] != [1] * len(points)
    assert not [row for row in workload.profile_work(SMOKE) if row.notebook == workload.CALIBRATION_POINT]


def test_runs_differing_only_in_their_selection_metric_are_one_training():
    rows = {(row.notebook, row.setup): row for row in workload.profile_work(QUICK)}
    cells = grids.plantnet(QUICK)
    assert rows[("table5_table8_plantnet", "plantnet")].runs == len({c.config.training_key() for c in cells}) < len(cells)


def test_the_learning_rate_choice_counts_the_trainings_at_the_multipliers_the_tables_do_not_train():
    rows = {row.setup: row for row in workload.profile_work(QUICK) if row.notebook == workload.CHOICE}
    assert list(rows) == list(QUICK.calibrated_setups)
    tables = {cell.config.training_key() for grid in grids.NOTEBOOK_GRIDS.values() for g in grid for cell in g(QUICK)}
    for name, row in rows.items():
        cells = learning_rates.base_cells(QUICK, name)
        tried = {grids.scaled_lr(c.config, m).training_key() for c in cells for m in QUICK.lr_multipliers}
        assert row.runs == len(tried - tables) > 0
    assert not [row for row in workload.profile_work(SMOKE) if row.notebook == workload.CHOICE]


def test_the_work_of_chosen_setups_is_their_rows_of_the_whole_profile():
    assert workload.profile_work(QUICK, ("cifar", "imagenet")) == [
        row for row in workload.profile_work(QUICK) if row.setup in ("cifar", "imagenet")]


def test_the_gpu_profile_has_the_paper_s_models_and_schedules_on_stand_ins():
    for name in ("cifar", "plantnet", "imagenet_lt", "imagenet"):
        gpu, paper = getattr(GPU, name), getattr(PAPER, name)
        assert gpu.synthetic and (gpu.model, gpu.epochs, gpu.batch_size, gpu.lr, gpu.milestones, gpu.seeds) == (
            paper.model, paper.epochs, paper.batch_size, paper.lr, paper.milestones, paper.seeds)
    size = workload.stand_in_size(GPU.cifar)
    assert (size.train, size.val, size.test) == (45_000, 5_000, 10_000)  # CIFAR-100's split, as the paper's


def test_a_real_dataset_cannot_be_counted():
    with pytest.raises(ValueError, match="'cifar100' dataset is real"):
        workload.stand_in_size(PAPER.cifar)


def test_a_calibration_run_outside_the_plan_counts_its_work_as_the_plan_does():
    """The calibration's runs are no notebook's, yet their progress line gives images per second and time left: each
    counts its images from its own config as the plan counts a notebook's run; a run on real data counts none."""
    from experiments.scale.plan import PlannedRun, plan

    planned = next(run for run in plan(QUICK) if run.config.dataset == "plantnet_like")
    outside = PlannedRun.outside_plan(planned.config)
    assert outside.notebooks == ("calibration",) and outside.train_images > 0
    assert (outside.train_images, outside.val_images, outside.test_images, outside.image_bytes) == \
        (planned.train_images, planned.val_images, planned.test_images, planned.image_bytes)
    real = PlannedRun.outside_plan(planned.config.replace(dataset="plantnet", dataset_options={}))
    assert real.train_images is None and real.image_bytes is None
