"""A profile trained as a whole (:mod:`experiments.scale`): the plan is the notebooks' grids, each training once;
executors give the inline records bit for bit; the store's claims let many processes share it without training a
run twice; a killed worker's run resumes to the same result."""

import contextlib
import dataclasses
import io
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.engine import run_claim
from experiments.engine.config import RunConfig
from experiments.engine.store import DamagedStoreWarning, ResultsStore, computed
from experiments.engine.train import run, run_stacked
from experiments.scale import cli, executors
from experiments.scale.plan import CalibrationFirst, PlannedRun, plan, stacks, state
from experiments.scale.progress import Progress
from experiments.analysis.workload import profile_work, stand_in_size
from experiments.spec.grids import NOTEBOOK_GRIDS
from experiments.spec.profiles import get_profile
from experiments.tests.test_experiments import TINY as EXPERIMENTS_TINY

ROOT = Path(__file__).resolve().parents[2]
TINY = {**EXPERIMENTS_TINY, "epochs": 2, "milestones": (1,)}


def _planned(seed: int, **changes) -> PlannedRun:
    return PlannedRun(RunConfig(**{**TINY, "seed": seed, **changes}), ("test",), None, 0)


def test_the_plan_is_every_notebook_grid_cell_once_per_training_with_its_readers():
    profile = get_profile("smoke")
    runs = plan(profile)
    trainings = {cell.config.training_key(): notebook for notebook, grids in NOTEBOOK_GRIDS.items()
                 for grid in grids for cell in grid(profile)}
    assert sorted(planned.config.training_key() for planned in runs) == sorted(trainings)
    for planned in runs:
        assert trainings[planned.config.training_key()] in planned.notebooks  # the last notebook reading it, at least
        assert planned.alone == ("fig3_epoch_time" in planned.notebooks)
        assert planned.train_images > 0
    assert any(len(run.notebooks) > 1 for run in runs)  # a run shared by two notebooks is planned once


def test_a_setups_plan_is_its_runs_of_the_whole_plan_with_the_images_the_workload_counts():
    profile = get_profile("smoke")
    cifar = plan(profile, ("cifar",))
    assert cifar == [run for run in plan(profile) if run.config.dataset == profile.cifar.dataset] and cifar
    notebooks = [work for work in profile_work(profile, ("cifar",)) if work.notebook in NOTEBOOK_GRIDS]
    assert (sum(run.train_images for run in cifar), sum(run.val_images + run.test_images for run in cifar)) == (
        sum(work.train_images for work in notebooks), sum(work.eval_images for work in notebooks))
    size = stand_in_size(profile.cifar)  # validation after every epoch, a test pass at most per selection metric
    assert (cifar[0].val_images, cifar[0].test_images) == (cifar[0].config.epochs * size.val, 4 * size.test)


def test_a_calibration_first_is_its_shortest_search_each_run_once_and_leaves_the_notebooks_the_rest():
    """The ``gpu`` profile's CIFAR-100 stand-in: the search's moves (the start, three step sizes, the held-out numbers)
    with each training once; the notebooks' runs at the knobs it chooses are those it trained plus those it left; a
    profile whose calibration is current has none to make."""
    from experiments.scale.plan import calibration_first, calibrations_to_make
    from experiments.tuning.calibration import shortest_search

    profile = get_profile("gpu")
    first = calibration_first(profile, "cifar")
    searched, _ = shortest_search(profile, "cifar")
    trained = [run.config.training_key() for run in first.runs]
    assert len(trained) == len(set(trained)) and set(trained) == {c.training_key() for move in searched for c in move}
    assert [len(move) for move in first.moves] == [8, 12, 12, 12, 4]  # the held-out p = 0.2 runs alone are new
    every = calibration_first(profile, "cifar", searched=None)  # where the start's seeds spread: all 4 searched
    assert [len(move) for move in every.moves] == [8, 48, 48, 48, 4]
    notebooks = plan(profile, ("cifar",))
    assert len(first.notebooks_trained) == 12  # CE at p = 0, 0.2 and 0.4, every seed, at the chosen knobs
    assert {run.config.training_key() for run in first.notebooks_trained} <= set(trained)
    assert not {run.config.training_key() for run in first.notebooks_left} & set(trained)
    assert len(first.notebooks_left) + len(first.notebooks_trained) == len(notebooks)
    assert all(run.train_images for run in first.runs)
    assert list(calibrations_to_make(get_profile("quick"))) == []  # its calibration is committed and current


def test_the_plan_says_what_the_store_holds_of_each_run(tmp_path):
    store, planned = ResultsStore(tmp_path), _planned(1)
    assert state(planned, store) == ("missing", 0)
    assert run(planned.config, store, stop_after_epochs=1) is None
    assert state(planned, store) == ("partial", 1)
    run(planned.config, store)
    assert state(planned, store) == ("finished", 2) and store.holds_outcome(planned.config)
    for holds in (lambda: state(planned, store) == ("missing", 0), lambda: not store.holds_outcome(planned.config)):
        store.record_path(planned.key).write_text('{"config": ')  # cut by a crash: train trains it again
        with pytest.warns(DamagedStoreWarning, match="the run will be trained again"):
            assert holds()


def test_local_with_two_workers_gives_the_inline_records_bit_for_bit_and_names_a_failed_run(tmp_path):
    """One pool of two workers: the runs that can train give the inline records; one that cannot (its real dataset
    is missing) is named with its log, and the others go on."""
    runs = [_planned(seed) for seed in (1, 2)]
    threads = torch.get_num_threads()
    try:
        inline = executors.TrainOptions(str(tmp_path / "inline"), threads=1)
        executors.inline(runs, inline, Progress(runs))
    finally:
        torch.set_num_threads(threads)
    failing = PlannedRun(RunConfig(**{**TINY, "dataset": "cifar100", "dataset_options": {}}), ("test",), "cifar100",
                         None)
    local = executors.TrainOptions(str(tmp_path / "local"), threads=1)
    progress = Progress([failing, *runs])
    executors.local([failing, *runs], local, progress, jobs=2)
    assert progress.done == 2 and list(progress.failed) == [failing.key]
    assert "MissingDataError" in Path(progress.failed[failing.key]).read_text()
    for planned in runs:
        one, other = (ResultsStore(options.store).finished(planned.key) for options in (inline, local))
        assert computed(one) == computed(other)


def test_a_worker_pool_is_kept_from_one_call_to_the_next_and_a_worker_dead_between_them_is_replaced(tmp_path):
    """The calibration's moves go to one pool: its workers serve call after call; one that died in between is
    started again, and no run of the next call is lost; closed, it ends every worker."""
    runs = [_planned(seed) for seed in (1, 2, 3, 4)]
    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=2) as pool:
        pool.train_runs(runs[:2], Progress(runs[:2]))
        started = {slot: worker[0] for slot, worker in pool.workers.items()}
        started[0].kill()
        started[0].join()
        progress = Progress(runs[2:])
        pool.train_runs(runs[2:], progress)
        assert progress.done == 2 and not progress.failed, progress.summary()
        assert pool.workers[1][0] is started[1] and pool.workers[0][0] is not started[0]
    assert not pool.workers and not started[1].is_alive()


def test_runs_whose_images_do_not_fit_their_device_beside_each_other_train_one_at_a_time(tmp_path):
    """Each run's process holds its stand-in's images on its device: two workers on a device whose images budget holds
    one run's train the runs one after the other, all of them, and the executor's note says so beforehand."""
    class Overlap(Progress):
        def __init__(self, runs):
            super().__init__(runs)
            self.now = self.most = 0

        def start(self, run):
            super().start(run)
            self.now += 1
            self.most = max(self.most, self.now)

        def finish(self, run):
            self.now -= 1
            super().finish(run)

    runs = [dataclasses.replace(_planned(seed), image_bytes=100 * 2 ** 30) for seed in (1, 2)]
    progress = Overlap(runs)
    pool = executors.WorkerPool(["cpu", "cpu"], executors.TrainOptions(str(tmp_path), threads=1), threads=1,
                                budget=lambda device: 150 * 2 ** 30)
    assert pool.memory_note([("cifar100_like", 100 * 2 ** 30), ("plantnet_like", 2 ** 30)]) == (
        "note: each cifar100_like run holds 100.0 GiB of images, and the runs on a device may hold 50% of its memory: "
        "cpu (150.0 GiB for images) trains at most 1 of them at once on its 2 workers")
    with pool:
        pool.train_runs(runs, progress)
    assert progress.done == 2 and not progress.failed and progress.most == 1
    roomy = executors.WorkerPool(["cpu", "cpu"], executors.TrainOptions(str(tmp_path), threads=1), threads=1,
                                 budget=lambda device: 200 * 2 ** 30)
    assert roomy.memory_note([("cifar100_like", 100 * 2 ** 30)]) is None and roomy.memory_note([]) is None


def test_a_gpu_run_starts_where_its_images_fit_on_its_gpu_and_in_the_machines_memory(tmp_path):
    """GPU runs hold their images on their GPU and in the machine's memory, where they render them: a run waits for
    room on its GPU, and for room in the machine's memory whichever GPU is free."""
    gib = 2 ** 30
    budgets = {"cuda:0": 150 * gib, "cuda:1": 150 * gib, "cuda:2": 150 * gib, "cpu": 250 * gib}
    runs = [dataclasses.replace(_planned(seed), image_bytes=100 * gib) for seed in (1, 2, 3)]
    pool = executors.WorkerPool(["cuda:0", "cuda:1", "cuda:2", "cuda:0"], executors.TrainOptions(str(tmp_path)),
                                threads=1, budget=budgets.__getitem__)
    assert pool.memory_note([("imagenet_like", 100 * gib)]) == (
        "note: each imagenet_like run holds 100.0 GiB of images, and the runs on a device may hold 50% of its memory: "
        "cuda:0 (150.0 GiB for images) trains at most 1 of them at once on its 2 workers; this machine (250.0 GiB for "
        "images) trains at most 2 of them at once on its 4 workers")
    pool.workers[0] = (None, None, executors._Job(runs[:1], Progress(runs), object()))  # run 1 training on cuda:0
    assert not pool._fits("cuda:0", runs[1:2]) and pool._fits("cuda:1", runs[1:2])
    pool.workers[1] = (None, None, executors._Job(runs[1:2], Progress(runs), object()))  # run 2 on cuda:1
    assert not pool._fits("cuda:2", runs[2:])  # cuda:2 is free, the machine's memory is not


def test_groups_that_fit_go_ahead_of_one_waiting_for_room_as_many_as_the_pool_has_workers(tmp_path):
    """A large stand-in's run waiting for room on its device holds back no run that fits there, up to as many as the
    pool has workers; then the others wait for it, so that it cannot wait for ever."""
    class Recording(executors.WorkerPool):
        def _send(self, slot, job):  # no process: the slot's worker is busy with the job
            self.workers[slot] = (None, None, job)
            self.sent.append(job.group[0].config.seed)

    gib = 2 ** 30
    large, small = ([dataclasses.replace(_planned(seed), image_bytes=size) for seed in seeds]
                    for seeds, size in (((1, 2), 100 * gib), ((3, 4, 5, 6), gib)))
    pool = Recording(["cpu"] * 3, executors.TrainOptions(str(tmp_path)), threads=1, budget=lambda device: 150 * gib)
    pool.sent, progress = [], Progress([*large, *small])
    pool._queue = [executors._Job([run], progress, None) for run in [*large, *small]]
    pool._fill()
    assert pool.sent == [1, 3, 4]  # seed 2 waits for room, seeds 3 and 4 fit beside seed 1 and go ahead of it
    pool.workers[1] = (None, None, None)  # seed 3 finished
    pool._fill()
    assert pool.sent == [1, 3, 4, 5]  # the third to go ahead: as many as the pool's workers
    pool.workers[2] = (None, None, None)  # seed 4 finished
    pool._fill()
    assert pool.sent == [1, 3, 4, 5]  # seed 6 would fit, but seed 2 has waited long enough
    pool.workers[0] = (None, None, None)  # seed 1 finished: room for seed 2
    pool._fill()
    assert pool.sent == [1, 3, 4, 5, 2, 6]


def test_a_pipe_another_thread_closed_while_this_one_waited_is_looked_at_again(tmp_path, monkeypatch):
    """Threads wait for their workers' messages outside the pool's lock: a pipe another thread closed meanwhile (its
    worker died) makes the wait raise, and the call looks again instead of failing."""
    waits, real = [], executors.wait

    def closed_once(objects, timeout=None):
        waits.append(len(objects))
        if len(waits) == 1:
            raise OSError("handle is closed")
        return real(objects, timeout=timeout)

    monkeypatch.setattr(executors, "wait", closed_once)
    runs = [_planned(1)]
    progress = Progress(runs)
    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=1) as pool:
        pool.train_runs(runs, progress)
    assert progress.done == 1 and not progress.failed and len(waits) > 1


def test_a_worker_pool_interrupted_mid_call_serves_the_next_call_with_no_stale_group(tmp_path):
    """An error while a call collects (Ctrl-C, say) stops the busy workers with their groups; the pool's next call
    reports only its own runs."""
    class Interrupting(Progress):
        def start(self, run):
            super().start(run)
            raise KeyboardInterrupt

    runs = [_planned(seed) for seed in (1, 2, 3)]
    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=2) as pool:
        with pytest.raises(KeyboardInterrupt):
            pool.train_runs(runs[:2], Interrupting(runs[:2]))
        assert all(group is None for _, _, group in pool.workers.values())
        progress = Progress(runs[2:])
        pool.train_runs(runs[2:], progress)
        assert progress.done == 1 and not progress.failed and set(progress.finished) == {runs[2].key}


def test_progress_counts_the_epochs_running_runs_checkpointed_in_this_call_alone(tmp_path, monkeypatch):
    """A run resumed at epoch 1 of 3 and a fresh one: at the start nothing is counted as trained (the resumed epoch
    was trained before); after each running run checkpointed one more epoch, the line shows those two epochs' images
    as trained (looked at by :meth:`Progress.watching`'s thread), a rate and the time left; a finished run counts the
    rest of its own. A log gets a line at most every LOG_EVERY seconds."""
    import io

    from experiments.scale import progress as progress_module

    store = ResultsStore(tmp_path)
    runs = [PlannedRun(RunConfig(**{**TINY, "epochs": 3, "milestones": (), "seed": seed}), ("test",), None, 300)
            for seed in (1, 2)]
    assert run(runs[0].config, store, stop_after_epochs=1) is None  # resumed at epoch 1 of 3
    log = io.StringIO()
    progress = Progress(runs, store=store, stream=log)
    assert progress.kept == {runs[0].key: 100, runs[1].key: 0} and store.epochs_kept(runs[1].key) == 0
    for planned in runs:
        progress.start(planned)
    progress.observe()
    assert "0 images/s" in progress.line() and log.getvalue() == ""  # nothing new, and no line yet in a log
    assert run(runs[0].config, store, stop_after_epochs=1) is None  # epoch 2 of 3
    assert run(runs[1].config, store, stop_after_epochs=1) is None  # epoch 1 of 3
    monkeypatch.setattr(progress_module, "LOG_EVERY", 0.0)
    with progress.watching(every=0.01):  # observes in its own thread
        deadline = time.time() + 60
        while sum(progress.trained.values()) < 200 and time.time() < deadline:
            time.sleep(0.01)
    assert progress.trained == {runs[0].key: 100, runs[1].key: 100}
    assert "2 running, 0 failed, 0 left" in log.getvalue() and "left" in log.getvalue().split("images/s")[-1]
    progress.finish(runs[0])
    assert progress.trained[runs[0].key] == 200 and progress.done == 1


def test_the_time_left_is_read_from_the_rate_since_the_first_run_started(monkeypatch):
    """Ten minutes in the queue before the first run starts: the rate, and the time left, count from that start (a
    tryout's follower said about 1h06 left for 10 minutes of work), not from the call's; and runs that finish together
    do not make it jump (a rate since the first images were counted did)."""
    import types

    from experiments.scale import progress as progress_module

    now = [0.0]
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    runs = [PlannedRun(RunConfig(**{**TINY, "seed": seed}), ("test",), None, 1000) for seed in (1, 2, 3)]
    progress = Progress(runs, live=False)
    assert progress.line().endswith("0 images/s")  # nothing started: no rate, no time left
    now[0] = 600.0
    for planned in runs[:2]:
        progress.start(planned)
    now[0], progress.trained = 700.0, {runs[0].key: 100, runs[1].key: 100}
    assert progress.line().endswith("2 images/s, about 23:20 left")  # 2800 images at 200 / 100 s
    now[0] = 1100.0
    progress.finish(runs[0])
    progress.finish(runs[1])
    assert progress.line().endswith("4 images/s, about 4:10 left")  # 1000 images at 2000 / 500 s


def test_runs_are_stacked_by_what_they_share_and_the_epoch_they_reached(tmp_path):
    store = ResultsStore(tmp_path)
    first, second, third, partial = (_planned(seed) for seed in (1, 2, 3, 4))
    other_lr, timed = _planned(5, lr=0.1), PlannedRun(_planned(6).config, ("fig3_epoch_time",), None, 0)
    run(partial.config, store, stop_after_epochs=1)
    runs = [first, other_lr, timed, second, partial, third]
    assert stacks(runs, 2, store) == [[first, second], [other_lr], [timed], [partial], [third]]
    assert stacks(runs, 3, store) == [[first, second, third], [other_lr], [timed], [partial]]
    assert stacks(runs, 1, store) == [[one] for one in runs]
    assert stacks(runs, 2, None) == [[first, second], [other_lr], [timed], [partial, third]]  # None: an empty store
    for size in (0, 2.0):
        try:
            stacks(runs, size, store)
        except ValueError as error:
            assert f"'size' should be a positive number of runs stacked into one model, got {size!r}" in str(error)
        else:
            raise AssertionError(f"size {size!r} accepted")


def test_local_and_inline_with_stacks_give_the_stacked_records_bit_for_bit(tmp_path):
    """Runs stacked by a worker of the local executor, by the inline one and by the engine directly: one result."""
    runs = [_planned(1), _planned(2, loss="cross_entropy", loss_options={}), _planned(3)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_stacked([one.config for one in runs[:2]], ResultsStore(tmp_path / "engine"))
        run(runs[2].config, ResultsStore(tmp_path / "engine"))  # the third of a stack of 2: alone
        executors.inline(runs, executors.TrainOptions(str(tmp_path / "inline"), threads=1, stack=2), Progress(runs))
    finally:
        torch.set_num_threads(threads)
    progress = Progress(runs)
    executors.local(runs, executors.TrainOptions(str(tmp_path / "local"), threads=1, stack=2), progress, jobs=1)
    assert progress.done == 3 and not progress.failed
    for one in runs:
        expected = computed(ResultsStore(tmp_path / "engine").finished(one.key))
        for name in ("inline", "local"):
            record = ResultsStore(tmp_path / name).finished(one.key)
            assert computed(record) == expected
            assert ("stacked_with" in record["provenance"]) == (one is not runs[2])


def test_train_writes_the_executors_manifest_beside_the_notebooks(tmp_path, monkeypatch, capsys):
    """``train`` leaves how long it took and what it trained where the notebooks' manifests go, so that the main job's
    time counts it; the runs already finished are counted as read from the store."""

    runs = [_planned(seed) for seed in (1, 2)]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    store, figures = tmp_path / "store", tmp_path / "figures"
    threads = torch.get_num_threads()
    try:
        run(runs[0].config, ResultsStore(store))
        arguments = ["train", "smoke", "--store", str(store), "--figures", str(figures), "--threads", "1"]
        assert cli.main(arguments) == 0
    finally:
        torch.set_num_threads(threads)
    manifest = json.loads((figures / "manifests" / "executor.json").read_text())
    assert manifest["executor"] == "inline" and manifest["workers"] == 1 and manifest["threads"] == 1
    assert manifest["runs"] == {"trained": 1, "from_store": 1, "failed": 0, "diverged": 0}
    assert manifest["profile"] == "smoke"
    assert manifest["stack"] == 1 and manifest["gpu_sharing"] is None  # a CPU's
    assert 0 < manifest["seconds"] and manifest["machine"] and manifest["commit"]
    assert "1 of 1 runs finished, 0 failed" in capsys.readouterr().err


def test_train_into_the_notebooks_store_sends_the_notebooks_that_read_its_runs_back_to_make(tmp_path, monkeypatch,
                                                                                               capsys):
    """make reruns a notebook when its code changes, not when the store does: a run trained again (a record removed,
    Fig. 3's timings made again on a quiet machine) leaves the notebooks that read it out of date, so ``train`` removes
    their executed copies, and only theirs."""
    from experiments.engine import train
    from experiments.tests.test_stacked_runs import _nan_for

    runs = [dataclasses.replace(_planned(1), notebooks=("table2", "table3")),
            dataclasses.replace(_planned(2), notebooks=("fig3",)),
            dataclasses.replace(_planned(3, loss="smooth_hinge", loss_options={"k": 5, "tau": 1.0}), notebooks=("fig5",))]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(cli, "BUILD", tmp_path / "build")
    monkeypatch.setattr(train, "build_loss", _nan_for("smooth_hinge"))  # the third run diverges: an outcome shown
    executed = tmp_path / "build" / "smoke"
    executed.mkdir(parents=True)
    for notebook in ("table2", "table3", "fig3", "fig5", "table4"):
        (executed / f"{notebook}.ipynb").write_text("{}")
    threads = torch.get_num_threads()
    try:
        run(runs[0].config, ResultsStore(tmp_path / "results" / "smoke"))  # finished before: its readers stay
        assert cli.main(["train", "smoke", "--threads", "1", "--figures", str(tmp_path / "figures")]) == 0
    finally:
        torch.set_num_threads(threads)
    assert sorted(path.stem for path in executed.glob("*.ipynb")) == ["table2", "table3", "table4"]
    assert "to run again on the runs trained now: fig3, fig5 (`make notebooks`)" in capsys.readouterr().err
    assert cli.out_of_date(runs, {runs[0].key}, executed) == ["table2", "table3"]
    assert cli.out_of_date(runs, {runs[0].key}, executed) == []  # already out of date


def test_a_run_whose_loss_becomes_nan_is_diverged_not_failed_and_is_not_trained_again(tmp_path, monkeypatch, capsys):
    """A NaN is an outcome, as the notebooks show it: ``train`` exits 0 naming the run diverged with its log, the plan
    says so, and the next ``train`` leaves it (and the notebooks read it back without training)."""
    from experiments.engine import train
    from experiments.tests.test_stacked_runs import _nan_for

    runs = [_planned(1), _planned(2, loss="smooth_hinge", loss_options={"k": 5, "tau": 1.0})]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    monkeypatch.setattr(train, "build_loss", _nan_for("smooth_hinge"))
    store, arguments = ResultsStore(tmp_path), ["train", "smoke", "--store", str(tmp_path), "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        assert cli.main(arguments) == 0
        err = capsys.readouterr().err
        assert "1 of 2 runs finished, 0 failed, 1 diverged (their loss became NaN: kept as such)" in err
        assert f"  diverged: {runs[1].key} (log: {tmp_path / 'logs' / runs[1].key}.log)" in err
        assert state(runs[1], store) == ("diverged", 0)  # NaN from its second step: no epoch kept
        assert cli.main(["plan", "smoke", "--store", str(tmp_path)]) == 0
        assert capsys.readouterr().out.splitlines()[-1].startswith("2 runs: 1 finished, 1 diverged, 0 training, 0 queued, 0 partial, 0 missing")
        assert cli.main(arguments) == 0
        assert "2 runs, 1 already finished, 1 diverged, 0 to train" in capsys.readouterr().err
        (store.root / "diverged").rename(tmp_path / "kept")  # as an array task meets it: no traceback, status 0
        assert cli.main(["run-one", runs[1].key, "--profile", "smoke", "--store", str(tmp_path)]) == 0
        assert capsys.readouterr().out == (f"{runs[1].key}: diverged: the training loss became NaN in epoch 1 (kept "
                                           "in the store as its outcome)\n")
    finally:
        torch.set_num_threads(threads)


def test_a_slurm_tasks_claim_is_taken_over_by_its_requeued_self_not_by_its_allocations_other_processes(
        tmp_path, monkeypatch):
    key = "0123456789abcdef"
    path = run_claim.claim_path(tmp_path, key)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    path.parent.mkdir(parents=True)
    path.write_text('{"host": "another-node", "pid": 1, "slurm_job": "77", "slurm_restart": 1}')
    assert not run_claim.try_claim(tmp_path, key)  # this incarnation's process on another node: its heartbeat tells
    path.write_text('{"host": "another-node", "pid": 1, "slurm_job": "77", "slurm_restart": 0}')
    assert run_claim.try_claim(tmp_path, key)  # this task before Slurm requeued it: gone
    assert run_claim.read_claim(path)["slurm_restart"] == 1


def test_a_claim_is_kept_by_a_live_holder_and_taken_over_from_a_dead_or_silent_one(tmp_path):
    key = "0123456789abcdef"
    path = run_claim.claim_path(tmp_path, key)
    assert run_claim.try_claim(tmp_path, key)
    assert run_claim.read_claim(path)["pid"] == os.getpid()
    assert not run_claim.try_claim(tmp_path, key)  # held by this live process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps({**run_claim.holder(), "pid": dead.pid}))
    assert run_claim.try_claim(tmp_path, key)  # its process is gone
    ended = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not yet reaped: a zombie, whose pid still exists
    deadline = time.time() + 30
    while Path(f"/proc/{ended.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.time() < deadline
        time.sleep(0.05)
    path.write_text(json.dumps({**run_claim.holder(), "pid": ended.pid, "pid_start": None}))
    assert run_claim.try_claim(tmp_path, key)  # its process has ended
    ended.wait()
    path.write_text('{"host": "another-node", "pid": 1}')
    assert not run_claim.try_claim(tmp_path, key)  # another host's claim, touched just now
    old = time.time() - run_claim.STALE_AFTER - 1
    os.utime(path, (old, old))
    assert run_claim.try_claim(tmp_path, key)  # silent for too long
    path.write_text(json.dumps({**run_claim.holder(), "pid_namespace": -1, "pid": dead.pid}))
    assert run_claim.live_holder(tmp_path, key)["pid"] == dead.pid  # a container's pid, not this namespace's: alive
    assert not run_claim.try_claim(tmp_path, key)  # while its heartbeat is fresh
    os.utime(path, (old, old))
    assert run_claim.live_holder(tmp_path, key) is None and run_claim.try_claim(tmp_path, key)
    assert run_claim.live_holder(tmp_path, key)["pid"] == os.getpid()
    os.utime(path, (old, old))
    assert not run_claim.try_claim(tmp_path, key)  # its live process tells, whatever its heartbeat (Ctrl-Z, say)
    path.write_text(json.dumps({**run_claim.holder(), "pid_start": run_claim.holder()["pid_start"] - 1}))
    assert run_claim.try_claim(tmp_path, key)  # this pid, reused by a process started later: the holder is gone
    run_claim.release(tmp_path, key)
    assert not path.exists()
    for damaged in ('[1, 2]', '{"host": ', '"a string"', ''):  # a claim cut by a crash, or not a holder's
        path.write_text(damaged)
        assert run_claim.read_claim(path) == {}
        assert not run_claim.try_claim(tmp_path, key)  # judged by its age: touched just now
        os.utime(path, (old, old))
        assert run_claim.try_claim(tmp_path, key)
        run_claim.release(tmp_path, key)


def test_a_stale_claim_a_competitor_took_over_between_the_look_and_the_rename_is_put_back_not_taken(tmp_path,
                                                                                                     monkeypatch):
    """Two processes judge one dead holder's claim stale; the quicker moves it aside and makes its own; the slower's
    rename then moves that new claim, not the one it judged: it puts it back and leaves the run to its holder."""
    key = "0123456789abcdef"
    path = run_claim.claim_path(tmp_path, key)
    path.parent.mkdir(parents=True)
    path.write_text('{"host": "node-a", "pid": 1}')
    old = time.time() - run_claim.STALE_AFTER - 1
    os.utime(path, (old, old))
    competitor = {"host": "node-b", "pid": 2, "since": time.time()}
    real_is_stale = run_claim.is_stale

    def judged_then_overtaken(*args, **kwargs):
        stale = real_is_stale(*args, **kwargs)
        path.unlink()  # the competitor, between this process's look and its rename
        path.write_text(json.dumps(competitor))
        return stale

    monkeypatch.setattr(run_claim, "is_stale", judged_then_overtaken)
    assert run_claim.try_claim(tmp_path, key) is False
    assert run_claim.read_claim(path) == competitor
    assert sorted(entry.name for entry in path.parent.iterdir()) == [path.name]  # nothing left aside


def test_a_release_while_a_competitor_puts_the_holder_s_claim_back_still_removes_it(tmp_path):
    """A competitor that moved this holder's claim aside by mistake puts it back a moment later; a release in between
    looks again, so that the finished run's claim does not stay behind naming a live process."""
    key = "0123456789abcdef"
    assert run_claim.try_claim(tmp_path, key)
    path = run_claim.claim_path(tmp_path, key)
    aside = path.with_name(f".{path.name}.stale.1")
    path.replace(aside)  # the competitor's rename
    putting_back = threading.Timer(0.05, lambda: (os.link(aside, path), aside.unlink()))
    putting_back.start()
    run_claim.release(tmp_path, key)
    putting_back.join()
    assert not path.exists()


def test_a_holder_whose_claim_was_taken_over_writes_nothing_more_and_waits_for_the_new_holder(tmp_path, monkeypatch,
                                                                                            capsys):
    """A holder paused past the claim's staleness (a suspended job) finds, when it goes on, that another host took
    the run over: its next checkpoint is refused, it writes nothing of the run, and it waits for that holder's record
    (here: returns None at once, ``wait=False``); its heartbeat never keeps the new holder's claim fresh."""
    config, store = RunConfig(**TINY), ResultsStore(tmp_path)
    path = run_claim.claim_path(tmp_path, config.training_key())
    new_holder = {"host": "node-b", "pid": 2, "since": time.time()}
    real_run = run_claim.run

    def taken_over_while_paused(*args, **kwargs):
        path.write_text(json.dumps(new_holder))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(run_claim, "run", taken_over_while_paused)
    assert run_claim.train_once(config, store, wait=False) is None
    assert "was taken over by node-b (pid 2)" in capsys.readouterr().err
    assert run_claim.read_claim(path) == new_holder  # not released: it is not this process's
    assert not store.checkpoint_path(config.key()).exists() and store.finished(config.key()) is None
    old = time.time() - 100
    os.utime(path, (old, old))
    with run_claim.held(tmp_path, config.training_key(), heartbeat=0.01):
        time.sleep(0.2)
    assert path.stat().st_mtime == pytest.approx(old)


def test_a_live_holder_whose_start_proc_hides_is_judged_by_its_heartbeat_not_as_a_reused_pid(tmp_path, monkeypatch):
    """Where /proc is mounted with hidepid (many clusters' login nodes), another user's process start cannot be read:
    its claim stands while its heartbeat does, rather than being judged a reused pid at once."""
    key = "0123456789abcdef"
    path = run_claim.claim_path(tmp_path, key)
    assert run_claim.try_claim(tmp_path, key)
    monkeypatch.setattr(run_claim, "_stat_after_name", lambda pid: None)
    assert run_claim.live_holder(tmp_path, key)["pid"] == os.getpid()
    assert not run_claim.try_claim(tmp_path, key)
    old = time.time() - run_claim.STALE_AFTER - 1
    os.utime(path, (old, old))
    assert run_claim.live_holder(tmp_path, key) is None


RACER = """
import sys
from experiments.engine import run_claim
from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
import json, os, torch
torch.set_num_threads(1)
real_run = run_claim.run
def counted(*args, **kwargs):
    with open(sys.argv[2], "a") as log:
        log.write(f"{os.getpid()}\\n")
    return real_run(*args, **kwargs)
run_claim.run = counted
config = RunConfig.from_dict(json.loads(sys.argv[3]))
run_claim.train_once(config, ResultsStore(sys.argv[1]), poll=0.2)
"""


def test_two_processes_racing_on_one_run_train_it_once(tmp_path):
    config = RunConfig(**TINY)
    arguments = [str(tmp_path / "store"), str(tmp_path / "trainings"), json_config(config)]
    racers = [subprocess.Popen([sys.executable, "-c", RACER, *arguments], cwd=ROOT, env=_env()) for _ in range(2)]
    assert [racer.wait(timeout=300) for racer in racers] == [0, 0]
    assert len((tmp_path / "trainings").read_text().split()) == 1
    assert ResultsStore(tmp_path / "store").finished(config.key()) is not None


def test_a_worker_killed_mid_run_is_resumed_by_the_next_train_to_the_same_result(tmp_path):
    config = RunConfig(**{**TINY, "epochs": 6, "milestones": (3,)})
    store = _CountingStore(tmp_path / "killed")
    worker = subprocess.Popen([sys.executable, "-c", RACER, str(store.root), str(tmp_path / "trainings"),
                               json_config(config)], cwd=ROOT, env=_env())
    deadline = time.time() + 300
    while not store.checkpoint_path(config.key()).exists() and time.time() < deadline:
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert store.finished(config.key()) is None, "the worker finished before it could be killed"
    assert run_claim.claim_path(store.root, config.training_key()).exists()  # left behind by the killed worker
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resumed = run_claim.train_once(config, store, wait=False)
        whole = run_claim.train_once(config, ResultsStore(tmp_path / "whole"))
    finally:
        torch.set_num_threads(threads)
    assert 0 < store.checkpoints_saved < config.epochs  # resumed from the killed worker's checkpoint, not restarted
    assert computed(resumed) == computed(whole)


def test_plan_says_what_each_stand_ins_images_take_in_a_training_process_memory(tmp_path):
    from experiments.scale.plan import stand_in_memory, table

    runs = plan(get_profile("gpu"))
    memory = stand_in_memory(runs)
    assert list(memory) == ["imagenet_like", "plantnet_like", "imagenet_lt_like", "cifar100_like"]  # largest first
    assert memory["imagenet_like"] > 8  # GiB: more than many partitions give a task by default
    assert f"imagenet_like {memory['imagenet_like']:.1f} GiB, plantnet_like" in table(runs, ResultsStore(tmp_path))
    said = "its Slurm task 12_0 ended without its record: RuntimeError: no GPU; log: 12_0.err"
    listing = table(runs[:2], ResultsStore(tmp_path), ended={runs[0].key: said}).splitlines()
    assert listing[1].endswith(f"  ({said})") and said not in listing[2]


def test_plan_says_why_a_run_s_slurm_task_ended_or_that_it_never_started(tmp_path):
    """A task's log, which Slurm opens as the task starts, says why it ended; a task without one never started (a
    tryout's task cancelled while queued was said to have a log that says nothing, naming a file that did not exist)."""
    from experiments.scale import cli

    log = tmp_path / "12_1.err"
    assert cli._ended_text("12_1", str(log)) == ("its Slurm task 12_1 left the queue without starting (no log: "
                                                 "cancelled or refused while queued)")
    log.write_text("Traceback (most recent call last):\nRuntimeError: no GPU\n")
    assert cli._ended_text("12_1", str(log)) == f"its Slurm task 12_1 ended without its record: RuntimeError: no GPU; log: {log}"


def test_a_failed_run_is_reported_with_the_line_of_its_log_that_says_why(tmp_path):
    """The reason is the log's last exception or ``error:`` line (a Slurm task's log ends with srun's own line), else
    its last line; the summary counts the runs failed for each reason before naming each run with its log."""
    from experiments.scale.progress import failure_reason

    runs = [PlannedRun(RunConfig(**{**TINY, "seed": seed}), ("test",), None, 0) for seed in (1, 2, 3)]
    logs = [tmp_path / f"{seed}.err" for seed in (1, 2, 3)]
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: no GPU here\n"
    logs[0].write_text(traceback + "srun: error: vm: task 0: Exited with exit code 1\n\n")
    logs[1].write_text(traceback)
    logs[2].write_text("epoch 3\nkilled\n")
    assert [failure_reason(str(log)) for log in logs] == ["RuntimeError: no GPU here"] * 2 + ["killed"]
    assert failure_reason(str(tmp_path / "none.err")) == ""
    again = tmp_path / "again.err"  # a log appended to by a second attempt, which was killed: its end says why
    again.write_text(traceback + "worker process 123 died (exit code -9) while training it\n")
    bare = tmp_path / "bare.err"
    bare.write_text("Traceback (most recent call last):\nMemoryError\nsrun: error: n1: task 0: Exited with code 1\n")
    assert [failure_reason(str(log)) for log in (again, bare)] == [
        "worker process 123 died (exit code -9) while training it", "MemoryError"]
    progress = Progress(runs, stream=io.StringIO())
    for planned, log in zip(runs, logs):
        progress.fail(planned, str(log))
    assert f"FAILED {runs[0].key} (test): RuntimeError: no GPU here (log: {logs[0]})" in progress.stream.getvalue()
    assert progress.summary().splitlines()[1:4] == ["  why 2 failed, as: RuntimeError: no GPU here",
                                                    "  why 1 failed: killed", f"  failed: {runs[0].key} (log: {logs[0]})"]


def test_cuda_without_a_gpu_inside_a_slurm_job_names_the_job_and_what_slurm_gave_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a node whose GPU torch cannot use
    for name, value in (("SLURM_JOB_ID", "1234"), ("SLURMD_NODENAME", "gpu07"), ("CUDA_VISIBLE_DEVICES", "0")):
        monkeypatch.setenv(name, value)
    assert executors.device_refusal("cuda") == (
        "--device cuda, but torch sees no CUDA device in Slurm job 1234 on gpu07 (CUDA_VISIBLE_DEVICES=0): check "
        "that node's GPUs and driver (nvidia-smi)")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert executors.device_refusal("cuda") == ("--device cuda, but Slurm job 1234 on gpu07 holds no GPU: ask one "
                                                "(--gpus-per-task 1, or --sbatch-option gres=gpu:1)")
    monkeypatch.delenv("SLURMD_NODENAME")  # salloc's shell on the login node: the job's step is still to start
    assert "torch sees no CUDA device here: train on a machine with a GPU (on a cluster: inside srun or salloc" in \
        executors.device_refusal("cuda")


def test_a_local_worker_killed_mid_run_is_named_failed_and_replaced_while_the_others_go_on(tmp_path):
    """``kill -9`` of the worker training the first run: ``train`` does not stop; that run is named failed with a log
    saying the worker died, a new worker trains the third run, and the second finishes beside them."""
    import multiprocessing
    import threading

    runs = [_planned(seed, epochs=6, milestones=(3,)) for seed in (1, 2, 3)]
    options = executors.TrainOptions(str(tmp_path / "store"), threads=1)
    store, progress = ResultsStore(options.store), Progress(runs)

    def kill_the_first_runs_worker() -> None:
        deadline = time.time() + 300
        while not store.checkpoint_path(runs[0].key).exists() and time.time() < deadline:
            time.sleep(0.05)
        first = [child for child in multiprocessing.active_children() if child.name == "topk-worker-0"]
        os.kill(first[0].pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_first_runs_worker)
    killer.start()
    executors.local(runs, options, progress, jobs=2)
    killer.join()
    assert list(progress.failed) == [runs[0].key] and progress.done == 2, progress.summary()
    assert "died (exit code -9)" in Path(progress.failed[runs[0].key]).read_text()
    assert store.finished(runs[0].key) is None and store.checkpoint_path(runs[0].key).exists()  # resumable


def test_ctrl_c_stops_a_local_train_with_its_workers_and_one_message_no_traceback(tmp_path):
    """SIGINT to the whole process group, as Ctrl-C sends it, once the first runs finished: exit 130, the message
    that the same command resumes, and no worker's traceback."""
    store = tmp_path / "store"
    command = [sys.executable, "-m", "experiments", "train", "smoke", "--executor", "local", "--jobs", "2",
               "--store", str(store), "--figures", str(tmp_path / "figures")]
    train = subprocess.Popen(command, cwd=ROOT, env=_env(), stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    deadline = time.time() + 300
    while not any((store / "runs").glob("*.json")) and time.time() < deadline and train.poll() is None:
        time.sleep(0.05)
    os.killpg(train.pid, signal.SIGINT)
    _, errors = train.communicate(timeout=120)
    assert train.returncode == 130, errors[-3000:]
    assert "interrupted: every finished run and every epoch's checkpoint is kept" in errors
    assert "Traceback" not in errors, errors[-3000:]


def test_after_a_stop_signal_a_finaliser_left_half_done_prints_no_traceback():
    """Ctrl-C can cut a library's cleanup short (llvmlite's under numba, in a CI run): its object's finaliser then
    fails, and Python prints that as "Exception ignored ... Traceback". After the stop signal nothing such is printed;
    before it, it still is."""
    code = ("import os, signal\n"
            "from experiments.scale.executors import interrupt_quietly\n"
            "class Finalised:\n"
            "    def __del__(self):\n"
            "        raise AttributeError('cut short')\n"
            "signal.signal(signal.SIGINT, interrupt_quietly)\n"
            "Finalised()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    for _ in range(10 ** 7):\n"
            "        pass\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n"
            "Finalised()\n")
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout == "interrupted\n", ran.stderr
    assert ran.stderr.count("Exception ignored") == 1 and ran.stderr.count("cut short") == 1, ran.stderr


def test_sigterm_to_a_local_train_alone_stops_it_with_its_workers_as_ctrl_c_does(tmp_path):
    """SIGTERM to the command's process only (``kill``, a scheduler ending the job; SIGHUP, a closed terminal, is taken
    the same way): exit 130, the message that the same command resumes, no traceback, and no worker left running."""
    store, mark = tmp_path / "store", f"topk-test-{os.getpid()}-{time.time_ns()}"
    command = [sys.executable, "-m", "experiments", "train", "smoke", "--executor", "local", "--jobs", "2",
               "--store", str(store)]
    train = subprocess.Popen(command, cwd=ROOT, env={**_env(), "TOPK_TEST_MARK": mark}, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    deadline = time.time() + 300
    while not any((store / "runs").glob("*.json")) and time.time() < deadline and train.poll() is None:
        time.sleep(0.05)
    train.send_signal(signal.SIGTERM)
    _, errors = train.communicate(timeout=120)
    assert train.returncode == 130, errors[-3000:]
    assert "interrupted: every finished run and every epoch's checkpoint is kept" in errors
    assert "Traceback" not in errors, errors[-3000:]
    assert _processes_marked(mark) == [], "workers outlived the command"


def test_workers_stop_when_their_parent_is_killed_and_keep_their_checkpoints(tmp_path):
    """``kill -9`` of the command (no handler runs, so it ends no worker): each worker sees its parent gone and stops
    as at Ctrl-C, within seconds, instead of training on for nobody with its run claimed."""
    store, mark = tmp_path / "store", f"topk-test-{os.getpid()}-{time.time_ns()}"
    command = [sys.executable, "-m", "experiments", "train", "smoke", "--executor", "local", "--jobs", "2",
               "--store", str(store)]
    with (tmp_path / "stderr").open("w") as errors:
        train = subprocess.Popen(command, cwd=ROOT, env={**_env(), "TOPK_TEST_MARK": mark}, stderr=errors,
                                 start_new_session=True)
    try:
        deadline = time.time() + 300
        while not any((store / "checkpoints").glob("*.pt")) and time.time() < deadline and train.poll() is None:
            time.sleep(0.05)
        assert train.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        train.send_signal(signal.SIGKILL)
        train.wait(timeout=60)
        deadline = time.time() + 60
        while _processes_marked(mark) and time.time() < deadline:
            time.sleep(0.2)
        assert _processes_marked(mark) == [], "workers outlived their killed parent"
    finally:  # not to leave them training past the test, whatever failed
        for pid in _processes_marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    results = ResultsStore(store)
    checkpointed = [path.stem for path in (store / "checkpoints").glob("*.pt")]
    assert any(results.load_checkpoint(key) is not None and results.finished(key) is None for key in checkpointed), \
        "no run stopped mid-training kept its checkpoint"


@pytest.mark.parametrize("stop, ignored", [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, False),
                                          (signal.SIGHUP, True)])
def test_a_command_stopped_outside_its_training_says_so_without_a_traceback(stop, ignored):
    """Each stop signal ends a command quietly with status 130; one ignored at its start (SIGHUP under ``nohup``) stays
    ignored, and the command goes on."""
    code = ("import signal, sys, time\n"
            "from experiments.scale.executors import STOP_SIGNALS, run_as_command\n"
            "for stop in STOP_SIGNALS:  # as a shell starts it, whatever the test runner's own dispositions\n"
            "    signal.signal(stop, signal.SIG_IGN if stop in IGNORED else signal.SIG_DFL)\n"
            "def main():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(3)\n"
            "    print('went on', flush=True)\n"
            "    return 0\n"
            "run_as_command(main)\n").replace("IGNORED", f"({int(stop)},)" if ignored else "()")
    command = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([command.stdout], [], [], 120)[0] and command.stdout.readline() == "ready\n"
        command.send_signal(stop)
        output, errors = command.communicate(timeout=60)
    finally:
        command.kill()
    if ignored:
        assert command.returncode == 0 and output == "went on\n", errors
    else:
        assert command.returncode == 130, errors
        assert errors.endswith("\ninterrupted: every finished run is kept; the same command resumes\n"), errors
        assert "Traceback" not in errors and output == "", errors


def test_every_command_that_trains_stops_quietly_on_every_stop_signal():
    """Each module run as a command that trains runs into a store or in other processes (it calls ``run``, the
    executors, or ``experiments train``) enters through :func:`executors.run_as_command`, so that SIGTERM and SIGHUP
    stop it as Ctrl-C does (``make calibrate`` killed by a scheduler left its workers training, before). Benchmarks
    that time steps in their own process keep nothing, and a signal's default action ends them whole."""
    training = [path for folder in ("experiments", "benchmarks") for path in (ROOT / folder).rglob("*.py")
                if "tests" not in path.parts and 'if __name__ == "__main__":' in (text := path.read_text())
                and any(sign in text for sign in ("from experiments.engine.train import run\n", "experiments.scale import",
                                                  "experiments.scale.executors import", '"experiments", "train"'))]
    assert {path.name for path in training} >= {"__main__.py", "calibrate.py", "crowding.py", "label_noise_capacity.py",
                                                 "bench_executors.py", "bench_calibration.py"}
    for path in training:
        main_block = path.read_text().split('if __name__ == "__main__":')[1]
        assert "run_as_command(main" in main_block, path


def _processes_marked(mark: str) -> list[int]:
    """The live processes whose environment holds ``mark`` (this test's own command and the workers it started)."""
    marked = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"TOPK_TEST_MARK={mark}".encode() in environ.read_bytes():
                marked.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return marked


class _CountingStore(ResultsStore):
    checkpoints_saved = 0

    def save_checkpoint(self, key, state):
        self.checkpoints_saved += 1
        super().save_checkpoint(key, state)


def json_config(config: RunConfig) -> str:
    return json.dumps(config.to_dict())


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_run_one_trains_several_keys_stacked_and_refuses_what_cannot_stack(tmp_path, monkeypatch, capsys):
    """An array task's command: ``run-one KEY KEY`` gives the engine's stacked records; runs of other settings, an
    unknown key and a stack below one are refused with what was wrong, and nothing trains."""

    runs = [_planned(1), _planned(2), _planned(3, lr=0.1)]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    store = tmp_path / "store"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cli.main(["run-one", runs[0].key, runs[1].key, "--profile", "smoke", "--store", str(store)]) == 0
        expected = run_stacked([one.config for one in runs[:2]], ResultsStore(tmp_path / "engine"))
    finally:
        torch.set_num_threads(threads)
    for one, record in zip(runs, expected):
        assert computed(ResultsStore(store).finished(one.key)) == computed(record)
    assert f"{runs[1].key}: finished" in capsys.readouterr().out
    sibling = runs[2].config.siblings()[1].key()  # another selection of one training: trained once, alone
    assert cli.main(["run-one", runs[2].key, sibling, "--profile", "smoke", "--store", str(store)]) == 0
    assert "stacked_with" not in ResultsStore(store).finished(runs[2].key)["provenance"]
    assert capsys.readouterr().out.count(": finished") == 1
    assert cli.main(["run-one", runs[0].key, runs[2].key, "--profile", "smoke", "--store", str(tmp_path / "x")]) == 2
    assert "cannot train stacked into one model: they differ in lr 0.1 against 0.05" in capsys.readouterr().err
    assert cli.main(["run-one", "0123456789abcdef", "--profile", "smoke", "--store", str(tmp_path / "x")]) == 2
    assert "no run of this profile has the key '0123456789abcdef'" in capsys.readouterr().err
    assert cli.main(["train", "smoke", "--stack", "0", "--store", str(tmp_path / "x")]) == 2
    assert "--stack should be a positive number of runs stacked into one model, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_plan_says_what_the_calibration_trains_first_where_a_stand_in_is_not_calibrated(monkeypatch, capsys, tmp_path):
    runs = [_planned(1), _planned(2)]
    first = CalibrationFirst("cifar", [[_planned(3)], [_planned(4), runs[1]]], runs[:1], runs[1:])  # trains the 2nd
    every = CalibrationFirst("cifar", [[_planned(3)], [_planned(4), _planned(5), runs[1]]], runs[:1], runs[1:])
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    monkeypatch.setattr(cli, "calibrations_to_make", lambda profile, searched=1: {"cifar": first if searched else every})
    monkeypatch.setattr(cli.fixed_point, "unsettled", lambda profile: ["cifar"])  # said once, with its search
    assert cli.main(["plan", "smoke", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "and first, make calibrate: at least 3 runs of 1 stand-in to calibrate (cifar100_like), 1 of them the "
        "notebooks' own once calibrated, 0 training images in all, where the seeds at a search's start agree so "
        "closely that it averages one; 4 runs and 0 training images where it needs every seed "
        "(docs/reproducing.md#the-calibrations-hours)")
    monkeypatch.setattr(cli, "calibrations_to_make", lambda profile, searched=1: {})  # calibrated: nothing said
    monkeypatch.setattr(cli.fixed_point, "unsettled", lambda profile: [])
    assert cli.main(["plan", "smoke", "--store", str(tmp_path)]) == 0
    assert "make calibrate" not in capsys.readouterr().out


def test_plan_says_which_stand_ins_have_a_step_left_beyond_their_search(monkeypatch, capsys, tmp_path):
    """A stand-in whose search is today's but whose learning rates are to choose again: ``train`` refuses the profile,
    so the plan says what ``make calibrate`` does first (it said nothing)."""
    monkeypatch.setattr(cli, "plan", lambda profile: [_planned(1)])
    monkeypatch.setattr(cli, "calibrations_to_make", lambda profile, searched=1: {})
    monkeypatch.setattr(cli.fixed_point, "unsettled", lambda profile: ["cifar"])
    monkeypatch.setattr(cli.fixed_point, "status", lambda profile, setup: {
        "state": "trained by an earlier engine (abc1234): run `make calibrate`"})
    assert cli.main(["plan", "smoke", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "and first, make calibrate: 1 stand-in with a step left (cifar100_like: trained by an earlier engine (abc1234): "
        "run `make calibrate`)")


def test_plan_with_a_stack_numbers_each_runs_group(monkeypatch, capsys, tmp_path):
    runs = [_planned(1), _planned(2, lr=0.1), _planned(3), _planned(4)]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    assert cli.main(["plan", "smoke", "--stack", "2", "--store", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["key", "state", "epochs", "images", "group", "notebooks"]
    assert [line.split()[4:6] for line in lines[1:5]] == [["1", "(x2)"], ["2", "(x1)"], ["1", "(x2)"], ["3", "(x1)"]]
    assert lines[-1] == "3 groups: 1 of 2 runs, 2 of 1 run"
    assert cli.main(["plan", "smoke", "--store", str(tmp_path)]) == 0
    assert "group" not in capsys.readouterr().out
    assert cli.main(["plan", "smoke", "--stack", "0", "--store", str(tmp_path)]) == 2


def test_plan_with_gpus_estimates_the_hours_of_each_measured_setting(monkeypatch, capsys, tmp_path):
    """Runs of the measured model and batch only, each setting's hours worked out by hand (as in test_hours.py, with
    100 times the images), the most complete and fastest first; measurements on a CPU or of another model are not
    read, stale ones only when no current one is left, and said to be; bad files and values are named."""
    from experiments.analysis.timings import engine_code
    from experiments.tests.test_hours import planned

    runs = [*(planned(seed, 360_000, 80_000, 20_000, **({"lr": 0.2} if seed == 3 else {})) for seed in range(4)),
            planned(4, 72_000, 0, 0, notebook="fig3_epoch_time"),
            planned(5, 360_000, 80_000, 20_000, batch_size=64)]  # another batch: not estimated
    other_batch = CalibrationFirst("imagenet", [runs[5:]], [], [])
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    header = ("device,device_name,engine_code,date,model,compile,batch_size,concurrency,stack,aggregate_images_per_s,"
              "eval_images_per_s,warmup_s\n")
    common = "cuda,test-gpu,{code},2026-01-01T00:00:00,small_cnn,reduce-overhead,32"
    rows = [common.format(code=engine_code()) + ",1,1,100,1000,10",
            common.format(code=engine_code()) + ",2,1,160,1600,12",
            common.format(code=engine_code(stacked=True)) + ",1,2,150,1500,20",
            common.format(code=engine_code(stacked=True)) + ",2,2,250,2500,20"]
    ignored = ["cuda,test-gpu,0,2000-01-01,small_cnn,default,32,1,1,1,,",  # stale, while a current one exists
               f"cpu,a-cpu,{engine_code()},2000-01-02,small_cnn,eager,32,1,1,99999,,",  # not a GPU
               f"cuda,test-gpu,{engine_code()},2000-01-03,densenet40_40,default,32,1,1,99999,,"]  # no run's model
    (tmp_path / "rates.csv").write_text(header + "\n".join([*ignored, *rows]) + "\n")
    rates = ["--rates", str(tmp_path / "rates.csv"), "--store", str(tmp_path)]
    assert cli.main(["plan", "smoke", "--gpus", "1", *rates]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("estimated hours on 1 GPU, at the rates of rates.csv's measurements made with today's engine:")
    where = "test-gpu, reduce-overhead, 2026-01-01T00:00:00: 5 of 6 runs (small_cnn, batch 32)"
    # two workers: two rounds of 4500 + 100 + 25 + 12 s, then the lone run 720 + 10 s; stacks of 2: 4966.7 s for the
    # first two, 3710 s for each other run, then the lone run; one run at a time: 4 x 3710 + 730 s; two workers with
    # stacks of 2: [0, 1] at 125 images/s (20 + 5760 + 128 + 50 s: done at 5958 s) beside [2] (4637 s), then [3] from
    # 4637 s: 12 s, 90,480 + 10,240 + 4,000 images at 80/s until 5958 s, then alone at (1, 1)'s rates: 255,280 / 100
    # + 80 + 20 s, done at 8610.8 s; then 730 s
    counted = "training, compilation, validation and testing counted"
    assert lines[start + 1].startswith("(a setting measured more than once has a line per measurement, its device, "
                                       "compile mode and date named, those covering the most runs first, then the "
                                       "fastest. Through Slurm: PER_GPU=1 is a task on each whole GPU, --gpus-per-task "
                                       "1; PER_GPU=M under MPS, a task on each share where the site offers gres/mps")
    assert lines[start + 2:] == [f"  PER_GPU=2 STACK=2        2.6 h  {where}; {counted}",
                                 f"  PER_GPU=2 STACK=1        2.8 h  {where}; {counted}",
                                 f"  PER_GPU=1 STACK=2        3.6 h  {where}; {counted}",
                                 f"  PER_GPU=1 STACK=1        4.3 h  {where}; {counted}"]
    first = CalibrationFirst("cifar", [runs[:1], runs[1:3]], runs[3:4], [])
    every = CalibrationFirst("cifar", [runs[:1], runs[1:4]], [], [])  # a search averaging every seed: one more run
    monkeypatch.setattr(cli, "calibrations_to_make", lambda profile, searched=1: {
        "cifar": first if searched else every, "imagenet": other_batch})
    assert cli.main(["plan", "smoke", "--gpus", "1", *rates]) == 0
    lines = capsys.readouterr().out.splitlines()
    # a stand-in's calibration: move after move of lone runs, at each PER_GPU measured with them: one worker
    # 3710 s, then 2 x 3710 s; two workers: 3712 s (the warm-up of two workers' setting, 12 s), then both runs at
    # once at 80 images/s each (12 + 4500 + 100 + 25 s); averaging every seed, a third run in the second move: one
    # worker 4 x 3710 s; two workers 3712 s, 4637 s, then the third alone 3712 s; a stand-in of another batch is not
    # estimated
    start = lines.index("and first, calibrating the stand-ins (make calibrate) takes at least (no move of a search "
                        "improving on its start; each move's runs wait for the last's; the notebooks' runs among them "
                        "are not trained again), each search averaging one seed (every seed, in brackets):")
    measured = "test-gpu, reduce-overhead, 2026-01-01T00:00:00; " + counted
    end = lines.index("", start)
    assert lines[start + 1:end] == [f"  cifar100_like      PER_GPU=2       2.3 h (3.4 h)  3 runs (4) in 2 moves; {measured}",
                                    f"  cifar100_like      PER_GPU=1       3.1 h (4.1 h)  3 runs (4) in 2 moves; {measured}",
                                    "  cifar100_like      not estimated: no measurement of its model and batch "
                                    "(small_cnn, batch 64)"]  # named by dataset: TINY's is cifar100_like too
    # then each setting's notebooks with the calibration first: one worker, 3 x 3710 s of moves, then the run it left,
    # 3710 s (every seed: 4 x 3710 s of moves, none left), in the notebooks' order of settings
    assert lines[end + 1] == ("the notebooks' runs above with their stand-in's calibration first, as make paper-figures "
                              "takes them from an empty store, at least (its search averaging one seed; every seed in "
                              "brackets):")
    assert [line.split()[0] for line in lines[end + 2:]] == ["PER_GPU=2", "PER_GPU=2", "PER_GPU=1", "PER_GPU=1"]
    assert lines[-1] == (f"  PER_GPU=1 STACK=1        4.1 h (4.1 h)  cifar100_like: its calibration, then its "
                         f"notebooks' runs; {where}")
    monkeypatch.setattr(cli, "calibrations_to_make", lambda profile, searched=1: {})
    (tmp_path / "rates.csv").write_text(header + "\n".join([*ignored, *rows[2:]]) + "\n")  # no lone run's rate
    assert cli.main(["plan", "smoke", "--gpus", "1", *rates]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"  PER_GPU=1 STACK=2: not estimated, a group of its plan has no measured rate ({where})",
        f"  PER_GPU=2 STACK=2: not estimated, a group of its plan has no measured rate ({where})"]
    (tmp_path / "rates.csv").write_text(header + ignored[0] + "\n")
    assert cli.main(["plan", "smoke", "--gpus", "8", *rates]) == 0
    assert ("at the rates of rates.csv's measurements made with an earlier engine (stale: the engine's code changed "
            "since):") in capsys.readouterr().out
    for text, error in ((header + ignored[1] + "\n", "stand-ins train (small_cnn at batch 32 or 64): `python -m "
                                                     "benchmarks.bench_concurrency --model MODEL --batch-size BATCH`"),
                        ("device,model,ms_per_step\ncuda,densenet40_40,5.0\n", "is not a CSV of "
                         "benchmarks.bench_concurrency: it lacks the columns ['device_name', 'date', 'batch_size', "
                         "'compile', 'concurrency', 'aggregate_images_per_s']")):
        (tmp_path / "rates.csv").write_text(text)
        assert cli.main(["plan", "smoke", "--gpus", "1", *rates]) == 2 and error in capsys.readouterr().err
    assert cli.main(["plan", "smoke", "--gpus", "1", "--rates", str(tmp_path / "none.csv"), "--store", str(tmp_path)]) == 2
    assert "none.csv does not exist" in capsys.readouterr().err
    assert cli.main(["plan", "smoke", "--gpus", "0", *rates]) == 2
    assert "--gpus should be a positive number of GPUs, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("ledger", [True, False])
def test_a_slurm_train_whose_ledger_squeue_cannot_check_submits_nothing(tmp_path, monkeypatch, ledger):
    """The ledger lists a task, or the folder's plain scripts may have been submitted by hand, and ``squeue`` does not
    answer (here: not on PATH): ``train`` asks again, then stops with the reason instead of submitting runs whose
    tasks may still be queued."""
    from experiments.scale import slurm, slurm_queue, slurm_request

    run = PlannedRun(RunConfig(**TINY), ("test",), None, 0)
    folder = tmp_path / "slurm"
    folder.mkdir()
    if ledger:
        (folder / slurm_queue.LEDGER).write_text(json.dumps({"job_id": "12_0", "keys": [run.key], "log": "12_0.err"})
                                                 + "\n")
    monkeypatch.setenv("PATH", str(tmp_path / "no-commands"))
    options = slurm_request.SlurmOptions(str(folder), poll=0.01)
    with pytest.raises(SystemExit, match=r"Slurm \(squeue or scontrol\) did not answer 3 times.*nothing submitted"):
        slurm.train([run], executors.TrainOptions(str(tmp_path / "store")), Progress([run]), options, profile="test")
    assert not list(folder.glob("*.sbatch"))  # not even the scripts were written


def test_the_slurm_follower_stops_with_the_way_back_when_squeue_stays_silent(tmp_path, monkeypatch):
    """A follower whose ``squeue`` does not answer (here: not on PATH) for :data:`slurm.SILENT_QUEUE_S` stops, saying
    the tasks go on and that the same command follows them again, instead of waiting for ever."""
    from experiments.scale import slurm

    run = PlannedRun(RunConfig(**TINY), ("test",), None, 0)
    monkeypatch.setenv("PATH", str(tmp_path / "no-commands"))
    monkeypatch.setattr(slurm, "SILENT_QUEUE_S", 0.05)
    progress = Progress([run])
    with pytest.raises(SystemExit, match="squeue has not answered .* run it again to follow them"):
        slurm.follow([(run, "12_0", "12_0.err")], executors.TrainOptions(str(tmp_path)), progress, poll=0.01)
    assert not progress.failed  # not reported failed: its task may still run


def test_the_slurm_follower_says_once_that_a_task_is_held_and_follows_it_to_its_end(tmp_path, monkeypatch, capsys):
    """A followed task that Slurm holds (a failed launch requeued held, ``scontrol hold``) or suspends waits on
    someone: the follower says so once, with the ways on, and goes on following it (here it leaves the queue without
    its record: failed)."""
    from experiments.scale import slurm

    run = PlannedRun(RunConfig(**TINY), ("test",), None, 0)
    answers = iter([{"12_0": "PENDING"}, {"12_0": "REQUEUE_HOLD"}, {"12_0": "REQUEUE_HOLD"}, {"12_0": "RUNNING"}, {}])
    monkeypatch.setattr(slurm, "queued", lambda job_ids: next(answers))
    progress = Progress([run])
    slurm.follow([(run, "12_0", str(tmp_path / "12_0.err"))], executors.TrainOptions(str(tmp_path)), progress,
                 poll=0.01)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: Slurm task")]
    assert notes == [f"note: Slurm task 12_0 (run {run.key}) is requeue hold: followed until it trains (`scontrol "
                     "release 12_0` or `scontrol resume 12_0`); or `scancel 12_0` and the same command again, which "
                     "submits its run anew"]
    assert list(progress.failed) == [run.key]


def test_a_damaged_record_is_no_finished_run_for_any_reporter(tmp_path):
    """A record cut by a crash is set aside by every reporter (a failed group's, the Slurm follower's, the follower of
    other processes' runs): the run is reported failed, not finished, and the next ``train`` trains it again."""
    run = PlannedRun(RunConfig(**TINY), ("test",), None, 0)
    store = ResultsStore(str(tmp_path))
    store.record_path(run.key).parent.mkdir(parents=True, exist_ok=True)
    store.record_path(run.key).write_text('{"config": ')
    progress = Progress([run])
    with pytest.warns(DamagedStoreWarning, match="the run will be trained again"):
        assert not progress.report_stored(run, store, "log")
    assert not store.record_path(run.key).exists() and not progress.finished
    store.record_path(run.key).write_text('{"config": ')
    with pytest.warns(DamagedStoreWarning, match="the run will be trained again"):
        executors._report([run], executors.TrainOptions(str(tmp_path)), progress, "the group's log")
    assert list(progress.failed) == [run.key] and not progress.finished


def test_the_slurm_ledger_finds_the_key_list_in_the_plain_script_slurm_gives_back(tmp_path):
    """What :func:`slurm_queue.sbatch_submissions` reads of a plain script, as Slurm gives it back: the key list's path
    (quoted where it holds a space), which lies in the Slurm folder."""
    from experiments.scale import slurm, slurm_queue, slurm_request

    run = PlannedRun(RunConfig(**TINY), ("test",), None, 0)
    options = slurm_request.SlurmOptions(str(tmp_path / "a folder" / "slurm"))
    script = slurm.sbatch_script([[run]], executors.TrainOptions(str(tmp_path / "a folder")), options, "test", "runs")
    path = Path(shlex.split(slurm_queue._KEYS_LINE.search(script.read_text())["path"])[0])
    assert path.parent == Path(options.folder).resolve() and path.read_text().split() == [run.key]


def test_a_claim_names_the_slurm_array_task_as_squeue_does(monkeypatch):
    """A run trained by an array task is named by ``plan`` as ``squeue`` lists the task (``<array>_<index>``), not by
    the task's own job id; outside an array, by the job id."""
    from experiments.engine import run_claim
    from experiments.scale.plan import holder_text

    monkeypatch.setenv("SLURM_JOB_ID", "1102")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1099")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert holder_text(run_claim.holder()).endswith(", Slurm task 1099_2")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    assert holder_text(run_claim.holder()).endswith(", Slurm job 1102")
