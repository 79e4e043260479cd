"""``python -m experiments plan|train|run-one`` refuse bad options before anything trains, each with one line naming
the value and what was expected (exit 2, no traceback); the Slurm executor writes its scripts without a memory
request when none is given; ``train`` writes its manifest only for a training into the notebooks' store."""

import os
import re
import shlex
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.__main__ import main
from experiments.paths import PROJECT_ROOT
from experiments.scale import cli, slurm_request
from experiments.scale.plan import plan
from experiments.spec.profiles import get_profile


@pytest.fixture(autouse=True)
def without_sbatch(tmp_path, monkeypatch):
    """No sbatch on PATH: these tests read the scripts' text, which a cluster's ``sbatch --test-only`` would weigh
    against its own partitions, GPUs and accounts (tested on a real cluster in test_slurm.py)."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-commands"))


SMOKE_KEY = "4699c24f5f58e247"  # a run of the smoke profile (`python -m experiments plan smoke`)


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "store"
    path.write_text("not a folder")
    return str(path)


REFUSED = [
    (["plan", "smoke", "--store", "{file}"], "the results store {file} is a file: give a folder"),
    (["train", "smoke", "--store", "{file}"], "the results store {file} is a file: give a folder"),
    (["run-one", SMOKE_KEY, "--profile", "smoke", "--store", "{file}"], "the results store {file} is a file"),
    (["{config}", "--store", "{file}"], "the results store {file} is a file"),
    (["train", "smoke", "--executor", "local", "--jobs", "0"], "(--jobs) should be a positive number of worker "
                                                               "processes, got 0"),
    (["train", "smoke", "--executor", "local", "--per-gpu", "0"], "(--per-gpu) should be a positive number of runs "
                                                                  "per GPU, got 0"),
    (["train", "smoke", "--threads", "-1"], "--threads should be 0 (the default) or a positive number of torch CPU "
                                            "threads per run, got -1"),
    (["run-one", SMOKE_KEY, "--profile", "smoke", "--threads", "-2"], "--threads should be 0 (the default) or a "),
    (["train", "smoke", "--stack", "0"], "--stack should be a positive number of runs stacked into one model, got 0"),
    (["plan", "smoke", "--gpus", "0"], "--gpus should be a positive number of GPUs, got 0"),
    (["plan", "smoke", "--rates", "rates.csv"], "--rates rates.csv gives the rates of the hours on GPUs: add --gpus N"),
    (["train", "smoke", "--executor", "slurm", "--gpus-per-task", "1", "--sbatch-only"],
     "--gpus-per-task 1 with --device cpu: the tasks would hold GPUs and train on the CPU; add --device cuda"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-only"],
     "--gpus-per-task 0 with --device cuda: the tasks would train on CUDA without a GPU; add --gpus-per-task 1"),
    (["train", "paper"], "206 runs of the paper profile still to train are on real datasets: pass their root "
                         "(--data-root, make DATA=)"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda:1", "--gpus-per-task", "1", "--sbatch-only"],
     "--device should be cpu or cuda for Slurm's tasks (each numbers its own GPUs from 0), got cuda:1"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--gpus-per-task", "2", "--sbatch-only"],
     "--gpus-per-task should be 0 or 1 (a run trains on one GPU), got 2"),
    (["train", "smoke", "--executor", "slurm", "--time-min", "0", "--sbatch-only"],
     "--time-min should be a positive number, got 0"),
    (["train", "smoke", "--executor", "slurm", "--time-min", "3", "--sbatch-only"],
     "--time-min 3 leaves no time to train: Slurm warns a task 120 s before its limit to requeue it; give more than 3 "
     "minutes"),
    (["train", "smoke", "--executor", "slurm", "--mem-gb", "-1", "--sbatch-only"],
     "--mem-gb should be a positive number of GB, got -1.0"),
    (["train", "smoke", "--executor", "slurm", "--slurm-folder", "{file}", "--sbatch-only"],
     "--slurm-folder {file} is a file: give a folder"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "time=5", "--sbatch-only"],
     "--sbatch-option 'time=5' is sbatch's --time, which train gives itself: use --time-min"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "part=debug", "--sbatch-only"],
     "--sbatch-option 'part=debug' is sbatch's --partition, which train gives itself: use --partition"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option=--parsable", "--sbatch-only"],
     "--sbatch-option '--parsable' is sbatch's --parsable, which the executor sets itself, or which would change"),
    (["train", "smoke", "--executor", "slurm", "--mem-gb", "4", "--sbatch-option", "mem-per-cpu=4G", "--sbatch-only"],
     "--sbatch-option 'mem-per-cpu=4G' and --mem-gb 4 each set the tasks' memory: give one"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=gpu:1", "--sbatch-option",
      "gres=nvme:1", "--sbatch-only"], "sbatch's --gres is given twice (--sbatch-option, or its own option): give it "
                                       "once, with every value in it (gres=gpu:1,nvme:1, say)"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "mail type", "--sbatch-only"],
     "--sbatch-option 'mail type' should be an sbatch option's long name, with =VALUE if it takes one"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--gpus-per-task", "1", "--sbatch-option",
      "gres=gpu:1", "--sbatch-only"], "--gpus-per-task 1 and --sbatch-option gres=gpu:1: each asks for the task's GPU"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=gpu:a100:2",
      "--sbatch-only"], "--sbatch-option gres=gpu:a100:2 asks for 2 GPUs a task, where a run trains on one"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "gres=gpu", "--sbatch-only"],
     "--sbatch-option gres=gpu with --device cpu: the tasks would hold GPUs and train on the CPU"),
    (["train", "gpu", "--executor", "slurm", "--mem-gb", "8", "--sbatch-only"],
     "--mem-gb 8 is less than the 15.2 GiB that the imagenet_like stand-in's images alone take in each of its tasks "
     "(every split, built in memory before training; the process needs more on top): give more"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "gres=mps:25", "--sbatch-only"],
     "--sbatch-option gres=mps:25 with --device cpu: the tasks would hold GPUs and train on the CPU"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--gpus-per-task", "1", "--sbatch-option",
      "gres=shard:2", "--sbatch-only"],
     "--gpus-per-task 1 and --sbatch-option gres=shard:2: each asks for the task's GPU"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=gpu:1,mps:25",
      "--sbatch-only"], "--sbatch-option gres=gpu:1,mps:25 asks for a GPU more than once"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=mps:25,shard:2",
      "--sbatch-only"], "--sbatch-option gres=mps:25,shard:2 asks for a GPU more than once"),
    (["train", "smoke", "--executor", "slurm", "--sbatch-option", "gres=gres:mps:25", "--sbatch-only"],
     "--sbatch-option gres=gres:mps:25 with --device cpu: the tasks would hold GPUs and train on the CPU"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=mps:0", "--sbatch-only"],
     "--sbatch-option gres=mps:0 with --device cuda: the tasks would train on CUDA without a GPU"),
    (["train", "smoke", "--executor", "slurm", "--device", "cuda", "--sbatch-option", "gres=nvme:1", "--sbatch-only"],
     "--sbatch-option gres=nvme:1 with --device cuda: the tasks would train on CUDA without a GPU; add --gpus-per-task "
     "1 (or --sbatch-option gres=gpu:1, or a share of one: gres=mps:N)"),
    (["train", "smoke", "--executor", "slurm", "--account", " ", "--sbatch-only"],
     "--account is empty (' '): give one, or leave the option out"),
    (["train", "smoke", "--executor", "local", "--jobs", "1", "--account", "lab"],
     "--account is an option of the Slurm executor: add --executor slurm, or leave it out"),
    (["train", "smoke", "--executor", "inline", "--time-min", "600"],
     "--time-min is an option of the Slurm executor: add --executor slurm, or leave it out"),
    (["train", "smoke", "--jobs", "3"], "--jobs places the local executor's workers, but the executor is inline: add "
                                        "--executor local, or leave it out"),
    (["train", "smoke", "--executor", "slurm", "--per-gpu", "2", "--sbatch-only"],
     "--per-gpu places the local executor's workers, but the executor is slurm"),
    (["train", "smoke", "--executor", "local", "--jobs", "2", "--per-gpu", "1"],
     "--jobs 2 and --per-gpu 1 each place the local executor's workers: give --jobs on a CPU or --per-gpu on GPUs"),
    (["trian", "smoke"], "'trian' is neither a command (plan, train, run-one) nor a run's JSON config"),
    (["train", "smoke", "--device", "tpu"], "--device should be cpu, cuda or cuda:N, got 'tpu'"),
    (["run-one", SMOKE_KEY, "--profile", "smoke", "--device", "gpu"], "--device should be cpu, cuda or cuda:N, got 'gpu'"),
    (["{config}", "--store", "{tmp}/one", "--device", "tpu"], "--device should be cpu, cuda or cuda:N, got 'tpu'"),
    (["train", "smoke", "--workers", "-3"], "--workers should be 0 (read in the training process) or a positive "
                                           "number of processes, got -3"),
    (["train", "paper", "--data-root", "{tmp}/none"], "the cifar100 dataset that 119 runs still to train read is not "
                                                      "in {tmp}/none/cifar100: `python -m data_prep cifar100 --root "
                                                      "{tmp}/none/cifar100` prepares it"),
]


@pytest.mark.parametrize("arguments,message", REFUSED)
def test_bad_options_are_refused_before_anything_trains(arguments, message, a_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results")  # the default store, were anything to train
    fill = {"file": a_file, "config": str(PROJECT_ROOT / "experiments" / "example_run.json"), "tmp": str(tmp_path)}
    assert main([word.format(**fill) for word in arguments]) == 2
    errors = capsys.readouterr().err
    assert errors.startswith("error: ") and message.format(**fill) in errors and "Traceback" not in errors
    assert not (tmp_path / "results").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
@pytest.mark.parametrize("arguments", [["train", "smoke", "--device", "cuda"],
                                       ["run-one", SMOKE_KEY, "--profile", "smoke", "--device", "cuda:1"],
                                       [str(PROJECT_ROOT / "experiments" / "example_run.json"), "--device", "cuda"]])
def test_training_on_cuda_where_torch_sees_none_is_refused_but_not_through_slurm(arguments, capsys, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results")
    assert main([*arguments, "--store", str(tmp_path / "store")]) == 2
    assert "but torch sees no CUDA device here: train on a machine with a GPU (on a cluster: inside srun or salloc, " \
           "or --executor slurm from here)" in capsys.readouterr().err
    assert main(["train", "smoke", "--device", "cuda", "--executor", "slurm", "--gpus-per-task", "1", "--sbatch-only",
                 "--store", str(tmp_path / "store")]) == 0  # Slurm's tasks train on the cluster's GPUs


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_where_torch_sees_none_is_no_error_when_nothing_is_left_to_train(capsys, tmp_path, monkeypatch):
    """A login node after Slurm's tasks: every run is in the store, so `train` and a single run read them back."""
    import json

    from experiments.engine.store import ResultsStore
    from experiments.engine.train import run
    from experiments.tests.test_scale import _planned

    planned = _planned(1)
    monkeypatch.setattr(cli, "plan", lambda profile: [planned])
    threads = torch.get_num_threads()
    try:
        record = run(planned.config, ResultsStore(tmp_path))
    finally:
        torch.set_num_threads(threads)
    for executor in (["--executor", "inline"], ["--executor", "local", "--per-gpu", "1"]):
        assert main(["train", "smoke", "--device", "cuda", "--store", str(tmp_path), *executor]) == 0
        assert "0 to train" in capsys.readouterr().err
    config = tmp_path / "config.json"
    config.write_text(json.dumps(planned.config.to_dict()))
    assert main([str(config), "--store", str(tmp_path), "--device", "cuda"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == record["key"]


def test_a_real_datasets_folder_is_not_looked_for_on_the_host_that_submits_to_slurm(capsys, tmp_path):
    """The data may be on the compute nodes alone; the scripts name the root made absolute."""
    assert main(["train", "paper", "--executor", "slurm", "--data-root", "data", "--sbatch-only", "--store",
                 str(tmp_path)]) == 0
    assert f"--data-root {Path('data').resolve()}" in (tmp_path / "slurm" / "runs.sbatch").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_runs_per_gpu_without_a_gpu_are_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results")
    assert main(["train", "smoke", "--executor", "local", "--per-gpu", "2"]) == 2
    assert "(--per-gpu) was given, but torch sees no CUDA device here: use --jobs on the CPU" in capsys.readouterr().err


def test_sbatch_scripts_without_a_memory_request_leave_it_to_the_partition_and_write_no_manifest(
        tmp_path, monkeypatch, capsys):
    """The docs' example (no ``--mem-gb``) writes both arrays' scripts; ``--sbatch-only`` trains nothing, so it leaves
    the manifests alone, even with ``--figures``."""
    monkeypatch.setattr(cli, "FIGURES", tmp_path / "figures")
    store = tmp_path / "store"
    arguments = ["train", "smoke", "--executor", "slurm", "--partition", "gpu", "--gpus-per-task", "1", "--device",
                 "cuda", "--time-min", "600", "--store", str(store), "--account", "lab", "--qos", "long",
                 "--sbatch-option", "mail-type=FAIL", "--sbatch-option=--hold", "--sbatch-only"]
    assert main(arguments) == 0 and main([*arguments, "--figures", str(tmp_path / "figures")]) == 0
    runs, alone = (store / "slurm" / f"{name}.sbatch" for name in ("runs", "alone"))
    directives = runs.read_text().splitlines()
    assert "#SBATCH --partition=gpu" in directives and "#SBATCH --gpus-per-task=1" in directives
    for given in ("--account=lab", "--qos=long", "--mail-type=FAIL", "--hold"):  # every task, both arrays
        assert f"#SBATCH {given}" in directives and f"#SBATCH {given}" in alone.read_text().splitlines()
    assert "#SBATCH --time=600" in directives and not any(line.startswith("#SBATCH --mem") for line in directives)
    assert "#SBATCH --exclusive" in alone.read_text().splitlines() and "--device cuda" in runs.read_text()
    assert not (tmp_path / "figures").exists()
    assert "submit each with `sbatch SCRIPT`" in capsys.readouterr().err


def test_without_a_memory_request_a_partition_default_below_a_stand_in_s_images_is_refused(tmp_path, capsys,
                                                                                             monkeypatch):
    """A task that asks no memory gets the partition's default (``DefMemPerCPU`` x its cores, say): where that is
    less than a stand-in's images, its tasks would fail out of memory hours in; refused with the default named. A
    default that holds them, or none Slurm states, is left to the partition; so is a memory ``--sbatch-option``."""
    asked = []

    def default(partition, cpus, gpus, memory=(4.0, "DefMemPerCPU=2048 x 2 cores")):
        asked.append((partition, cpus, gpus))
        return memory

    monkeypatch.setattr(slurm_request, "default_memory", default)
    arguments = ["train", "gpu", "--executor", "slurm", "--partition", "gpu", "--cpus-per-task", "2", "--device",
                 "cuda", "--gpus-per-task", "1", "--uncalibrated", "--store", str(tmp_path), "--sbatch-only"]
    assert main(arguments) == 2
    assert asked == [("gpu", 2, 1)]
    assert ("error: without --mem-gb each task gets the 4.0 GiB that Slurm gives one asking no memory on partition "
            "gpu (DefMemPerCPU=2048 x 2 cores), less than the 15.2 GiB that the imagenet_like stand-in's images alone "
            "take in each of its tasks") in capsys.readouterr().err
    assert main([*arguments, "--sbatch-option", "mem-bind=local"]) == 2 and len(asked) == 2  # a binding, not a size
    assert main([*arguments, "--sbatch-option", "mem-per-gpu=64G"]) == 0 and len(asked) == 2  # memory given: not asked
    monkeypatch.setattr(slurm_request, "default_memory", lambda *args: (64.0, "DefMemPerGPU=65536 x 1 GPU"))
    assert main(arguments) == 0
    monkeypatch.setattr(slurm_request, "default_memory", lambda *args: None)  # UNLIMITED, or no Slurm here
    assert main(arguments) == 0


def test_tasks_on_shares_of_a_gpu_ask_them_and_shards_with_cuda_graphs_are_told_they_take_turns(tmp_path, capsys):
    """Where a cluster shares its GPUs between tasks (gres/mps, gres/shard), a task holds a share instead of a GPU,
    but Fig. 3's timed runs hold a whole one; with shards, taken in turns, CUDA graphs gain nothing side by side, which
    the user is told."""
    store = tmp_path / "store"
    arguments = ["train", "smoke", "--executor", "slurm", "--device", "cuda", "--store", str(store), "--sbatch-only"]
    assert main([*arguments, "--sbatch-option", "gres=mps:a100:25,nvme:1", "--compile", "reduce-overhead"]) == 0
    assert "#SBATCH --gres=mps:a100:25,nvme:1" in (store / "slurm" / "runs.sbatch").read_text().splitlines()
    assert "#SBATCH --gres=gpu:a100:1,nvme:1" in (store / "slurm" / "alone.sbatch").read_text().splitlines()  # timed
    told = capsys.readouterr().err
    assert "take turns" not in told and "runs trained alone (timed) each hold a whole GPU (gres gpu:a100:1,nvme:1)" \
        in told
    assert main([*arguments, "--sbatch-option", "gres=shard:2", "--compile", "reduce-overhead"]) == 0
    assert "#SBATCH --gres=shard:2" in (store / "slurm" / "runs.sbatch").read_text().splitlines()
    assert "note: --sbatch-option gres=shard:2: Slurm's shards take turns on a GPU" in capsys.readouterr().err
    assert main([*arguments, "--sbatch-option", "gres=shard:2"]) == 0  # eager steps: their gaps can be filled
    assert "take turns" not in capsys.readouterr().err


def test_sbatch_scripts_ask_one_task_and_requeue_themselves_out_of_time_from_a_key_file_of_their_own(
        tmp_path, monkeypatch):
    """``--gpus-per-task`` with ``--ntasks`` (Slurm 23.11 refuses it alone); Slurm's warning before the time limit
    requeues the task at most ``--max-requeues`` times (Slurm never requeues a timed-out task itself); and each
    submission's keys in a file named by its content, so that a later submission cannot change the keys of tasks still
    queued. The trap itself is run by a real Slurm in test_slurm.py."""
    store = tmp_path / "store"
    arguments = ["train", "smoke", "--executor", "slurm", "--gpus-per-task", "1", "--device", "cuda", "--store",
                 str(store), "--sbatch-only", "--max-requeues", "7"]
    assert main(arguments) == 0
    script = (store / "slurm" / "runs.sbatch").read_text()
    directives = script.splitlines()
    assert {"#SBATCH --ntasks=1", "#SBATCH --gpus-per-task=1", f"#SBATCH --signal=B:USR1@{slurm_request.WARNING_S}",
            "#SBATCH --requeue"} <= set(directives)
    assert "trap out_of_time USR1" in directives and '-ge 7 ]' in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert directives[-1] == 'wait "$run"  # its own exit status, also where it ended during a trap'
    first = sorted((store / "slurm").glob("runs-*.keys"))
    assert len(first) == 1 and first[0].name in script
    (store / "slurm" / "runs.sbatch").rename(store / "slurm" / "first.sbatch")
    monkeypatch.setattr(cli, "plan", lambda profile: plan(profile)[1:3])  # a later submission of other runs
    assert main(arguments) == 0
    assert sorted((store / "slurm").glob("runs-*.keys")) != first and first[0].exists()
    assert first[0].name in (store / "slurm" / "first.sbatch").read_text()
    assert main([*arguments[:-2], "--max-requeues", "-1"]) == 2


def test_an_uncalibrated_profile_is_not_trained_unless_asked(tmp_path, capsys):
    """The gpu profile's stand-ins have no committed calibration: a run's key holds its stand-in's difficulty, so
    `train` refuses (runs that calibrating would make obsolete), and trains with --uncalibrated."""
    arguments = ["train", "gpu", "--executor", "slurm", "--mem-gb", "32", "--store", str(tmp_path / "store"),
                 "--sbatch-only"]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert ("the gpu profile's stand-ins cifar (cifar100_like), plantnet (plantnet_like), imagenet_lt "
            "(imagenet_lt_like), imagenet (imagenet_like) have calibration steps left") in error
    assert "make calibrate PROFILE=gpu" in error
    assert main([*arguments, "--uncalibrated"]) == 0
    assert (tmp_path / "store" / "slurm" / "runs.sbatch").exists()


def test_runs_a_live_process_trains_are_left_to_it_and_named_by_plan(tmp_path, capsys, monkeypatch):
    """A run whose claim a live process holds (another `train`, a Slurm task) is not trained or submitted again:
    `train` leaves it to its holder, and `plan` shows it training, with the holder."""
    from experiments.engine import run_claim

    store = tmp_path / "store"
    runs = plan(get_profile("smoke"))[:2]
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    held = runs[0].config.training_key()
    assert run_claim.try_claim(store, held)  # as another process on this host would
    try:
        assert main(["plan", "smoke", "--store", str(store)]) == 0
        listing = capsys.readouterr().out
        assert f"{runs[0].key}  training" in listing and f"(by {socket.gethostname()} pid {os.getpid()})" in listing
        assert main(["train", "smoke", "--executor", "slurm", "--store", str(store), "--sbatch-only"]) == 0
        assert "1 being trained by other processes (waited for; `plan` names them), 1 to train" in \
            capsys.readouterr().err
        assert next((store / "slurm").glob("runs-*.keys")).read_text().split() == [runs[1].key]
    finally:
        run_claim.release(store, held)


def test_train_into_another_store_writes_no_manifest_over_the_notebooks(tmp_path, monkeypatch):
    """Nor does a `train` with nothing left to train: the manifest of the training that made the runs stays."""
    from experiments.tests.test_scale import _planned

    monkeypatch.setattr(cli, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(cli, "plan", lambda profile: [_planned(1)])
    threads = torch.get_num_threads()
    try:
        assert main(["train", "smoke", "--store", str(tmp_path / "elsewhere"), "--threads", "1"]) == 0
        assert not (tmp_path / "figures").exists()
        monkeypatch.setattr(cli, "RESULTS", tmp_path / "results")
        assert main(["train", "smoke", "--threads", "1"]) == 0  # the notebooks' store
    finally:
        torch.set_num_threads(threads)
    manifest = tmp_path / "figures" / "smoke" / "manifests" / "executor.json"
    written = manifest.read_text()
    assert '"trained": 1' in written
    assert main(["train", "smoke"]) == 0 and manifest.read_text() == written


def test_run_one_trains_a_run_outside_the_plan_from_the_configs_the_slurm_executor_writes(tmp_path, capsys):
    """A calibration run is in no notebook's grid: run-one finds it in ``--configs`` (KEY.json), and names the folder
    when the key is in neither."""
    import json

    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore
    from experiments.tests.test_experiments import TINY

    config = RunConfig(**{**TINY, "epochs": 1, "milestones": ()})
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / f"{config.key()}.json").write_text(json.dumps(config.to_dict()))
    arguments = ["run-one", config.key(), "--profile", "smoke", "--store", str(tmp_path / "store"), "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        assert main(arguments) == 2
        assert f"no run of this profile has the key {config.key()!r}" in capsys.readouterr().err
        assert main([*arguments, "--configs", str(tmp_path / "configs")]) == 0
    finally:
        torch.set_num_threads(threads)
    assert ResultsStore(tmp_path / "store").finished(config.key()) is not None
    assert main(["run-one", "0" * 16, "--profile", "smoke", "--configs", str(tmp_path / "configs")]) == 2
    assert f"and {tmp_path / 'configs'} holds no {'0' * 16}.json" in capsys.readouterr().err


def test_run_one_refuses_a_config_file_that_is_not_its_keys_stand_in_run(tmp_path, capsys):
    import json

    from experiments.engine.config import RunConfig
    from experiments.tests.test_experiments import TINY

    config = RunConfig(**{**TINY, "epochs": 1, "milestones": ()})
    (tmp_path / f"{'1' * 16}.json").write_text(json.dumps(config.to_dict()))  # another run's config under this key
    (tmp_path / f"{'2' * 16}.json").write_text("{not json")
    for key, message in (("1" * 16, f"should hold stand-in run {'1' * 16}, holds {config.key()}"),
                         ("2" * 16, "error: bad config")):
        assert main(["run-one", key, "--profile", "smoke", "--configs", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err


def test_train_waits_for_the_runs_other_processes_train_and_trains_those_they_leave(tmp_path, monkeypatch, capsys):
    """One run trained by another process (run-one), one claimed by a process that stops without training it: `train`
    follows the first beside its own run's training (reported finished while that one trains: a tryout's follower
    showed such runs left until its end), and trains the second itself once its holder is gone."""
    import json
    import subprocess
    import sys
    import time

    from experiments.engine import run_claim
    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore
    from experiments.scale.plan import PlannedRun
    from experiments.tests.test_experiments import TINY

    runs = [PlannedRun.outside_plan(RunConfig(**{**TINY, "seed": seed, "epochs": 12, "milestones": ()}))
            for seed in (1, 2, 3)]
    store, configs = tmp_path / "store", tmp_path / "configs"
    configs.mkdir()
    (configs / f"{runs[0].key}.json").write_text(json.dumps(runs[0].config.to_dict()))
    trainer = subprocess.Popen([sys.executable, "-m", "experiments", "run-one", runs[0].key, "--profile", "smoke",
                                "--configs", str(configs), "--store", str(store), "--threads", "1"],
                               cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from experiments.engine import run_claim; "
                               f"run_claim.try_claim(sys.argv[1], {runs[1].config.training_key()!r}); time.sleep(3)",
                               str(store)], cwd=PROJECT_ROOT)
    deadline = time.time() + 120
    while not all(run_claim.claim_path(store, run.config.training_key()).exists() for run in runs[:2]):
        assert time.time() < deadline and trainer.poll() is None, "the other processes did not claim their runs"
        time.sleep(0.05)
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    monkeypatch.setattr(cli, "HOLDERS_POLL_S", 0.2)
    inline, seen_finished = cli.executors.inline, []

    def inline_once_the_other_process_has_finished(part, options, progress):
        deadline = time.time() + 120
        while runs[0].key not in progress.finished and time.time() < deadline:
            time.sleep(0.05)
        seen_finished.append(runs[0].key in progress.finished)
        inline(part, options, progress)
    monkeypatch.setattr(cli.executors, "inline", inline_once_the_other_process_has_finished)
    threads = torch.get_num_threads()
    try:
        assert main(["train", "smoke", "--store", str(store), "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
        trainer.wait(timeout=120), holder.wait(timeout=120)
    err = capsys.readouterr().err
    assert seen_finished[0], "the run another process trained was not reported while this call trained its own"
    assert "2 being trained by other processes (waited for; `plan` names them), 1 to train" in err
    assert "1 of the runs other processes trained were left without an outcome" in err
    assert "3 of 3 runs finished, 0 failed" in err and trainer.returncode == 0
    assert all(ResultsStore(store).finished(run.key) is not None for run in runs)


HOLDS_UNTIL = """
import sys, time
from pathlib import Path
from experiments.engine import run_claim
run_claim.try_claim(sys.argv[1], sys.argv[2])
deadline = time.time() + 120
while not Path(sys.argv[3]).exists() and time.time() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("executor", ["inline", "local"])
def test_a_run_another_process_claims_while_train_runs_is_left_to_it_not_waited_for(tmp_path, monkeypatch, capsys,
                                                                                   executor):
    """Two `train` commands on one store (two nodes, say) go through the same plan: a run the other claimed after this
    one started is passed over, not waited for, so that its worker trains the next run; it is followed, and trained
    here once its holder leaves it. The holder below keeps its claim until the run after it is finished: a worker
    waiting for it would finish that run only when the holder gives up, after two minutes."""
    import subprocess

    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore
    from experiments.scale.plan import PlannedRun
    from experiments.tests.test_experiments import TINY

    runs = [PlannedRun.outside_plan(RunConfig(**{**TINY, "seed": seed})) for seed in (1, 2)]
    store = ResultsStore(tmp_path / "store")
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    monkeypatch.setattr(cli, "HOLDERS_POLL_S", 0.2)
    holders = []
    real = getattr(cli.executors, executor)

    def claimed_by_another_process_as_training_begins(part, *args, **kwargs):
        if not holders:
            holders.append(subprocess.Popen([sys.executable, "-c", HOLDS_UNTIL, str(store.root),
                                             runs[0].config.training_key(), str(store.record_path(runs[1].key))],
                                            cwd=PROJECT_ROOT))
            from experiments.engine import run_claim
            deadline = time.time() + 120
            while run_claim.live_holder(store.root, runs[0].config.training_key()) is None:
                assert time.time() < deadline and holders[0].poll() is None
                time.sleep(0.05)
        return real(part, *args, **kwargs)

    monkeypatch.setattr(cli.executors, executor, claimed_by_another_process_as_training_begins)
    threads = torch.get_num_threads()
    try:
        assert main(["train", "smoke", "--store", str(store.root), "--threads", "1", "--executor", executor]) == 0
    finally:
        torch.set_num_threads(threads)
        holders[0].wait(timeout=150)
    err = capsys.readouterr().err
    written = sorted(runs, key=lambda run: store.record_path(run.key).stat().st_mtime_ns)
    assert written == [runs[1], runs[0]]  # one waiting would train runs[0] first, once its holder gave up: no clock
    assert "1 of the runs other processes trained were left without an outcome" in err
    assert "2 of 2 runs finished, 0 failed" in err
    assert all(store.finished(run.key) is not None for run in runs)


def test_the_runs_other_processes_train_are_followed_again_where_their_thread_failed_and_stop_with_the_block(
        tmp_path, monkeypatch, capsys):
    """The thread that follows the runs other processes train says at once why it failed, and the runs are followed
    again when asked for (here: a run nobody holds, given back to be trained); leaving the block stops a thread still
    waiting on a live holder (this process's own claim) at once, not after its poll."""
    from experiments.engine import run_claim
    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore
    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress
    from experiments.tests.test_experiments import TINY

    runs = [PlannedRun.outside_plan(RunConfig(**{**TINY, "seed": seed})) for seed in (1, 2)]
    store, follows = ResultsStore(tmp_path / "store"), []
    await_holders = cli.await_holders

    def failing_once(*arguments):
        follows.append(threading.current_thread().name)
        if len(follows) == 1:
            raise OSError("the store is away")
        return await_holders(*arguments)
    monkeypatch.setattr(cli, "await_holders", failing_once)
    with cli.holders_followed(runs[:1], store, Progress(runs[:1], live=False)) as orphans:
        assert orphans() == runs[:1]
    assert follows == ["holders", "MainThread"]
    assert ("note: following the 1 runs other processes train failed (the store is away); they are followed again "
            "after this call's own training") in capsys.readouterr().err
    monkeypatch.setattr(cli, "await_holders", await_holders)
    monkeypatch.setattr(cli, "HOLDERS_POLL_S", 60.0)
    assert run_claim.try_claim(store.root, runs[1].config.training_key())  # held by this live process
    began = time.monotonic()
    with cli.holders_followed(runs[1:], store, Progress(runs[1:], live=False)):
        time.sleep(0.2)
    assert time.monotonic() - began < 10 and not [thread for thread in threading.enumerate()
                                                 if thread.name == "holders"]


def test_every_executor_command_the_docs_show_is_one_the_command_line_takes():
    """Each ``python -m experiments plan|train|run-one ...`` line of the docs' shell blocks parses, and a Slurm one
    passes the executor's checks (a renamed or removed option, or one now refused, fails here, not in a reader's
    terminal)."""
    shown = [line for page in (PROJECT_ROOT / "docs").glob("*.md")
             for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", page.read_text(), flags=re.M | re.S)
             for line in block.splitlines() if re.match(r"python -m experiments (plan|train|run-one) ", line)]
    assert len(shown) >= 10, shown
    for line in shown:
        try:
            args = cli.parser().parse_args(shlex.split(line, comments=True)[3:])
        except SystemExit:
            pytest.fail(f"the docs show a command the command line refuses: {line}")
        if getattr(args, "executor", None) == "slurm":
            assert slurm_request.refusal(args) is None, f"{line}: {slurm_request.refusal(args)}"


def test_without_submitit_the_arrays_go_to_sbatch_and_submitit_asked_for_is_refused(tmp_path, capsys, monkeypatch):
    """Where submitit cannot be imported, ``train --executor slurm`` says that it submits the plain scripts with sbatch
    (here it then finds no sbatch: one line, no traceback); ``--submit-with submitit`` is refused before anything is
    written. The submission itself is tested on a real cluster (test_slurm.py)."""
    monkeypatch.setitem(sys.modules, "submitit", None)  # what `import submitit` raises ImportError on
    arguments = ["train", "smoke", "--executor", "slurm", "--store", str(tmp_path / "store")]
    with pytest.raises(SystemExit, match="^error: the slurm executor found no sbatch here: run it where Slurm's "
                                         "commands are"):
        main(arguments)
    assert "note: submitit is not installed here: the plain scripts are submitted with sbatch" in capsys.readouterr().err
    assert (tmp_path / "store" / "slurm" / "runs.sbatch").exists()
    assert main([*arguments, "--submit-with", "submitit", "--slurm-folder", str(tmp_path / "other")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --submit-with submitit, but submitit is not installed here: `pip install submitit`, or leave the "
        "option out to submit the plain scripts with sbatch"]
    assert not (tmp_path / "other").exists()


def test_a_slurm_folder_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys):
    """The scripts' folder under a file (or on a read-only disk): one line naming the folder and why, no traceback."""
    (tmp_path / "a file").write_text("")
    folder = tmp_path / "a file" / "slurm"
    with pytest.raises(SystemExit, match=f"^error: the Slurm scripts cannot be written in {re.escape(str(folder))} "
                                         r"\(Not a directory\): give a --slurm-folder \(or --store\) you can write to$"):
        main(["train", "smoke", "--executor", "slurm", "--store", str(tmp_path / "store"), "--slurm-folder",
              str(folder), "--sbatch-only"])
