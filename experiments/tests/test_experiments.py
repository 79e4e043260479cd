"""Models, configs, the training loop, the results store (never recompute, resume to the same result) and DDP."""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

from data_prep.common import MissingDataError
from data_prep.splits import TensorImages
from data_prep.transforms import augment_and_normalise
from experiments.__main__ import main as experiments_main
from experiments.engine import config as config_module
from experiments.engine.config import RunConfig
from experiments.engine.models import build_model, parameter_count
from experiments.engine.batches import InMemoryBatches
from experiments.engine.store import ResultsStore
from experiments.engine.train import flipped_label_fit, reseed_process, run, train_epoch
from experiments.harness import flatten
from experiments.scale import executors
from topk.losses import build_loss, noised_hinge

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(dataset="cifar100_like", dataset_options={"per_class_train": 4, "per_class_val": 1, "per_class_test": 1,
                                                    "image_size": 16},
            model="small_cnn", model_options={"width": 8}, loss="noised_balanced",
            loss_options={"k": 5, "epsilon": 0.5, "n_samples": 3}, epochs=3, batch_size=32, lr=0.05,
            weight_decay=5e-4, milestones=(2,), seed=1)


def test_densenet_40_40_has_the_papers_parameter_count():
    model = build_model("densenet40_40", 100)
    assert parameter_count(model) == 1_941_620
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_resnet_reads_imagenet_weights_from_a_local_file_and_takes_a_cosine_head(tmp_path):
    import torchvision

    source = torchvision.models.resnet18(weights=None)
    torch.save(source.state_dict(), tmp_path / "resnet18.pth")
    model = build_model("resnet18", 7, weights=tmp_path / "resnet18.pth", cosine_scale=40.0)
    torch.testing.assert_close(model.conv1.weight, source.conv1.weight)
    assert model(torch.randn(2, 3, 64, 64)).abs().max() <= 40.0 + 1e-4
    with pytest.raises(FileNotFoundError, match="ImageNet weights file not found"):
        build_model("resnet50", 7, weights=tmp_path / "absent.pth")


def test_bad_configs_are_refused_before_training_with_the_valid_choices():
    with pytest.raises(ValueError, match="unknown loss 'hinge'; the losses are .*noised_balanced"):
        RunConfig(**{**TINY, "loss": "hinge"})
    with pytest.raises(ValueError, match="unknown model 'vgg'; the models are .*densenet40_40"):
        RunConfig(**{**TINY, "model": "vgg"})
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; the datasets are .*cifar100_like"):
        RunConfig(**{**TINY, "dataset": "mnist"})
    with pytest.raises(ValueError, match=r"'milestones' should be increasing epochs in \(0, 3\), got \(5,\)"):
        RunConfig(**{**TINY, "milestones": (5,)})
    with pytest.raises(ValueError, match="'selection_metric' should be"):
        RunConfig(**{**TINY, "selection_metric": "macro_top3"})
    with pytest.raises(ValueError, match="'lr' should be a number >= 0, got -0.1"):
        RunConfig(**{**TINY, "lr": -0.1})
    with pytest.raises(ValueError, match="unknown config fields \\['learning_rate'\\]"):
        RunConfig.from_dict({**TINY, "learning_rate": 0.1})


def test_config_key_is_stable_and_changes_with_any_field():
    config = RunConfig(**TINY)
    assert config.key() == RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))).key()
    assert config.key() != config.replace(seed=2).key()
    assert config.key() != config.replace(loss_options={**TINY["loss_options"], "epsilon": 0.1}).key()


def test_a_redrawn_stand_ins_runs_get_new_keys_and_the_others_keep_theirs(monkeypatch):
    config = RunConfig(**{**TINY, "dataset": "plantnet_like", "dataset_options": {"n_images": 400, "n_classes": 10}})
    unchanged = RunConfig(**{**TINY, "dataset": "imagenet_like"})
    keys = config.key(), unchanged.key()
    monkeypatch.setitem(config_module.GENERATOR_VERSIONS, "plantnet_like", 3)
    assert config.key() != keys[0] and unchanged.key() == keys[1]
    # a stand-in never redrawn is keyed by its config alone, as before versions existed
    canonical = json.dumps(unchanged.to_dict(), sort_keys=True, separators=(",", ":"))
    assert unchanged.key() == hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_a_run_records_metrics_timings_and_provenance_and_is_never_recomputed(tmp_path):
    store = ResultsStore(tmp_path)
    config = RunConfig(**{**TINY, "selection_metric": "macro_top5"})
    record = run(config, store)
    assert [h["epoch"] for h in record["history"]] == [1, 2, 3]
    assert all(h["epoch_seconds"] > 0 and 0 < h["loss_seconds"] < h["epoch_seconds"] for h in record["history"])
    assert record["history"][2]["lr"] == pytest.approx(0.005)  # divided by 10 at the milestone
    # The noised loss's gradient has at most B + 1 = 4 non-zero coordinates per sample (Fig. 2), and some.
    assert all(0 < h["grad_nonzero"] <= 4 for h in record["history"])
    assert set(record["test"]) == {"top", "macro_top", "macro_top_by_group", "crowded_classes"}
    assert 0 <= record["test"]["top"]["5"] <= 1 and record["data"]["synthetic"]
    assert record["provenance"]["git_commit"] and record["provenance"]["torch"] == torch.__version__
    assert not store.checkpoint_path(config.key()).exists()
    before = store.record_path(config.key()).stat().st_mtime_ns
    assert run(config, store) == record
    assert store.record_path(config.key()).stat().st_mtime_ns == before


class _Lookup(torch.nn.Module):
    """Predicts ``labels[i]`` for the 1-pixel image whose value is ``i`` (normalised with mean 0 and std 1)."""

    def __init__(self, labels: torch.Tensor, n_classes: int):
        super().__init__()
        self.labels, self.n_classes = labels, n_classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        index = (images[:, 0, 0, 0] * 255).round().long()
        return torch.nn.functional.one_hot(self.labels[index], self.n_classes).float()


def test_the_flipped_label_fit_counts_the_flipped_images_predicted_as_their_noisy_and_their_true_label():
    clean, noisy = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([0, 2, 1, 3, 1, 0])  # rows 1, 2, 4, 5 flipped
    images = torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1)
    train = TensorImages(images, noisy, augment_and_normalise(1, mean=(0.0,), std=(1.0,)))  # never augmented here
    predicted = torch.tensor([0, 2, 2, 3, 1, 3])  # row 1 and 4: noisy label; row 2: true; row 5: neither
    fit = flipped_label_fit(_Lookup(predicted, 4), train, clean, torch.device("cpu"), batch_size=3)
    assert fit == {"flipped": 4, "fits_noisy": 0.5, "fits_clean": 0.25}
    assert flipped_label_fit(_Lookup(clean, 4), TensorImages(images, clean, train.transform), clean,
                             torch.device("cpu")) == {"flipped": 0, "fits_noisy": None, "fits_clean": None}


def test_a_run_on_noisy_labels_records_how_much_of_the_noise_it_fits_and_tables_show_it(tmp_path):
    config = RunConfig(**{**TINY, "loss": "cross_entropy", "loss_options": {}, "epochs": 1, "milestones": (),
                          "dataset_options": {**TINY["dataset_options"], "noise": 0.5}})
    record = run(config, ResultsStore(tmp_path))
    fit = record["label_noise_fit"]
    assert fit["flipped"] > 0 and 0 <= fit["fits_noisy"] + fit["fits_clean"] <= 1
    row = flatten(record)
    assert (row["flipped_fit_noisy"], row["flipped_fit_clean"]) == (100 * fit["fits_noisy"], 100 * fit["fits_clean"])
    assert "label_noise_fit" not in run(RunConfig(**TINY), ResultsStore(tmp_path))  # no noise, nothing to fit


def test_a_run_records_the_classes_crowding_the_test_top_ks(tmp_path):
    """The test evaluation counts, for each K evaluated, the classes in the top K of more than half the test images;
    the validation history does not (one pass more per run, not per epoch)."""
    record = run(RunConfig(**TINY), ResultsStore(tmp_path))
    crowded = record["test"]["crowded_classes"]
    assert set(crowded) == {str(k) for k in RunConfig(**TINY).eval_ks}
    assert all(0 <= n < 2 * int(k) for k, n in crowded.items())  # shares sum to K, so fewer than 2K exceed 1/2
    assert all("crowded_classes" not in epoch["val"] for epoch in record["history"])
    row = flatten(record)
    assert all(row[f"test_crowded_top{k}"] == n for k, n in crowded.items())


COMPILE = [None, pytest.param("default", marks=pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor on a CPU needs a C++ compiler"))]


@pytest.mark.parametrize("compile_mode", COMPILE)
def test_an_interrupted_run_resumes_to_the_same_result_as_an_uninterrupted_one(tmp_path, compile_mode):
    """Eager, and with the model and the loss compiled (``--compile``)."""
    config = RunConfig(**TINY)
    torch.use_deterministic_algorithms(True)
    try:
        whole = run(config, ResultsStore(tmp_path / "whole"), compile_mode=compile_mode)
        store = ResultsStore(tmp_path / "killed")
        assert run(config, store, stop_after_epochs=1, compile_mode=compile_mode) is None  # as if killed after epoch 1
        assert store.checkpoint_path(config.key()).exists() and store.finished(config.key()) is None
        resumed = run(config, store, compile_mode=compile_mode)
    finally:
        torch.use_deterministic_algorithms(False)
    assert resumed["provenance"]["compile_mode"] == compile_mode

    assert _without_times(resumed) == _without_times(whole)
    assert resumed["test"] == whole["test"] and resumed["selected_epoch"] == whole["selected_epoch"]


def test_a_cpu_run_is_bit_reproducible_for_a_seed_and_a_thread_count(tmp_path):
    """What makes a verdict survive a rerun on the same machine: the same seed and number of CPU threads give the same
    losses and accuracies to the bit, without torch's deterministic mode. (Other thread counts sum in other orders.)"""
    config = RunConfig(**TINY)
    first, second = (run(config, ResultsStore(tmp_path / name)) for name in ("first", "second"))
    assert _without_times(first) == _without_times(second) and first["test"] == second["test"]


def _result(record: dict) -> tuple:
    """What a run computes: its config, losses, validation values, selected epoch and test metrics (not timings)."""
    return record["config"], _without_times(record), record["selected_epoch"], record["test"]


def test_one_training_stores_each_selection_metric_s_record_as_its_own_training_would(tmp_path):
    config = RunConfig(**{**TINY, "loss": "cross_entropy", "loss_options": {}, "eval_ks": (1, 3, 5),
                          "selection_metric": "top5"})
    store = ResultsStore(tmp_path / "shared")
    own = run(config, store)
    siblings = {sibling.selection_metric: store.finished(sibling.key()) for sibling in config.siblings()}
    assert sorted(siblings) == ["macro_top1", "macro_top3", "macro_top5", "top1", "top3", "top5"]
    assert siblings["top5"] == own
    for metric in ("top1", "macro_top3"):
        alone = run(config.replace(selection_metric=metric), ResultsStore(tmp_path / metric))
        assert _result(siblings[metric]) == _result(alone)  # to the bit: the metric only picks the tested epoch
    assert {record["selected_epoch"] for record in siblings.values()} <= {1, 2, 3}
    assert all(record["test"] == own["test"] for record in siblings.values()
               if record["selected_epoch"] == own["selected_epoch"])
    written = {metric: store.record_path(record["key"]).stat().st_mtime_ns for metric, record in siblings.items()}
    store.record_path(own["key"]).unlink()
    assert _result(run(config, store)) == _result(own)  # trained again
    rewritten = {m for m, r in siblings.items() if store.record_path(r["key"]).stat().st_mtime_ns != written[m]}
    assert rewritten == {"top5"}  # the siblings already stored are left as they were


def test_a_compiled_run_is_the_eager_run_up_to_rounding(tmp_path):
    """The compiled step draws the noised loss's noise from PyTorch's random stream, as eager mode does: the first
    epoch's training loss agrees to rounding (later epochs drift apart as rounding differences are trained on)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor on a CPU needs a C++ compiler")
    config = RunConfig(**{**TINY, "epochs": 1, "milestones": ()})
    eager = run(config, ResultsStore(tmp_path / "eager"))
    compiled = run(config, ResultsStore(tmp_path / "compiled"), compile_mode="default")
    assert compiled["history"][0]["train_loss"] == pytest.approx(eager["history"][0]["train_loss"], rel=1e-4)
    with pytest.raises(ValueError, match="'compile_mode' should be None or one of"):
        run(config.replace(seed=5), ResultsStore(tmp_path / "bad"), compile_mode="fast")


def _without_times(record):
    return [{k: v for k, v in h.items() if not k.endswith("seconds")} for h in record["history"]]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
def test_a_cuda_run_trains_under_bfloat16_autocast_and_stores_its_siblings(tmp_path):
    config = RunConfig(**TINY)
    store = ResultsStore(tmp_path)
    record = run(config, store, device="cuda")
    assert record["provenance"]["device"].startswith("cuda") and [h["epoch"] for h in record["history"]] == [1, 2, 3]
    assert all(h["train_loss"] == h["train_loss"] and 0 < h["loss_seconds"] < h["epoch_seconds"]
               for h in record["history"])
    assert all(0 < h["grad_nonzero"] <= 4 for h in record["history"])  # B + 1 = 4 coordinates at most, as on a CPU
    siblings = [store.finished(sibling.key()) for sibling in config.siblings()]
    assert all(s is not None and s["history"] == record["history"] for s in siblings)


def _synchronisations(action) -> int:
    """How many times ``action`` made the host wait for the CUDA device (sync debug mode's warnings)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            action()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(warning.message) for warning in caught)


@CUDA
def test_a_cuda_epoch_waits_for_the_device_a_fixed_number_of_times_whatever_its_batches():
    """The epoch reads the device at its end only. A wait inside the step (a copy from the host's memory, a
    ``.item()``) would keep the host from queueing steps ahead of the device."""
    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (48, 3, 32, 32), dtype=torch.uint8, generator=generator)
    data = InMemoryBatches(TensorImages(images, torch.randint(0, 10, (48,), generator=generator),
                                        augment_and_normalise(32)), device)
    model = build_model("small_cnn", 10).to(device)
    loss = build_loss("noised_balanced", k=2, epsilon=1.0, n_samples=3).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def epoch(batch_size):
        return lambda: train_epoch(model, loss, data.shuffled(0, batch_size), optimiser, device, False, 0)

    epoch(8)()  # warm-up: the first launches, cuBLAS's and cuDNN's handles
    two_batches, six_batches = _synchronisations(epoch(24)), _synchronisations(epoch(8))
    assert two_batches == six_batches < 6, (two_batches, six_batches)


@pytest.mark.skipif(os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None,
                    reason="deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 set before CUDA starts")
@CUDA
@pytest.mark.parametrize("compile_mode", [None, "reduce-overhead"])  # eager, and make's default on CUDA (CUDA graphs)
def test_an_interrupted_cuda_run_resumes_to_the_same_result_with_its_noise_stream(tmp_path, deterministic,
                                                                                  compile_mode):
    config = RunConfig(**TINY)  # the noised loss: its noise comes from the CUDA generator saved with the checkpoint
    whole = run(config, ResultsStore(tmp_path / "whole"), device="cuda", compile_mode=compile_mode)
    store = ResultsStore(tmp_path / "killed")
    assert run(config, store, device="cuda", stop_after_epochs=1, compile_mode=compile_mode) is None
    resumed = run(config, store, device="cuda", compile_mode=compile_mode)
    assert _result(resumed) == _result(whole)


@CUDA
def test_cuda_runs_stacked_into_one_model_train_as_cuda_graphs(tmp_path):
    """What ``make paper-figures DEVICE=cuda STACK=2`` does: grouped layers under bfloat16 autocast, channels-last and
    CUDA graphs; each run's history its own and finite."""
    from experiments.engine.train import run_stacked

    configs = [RunConfig(**{**TINY, "seed": seed}) for seed in (1, 2)]
    records = run_stacked(configs, ResultsStore(tmp_path), device="cuda", compile_mode="reduce-overhead")
    for record in records:
        assert [h["stack"] for h in record["history"]] == [2, 2, 2]
        assert all(h["train_loss"] == h["train_loss"] and 0 < h["grad_nonzero"] <= 4 for h in record["history"])
    assert records[0]["history"][0]["train_loss"] != records[1]["history"][0]["train_loss"]  # own seeds and orders


@CUDA
def test_cuda_graphs_of_finished_runs_are_freed_in_a_process_that_trains_run_after_run(tmp_path):
    """A ``local`` worker trains run after run, each compiled with CUDA graphs anew: the memory reserved after the
    third run is not the first's plus two more graph pools."""
    import gc

    reserved = []
    for seed in (1, 2, 3):
        run(RunConfig(**{**TINY, "seed": seed}), ResultsStore(tmp_path), device="cuda", compile_mode="reduce-overhead")
        gc.collect()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[2] <= 1.25 * reserved[0] + 2 ** 26, [f"{value / 2 ** 20:.0f} MiB" for value in reserved]


@CUDA
def test_local_workers_on_cuda_without_an_index_train_on_the_first_gpu(tmp_path):
    """``train --executor local --jobs 2 --device cuda``: each worker sets GPU 0 (``torch.cuda.set_device("cuda")``,
    which torch refuses, crashed every worker once) and its runs finish."""
    from experiments.scale import executors
    from experiments.scale.plan import PlannedRun
    from experiments.scale.progress import Progress

    runs = [PlannedRun(RunConfig(**{**TINY, "seed": seed}), ("test",), None, 0) for seed in (1, 2)]
    progress = Progress(runs)
    executors.local(runs, executors.TrainOptions(str(tmp_path), "cuda", threads=1), progress, jobs=2)
    assert progress.done == 2 and not progress.failed, progress.summary()


def test_a_search_thread_gets_cuda_graph_trees_of_its_own(monkeypatch):
    """torch 2.11 makes the CUDA-graph trees' containers for inductor's importing thread alone: a ``reduce-overhead``
    step first run by another thread failed (NOTES section 20). A calibration's search thread is given its own
    before its work, where autograd's threads find them too; the main thread's are left alone."""
    from torch._inductor import cudagraph_trees

    from experiments.scale.calibrate import _each_in_a_thread

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the trees are only made where a GPU is seen
    main_containers = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers")

    def look(setup):  # before any first use, which later torch versions answer by making them
        made = hasattr(cudagraph_trees.local, "tree_manager_containers")
        stashed = torch._C._is_key_in_tls("tree_manager_containers")
        return made, stashed and torch._C._get_obj_in_tls("tree_manager_containers")

    (made, stashed), = _each_in_a_thread(look, ("cifar100",))
    assert made and stashed is not False and stashed is not main_containers
    assert cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers") is main_containers


@pytest.mark.parametrize("stash", ["torch's", "one that keeps the reference it is handed"])
def test_a_search_threads_trees_are_counted_once_by_each_holder(monkeypatch, stash):
    """torch 2.11's stash keeps the pointer it is handed without counting a reference and releases it at the thread's
    end, as ``threading.local`` does: the trees were freed twice, and the sixth H200 lease's thread test crashed
    (NOTES section 27). Whichever the stash, each holder counts its own reference. (Without it, this test's
    process crashes when the thread ends.)"""
    import ctypes

    from torch._inductor import cudagraph_trees

    from experiments.engine.cuda_graph_threads import give_this_thread_cuda_graph_trees

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kept_uncounted = {}
    if stash != "torch's":
        def taking_over(name, value):  # holds ``value`` without counting it, as a stolen reference
            kept_uncounted[name] = value
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(value))
        monkeypatch.setattr(torch._C, "_stash_obj_in_tls", taking_over)
    extra_counted = []

    def count_holders():  # each stashed object against one held alike (the local, a name, the call) but not stashed
        give_this_thread_cuda_graph_trees()
        cudagraph_trees.local.unstashed = unstashed = {}
        for name in ("tree_manager_containers", "tree_manager_locks"):
            stashed = getattr(cudagraph_trees.local, name)
            extra_counted.append(sys.getrefcount(stashed) - sys.getrefcount(unstashed))

    thread = threading.Thread(target=count_holders)
    thread.start()
    thread.join()
    assert extra_counted == [1, 1]  # the stash's own reference


@CUDA
def test_a_cuda_graph_run_trains_in_a_search_thread(tmp_path):
    """A calibration's search thread trains a move in-process where its worker is lost; with ``reduce-overhead`` on
    torch 2.11 its first step failed in ``cudagraph_trees.get_obj``."""
    from experiments.scale.calibrate import _each_in_a_thread

    config = RunConfig(**TINY)
    record, = _each_in_a_thread(lambda setup: run(config, ResultsStore(tmp_path), device="cuda",
                                                  compile_mode="reduce-overhead"), ("cifar100",))
    assert [h["epoch"] for h in record["history"]] == list(range(1, config.epochs + 1))
    assert all(math.isfinite(h["train_loss"]) for h in record["history"]), record["history"]


def test_a_missing_real_dataset_names_the_data_prep_command(tmp_path, capsys):
    config = RunConfig(**{**TINY, "dataset": "cifar100", "dataset_options": {}})
    with pytest.raises(MissingDataError, match="python -m data_prep cifar100 --root PATH"):
        run(config, ResultsStore(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    command = lambda: experiments_main([str(path), "--store", str(tmp_path), "--data-root", str(tmp_path / "none")])  # noqa: E731
    assert executors.command_status(command) == 2  # as the command line ends: one line, no traceback
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "python -m data_prep cifar100 --root" in error and "Traceback" not in error


def test_an_interrupted_command_says_what_it_kept_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    config = RunConfig(**TINY)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    arguments = [str(path), "--store", str(tmp_path / "store")]

    def interrupted_after_one_epoch(config, store, **options):
        run(config, store, stop_after_epochs=1, **options)
        raise KeyboardInterrupt

    monkeypatch.setattr("experiments.__main__.run", interrupted_after_one_epoch)
    assert experiments_main(arguments) == 130
    assert f"interrupted: run {config.key()} keeps 1 of its 3 epochs" in capsys.readouterr().err
    monkeypatch.undo()
    assert experiments_main(arguments) == 0
    assert len(ResultsStore(tmp_path / "store").finished(config.key())["history"]) == 3


def test_ddp_processes_draw_their_own_loss_noise_and_draw_it_again_on_a_rerun():
    """Under DDP every process starts from the run's seed; reseeded per epoch and rank, the noised loss of the same
    scores differs between processes and is the same for one process and epoch, as on a resumed run."""
    scores, labels = torch.randn(4, 20, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 3, 7, 19])

    def loss_on(rank: int, epoch: int = 2) -> float:
        reseed_process(seed=5, epoch=epoch, rank=rank)
        return noised_hinge(scores, labels, k=3, epsilon=1.0, n_samples=2).item()

    first, second, again, next_epoch = loss_on(0), loss_on(1), loss_on(0), loss_on(0, epoch=3)
    assert first == again and len({first, second, next_epoch}) == 3


@pytest.mark.parametrize("compile_mode", COMPILE)
def test_torchrun_trains_with_distributed_data_parallel_on_two_cpu_processes(tmp_path, compile_mode):
    config = RunConfig(**{**TINY, "epochs": 1, "milestones": ()})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    port = "29531" if compile_mode is None else "29532"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
               "-m", "experiments", str(path), "--store", str(tmp_path / "store"), "--device", "cpu",
               *(["--compile", compile_mode] if compile_mode else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = ResultsStore(tmp_path / "store").finished(config.key())
    assert record["provenance"]["processes"] == 2 and len(record["history"]) == 1
    assert record["provenance"]["compile_mode"] == compile_mode
    compiled = tmp_path / "cache" / "topk" / "torchinductor" / "fxgraph"  # both processes compiled into one cache
    assert compiled.is_dir() and any(compiled.iterdir()) if compile_mode else not compiled.exists()


@pytest.mark.parametrize("loss,options,model_options", [
    ("ldam", {"max_margin": 0.5, "scale": 30.0}, {"width": 4}),
    ("noised_imbalanced", {"k": 5, "epsilon": 0.1, "n_samples": 3, "max_margin": 0.2, "scale": 40.0},
     {"width": 4, "cosine_scale": 1.0}),
    ("smooth_hinge", {"k": 5, "tau": 1.0}, {"width": 4}),
])
def test_losses_with_class_count_margins_and_the_smoothed_hinge_train(tmp_path, loss, options, model_options):
    config = RunConfig(**{**TINY, "loss": loss, "loss_options": options, "model_options": model_options,
                          "epochs": 1, "milestones": ()})
    record = run(config, ResultsStore(tmp_path))
    assert record["history"][0]["train_loss"] > 0 and 0 <= record["test"]["top"]["5"] <= 1
    if loss in ("ldam", "smooth_hinge"):  # dense gradients: all 100 coordinates but those that underflow in float32
        assert record["history"][0]["grad_nonzero"] > 90
