"""The slurm executor on a real one-node Slurm cluster (``.ci/slurm/up.sh``; ``.ci/run`` starts and stops it): array
tasks give the inline records, through submitit and through the plain sbatch script, and a running task requeued
by ``scontrol requeue`` resumes to the same record. Skipped where no cluster answers, unless
``TOPK_REQUIRE_SLURM=1`` (CI), where that is a failure. Tests that count or follow their arrays by name give
``slurm.train`` a profile name of their own: pytest-xdist runs them side by side on the one cluster."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore, computed
from experiments.engine.train import run_stacked
from experiments.scale import cli, executors, slurm, slurm_queue, slurm_request
from experiments.scale.plan import PlannedRun, plan
from experiments.scale.progress import Progress
from experiments.spec.profiles import get_profile
from experiments.tests.test_scale import TINY


def _cluster_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    listing = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True)
    return listing.returncode == 0 and any(state in listing.stdout for state in ("idle", "mix", "alloc"))


if not _cluster_answers():
    if os.environ.get("TOPK_REQUIRE_SLURM") == "1":
        pytest.fail("TOPK_REQUIRE_SLURM=1 but no Slurm cluster answers: start one with .ci/slurm/up.sh",
                    pytrace=False)
    pytestmark = pytest.mark.skip(reason="no Slurm cluster answers (start one with .ci/slurm/up.sh)")


def _inline(runs: list[PlannedRun], store) -> ResultsStore:
    threads = torch.get_num_threads()
    try:
        executors.inline(runs, executors.TrainOptions(str(store), threads=1), Progress(runs))
    finally:
        torch.set_num_threads(threads)
    return ResultsStore(store)


def _options(tmp_path, name: str) -> tuple[executors.TrainOptions, slurm_request.SlurmOptions]:
    return (executors.TrainOptions(str(tmp_path / name), threads=1),
            slurm_request.SlurmOptions(str(tmp_path / name / "slurm"), cpus_per_task=1, mem_gb=1, time_min=10, poll=1.0))


def _wait_for(job: str, timeout: float = 600) -> None:
    """Until the job has left the queue, asked every 0.2 s (``sbatch --wait`` asks at growing intervals, up to 32 s)."""
    deadline = time.time() + timeout
    while subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, f"job {job} still queued after {timeout} s"
        time.sleep(0.2)


@pytest.mark.parametrize("submitit_installed", [True, False])
def test_the_smoke_profiles_missing_runs_as_an_array_give_the_inline_records(tmp_path, monkeypatch, capsys,
                                                                              submitit_installed):
    """Through submitit; where it is not installed, through the plain scripts, which ``train`` then submits with
    sbatch (a note says so), its ledger naming each task and its log as it names submitit's."""
    if not submitit_installed:
        monkeypatch.setitem(sys.modules, "submitit", None)  # what `import submitit` raises ImportError on
    runs = plan(get_profile("smoke"))[:2]  # a part of the profile, to keep the test short on 2 cores
    inline = _inline(runs, tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "slurm")
    progress = Progress(runs)
    slurm.train(runs, options, progress, slurm_options, profile="smoke")
    assert progress.done == 2 and not progress.failed, progress.summary()
    for run in runs:
        assert computed(ResultsStore(options.store).finished(run.key)) == computed(inline.finished(run.key))
    ledger = [json.loads(line) for line in (Path(slurm_options.folder) / slurm_queue.LEDGER).read_text().splitlines()]
    assert sorted(key for entry in ledger for key in entry["keys"]) == sorted(run.key for run in runs)
    assert (Path(slurm_options.folder) / "submitit").is_dir() == submitit_installed
    if not submitit_installed:
        err = capsys.readouterr().err
        assert "note: submitit is not installed here: the plain scripts are submitted with sbatch" in err
        assert re.search(r"submitted 2 array tasks \(job \d+\) with sbatch", err), err
        for entry in ledger:
            assert re.fullmatch(r"\d+_[01]", entry["job_id"]) and Path(entry["log"]).name == f"{entry['job_id']}.err"


@pytest.mark.parametrize("submit_with", slurm_request.SUBMITTERS)
def test_an_array_sbatch_refuses_stops_with_its_reason_in_one_line(tmp_path, submit_with):
    runs = plan(get_profile("smoke"))[:1]
    options, slurm_options = _options(tmp_path, "refused")
    slurm_options = dataclasses.replace(slurm_options, partition="nosuch", submit_with=submit_with)
    with pytest.raises(SystemExit, match=r"^error: sbatch refused the runs array: .*Invalid partition name"):
        slurm.train(runs, options, Progress(runs), slurm_options, profile="smoke")


def _enforces_accounts() -> bool:
    """Whether the cluster refuses a job whose account its user has none of (up.sh's, with accounting)."""
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return re.search(r"^AccountingStorageEnforce\s*=\s*\S*associations", shown, re.MULTILINE) is not None


def _cons_tres() -> bool:
    """Whether the cluster counts GPUs a task (``--gpus-per-task``: ``select/cons_tres``, up.sh's default)."""
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return re.search(r"^SelectType\s*=\s*select/cons_tres", shown, re.MULTILINE) is not None


def _offered_gres() -> set[str]:
    """The generic resources' names the cluster's nodes offer (up.sh's: gpu, mps, shard)."""
    listing = subprocess.run(["sinfo", "--noheader", "--format=%G"], capture_output=True, text=True).stdout
    return {resource.split(":")[0] for resource in re.split(r"[,\s]+", listing) if resource}


def _submitted_in_the_background(runs: list[PlannedRun], options, slurm_options, profile: str,
                                 outside_plan: bool = False):
    """``slurm.train`` in a thread, returned once its arrays are in the ledger: the thread, its progress, the ledger."""
    ledger = Path(slurm_options.folder) / slurm_queue.LEDGER
    progress = Progress(runs)
    follower = threading.Thread(target=slurm.train, args=(runs, options, progress, slurm_options),
                                kwargs={"profile": profile, "outside_plan": outside_plan})
    follower.start()
    deadline = time.time() + 120
    while not ledger.exists() and follower.is_alive() and time.time() < deadline:
        time.sleep(0.1)
    assert ledger.exists(), f"the {profile} arrays were not submitted (the follower's error is above)"
    return follower, progress, ledger


def _shown(task: str) -> str:
    return subprocess.run(["scontrol", "show", "job", task], capture_output=True, text=True).stdout


def _gres_asked(shown: str, field: str) -> list[str]:
    """The generic resources in ``scontrol show job``'s FIELD (``TresPerTask``, ``TresPerNode``) as NAME:COUNT. Slurm
    22.05 writes ``gres:gpu:1``; 24.11 ``gres/gpu=1`` a task, ``gres/gpu:1`` a node, beside the CPUs."""
    value = re.search(rf"\b{field}=(\S*)", shown)
    resources = value.group(1).split(",") if value else []
    return [re.sub(r"^gres[:/]", "", resource).replace("=", ":") for resource in resources
            if resource.startswith("gres")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the tasks would train")
def test_gpu_tasks_charged_to_an_account_are_queued_as_asked_through_submitit_and_the_plain_script(tmp_path):
    """On up.sh's stand-in GPUs: submitit's array with ``--gpus-per-task 1`` and the plain script with
    ``--sbatch-option gres=gpu:1`` each queue a task asking one GPU, charged to ``--account``. Released, each starts
    (Slurm found it a GPU) and stops at once, before it builds any data, naming its Slurm job and the missing CUDA
    device: in the plain script's log, and in the follower's report of submitit's task."""
    if not _enforces_accounts() or not _cons_tres():
        pytest.skip("the cluster enforces no accounts or counts no GPUs a task (up.sh's SLURM_CI_* settings)")
    run = PlannedRun(RunConfig(**{**TINY, "seed": 9}), ("test",), None, 0)
    options, slurm_options = _options(tmp_path, "gpus")
    options = dataclasses.replace(options, device="cuda")
    slurm_options = dataclasses.replace(slurm_options, gpus_per_task=1,
                                        sbatch_options=(("account", "topk-ci"), ("hold", None)))
    follower, progress, ledger = _submitted_in_the_background([run], options, slurm_options, "gpus")
    by_gres = dataclasses.replace(slurm_options, gpus_per_task=0,
                                  sbatch_options=(("gres", "gpu:1"), ("account", "topk-ci"), ("hold", None)))
    script = slurm.sbatch_script([[run]], options, by_gres, "smoke", "alone", outside_plan=True)
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    tasks = [json.loads(ledger.read_text())["job_id"], submitted.stdout.strip().split(";")[0] + "_0"]
    try:
        for task, field in zip(tasks, ("TresPerTask", "TresPerNode")):
            shown = _shown(task)
            assert "Account=topk-ci" in shown and "Reason=JobHeldUser" in shown, shown
            assert _gres_asked(shown, field) == ["gpu:1"], shown
        for task in tasks:
            subprocess.run(["scontrol", "release", task], capture_output=True, text=True)
        for task in tasks:
            _wait_for(task.split("_")[0])
    finally:
        subprocess.run(["scancel", tasks[0].split("_")[0], tasks[1].split("_")[0]], capture_output=True)
    no_gpu = f"--device cuda, but torch sees no CUDA device in Slurm job {tasks[1].split('_')[0]} on "
    assert no_gpu in (Path(slurm_options.folder) / f"{tasks[1]}.err").read_text()
    follower.join(timeout=120)
    assert not follower.is_alive() and list(progress.failed) == [run.key], progress.summary()
    assert progress.reasons[run.key].startswith("RuntimeError: --device cuda, but torch sees no CUDA device in "
                                                "Slurm job"), progress.summary()
    ended = slurm_queue.still_in_queue([run], slurm_options.folder).ended  # what `plan` says of the run
    assert ended[run.key][0] == tasks[0] and "no CUDA device in Slurm job" in Path(ended[run.key][1]).read_text()


def test_sbatch_only_asks_sbatch_whether_it_would_take_each_script_and_queues_nothing(tmp_path, capsys):
    """``--sbatch-only`` writes the scripts, then ``sbatch --test-only`` weighs each: a misspelled ``--sbatch-option``
    (which ``train`` cannot know from a right one) or a partition the cluster lacks stops the command with sbatch's
    reason; good scripts are said to be taken, and nothing is queued either way."""
    from experiments.__main__ import main

    arguments = ["train", "smoke", "--executor", "slurm", "--store", str(tmp_path / "store"), "--sbatch-only",
                 "--time-min", "10"]
    wrongs = [(["--sbatch-option", "holdd"], "unrecognized option '--holdd'"),
              (["--partition", "nosuch"], "invalid partition specified: nosuch"),
              (["--device", "cuda", "--sbatch-option", "gres=gpu:nosuch:1"],  # a GPU model the cluster lacks
               "Requested node configuration is not available"),
              (["--constraint", "nosuch"], "Invalid feature specification")]
    wrongs += [(["--account", "nosuch"], "Invalid account")] if _enforces_accounts() else []
    for wrong, reason in wrongs:
        with pytest.raises(SystemExit, match=f"^error: sbatch --test-only refuses .*runs.sbatch: .*{reason}"):
            main([*arguments, *wrong])
    rights = [["--sbatch-option", "hold"],
              ["--device", "cuda", "--sbatch-option", "gres=gpu:1", "--constraint", "standin-gpu", "--account", "topk-ci"]]
    rights += [["--device", "cuda", "--gpus-per-task", "1"]] if _cons_tres() else []
    rights += [["--device", "cuda", "--sbatch-option", f"gres={share}"] for share in ("mps:25", "shard:2")
               if share.split(":")[0] in _offered_gres()]  # up.sh's cluster offers both
    for right in rights:
        assert main([*arguments, *right]) == 0
        assert "(taken by sbatch --test-only, nothing queued): submit each with `sbatch SCRIPT`" in \
            capsys.readouterr().err
    commands = subprocess.run(["squeue", "--me", "--noheader", "--format=%o"], capture_output=True, text=True)
    assert commands.returncode == 0, commands.stderr
    assert not [command for command in commands.stdout.split() if command.startswith(str(tmp_path))], commands.stdout


def test_a_task_asking_no_memory_gets_the_cluster_s_default_which_refuses_a_stand_in_larger_than_it(tmp_path,
                                                                                                   capsys):
    """up.sh's cluster sets ``DefMemPerCPU`` for the whole cluster, not per partition (whose line says
    ``DefMemPerNode=UNLIMITED``): a task of 2 cores asking no memory is given twice it, as Slurm's own record of a held
    job shows, and ``train`` refuses the gpu profile, whose largest stand-in's images alone take more."""
    from experiments.__main__ import main

    job = subprocess.run(["sbatch", "--parsable", "--hold", "--cpus-per-task", "2", "--wrap", "true"],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["scancel", job], check=True)
    given = re.search(r"\bMinMemoryCPU=([0-9]+)([MG])\b", shown)
    per_cpu_mib = int(given[1]) * {"M": 1, "G": 1024}[given[2]]
    assert slurm_request.default_memory(None, 2, 0) == (2 * per_cpu_mib / 1024, f"DefMemPerCPU={per_cpu_mib} x 2 cores")
    assert slurm_request.default_memory("urgent", 1, 0) == (per_cpu_mib / 1024, f"DefMemPerCPU={per_cpu_mib} x 1 core")
    assert slurm_request.default_memory("nosuch", 1, 0) is None
    arguments = ["train", "gpu", "--executor", "slurm", "--uncalibrated", "--store", str(tmp_path), "--sbatch-only"]
    assert main(arguments) == 2
    assert (f"each task gets the {per_cpu_mib / 1024:.1f} GiB that Slurm gives one asking no memory on the default "
            f"partition (DefMemPerCPU={per_cpu_mib} x 1 core), less than the") in capsys.readouterr().err
    assert not (tmp_path / "slurm").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the tasks would train")
def test_a_timed_run_submitted_through_submitit_holds_a_whole_gpu_where_the_others_hold_shards(tmp_path):
    """Fig. 3's runs go in the array of runs trained alone (``--exclusive``), which asks a whole GPU where the other
    tasks ask a shard: Slurm refuses a shard beside ``--exclusive``, and the run's timing would be a share's."""
    if "shard" not in _offered_gres():
        pytest.skip("the cluster offers no shards of a GPU (up.sh's gres/shard)")
    timed = PlannedRun(RunConfig(**{**TINY, "seed": 11}), ("fig3_epoch_time",), None, 0)
    assert timed.alone
    options, slurm_options = _options(tmp_path, "timed")
    options = dataclasses.replace(options, device="cuda")
    slurm_options = dataclasses.replace(slurm_options, sbatch_options=(("gres", "shard:2"), ("hold", None)))
    follower, progress, ledger = _submitted_in_the_background([timed], options, slurm_options, "timed")
    task = json.loads(ledger.read_text())["job_id"]
    try:
        shown = _shown(task)
        assert _gres_asked(shown, "TresPerNode") == ["gpu:1"] and "OverSubscribe=NO" in shown, shown
    finally:
        subprocess.run(["scancel", task.split("_")[0]], capture_output=True)
    follower.join(timeout=120)
    assert not follower.is_alive() and list(progress.failed) == [timed.key], progress.summary()


def test_sbatch_only_says_how_far_its_scripts_were_checked_without_a_controller_or_an_sbatch(tmp_path, monkeypatch):
    """A controller that does not answer (here: a configuration naming a port nothing listens on) leaves the cluster's
    limits unchecked, while sbatch still refuses an option it does not know; without sbatch, nothing is checked."""
    script = tmp_path / "runs.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --time=10\ntrue\n")
    config = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text().splitlines()
    unreachable = tmp_path / "slurm.conf"
    kept = [line for line in config if not line.startswith(("SlurmctldPort", "MessageTimeout"))]
    unreachable.write_text("\n".join(kept) + "\nSlurmctldPort=1\nMessageTimeout=1\n")
    monkeypatch.setenv("SLURM_CONF", str(unreachable))
    assert slurm.test_only([script]).startswith("not checked against the cluster: ")
    script.write_text("#!/bin/bash\n#SBATCH --holdd\ntrue\n")
    with pytest.raises(SystemExit, match="unrecognized option '--holdd'"):
        slurm.test_only([script])
    monkeypatch.setenv("PATH", str(tmp_path / "no-commands"))
    assert slurm.test_only([script]) == "not checked: no sbatch here; sbatch checks them when you submit them"


def test_other_sbatch_options_reach_every_task_through_submitit_and_the_plain_script(tmp_path):
    """``--sbatch-option hold`` and ``comment=...`` (as ``--account`` or ``--qos`` would): each array's task is held
    with that comment, in submitit's array and in the plain script's; released, each trains its run."""
    run = PlannedRun(RunConfig(**{**TINY, "seed": 7}), ("test",), None, 0)
    options, slurm_options = _options(tmp_path, "options")
    slurm_options = dataclasses.replace(slurm_options, sbatch_options=(("hold", None), ("comment", "topk-ci")))
    follower, progress, ledger = _submitted_in_the_background([run], options, slurm_options, "options")
    script = slurm.sbatch_script([[run]], options, slurm_options, "smoke", "alone", outside_plan=True)
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    tasks = [json.loads(ledger.read_text())["job_id"], submitted.stdout.strip().split(";")[0] + "_0"]
    try:
        for task in tasks:
            shown = subprocess.run(["scontrol", "show", "job", task], capture_output=True, text=True).stdout
            assert "Reason=JobHeldUser" in shown and "Comment=topk-ci" in shown, shown
    finally:
        for task in tasks:
            subprocess.run(["scontrol", "release", task], capture_output=True, text=True)
    follower.join(timeout=600)
    _wait_for(tasks[1].split("_")[0])
    assert progress.done == 1 and not progress.failed, progress.summary()
    state = re.search(r"\bJobState=(\S+)", _shown(tasks[1]))  # the controller keeps an ended job for MinJobAge
    assert state and state[1] == "COMPLETED", f"the plain script's task ended {state[1] if state else 'unknown'}"


def test_the_plain_sbatch_script_runs_the_same_runs_through_run_one(tmp_path):
    runs = plan(get_profile("smoke"))[2:3]
    inline = _inline(runs, tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "sbatch")
    script = slurm.sbatch_script([[run] for run in runs], options, slurm_options, "smoke", "runs")
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    _wait_for(submitted.stdout.strip().split(";")[0])
    for run in runs:
        assert computed(ResultsStore(options.store).finished(run.key)) == computed(inline.finished(run.key))


def test_runs_stacked_in_one_task_give_the_stacked_records_through_submitit_and_sbatch(tmp_path):
    """``--stack 2``: one array task trains two runs stacked into one model, through submitit and through the plain
    script's ``run-one KEY KEY`` (its keys split into words), as the engine does in this process."""
    runs = plan(get_profile("smoke"))[:2]
    stacked = [run for run in runs if not run.alone]
    assert len(stacked) == 2 and stacked[0].config.stack_signature() == stacked[1].config.stack_signature()
    engine = ResultsStore(tmp_path / "engine")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_stacked([run.config for run in stacked], engine)
    finally:
        torch.set_num_threads(threads)
    options, slurm_options = _options(tmp_path, "submitit")
    options = dataclasses.replace(options, stack=2)
    progress = Progress(stacked)
    slurm.train(stacked, options, progress, slurm_options, profile="smoke")
    assert progress.done == 2 and not progress.failed, progress.summary()
    sbatch_options, sbatch_slurm = _options(tmp_path, "sbatch")
    script = slurm.sbatch_script([stacked], sbatch_options, sbatch_slurm, "smoke", "runs")
    keys = list((tmp_path / "sbatch" / "slurm").glob("runs-*.keys"))
    assert len(keys) == 1 and keys[0].read_text() == f"{stacked[0].key} {stacked[1].key}\n"
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    _wait_for(submitted.stdout.strip().split(";")[0])
    for run in stacked:
        expected = computed(engine.finished(run.key))
        for store in (options.store, sbatch_options.store):
            record = ResultsStore(store).finished(run.key)
            assert computed(record) == expected and len(record["provenance"]["stacked_with"]) == 2


def test_a_running_task_requeued_resumes_to_the_same_record(tmp_path):
    run = PlannedRun(RunConfig(**{**TINY, "epochs": 8, "milestones": (4,)}), ("test",), None, 0)
    inline = _inline([run], tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "requeued")
    store, progress = ResultsStore(options.store), Progress([run])
    follower = threading.Thread(target=slurm.train, args=([run], options, progress, slurm_options),
                                kwargs={"profile": "requeue"})
    follower.start()
    deadline = time.time() + 300
    while not store.checkpoint_path(run.key).exists() and time.time() < deadline:
        time.sleep(0.1)
    assert store.finished(run.key) is None, "the task finished before it could be requeued"
    assert slurm_queue.queued_tasks("requeue") == 1  # what a second `train` of the same profile would warn of
    job = subprocess.run(["squeue", "--noheader", "--format=%i", "--name=topk-requeue-runs"], capture_output=True,
                         text=True).stdout.split()
    assert len(job) == 1, job
    requeue = subprocess.run(["scontrol", "requeue", job[0]], capture_output=True, text=True)
    assert requeue.returncode == 0, requeue.stderr
    follower.join(timeout=600)
    assert progress.done == 1 and not progress.failed, progress.summary()
    starts = sum(path.read_text().count("Starting with JobEnvironment")
                 for path in (tmp_path / "requeued" / "slurm" / "submitit").glob("*_log.out"))
    assert starts == 2  # the task ran twice: before and after its requeue
    assert computed(store.finished(run.key)) == computed(inline.finished(run.key))
    from submitit.core.utils import DelayedSubmission

    submitted = list((tmp_path / "requeued" / "slurm" / "submitit").glob("*_submitted.pkl"))
    assert submitted, "submitit kept no submission"
    for path in submitted:  # out of time, requeued this many times (submitit's default: 3)
        assert DelayedSubmission.load(path)._timeout_countdown == slurm_options.max_requeues == 20


def test_a_task_preempted_by_a_higher_partitions_job_is_requeued_and_resumes_to_the_same_record(tmp_path):
    """On up.sh's cluster, which requeues only the jobs that asked (``JobRequeue=0``) and lets a job of its ``urgent``
    partition take a ``debug`` job's resources (``PreemptMode=REQUEUE``): a job asking both stand-in GPUs preempts the
    running task that holds one, which is requeued (sacct: preempted, then completed), runs again once the urgent job
    has ended, and ends with the inline record, through submitit, then through the plain script (one after the other:
    each urgent job would preempt the other's task too)."""
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    if not re.search(r"^PreemptMode\s*=\s*REQUEUE", shown, re.MULTILINE) or "urgent" not in _partitions():
        pytest.skip("the cluster preempts no job by requeueing it (up.sh's urgent partition)")
    if subprocess.run(["sacct", "--noheader", "--starttime=now"], capture_output=True).returncode != 0:
        pytest.skip("no accounting (up.sh's SLURM_CI_ACCOUNTING=0), where sacct would tell the preemption")
    run = PlannedRun(RunConfig(**{**TINY, "epochs": 64, "milestones": (32,), "seed": 21}), ("test",), None, 0)
    inline = _inline([run], tmp_path / "inline")
    for submit_with in slurm_request.SUBMITTERS:
        options, slurm_options = _options(tmp_path, submit_with)
        slurm_options = dataclasses.replace(slurm_options, submit_with=submit_with,
                                            sbatch_options=(("gres", "gpu:1"),))
        store = ResultsStore(options.store)
        follower, progress, ledger = _submitted_in_the_background([run], options, slurm_options, "smoke",
                                                                  outside_plan=True)  # run-one reads its config
        task = json.loads(ledger.read_text())["job_id"]
        deadline = time.time() + 300
        while not store.checkpoint_path(run.key).exists() and time.time() < deadline:
            time.sleep(0.1)
        assert store.finished(run.key) is None, f"the task finished before it could be preempted ({submit_with})"
        urgent = subprocess.run(["sbatch", "--parsable", "--partition=urgent", "--gres=gpu:2", "--mem=100M",
                                 "--time=5", f"--output={tmp_path}/urgent.out", "--wrap", "sleep 2"],
                                capture_output=True, text=True)
        assert urgent.returncode == 0, urgent.stderr
        follower.join(timeout=600)
        assert not follower.is_alive() and progress.done == 1 and not progress.failed, progress.summary()
        assert computed(store.finished(run.key)) == computed(inline.finished(run.key))
        _wait_for(task.split("_")[0])
        states = _accounted_states(task)
        assert states[0] == "PREEMPTED" and states[-1] == "COMPLETED", (submit_with, states)


def _accounted_states(task: str, timeout: float = 60) -> list[str]:
    """The states sacct lists for ``task``'s runs, first to last, once the last is final: slurmdbd hears of a job's
    end after squeue has dropped it (a CI run once read ``RUNNING`` there)."""
    deadline = time.time() + timeout
    while True:
        listed = subprocess.run(["sacct", "--jobs", task, "--duplicates", "--noheader", "--parsable2",
                                 "--format=JobID,State"], capture_output=True, text=True).stdout.split()
        states = [line.split("|")[1] for line in listed if "." not in line.split("|")[0]]
        if (states and states[-1] not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING")) or time.time() > deadline:
            return states
        time.sleep(0.5)


def _partitions() -> set[str]:
    listing = subprocess.run(["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True).stdout
    return set(listing.split())


def test_a_second_train_follows_the_runs_an_earlier_submission_still_has_queued(tmp_path, capsys, monkeypatch):
    """One task running, the other pending behind it (array parallelism 1): ``plan`` shows the pending run queued
    with its task, and a second ``train`` of the same runs submits nothing and reports both as the earlier tasks end
    them."""
    runs = [PlannedRun(RunConfig(**{**TINY, "epochs": 8, "milestones": (4,), "seed": seed}), ("test",), None, 0)
            for seed in (1, 2)]
    inline = _inline(runs, tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "twice")
    slurm_options = dataclasses.replace(slurm_options, array_parallelism=1)
    ledger = Path(slurm_options.folder) / slurm_queue.LEDGER
    first = threading.Thread(target=slurm.train, args=(runs, options, Progress(runs), slurm_options),
                             kwargs={"profile": "twice"})
    first.start()
    deadline = time.time() + 120
    while not ledger.exists() and time.time() < deadline:
        time.sleep(0.1)
    store = ResultsStore(options.store)
    left = [run for run in runs if store.finished(run.key) is None]  # what `train` would be given: plan's missing runs
    assert len(left) == 2, "a run finished before the second train began"
    monkeypatch.setattr(cli, "plan", lambda profile: runs)
    assert cli.main(["plan", "smoke", "--store", options.store]) == 0
    listing = capsys.readouterr().out
    assert f"{runs[1].key}    queued" in listing and "(Slurm task " in listing, listing
    progress = Progress(left)
    slurm.train(left, options, progress, slurm_options, profile="twice")
    first.join(timeout=600)
    assert "2 of the 2 runs to train are in the queue from an earlier submission" in capsys.readouterr().err
    assert progress.done == 2 and not progress.failed, progress.summary()
    assert len(ledger.read_text().splitlines()) == 2  # the first submission's two tasks, nothing more
    for run in runs:
        assert computed(store.finished(run.key)) == computed(inline.finished(run.key))


def test_a_train_follows_the_tasks_of_a_plain_script_submitted_with_sbatch(tmp_path, capsys):
    """The plain script submitted by hand (one task running, the other pending behind it): a ``train`` of the runs
    still missing reads the array's script back from Slurm, finds their tasks, follows them and submits nothing."""
    runs = [PlannedRun(RunConfig(**{**TINY, "epochs": 8, "milestones": (4,), "seed": seed}), ("test",), None, 0)
            for seed in (5, 6)]
    inline = _inline(runs, tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "plain")
    slurm_options = dataclasses.replace(slurm_options, array_parallelism=1)
    script = slurm.sbatch_script([[run] for run in runs], options, slurm_options, "smoke", "runs", outside_plan=True)
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    array = submitted.stdout.strip().split(";")[0]
    store = ResultsStore(options.store)
    left = [run for run in runs if store.finished(run.key) is None]  # what `train` would be given: plan's missing runs
    progress = Progress(left)
    slurm.train(left, options, progress, slurm_options, profile="smoke")
    _wait_for(array)
    assert (f"{len(left)} of the {len(left)} runs to train are in the queue from an earlier submission (job {array})"
            in capsys.readouterr().err)
    assert progress.done == len(left) and not progress.failed, progress.summary()
    ledger = [json.loads(line) for line in (Path(slurm_options.folder) / slurm_queue.LEDGER).read_text().splitlines()]
    assert {entry["job_id"].split("_")[0] for entry in ledger} == {array}  # nothing submitted through submitit
    assert [run.key for run in runs[1:]] == [key for entry in ledger if entry["job_id"] == f"{array}_1"
                                             for key in entry["keys"]]
    for run in runs:
        assert computed(store.finished(run.key)) == computed(inline.finished(run.key))


def test_a_held_task_is_not_followed_and_a_run_is_followed_in_its_latest_live_task(tmp_path):
    """The ledger against the queue: a pending task held by ``scontrol hold`` is not followed (a new ``train``
    submits its run again), and a later ledger line whose task is gone does not hide the earlier task still live."""
    runs = [PlannedRun(RunConfig(**{**TINY, "epochs": 8, "milestones": (4,), "seed": seed}), ("test",), None, 0)
            for seed in (3, 4)]
    options, slurm_options = _options(tmp_path, "held")
    slurm_options = dataclasses.replace(slurm_options, array_parallelism=1)
    follower, progress, ledger = _submitted_in_the_background(runs, options, slurm_options, "held")
    task_of = {entry["keys"][0]: entry["job_id"] for entry in map(json.loads, ledger.read_text().splitlines())}
    second = task_of[runs[1].key]
    hold = subprocess.run(["scontrol", "hold", second], capture_output=True, text=True)
    try:
        assert hold.returncode == 0, hold.stderr
        gone = task_of[runs[0].key].split("_")[0] + "_99"  # a task index the array never had
        with ledger.open("a") as handle:
            handle.write(json.dumps({"job_id": gone, "keys": [runs[0].key], "log": "gone.err"}) + "\n")
        in_queue = slurm_queue.still_in_queue(runs, slurm_options.folder)
        assert [(run.key, job_id) for run, job_id, _ in in_queue.tasks] == [(runs[0].key, task_of[runs[0].key])]
        assert second in in_queue.in_queue  # listed by the queue, though not followed
    finally:
        subprocess.run(["scontrol", "release", second], capture_output=True, text=True)
    follower.join(timeout=600)
    assert progress.done == 2 and not progress.failed, progress.summary()


def test_a_plain_script_task_warned_of_its_time_limit_requeues_itself_and_resumes_to_the_same_record(tmp_path):
    """Slurm never requeues a task that reaches its time limit: the plain script's trap does, on the warning Slurm
    sends before it (``--signal=B:USR1@...``), sent here at once by ``scancel --signal USR1 --batch``."""
    run = PlannedRun(RunConfig(**{**TINY, "epochs": 8, "milestones": (4,)}), ("test",), None, 0)
    inline = _inline([run], tmp_path / "inline")
    options, slurm_options = _options(tmp_path, "warned")
    store = ResultsStore(options.store)
    script = slurm.sbatch_script([[run]], options, slurm_options, "smoke", "runs", outside_plan=True)
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.time() + 300
    while not store.checkpoint_path(run.key).exists() and time.time() < deadline:
        time.sleep(0.1)
    assert store.finished(run.key) is None, "the task finished before it could be warned"
    warned = subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_0"], capture_output=True, text=True)
    assert warned.returncode == 0, warned.stderr
    _wait_for(job)
    log = (Path(slurm_options.folder) / f"{job}_0.err").read_text()
    assert "out of time: requeued (restart 1 of at most 20); it resumes from its checkpoints" in log, log
    assert computed(store.finished(run.key)) == computed(inline.finished(run.key))


@pytest.mark.parametrize("submit_with", slurm_request.SUBMITTERS)
def test_a_calibration_steps_runs_train_as_an_array_and_the_search_reads_them_back(tmp_path, submit_with):
    """``make calibrate EXECUTOR=slurm``: the runs a step announces, outside any notebook's plan, go out as one array
    (through submitit, or the plain script through sbatch) and come back as records in the store, or as a divergence
    (a learning rate far too large), which does not stop the search; the plain sbatch script written beside gives the
    same through ``run-one --configs``."""
    from experiments.scale import calibrate

    ce = {**TINY, "loss": "cross_entropy", "loss_options": {}, "epochs": 1, "milestones": ()}
    configs = [RunConfig(**{**ce, "seed": seed}) for seed in (11, 12)]
    diverging = RunConfig(**{**ce, "seed": 13, "lr": 1e30})
    options, slurm_options = _options(tmp_path, "calibration")
    slurm_options = dataclasses.replace(slurm_options, submit_with=submit_with)
    store = ResultsStore(options.store)
    ahead = calibrate.executor_ahead(store, lambda runs, progress: slurm.train(runs, options, progress, slurm_options,
                                                                                 profile="smoke", outside_plan=True))
    ahead([*configs, diverging])
    assert all(store.finished(config.key()) for config in configs)
    assert store.divergence(diverging.training_key()) == "the training loss became NaN in epoch 1"
    written = sorted(path.stem for path in (tmp_path / "calibration" / "slurm" / "configs").glob("*.json"))
    assert written == sorted(config.key() for config in (*configs, diverging))  # what the plain sbatch script reads
    through_the_array = {config.key(): computed(store.finished(config.key())) for config in configs}
    for folder in ("runs", "diverged"):  # the store emptied of outcomes: the plain script trains them again
        (store.root / folder).rename(tmp_path / f"first_{folder}")
    script = tmp_path / "calibration" / "slurm" / "calibration.sbatch"  # the calibration's array has its own name
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    _wait_for(submitted.stdout.strip().split(";")[0])
    assert {key: computed(store.finished(key)) for key in through_the_array} == through_the_array
    assert store.divergence(diverging.training_key()) == "the training loss became NaN in epoch 1"
