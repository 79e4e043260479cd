"""The calibration with each move's runs trained side by side (experiments.scale.calibrate): a move's missing
trainings go to the executor once each, the search reads them back, a failed run stops it naming its log while a
diverged one is read back as diverged, and bad options are refused."""

import threading
import time

import pytest
import torch

from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
from experiments.scale import calibrate, executors
from experiments.spec.profiles import QUICK
from experiments.tests.test_experiments import TINY
from experiments.tuning import fixed_point

CE = {**TINY, "loss": "cross_entropy", "loss_options": {}, "epochs": 1, "milestones": ()}


def test_a_moves_missing_runs_train_in_worker_processes_once_each_and_are_read_back(tmp_path):
    """Two local workers train what the store lacks (each writes its run's log), a lone run too (on a login node the
    search must not train), a sibling (another selection metric) with its training; the search then reads each run
    back, the same record."""
    store = ResultsStore(tmp_path)
    configs = [RunConfig(**{**CE, "seed": seed}) for seed in (1, 2, 3)]
    sibling = configs[0].replace(selection_metric="top1")
    sent = []

    def trainer(runs, progress):
        sent.append([run.key for run in runs])
        executors.local(runs, executors.TrainOptions(str(store.root)), progress, jobs=2)

    ahead = calibrate.executor_ahead(store, trainer)
    ahead([configs[0], sibling, configs[1], configs[1]])
    ahead(configs)
    assert sent == [[configs[0].key(), configs[1].key()], [configs[2].key()]]
    records = [store.finished(config.key()) for config in (*configs, sibling)]
    assert all(records) and all((tmp_path / "logs" / f"{config.key()}.log").exists() for config in configs)
    assert [fixed_point.trained(config, store, "cpu", "quick", "cifar") for config in configs] == records[:3]


def test_a_run_that_failed_in_the_executor_stops_the_calibration_and_a_diverged_one_does_not(tmp_path):
    """A diverged run is not sent again: the search reads its NaN from the store (on a login node too)."""
    store, config = ResultsStore(tmp_path), RunConfig(**{**CE, "seed": 1})
    log, sent = tmp_path / "run.log", []

    def failing(runs, progress):
        for run in runs:
            progress.start(run)
            progress.fail(run, str(log))

    with pytest.raises(SystemExit, match=rf"error: 1 of the calibration's runs failed: {config.key()} \(log: {log}\)"):
        calibrate.executor_ahead(store, failing)([config])

    def diverging(runs, progress):
        for run in runs:
            sent.append(run.key)
            progress.start(run)
            store.save_divergence(run.config.training_key(), "the training loss became NaN in epoch 1", "e" * 40)
            progress.diverge(run, str(log))

    calibrate.executor_ahead(store, diverging)([config])
    calibrate.executor_ahead(store, diverging)([config])
    assert sent == [config.key()]
    with pytest.raises(FloatingPointError, match="became NaN in epoch 1"):  # as on a login node: nothing trains
        fixed_point.trained(config, store, "cuda", "quick", "cifar")


@pytest.mark.parametrize("arguments,message", [
    (["quick", "--jobs", "0"], "(--jobs) should be a positive number of worker processes, got 0"),
    (["quick", "--executor", "slurm", "--device", "cuda"], "--gpus-per-task 0 with --device cuda"),
])
def test_bad_options_are_refused(arguments, message, capsys):
    assert calibrate.main(arguments) == 2
    assert message in capsys.readouterr().err


def test_a_calibrated_profile_is_left_as_it_is_whatever_the_executor(capsys):
    """The quick profile's committed calibration is current: two workers find nothing to train."""
    assert not fixed_point.unsettled(QUICK), "the committed calibration is not current (run `make calibrate`)"
    assert calibrate.main(["quick", "--jobs", "2"]) == 0
    assert "cifar: " in capsys.readouterr().out


def test_the_slurm_options_say_where_the_calibrations_scripts_go_and_that_sbatch_only_is_refused(capsys):
    with pytest.raises(SystemExit):
        calibrate.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps its lines
    assert ("(default: STORE/slurm/calibration; either way each stand-in's in a folder named by its setup: cifar, "
            "plantnet, imagenet_lt, imagenet)") in shown
    assert "--sbatch-only refused where a stand-in needs calibrating" in shown


def test_a_slurm_memory_below_a_stand_in_to_calibrate_is_refused_before_anything_is_submitted(tmp_path, capsys):
    """make's SLURM options reach the calibration first: its tasks build the same stand-ins as train's."""
    assert calibrate.main(["gpu", "--executor", "slurm", "--mem-gb", "8", "--store", str(tmp_path)]) == 2
    assert "--mem-gb 8 is less than the 15.2 GiB that the imagenet_like stand-in's images alone take" in \
        capsys.readouterr().err
    assert not (tmp_path / "slurm").exists()


def test_sbatch_only_is_refused_where_a_stand_in_needs_calibrating_and_passes_where_none_does(tmp_path, capsys):
    """make's SLURM options serve train and calibrate: --sbatch-only writes the profile's scripts, but a calibration
    cannot be written ahead (each move needs the last's runs)."""
    slurm = ["--executor", "slurm", "--sbatch-only", "--mem-gb", "32", "--store", str(tmp_path)]
    assert calibrate.main(["gpu", *slurm]) == 2
    error = capsys.readouterr().err
    assert ("--sbatch-only: the gpu stand-ins cifar (cifar100_like), plantnet (plantnet_like), imagenet_lt "
            "(imagenet_lt_like), imagenet (imagenet_like) need calibrating") in error
    assert calibrate.main(["quick", *slurm]) == 0  # current: nothing to calibrate, nothing submitted
    assert not (tmp_path / "slurm").exists()


def test_ctrl_c_stops_the_calibration_with_one_message_and_status_130(tmp_path, monkeypatch, capsys):
    """An interrupted calibration keeps what it finished (the store's runs, the steps stored) and says so, with no
    traceback; the same command resumes."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fixed_point, "settle", interrupted)
    assert calibrate.main(["gpu", "--store", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err.startswith(f"\ninterrupted: every finished run and every epoch's checkpoint is kept in {tmp_path}")
    assert err.rstrip().endswith("the same command resumes") and "Traceback" not in err
    slurm = ["--executor", "slurm", "--mem-gb", "32"]
    assert calibrate.main(["gpu", "--store", str(tmp_path), *slurm]) == 130  # its arrays go on
    told = capsys.readouterr().err  # the calibration's arrays alone, not the training's of the same profile
    assert "`scancel --user $(id -un) --name topk-gpu-calibration` stop them" in told and "topk-gpu-runs" not in told


def test_a_calibration_run_that_diverged_stops_the_search_with_one_line(tmp_path, monkeypatch, capsys):
    def diverged(*args, **kwargs):
        raise FloatingPointError("the training loss became NaN in epoch 3")

    monkeypatch.setattr(fixed_point, "settle", diverged)
    assert calibrate.main(["gpu", "--store", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        "error: a cross-entropy run of the calibration diverged (the training loss became NaN in epoch 3); its NaN is "
        f"kept in {tmp_path}/diverged/ (delete the file to train it again): change the stand-in's start or steps "
        "(experiments/tuning/calibration.py)\n")


def test_with_slurm_the_stand_ins_calibrate_side_by_side_each_with_its_own_scripts(tmp_path, monkeypatch, capsys):
    """Their searches are independent: each in a thread of its own at once (a barrier every setup must reach, which one
    thread after another never would), its arrays' scripts in a folder of its own, their states in the setups'
    order; one setup's error comes after the others have ended."""
    from experiments.spec.profiles import GPU

    setups = GPU.calibrated_setups
    together, seen, folders = threading.Barrier(len(setups), timeout=30), {}, {}

    def settle(profile, setup, train, say, ahead=None):
        together.wait()
        say(f"searching\n{setup}'s table")
        seen[setup] = threading.current_thread().name
        ahead([RunConfig(**{**CE, "seed": 20 + setups.index(setup)})])  # a move: one array
        return profile

    def train(runs, options, progress, slurm_options, **kwargs):
        folders[runs[0].config.seed] = slurm_options.folder
        for run in runs:
            progress.start(run)
            progress.finish(run)

    monkeypatch.setattr(fixed_point, "settle", settle)
    monkeypatch.setattr(fixed_point, "status", lambda profile, setup: {"state": f"settled {setup}"})
    monkeypatch.setattr(calibrate.slurm, "train", train)
    assert calibrate.main(["gpu", "--store", str(tmp_path), "--executor", "slurm", "--mem-gb", "32"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-len(setups):] == [f"{setup}: settled {setup}" for setup in setups]
    assert sorted(out[:-len(setups)]) == sorted(line for setup in setups  # each line names its stand-in
                                                for line in (f"[{setup}] searching", f"[{setup}] {setup}'s table"))
    assert seen == {setup: f"calibrate-{setup}" for setup in setups}
    assert folders == {20 + i: str(tmp_path / "slurm" / "calibration" / setup) for i, setup in enumerate(setups)}

    ended = []

    def work(setup):
        if setup == "cifar":
            raise SystemExit("error: 1 of the calibration's runs failed")
        time.sleep(0.2)
        ended.append(setup)
        return setup

    with pytest.raises(SystemExit, match="1 of the calibration's runs failed"):
        calibrate._each_in_a_thread(work, ("cifar", "plantnet"))
    assert ended == ["plantnet"]
    assert "[cifar] stopped: error: 1 of the calibration's runs failed; the other stand-ins go on" in \
        capsys.readouterr().err  # said at once, not hours later


def test_stand_ins_keeping_their_entries_at_once_lose_none(tmp_path, monkeypatch):
    """The file of a profile's calibrations is read and rewritten whole for each entry: setups that keep theirs at the
    same moment (side by side) must all be in it."""
    from experiments.spec import tuned

    entries = tuned.calibrations("quick")
    monkeypatch.setattr(tuned, "CALIBRATED", tmp_path)
    together = threading.Barrier(len(entries), timeout=30)

    def keep(setup):
        together.wait()
        tuned.keep("quick", setup, entries[setup])

    threads = [threading.Thread(target=keep, args=(setup,)) for setup in entries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tuned.calibrations("quick") == entries


def test_with_local_workers_the_stand_ins_calibrate_side_by_side_sharing_them(tmp_path, monkeypatch, capsys):
    """Each stand-in's search in a thread of its own at once (a barrier every setup must reach), their moves trained by
    one pool of two worker processes, each move's runs reported to its own search and read back."""
    from experiments.spec.profiles import GPU

    setups, store = GPU.calibrated_setups, ResultsStore(tmp_path)
    together, configs = threading.Barrier(len(setups), timeout=60), {}

    def settle(profile, setup, train, say, ahead=None):
        together.wait()
        configs[setup] = [RunConfig(**{**CE, "seed": 30 + 2 * setups.index(setup) + i}) for i in range(2)]
        ahead(configs[setup])  # a move: through the shared workers
        say(f"read {len([train(config) for config in configs[setup]])} runs")
        return profile

    monkeypatch.setattr(fixed_point, "settle", settle)
    monkeypatch.setattr(fixed_point, "status", lambda profile, setup: {"state": f"settled {setup}"})
    assert calibrate.main(["gpu", "--store", str(tmp_path), "--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-len(setups):] == [f"{setup}: settled {setup}" for setup in setups]
    assert sorted(out[:-len(setups)]) == sorted(f"[{setup}] read 2 runs" for setup in setups)
    assert all(store.finished(config.key()) for runs in configs.values() for config in runs)


def test_threads_sharing_a_pool_each_get_their_own_runs_back_as_inline_trains_them(tmp_path):
    """Two threads ask one pool of two workers for their groups at once: each call returns once its own are done,
    reported to its own progress only, and the records are those of training inline, bit for bit."""
    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress
    from experiments.tests.test_scale import computed

    # a's runs long beside the workers' start-up jitter: b's group, queued behind a's third, is sent while it trains
    asked = {name: [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": seed, "epochs": epochs})) for seed in seeds]
             for name, seeds, epochs in (("a", (41, 42, 43), 15), ("b", (44,), 1))}
    progress = {name: Progress(runs, live=False) for name, runs in asked.items()}
    options = executors.TrainOptions(str(tmp_path / "pool"), threads=1)
    with executors.WorkerPool.of(options, jobs=2) as pool:
        callers_at_once, send = set(), pool._send

        def sending(slot, job):  # the calls whose groups train at once, this one's included
            send(slot, job)
            callers_at_once.add(frozenset(busy.call for _, _, busy in pool.workers.values() if busy is not None))

        pool._send = sending
        threads = [threading.Thread(target=pool.train_runs, args=(runs, progress[name]))
                   for name, runs in asked.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert len(pool.workers) == 2
    assert max(map(len, callers_at_once)) == 2  # a's and b's groups shared the workers: not one call after the other
    for name, runs in asked.items():
        assert set(progress[name].finished) == {run.key for run in runs} and not progress[name].failed
    every = [run for runs in asked.values() for run in runs]
    threads = torch.get_num_threads()
    try:
        executors.inline(every, executors.TrainOptions(str(tmp_path / "inline"), threads=1), Progress(every, live=False))
    finally:
        torch.set_num_threads(threads)
    for run in every:
        assert computed(ResultsStore(tmp_path / "pool").finished(run.key)) == computed(
            ResultsStore(tmp_path / "inline").finished(run.key))


def test_ctrl_c_reaching_the_workers_ends_every_threads_call_and_the_pool_closes_without_starting_any_again(tmp_path):
    """Ctrl-C reaches the workers (the whole process group) while two threads train through the pool: the calls end
    (KeyboardInterrupt, or the pool closed), no run is reported failed nor a worker's death logged, and closing the
    pool while they end starts no worker again."""
    import os
    import signal

    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress

    runs = {seed: [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": seed, "epochs": 400}))] for seed in (51, 52)}
    progress = {seed: Progress(group, live=False) for seed, group in runs.items()}
    ended = {}
    pool = executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=2)

    def call(seed):
        try:
            pool.train_runs(runs[seed], progress[seed])
        except BaseException as error:
            ended[seed] = type(error)

    threads = [threading.Thread(target=call, args=(seed,), daemon=True) for seed in runs]
    for thread in threads:
        thread.start()
    logs = [tmp_path / "logs" / f"{group[0].key}.log" for group in runs.values()]  # opened as a worker starts a group
    deadline = time.time() + 120
    while time.time() < deadline and not all(log.exists() for log in logs):
        time.sleep(0.1)
    time.sleep(2)  # both workers inside their runs
    workers = [process for process, _, _ in pool.workers.values()]
    assert len(workers) == 2
    for process in workers:
        os.kill(process.pid, signal.SIGINT)
    for thread in threads:
        thread.join(timeout=60)
    pool.close()
    assert set(ended.values()) <= {KeyboardInterrupt, executors.PoolClosed} and set(ended) == set(runs)
    assert not any(each.failed for each in progress.values()) and not pool.workers
    assert not any(process.is_alive() for process in workers)  # ended by Ctrl-C, or by the stop of their call
    assert not any("died" in log.read_text() for log in (tmp_path / "logs").glob("*.log"))


def test_a_worker_started_by_a_search_thread_drops_a_ctrl_c_of_its_start(tmp_path, capfd):
    """A calibration's search threads start workers; Ctrl-C while one still imports torch printed its traceback and
    ended it. Now it starts with SIGINT blocked, from any thread, drops what came meanwhile, then trains."""
    import os
    import signal

    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress

    runs = [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": 64}))]
    progress = Progress(runs, live=False)
    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=1) as pool:
        starter = threading.Thread(target=pool._start, args=(0,))
        starter.start()
        starter.join()
        worker = pool.workers[0][0]
        for _ in range(5):  # during its first second: the interpreter's start and torch's import
            os.kill(worker.pid, signal.SIGINT)
            time.sleep(0.2)
        trainer = threading.Thread(target=pool.train_runs, args=(runs, progress))
        trainer.start()
        trainer.join(timeout=120)
    assert progress.done == 1 and not progress.failed, progress.summary()
    assert "Traceback" not in capfd.readouterr().err


def test_runs_whose_logs_cannot_be_written_are_each_reported_failed_to_their_own_thread(tmp_path, capfd):
    """The store's logs unwritable (here a file where their folder belongs): each worker reports its group failed,
    naming the log and why, without a traceback, and every thread's run is reported, none raising."""
    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress

    (tmp_path / "logs").write_text("not a folder")
    runs = {seed: [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": seed}))] for seed in (65, 66)}
    progress = {seed: Progress(group, live=False) for seed, group in runs.items()}
    raised = {}

    def call(seed):
        try:
            pool.train_runs(runs[seed], progress[seed])
        except BaseException as error:
            raised[seed] = error

    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=2) as pool:
        threads = [threading.Thread(target=call, args=(seed,)) for seed in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert raised == {}
    for seed, (run,) in runs.items():
        assert "could not be written" in progress[seed].failed.get(run.key, ""), progress[seed].summary()
    assert "Traceback" not in capfd.readouterr().err


def test_a_note_that_cannot_be_written_to_its_log_goes_to_stderr(tmp_path, capsys):
    """A worker's death noted where the log cannot be written: the note and the reason go to stderr, and the log's
    path is still returned for the report."""
    from experiments.scale.plan import PlannedRun

    (tmp_path / "logs").write_text("not a folder")
    group = [PlannedRun.outside_plan(RunConfig(**CE))]
    options = executors.TrainOptions(str(tmp_path))
    assert executors._append_to_log(options, group, "worker process 1 died\n") == str(executors.log_path(options, group))
    err = capsys.readouterr().err
    assert "worker process 1 died" in err and "(not written to " in err


def test_workers_that_ctrl_c_ended_while_idle_are_not_started_again_and_the_next_call_is_interrupted(tmp_path):
    """Ctrl-C reaches idle workers too (they wait for a group): the next call closes the pool instead of starting
    them again, and the threads' stop reads as an interruption."""
    import os
    import signal

    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress

    runs = [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": seed})) for seed in (61, 62)]
    with executors.WorkerPool.of(executors.TrainOptions(str(tmp_path), threads=1), jobs=2) as pool:
        pool.train_runs(runs, Progress(runs, live=False))
        idle = [process for process, _, _ in pool.workers.values()]
        for process in idle:
            os.kill(process.pid, signal.SIGINT)
            process.join(timeout=30)
        started = []
        pool._start = started.append
        later = [PlannedRun.outside_plan(RunConfig(**{**CE, "seed": 63}))]
        with pytest.raises(KeyboardInterrupt):
            pool.train_runs(later, Progress(later, live=False))
        assert started == [] and [process.exitcode for process in idle] == [executors.INTERRUPTED] * 2
        with pytest.raises(executors.PoolClosed):
            pool.train_runs(later, Progress(later, live=False))

    def work(setup):
        raise executors.PoolClosed("closed") if setup == "cifar" else SystemExit("a failed run")

    with pytest.raises(KeyboardInterrupt):  # not PoolClosed's traceback: the command says it was interrupted
        calibrate._each_in_a_thread(work, ("cifar", "plantnet"))
