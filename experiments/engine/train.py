"""The one training loop of every experiment: SGD with Nesterov momentum and a multistep schedule, model selection on
a validation metric, test evaluation of the selected epoch, per-epoch timings, a checkpoint after every epoch, and
one record per run in the results store. Runs under ``torchrun`` with DistributedDataParallel as well.

The selection metric does not change the training, only the epoch whose model is tested: a run tracks every metric
it could be selected on and, when it finishes, also stores the records of its siblings
(:meth:`experiments.engine.config.RunConfig.siblings`; e.g. cross-entropy selected on top-1, top-3 and top-5 for one
table): each is what its own training would have given, to the bit.

A finished run is never recomputed; an interrupted one resumes from its last checkpoint, and reaches the same
result as an uninterrupted run: the data order and the augmentation of epoch ``e`` depend only on ``(seed, e)``
(:mod:`experiments.engine.batches`), and the RNG states (the noised losses' noise) are saved with every checkpoint; under
DDP each process's stream is reseeded at every epoch instead (:func:`reseed_process`). In-memory datasets live on
the training device and are augmented there, batch by batch.

Runs that share their data, model and optimiser settings can train stacked into one model (:func:`run_stacked`,
:mod:`experiments.engine.stacked`): one step for all, each run with its own seed, data order, loss, evaluation,
checkpoints and records.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import data_prep
from data_prep.common import TensorImages
from experiments.engine.batches import InMemoryBatches, batches, order_seed
from experiments.engine.config import SELECTION, RunConfig, selection_metrics, stack_mismatch
from experiments.engine.models import build_model, parameter_count
from experiments.engine.stacked import (StackedLosses, StackedModels, run_optimiser_state, side_by_side_batches,
                                        stack_optimiser_states)
from experiments.engine.store import ResultsStore
from experiments.provenance import device_name, git_commit, versions
from topk.losses import build_loss
from topk.metrics import NAN_SCORES, MacroTopKAccuracy, TopKAccuracy, TopKCoverage


#: ``torch.compile`` modes of the training step (``reduce-overhead``: CUDA graphs).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def run(config: RunConfig, store: ResultsStore, *, device: str = "cpu", data_root: str | Path | None = None,
        num_workers: int | None = None, compile_mode: str | None = None, progress: bool = False,
        stop_after_epochs: int | None = None) -> dict | None:
    """Train ``config`` (or return its finished record). ``num_workers``: processes reading an image-folder dataset
    (default: the machine's cores; in-memory datasets need none). ``compile_mode``: None (eager) or one of
    :data:`COMPILE_MODES`: the model and the loss (as one graph, ``fullgraph=True``) are compiled; how a run is
    executed is not part of its config, and the result is eager mode's up to rounding (same random stream). ``stop_after_epochs`` stops this
    call early (as a kill would), leaving the checkpoint; it returns None then."""
    return run_stacked([config], store, device=device, data_root=data_root, num_workers=num_workers,
                       compile_mode=compile_mode, progress=progress, stop_after_epochs=stop_after_epochs)[0]


def run_stacked(configs: list[RunConfig], store: ResultsStore, *, device: str = "cpu",
                data_root: str | Path | None = None, num_workers: int | None = None, compile_mode: str | None = None,
                progress: bool = False, stop_after_epochs: int | None = None) -> list[dict | None]:
    """Train ``configs`` together, as :func:`run` trains one, and return their records in order (None for all when
    ``stop_after_epochs`` stopped the call). Unfinished runs resumed from one epoch train stacked into one model
    (:class:`experiments.engine.stacked.StackedModels`: one grouped step for all), each from its own seed, on its own
    data order, with its own loss, evaluation, checkpoints and records, which are a lone run's up to rounding and the
    noised losses' draws (the runs share PyTorch's random stream, in turn); runs at other epochs train as other
    stacks, one after the other. The runs should share a :meth:`RunConfig.stack_signature` and, when several, an
    in-memory dataset. A run whose loss becomes NaN stops the call, naming it, after the others saved that epoch."""
    if compile_mode is not None and compile_mode not in COMPILE_MODES:
        raise ValueError(f"'compile_mode' should be None or one of {COMPILE_MODES}, got {compile_mode!r}")
    records = [store.finished(config.key()) for config in configs]
    todo = [config for config, record in zip(configs, records) if record is None]
    if not todo:
        return records
    if mismatch := stack_mismatch(todo):
        raise ValueError(f"runs trained stacked should share their data, model, batches and optimiser settings; "
                         f"run {mismatch[0].key()} differs from run {todo[0].key()} in {mismatch[1]}")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if world > 1 and len(todo) > 1:
        raise ValueError(f"runs are stacked in one process, not under DistributedDataParallel ({world} processes)")
    first, device = todo[0], torch.device(device)
    splits = data_prep.load(first.dataset, data_root, **first.dataset_options)
    data = tuple(batches(split, device, num_workers) for split in (splits.train, splits.val, splits.test))
    if len(todo) > 1 and not isinstance(data[0], InMemoryBatches):
        raise ValueError(f"runs are stacked on in-memory datasets only: {first.dataset!r} is read from files by "
                         "worker processes; train its runs one at a time (--stack 1)")
    by_epoch: dict[int, list[_Run]] = {}  # runs resumed from one epoch train together
    for one in (_start(config, store, splits, device, data_root, len(todo) > 1) for config in todo):
        by_epoch.setdefault(one.state["epoch"], []).append(one)
    finished = {}
    for together in by_epoch.values():  # each stack's records as soon as it is trained
        if not _train_together(together, store, splits, data, device, compile_mode, progress, stop_after_epochs):
            return [None] * len(configs)
        stacked_with = [one.config.training_key() for one in together] if len(together) > 1 else None
        finished |= {one.config.key(): _finish(one, store, splits, data[2], device, world, rank, compile_mode,
                                               stacked_with) for one in together}
    return [record if record is not None else finished[config.key()] for config, record in zip(configs, records)]


def _train_together(runs: list[_Run], store: ResultsStore, splits, data: tuple, device: torch.device,
                    compile_mode: str | None, progress: bool, stop_after_epochs: int | None) -> bool:
    """Train ``runs`` (one, or several at one epoch, stacked) to their last epoch, a checkpoint of each after every
    epoch; False when ``stop_after_epochs`` stopped them first."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    first, (train_batches, val_batches, _) = runs[0].config, data
    if runs[0].rng is not None:  # its own streams, whatever runs were built after it
        _set_rng_states(runs[0].rng)
    model, loss_fn, optimiser, schedule = _trained_together(runs)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if compile_mode is not None:
        trained, loss_fn = compile_step(trained, loss_fn, compile_mode)
    epochs_this_call = 0
    while runs[0].state["epoch"] < first.epochs:
        epoch = runs[0].state["epoch"]
        if world > 1:
            reseed_process(first.seed, epoch, rank)
        loaders = [train_batches.shuffled(order_seed(one.config.seed, epoch), first.batch_size // world, rank, world)
                   for one in runs]
        lr = optimiser.param_groups[0]["lr"]  # the epoch's rate, before the schedule's step sets the next one's
        seconds, loss_seconds, mean_loss, grad_nonzero = train_epoch(
            trained, loss_fn, loaders[0] if len(runs) == 1 else side_by_side_batches(loaders), optimiser, device,
            progress, epoch)
        schedule.step()
        diverged = [one.config.key() for index, one in enumerate(runs) if math.isnan(_of_run(mean_loss, index))]
        for index, one in enumerate(runs):
            if len(runs) > 1 and one.config.key() not in diverged:  # its own model: checkpoint, selected epochs
                one.model.load_state_dict(model.run_state_dict(index))
        validations = _validations(model, runs, diverged, val_batches, splits.class_counts)
        if rank == 0:  # what every run's checkpoint of this epoch shares, read once
            shared = {"schedule": schedule.state_dict(), "optimiser": optimiser.state_dict(), "rng": _rng_states()}
        for index, (one, validation) in enumerate(zip(runs, validations)):
            if one.config.key() in diverged:  # its checkpoint stays at the last good epoch
                continue
            one.state["history"].append({
                "epoch": epoch + 1, "train_loss": _of_run(mean_loss, index), "epoch_seconds": seconds,
                "loss_seconds": loss_seconds, "grad_nonzero": _of_run(grad_nonzero, index), "lr": lr,
                "val": validation, **({"stack": len(runs)} if len(runs) > 1 else {})})
            _keep_selected(one.state, validation, one.model)
            one.state["epoch"] = epoch + 1
            if rank == 0:
                store.save_checkpoint(one.config.key(), {
                    **shared, "model": one.model.state_dict(), "state": one.state,
                    "optimiser": (shared["optimiser"] if len(runs) == 1
                                  else run_optimiser_state(shared["optimiser"], index, len(runs)))})
        if diverged:
            raise FloatingPointError(f"the training of run {', '.join(diverged)} became NaN (its loss or its scores) in "
                                     f"epoch {epoch + 1}; the {len(runs) - len(diverged)} other runs of its stack "
                                     "saved that epoch")
        epochs_this_call += 1
        if stop_after_epochs is not None and epochs_this_call >= stop_after_epochs and epoch + 1 < first.epochs:
            return False
    return True


@dataclass
class _Run:
    """One run of a :func:`run_stacked` call: its config, its own model (the one trained, or a copy of its part of
    the stacked one), loss, optimiser and schedule, its training state, the checkpoint it resumed from and the random
    streams' states its training starts from (the checkpoint's, those its seed left once it was built, or None: the
    current ones)."""

    config: RunConfig
    model: nn.Module
    loss_fn: nn.Module
    optimiser: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    state: dict
    checkpoint: dict | None
    rng: dict | None


def _start(config: RunConfig, store: ResultsStore, splits, device: torch.device, data_root, among_others: bool) -> _Run:
    """The run built from its seed, resumed from its checkpoint where the store holds one. A fresh run built
    ``among_others`` keeps the random streams its seed left, to start from them whatever is built after it (a lone
    run needs no copy: reading every GPU's stream would also start CUDA on each)."""
    _seed_everything(config.seed)
    model_options = {name: value.format(data_root=data_root) if isinstance(value, str) else value
                     for name, value in config.model_options.items()}  # "{data_root}/file" names a file of the data
    model = build_model(config.model, splits.num_classes, **model_options).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    loss_fn = build_loss(config.loss, class_counts=splits.class_counts, **config.loss_options).to(device)
    optimiser = optimiser_of(model.parameters(), config)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimiser, list(config.milestones), config.lr_gamma)
    state = {"epoch": 0, "history": [], "selected": dict.fromkeys(selection_metrics(config.eval_ks)), "models": {}}
    if (checkpoint := store.load_checkpoint(config.key(), _fits(model, optimiser, config))) is not None:
        model.load_state_dict(checkpoint["model"])
        optimiser.load_state_dict(checkpoint["optimiser"])
        schedule.load_state_dict(checkpoint["schedule"])
        state = checkpoint["state"]
    return _Run(config, model, loss_fn, optimiser, schedule, state, checkpoint,
                checkpoint["rng"] if checkpoint is not None else _rng_states() if among_others else None)


def optimiser_of(parameters, config: RunConfig) -> torch.optim.SGD:
    """SGD with Nesterov momentum, the config's rate, momentum and weight decay (every experiment of the paper)."""
    return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, nesterov=True,
                           weight_decay=config.weight_decay)


def _validations(model: nn.Module, runs: list[_Run], diverged: list[str], val_batches, class_counts) -> list[dict | None]:
    """Each run's validation metrics: a stack's in one pass, a lone run's as ever. A run of a stack whose loss
    (``diverged``) or, found here, whose scores became NaN gets None and joins ``diverged``."""
    batch_size = runs[0].config.batch_size
    if len(runs) == 1:
        return [evaluate(model, val_batches, runs[0].config.eval_ks, class_counts, batch_size)]
    if not diverged:
        try:
            return evaluate_stacked(model, val_batches, [one.config.eval_ks for one in runs], class_counts, batch_size)
        except ValueError as error:  # a run's weights, not its loss, became NaN: found run by run below
            if str(error) != NAN_SCORES:
                raise
    validations = []
    for one in runs:
        try:
            validations.append(None if one.config.key() in diverged else
                               evaluate(one.model, val_batches, one.config.eval_ks, class_counts, batch_size))
        except ValueError as error:
            if str(error) != NAN_SCORES:
                raise
            diverged.append(one.config.key())
            validations.append(None)
    return validations


def _trained_together(runs: list[_Run]) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, object]:
    """What the step trains: the lone run's own model, loss, optimiser and schedule, or the runs stacked into one model
    with one optimiser holding their momenta and one schedule at their epoch."""
    if len(runs) == 1:
        return runs[0].model, runs[0].loss_fn, runs[0].optimiser, runs[0].schedule
    model = StackedModels([one.model for one in runs])
    optimiser = optimiser_of(model.parameters(), runs[0].config)
    if runs[0].checkpoint is not None:
        optimiser.load_state_dict(stack_optimiser_states([one.optimiser.state_dict() for one in runs]))
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimiser, list(runs[0].config.milestones), runs[0].config.lr_gamma)
    schedule.load_state_dict(runs[0].schedule.state_dict())
    return model, StackedLosses([one.loss_fn for one in runs]), optimiser, schedule


def _of_run(value: float | list[float], index: int) -> float:
    """A lone run's epoch statistic, or run ``index``'s of stacked runs' (:func:`train_epoch` gives one per run)."""
    return value[index] if isinstance(value, list) else value


def _finish(one: _Run, store: ResultsStore, splits, test_batches, device: torch.device, world: int, rank: int,
            compile_mode: str | None, stacked_with: list[str] | None) -> dict:
    """The trained run's records: its own and its siblings' (each tests the model of its selected epoch)."""
    config, state, model = one.config, one.state, one.model
    tested = {}  # selected epoch -> its test metrics (and label-noise fit)
    provenance = {**_provenance(device, world, model), "compile_mode": compile_mode}
    if stacked_with is not None:
        provenance["stacked_with"] = stacked_with
    for sibling in sorted(config.siblings(), key=lambda sibling: sibling == config):  # its own record last
        selected = state["selected"].get(sibling.selection_metric)
        if sibling != config and (selected is None or store.finished(sibling.key()) is not None):
            continue
        if selected["epoch"] not in tested:
            model.load_state_dict(state["models"][selected["epoch"]])
            tested[selected["epoch"]] = _tested(model, splits, test_batches, config, device)
        record = json.loads(json.dumps({  # the same form as when read back from the store
            "key": sibling.key(), "config": sibling.to_dict(), "history": state["history"],
            "selected_epoch": selected["epoch"], **tested[selected["epoch"]],
            "data": {"name": splits.name, "synthetic": splits.synthetic, "description": splits.description,
                     "num_classes": splits.num_classes, "train_size": len(splits.train)},
            "provenance": provenance}))
        if rank == 0:
            store.save_record(sibling.key(), record)
    return record  # this config's own


def _keep_selected(state: dict, validation: dict, model: nn.Module) -> None:
    """After an epoch's validation: for each selection metric the run tracks, the first epoch of its best value so
    far; the models of the selected epochs only are kept."""
    epoch = len(state["history"])
    for metric, selected in state["selected"].items():
        value = selection_value(validation, metric)
        if selected is None or value > selected["value"]:
            state["selected"][metric] = {"epoch": epoch, "value": value}
    epochs = {selected["epoch"] for selected in state["selected"].values()}
    if epoch in epochs:
        state["models"][epoch] = copy.deepcopy(model.state_dict())
    state["models"] = {kept: weights for kept, weights in state["models"].items() if kept in epochs}


def _fits(model: nn.Module, optimiser: torch.optim.Optimizer, config: RunConfig):
    """The test a checkpoint passes before anything is loaded from it (:meth:`ResultsStore.load_checkpoint`): the
    model's tensors by name and shape, the optimiser's parameter groups, an epoch within the run, and the RNG states
    :func:`_set_rng_states` restores. A checkpoint of another model, or one missing a part, would fail half-way
    through loading, leaving the model neither fresh nor resumed."""
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    group_sizes = [len(group["params"]) for group in optimiser.param_groups]

    def check(checkpoint: dict) -> None:
        weights = checkpoint["model"]
        found = {name: tuple(tensor.shape) for name, tensor in weights.items() if isinstance(tensor, torch.Tensor)}
        if found != shapes:
            differ = sorted(set(found.items()) ^ set(shapes.items()))[:3]
            raise ValueError(f"the checkpoint's model is not this run's (tensors differ: {differ})")
        groups = checkpoint["optimiser"].get("param_groups")
        if not isinstance(groups, list) or [len(group.get("params", ())) for group in groups] != group_sizes:
            raise ValueError("the checkpoint's optimiser does not hold this model's parameters")
        state = checkpoint["state"]
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or not 0 < epoch <= config.epochs or len(state.get("history", ())) != epoch:
            raise ValueError(f"the checkpoint's epoch {epoch!r} is not one of the run's {config.epochs} epochs with "
                             "its history")
        selected = state.get("selected")
        if not isinstance(selected, dict) or set(selected) != set(selection_metrics(config.eval_ks)) or not all(
                isinstance(choice, dict) and choice.get("epoch") in state.get("models", {}) for choice in selected.values()):
            raise ValueError("the checkpoint's state should track every selection metric, with the model of each "
                             "selected epoch")
        rng = checkpoint["rng"]
        if not (isinstance(rng.get("torch"), torch.Tensor) and isinstance(rng.get("python"), tuple)
                and isinstance(rng.get("numpy"), dict)):
            raise ValueError("the checkpoint's RNG states should be torch's tensor, python's tuple and numpy's dict")

    return check


def _tested(model: nn.Module, splits, test_batches, config: RunConfig, device: torch.device) -> dict:
    """A selected model's test metrics (with the classes crowding most top Ks) and, on noisy labels, how much of the
    noise it fits."""
    tested = {"test": evaluate(model, test_batches, config.eval_ks, splits.class_counts, config.batch_size,
                               coverage=True)}
    if (clean_labels := splits.info.get("clean_train_labels")) is not None:
        tested["label_noise_fit"] = flipped_label_fit(model, splits.train, clean_labels, device, config.batch_size)
    return tested


def compile_step(model: nn.Module, loss_fn: nn.Module, mode: str) -> tuple[nn.Module, nn.Module]:
    """The model and the loss compiled by ``torch.compile`` in ``mode`` (the loss as one graph). PyTorch's random
    stream is used inside the graphs too (not inductor's own): the noised losses draw the noise an eager run draws,
    so a compiled run is the eager run up to rounding."""
    options = {**torch._inductor.list_mode_options(mode), "fallback_random": True}
    return torch.compile(model, options=options), torch.compile(loss_fn, options=options, fullgraph=True)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reseed_process(seed: int, epoch: int, rank: int) -> None:
    """Under DDP, this process's global RNG (where the noised losses draw their Monte Carlo noise) seeded from the run's
    ``seed``, the ``epoch`` and the process's ``rank``. Every process starts from ``seed`` (the model is built alike),
    so without it the processes' streams coincide and the rows at one position of every process's batch share their
    noise: the gradient averaged over 8 processes had x1.6-1.7 the variance at near-zero logits, and no more than
    with independent noise once the logits spread over a unit or more (K 5, eps 0.2, B 10:
    ``python -m benchmarks.bench_ddp_noise``). Reseeding at every epoch lets a resumed run draw what the uninterrupted one
    drew without each process's state in the checkpoint. Hashed, so that it never meets the seed of the process's
    augmentation stream (:mod:`experiments.engine.batches`)."""
    digest = hashlib.sha256(f"process noise {seed} {epoch} {rank}".encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def _rng_states() -> dict:
    """Every generator's state as tensors, numbers and tuples, which a checkpoint read as data holds: numpy's key
    array as a tensor."""
    numpy = np.random.get_state(legacy=False)
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": {"key": torch.from_numpy(numpy["state"]["key"].astype(np.int64)), "pos": numpy["state"]["pos"],
                        "has_gauss": numpy["has_gauss"], "gauss": numpy["gauss"]}}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    numpy = states["numpy"]
    np.random.set_state(("MT19937", numpy["key"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["gauss"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class _Stopwatch:
    """Seconds spent in intervals: timed by CUDA events on CUDA (read at the end, after one synchronisation), by the
    host's clock on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda, self.seconds, self.intervals = cuda, 0.0, []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._begin = self._now()

    def stop(self) -> None:
        if self.cuda:
            self.intervals.append((self._begin, self._now()))
        else:
            self.seconds += self._now() - self._begin

    def total(self) -> float:
        """The seconds of every interval; on CUDA, after the device has finished them."""
        return sum(begin.elapsed_time(end) for begin, end in self.intervals) / 1e3 if self.cuda else self.seconds


def train_epoch(model, loss_fn, loader, optimiser, device, progress,
                epoch) -> tuple[float, float, float | list[float], float | list[float]]:
    """One epoch; returns (seconds, seconds in the loss's forward, mean loss, mean number of non-zero coordinates
    of the loss's gradient with respect to a sample's scores: the sparsity of Fig. 2). The loss sums and the sparsity
    count stay on the device and the times are CUDA events on CUDA: the epoch reads the device once, at its end.
    Stacked runs (:mod:`experiments.engine.stacked`: scores ``[B, N, classes]``, one loss per run) get a list of ``N``
    means for each of the last two, a run whose loss became NaN a NaN (one run's NaN raises ``FloatingPointError``)."""
    model.train()
    cuda = device.type == "cuda"
    batches = loader
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(loader, desc=f"epoch {epoch + 1}", leave=False)
    epoch_time, loss_time = _Stopwatch(cuda), _Stopwatch(cuda)
    total, count, nonzero, rows = 0.0, 0, 0, 0
    epoch_time.start()
    for images, labels in batches:
        torch.compiler.cudagraph_mark_step_begin()  # a new step for compiled CUDA graphs (a no-op otherwise)
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if cuda:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            scores = model(images)
        loss_time.start()
        scores = scores.float()  # losses in float32 whatever the autocast dtype
        scores.retain_grad()
        loss = loss_fn(scores, labels)
        loss_time.stop()
        optimiser.zero_grad(set_to_none=True)
        loss.sum().backward()  # stacked runs' losses: each run's gradient is its own loss's
        optimiser.step()
        total, count = total + loss.detach(), count + 1
        nonzero = nonzero + torch.count_nonzero(scores.grad, dim=-1).sum(0)  # per run when stacked
        rows += len(labels)
    epoch_time.stop()
    mean_loss = torch.as_tensor(total / max(count, 1)).tolist()  # the epoch's one synchronisation
    if mean_loss != mean_loss:  # a stack's list: its caller names the runs
        raise FloatingPointError(f"the training loss became NaN in epoch {epoch + 1}")
    return epoch_time.total(), loss_time.total(), mean_loss, torch.as_tensor(nonzero / max(rows, 1)).tolist()


@torch.no_grad()
def evaluate(model: nn.Module, split, ks, train_class_counts, batch_size: int = 256, *, coverage: bool = False) -> dict:
    """Top-K and macro-average top-K for every K in ``ks``, the latter also per few/medium/many-shot group, over the
    batches of ``split`` (:func:`experiments.engine.batches.batches`); with ``coverage``, also the number of classes in the
    top K of more than half the images (:meth:`topk.metrics.TopKCoverage.crowded_classes`)."""
    return _evaluate(model, split, [ks], train_class_counts, batch_size, coverage)[0]


@torch.no_grad()
def evaluate_stacked(model: StackedModels, split, ks_of_runs: list, train_class_counts, batch_size: int) -> list[dict]:
    """:func:`evaluate` of every run of a stack in one pass over ``split``: each batch given to every run (side by
    side along the channels), run ``n``'s metrics at its ``ks_of_runs[n]``."""
    return _evaluate(model, split, ks_of_runs, train_class_counts, batch_size, False)


def _evaluate(model: nn.Module, split, ks_of_runs: list, train_class_counts, batch_size: int,
              coverage: bool) -> list[dict]:
    model.eval()
    metrics = [_Metrics(ks, len(train_class_counts), coverage) for ks in ks_of_runs]
    stacked = isinstance(model, StackedModels)
    for images, labels in split.in_order(batch_size):
        if stacked:
            images = images.repeat(1, len(metrics), 1, 1)  # [B, C, H, W] -> [B, N * C, H, W]
        scores = _evaluation_scores(model, images)
        for run_metrics, run_scores in zip(metrics, scores.unbind(1) if stacked else [scores]):
            run_metrics.update(run_scores, labels)
    return [run_metrics.result(train_class_counts) for run_metrics in metrics]


class _Metrics:
    """One model's top-K, macro-average top-K and (with ``coverage``) crowded classes, batch after batch."""

    def __init__(self, ks, num_classes: int, coverage: bool):
        self.top, self.macro = TopKAccuracy(ks), MacroTopKAccuracy(ks, num_classes)
        self.covered = TopKCoverage(ks, num_classes) if coverage else None

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        self.top.update(scores, labels)
        self.macro.update(scores, labels)
        if self.covered is not None:
            self.covered.update(scores)

    def result(self, train_class_counts) -> dict:
        groups = {name: {str(k): (None if v != v else v) for k, v in values.items()}  # an empty shot group: null
                  for name, values in self.macro.compute_by_group(train_class_counts).items()}
        result = {"top": {str(k): v for k, v in self.top.compute().items()},
                  "macro_top": {k: v for k, v in groups.pop("all").items() if k != "n_classes"},
                  "macro_top_by_group": groups}
        if self.covered is not None:
            result["crowded_classes"] = {str(k): n for k, n in self.covered.crowded_classes().items()}
        return result


@torch.no_grad()
def flipped_label_fit(model: nn.Module, train: TensorImages, clean_labels: torch.Tensor, device: torch.device,
                      batch_size: int = 256) -> dict:
    """On the training images whose label noise flipped, the share the model predicts as their noisy label (it has
    memorised the noise, as networks that can fit random labels do: Zhang et al. 2017) and as their true class (it
    has not), from the images as they are, not augmented."""
    model.eval()
    flipped = (train.labels != clean_labels).nonzero().flatten()
    if len(flipped) == 0:
        return {"flipped": 0, "fits_noisy": None, "fits_clean": None}
    predicted = torch.cat([_evaluation_scores(model, train.transform.plain(train.images[rows].to(device))).argmax(1)
                           for rows in flipped.split(batch_size)]).cpu()
    return {"flipped": len(flipped), "fits_noisy": (predicted == train.labels[flipped]).float().mean().item(),
            "fits_clean": (predicted == clean_labels[flipped]).float().mean().item()}


def _evaluation_scores(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """float32 scores of an evaluation batch: channels-last and bfloat16 autocast on CUDA, as in training."""
    if images.is_cuda:
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=images.is_cuda):
        return model(images).float()


def selection_value(metrics: dict, selection: str) -> float:
    """The value in ``metrics`` (one evaluation) of the model-selection metric ``selection``, e.g. "macro_top5"."""
    macro, k = SELECTION.match(selection).groups()
    return metrics["macro_top" if macro else "top"][k]


def _provenance(device: torch.device, world: int, model: nn.Module) -> dict:
    return {"git_commit": git_commit(), **versions(), "device": f"{device.type}: {device_name(device)}",
            "processes": world, "cpu_threads": torch.get_num_threads(), "parameters": parameter_count(model),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
