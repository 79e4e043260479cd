"""How many of the paper's CIFAR-100 trainings one GPU should run side by side: the aggregate images per second of 1,
2, 4 and 8 trainings at once, each run's own speed and the memory they hold, and what that makes of the ``gpu``
profile's hours. With ``--stack``, each process trains that many runs stacked into one model
(:mod:`experiments.engine.stacked`: one grouped convolution for the runs' convolutions), each run from its own seed
and on its own data order: a step of ``S`` stacked runs trains ``S`` x batch images.

Each training is a separate process, spawned (multiprocessing's "spawn", as the ``local`` executor's workers are), that
trains as the engine does (:func:`experiments.engine.train.train_epoch`, compiled by its ``compile_step``): the paper's
model and optimiser (DenseNet-BC 40-40, SGD with Nesterov momentum, batch 64; bfloat16 autocast and channels-last on
CUDA), cross-entropy, on a CIFAR-100-sized set of 45,000 uint8 32 px images held on the device and augmented there
(:func:`benchmarks.bench_epoch_time.cifar_shaped`). Every process warms up (``--warmup`` steps: compilation
included, their seconds measured) and waits at a barrier; then all time ``--steps`` steps at once, each by the wall
clock over its own window (ended by a synchronisation). A run's images/s is its steps x batch over its window; the
aggregate is their sum.
After a second barrier, while every run still holds its memory, each process reads its peak (CUDA: torch's peak
allocated; CPU: the process's peak resident set) and, on CUDA, the whole device's used memory
(``torch.cuda.mem_get_info``: every process's context and cache). Then, after an untimed pass and a barrier, all
time three validation passes at once as the engine makes them (:func:`experiments.engine.train.evaluate`, or
``evaluate_stacked``: the uncompiled model in eval mode, batches of ``--batch-size``) over ``--eval-images`` images
(default: the profile's CIFAR-100 validation set), every run of a stack counted, until a last barrier. A failed
validation leaves its rate empty and keeps the training's figures. One run is always measured first: it is the
baseline of the ratios printed and written, from the same invocation.

    python -m benchmarks.bench_concurrency                                 # CUDA, compiled DenseNet-40-40, 1 2 4 8
    python -m benchmarks.bench_concurrency --compile-mode reduce-overhead --concurrency 1 --stack 2 4 8
    python -m benchmarks.bench_concurrency --device cpu --model small_cnn --concurrency 1 2 --steps 3 --warmup 1 \\
        --no-compile                                                       # check the script

``--cudnn-benchmark`` lets cuDNN time its algorithms for each convolution's shapes first (``torch.backends.cudnn.
benchmark``). A row per measurement (processes x stacked runs) is appended to ``--out`` as it finishes; the rows of
one invocation share its ``date``. At the end, :func:`print_hours` gives the hours of the profile's CIFAR-100
notebooks (``--profile``, default ``gpu``) on one GPU and on eight, at each measured setting taken as the executor's
``PER_GPU`` and ``STACK``, scheduled as the ``local`` executor schedules the plan's runs, evaluation included
(:mod:`experiments.scale.hours`); the fastest is printed with the targets.

Targets, judged on a GPU only: on an H100 the best concurrency gives >= 3x the images per second of one run, and the
``gpu`` profile's CIFAR-100 part fits in 8 h on one H100 and in 1 h on eight.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import resource
import time
import traceback
from dataclasses import dataclass, replace
from itertools import chain, count, islice
from multiprocessing.connection import wait
from pathlib import Path

import torch

from benchmarks._fig3_setup import checked_device, paper_model, paper_model_and_optimiser, paper_optimiser
from benchmarks._measure import append_csv_row
from benchmarks.bench_epoch_time import cifar_shaped
from experiments.analysis.timings import (EIGHT_GPUS_HOURS_TARGET, GPUS, ONE_GPU_HOURS_TARGET, RATIO_TARGET,
                                          TRAIN_IMAGES, engine_code, runs_text)
from experiments.analysis.workload import stand_in_size
from experiments.engine.batches import order_seed
from experiments.engine.stacked import StackedLosses, StackedModels, side_by_side_batches
from experiments.engine.train import COMPILE_MODES, compile_step, evaluate, evaluate_stacked, train_epoch
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.scale.executors import cpu_threads, run_as_command
from experiments.scale.gpu_sharing import gpu_sharing
from experiments.scale.hours import Rates, counted_text, fastest, read_measurements, runs_measured_by, setting_text
from experiments.scale.plan import plan
from experiments.spec.profiles import get_profile
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "engine_code", "date", "model", "compile", "gpu_sharing", "cudnn_benchmark", "batch_size", "warmup",
          "steps", "concurrency", "stack", "warmup_s",
          "run_images_per_s_mean", "run_images_per_s_min", "aggregate_images_per_s", "ratio_to_one_run",
          "run_peak_mib", "device_used_mib", "device_total_mib", "eval_images", "eval_images_per_s"]
MIB = 2 ** 20
EVAL_KS = (1, 5)  #: the metrics' ranks of the paper's CIFAR-100 runs (RunConfig's default)
EVAL_PASSES = 3  #: timed validation passes


@dataclass(frozen=True)
class Training:
    """What every process of a measurement trains, and how."""

    device: str
    model: str
    batch_size: int
    warmup: int
    steps: int
    compile_mode: str | None  #: None: eager
    stack: int = 1  #: runs stacked into one model in each process
    cudnn_benchmark: bool = False
    eval_images: int = 0  #: images of the timed validation pass (0: none timed)


def endless_batches(data, batch_size: int, seed: int):
    """The in-memory batches of epoch after epoch, as the engine draws them."""
    return chain.from_iterable(data.shuffled(order_seed(seed, epoch), batch_size) for epoch in count())


def process_training(index: int, training: Training, device: torch.device):
    """The model, optimiser, loss and endless batches of process ``index``: one run as the engine trains it, or
    ``training.stack`` runs stacked into one model, run ``r`` from seed ``r`` on its own data order (one copy of the
    data shared)."""
    data = cifar_shaped(TRAIN_IMAGES, device)
    if training.stack == 1:
        model, optimiser = paper_model_and_optimiser(training.model, device)
        return model, optimiser, build_loss("cross_entropy").to(device), endless_batches(data, training.batch_size, index)
    seeds = range(index * training.stack, (index + 1) * training.stack)
    model = StackedModels([paper_model(training.model, device, seed) for seed in seeds])
    losses = StackedLosses([build_loss("cross_entropy") for _ in seeds]).to(device)
    batches = side_by_side_batches([endless_batches(data, training.batch_size, seed) for seed in seeds])
    return model, paper_optimiser(model.parameters()), losses, batches


def timed_training(index: int, training: Training, threads: int, barrier, warmup_turn=None) -> dict:
    """In one process: warm up (its seconds, compilation included, are measured), time ``training.steps`` steps
    between the barriers shared with the other runs, read the memory, then time the validation pass. ``warmup_turn``
    (a lock), where given, is held from building the run to the end of its warm-up: runs that are threads of one
    process then compile one after the other (compiling at once, dynamo recompiled on guards that had passed)."""
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = training.cudnn_benchmark
    device = torch.device(training.device)
    with warmup_turn or contextlib.nullcontext():
        model, optimiser, loss, batches = process_training(index, training, device)
        start = time.perf_counter()
        trained, loss = compile_step(model, loss, training.compile_mode) if training.compile_mode else (model, loss)

        def train(steps: int) -> None:  # train_epoch reads the device at its end: nothing is left queued
            train_epoch(trained, loss, islice(batches, steps), optimiser, device, progress=False, epoch=0)

        train(training.warmup)
        warmup_s = time.perf_counter() - start
    barrier.wait()
    start = time.perf_counter()
    train(training.steps)
    seconds = time.perf_counter() - start
    barrier.wait()  # every run still holds its memory
    measured = {"images_per_s": training.steps * training.batch_size * training.stack / seconds, "warmup_s": warmup_s,
                "peak_mib": peak_mib(device), **device_memory_mib(device)}
    eval_images_per_s, eval_error = timed_evaluation(model, training, device, barrier)
    return {**measured, "eval_images_per_s": eval_images_per_s, "eval_error": eval_error}


def timed_evaluation(model: torch.nn.Module, training: Training, device: torch.device,
                     barrier) -> tuple[float | None, str]:
    """Images per second (of every run of a stack) of :data:`EVAL_PASSES` validation passes as the engine makes them
    (the uncompiled ``model`` over ``training.eval_images`` images), after an untimed pass, between two barriers: each
    process's window ends with the last process's, so the processes' rates add up to their images over that window.
    Returns the rate and "", or None and the error when a pass failed (the barriers are still kept, and the training's
    measurement with them); 0 and "" when no images are asked for."""
    if not training.eval_images:
        return 0.0, ""
    error = ""
    try:
        data, counts = cifar_shaped(training.eval_images, device, augment=False), torch.full((100,), 450)

        def evaluate_once() -> None:  # the metrics are read back: nothing is left queued
            if training.stack == 1:
                evaluate(model, data, EVAL_KS, counts, training.batch_size)
            else:
                evaluate_stacked(model, data, [EVAL_KS] * training.stack, counts, training.batch_size)

        evaluate_once()
    except Exception as failure:  # an out-of-memory error, say: the training's figures stand
        error = f"{type(failure).__name__}: {failure}"
    barrier.wait()
    start = time.perf_counter()
    try:
        for _ in range(EVAL_PASSES * (not error)):
            evaluate_once()
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
    barrier.wait()
    seconds = time.perf_counter() - start
    return (None, error) if error else (EVAL_PASSES * training.eval_images * training.stack / seconds, "")


def peak_mib(device: torch.device) -> float:
    """This process's peak: torch's peak allocated on CUDA, the peak resident set on a CPU (Linux: KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_memory_mib(device: torch.device) -> dict:
    """The whole GPU's used and total memory, whoever holds it; nothing on a CPU."""
    if device.type != "cuda":
        return {"device_used_mib": "", "device_total_mib": ""}
    free, total = torch.cuda.mem_get_info(device)
    return {"device_used_mib": round((total - free) / MIB), "device_total_mib": round(total / MIB)}


def _run_one(index: int, training: Training, threads: int, barrier, sender) -> None:
    """A spawned process: sends its measurement, or its traceback after breaking the barrier so the others stop."""
    try:
        sender.send(timed_training(index, training, threads, barrier))
    except Exception:  # reported to the parent, which raises it
        barrier.abort()
        sender.send(f"run {index}:\n{traceback.format_exc()}")
    finally:
        sender.close()


def _collect(receivers: list, barrier) -> list:
    """Each run's message (a dict, or an error text); a run that fails or dies breaks the barrier for the others."""
    messages = {}
    while len(messages) < len(receivers):
        for ready in wait([receiver for index, receiver in enumerate(receivers) if index not in messages]):
            index = receivers.index(ready)
            try:
                messages[index] = ready.recv()
            except EOFError:
                messages[index] = f"run {index}: its process died without a result"
            if isinstance(messages[index], str):
                barrier.abort()
    return [messages[index] for index in range(len(receivers))]


def side_by_side(training: Training, concurrency: int) -> list[dict]:
    """Each process's measurement with ``concurrency`` processes training at once, the CPU's threads shared between
    them as the ``local`` executor shares them; raises with every failed run's traceback."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(concurrency)
    pipes = [context.Pipe(duplex=False) for _ in range(concurrency)]
    processes = [context.Process(target=_run_one, args=(index, training, cpu_threads(concurrency), barrier, sender),
                                 name=f"concurrency-run-{index}") for index, (_, sender) in enumerate(pipes)]
    for process in processes:
        process.start()
    for _, sender in pipes:
        sender.close()
    try:
        results = _collect([receiver for receiver, _ in pipes], barrier)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
    failures = [result for result in results if isinstance(result, str)]
    if failures:
        raise RuntimeError(f"{len(failures)} of {concurrency} runs failed:\n" + "\n".join(failures))
    return results


def aggregate_rate(results: list[dict]) -> float:
    """The images per second of the runs together: the sum of their own."""
    return sum(result["images_per_s"] for result in results)


def rate_columns(results: list[dict], stack: int, one_run_aggregate: float) -> dict:
    """The rates, device memory and warm-up of one measurement, as both this benchmark and ``bench_streams`` write
    them: ``results`` of its processes (or threads), each training ``stack`` runs; a run's images/s is its process's
    over ``stack``."""
    aggregate, evaluated = aggregate_rate(results), [result["eval_images_per_s"] for result in results]
    return {"run_images_per_s_mean": round(aggregate / (len(results) * stack), 1),
            "run_images_per_s_min": round(min(result["images_per_s"] for result in results) / stack, 1),
            "aggregate_images_per_s": round(aggregate, 1), "ratio_to_one_run": round(aggregate / one_run_aggregate, 4),
            "device_used_mib": max(result["device_used_mib"] for result in results),
            "device_total_mib": results[0]["device_total_mib"],
            "warmup_s": round(max(result["warmup_s"] for result in results), 1),
            "eval_images_per_s": "" if None in evaluated else round(sum(evaluated), 1) or ""}


def rates_text(row: dict) -> str:
    """A row's :func:`rate_columns` as printed: each run's rate, the aggregate and its ratio to one run."""
    return (f"{row['run_images_per_s_mean']:9.1f} images/s per run (min {row['run_images_per_s_min']:.1f}), aggregate "
            f"{row['aggregate_images_per_s']:9.1f} images/s, x{row['ratio_to_one_run']:.2f} one run")


def device_and_validation_text(row: dict, results: list[dict]) -> str:
    """The device's memory in use (CUDA), the validation rate, and each run's failed validation, as printed."""
    used = f", device {row['device_used_mib']} / {row['device_total_mib']} MiB" if row["device_used_mib"] else ""
    evaluated = f"; validation {row['eval_images_per_s']:,.0f} images/s" if row["eval_images_per_s"] else ""
    return used + evaluated + "".join(f"; the validation of run {index} failed: {result['eval_error']}"
                                      for index, result in enumerate(results) if result["eval_error"])


def summary_row(results: list[dict], stack: int, one_run_aggregate: float) -> dict:
    """The CSV columns of one measurement (without the stamp and the settings): :func:`rate_columns`, the processes
    and runs stacked in each, and the largest process's peak."""
    return {"concurrency": len(results), "stack": stack, **rate_columns(results, stack, one_run_aggregate),
            "run_peak_mib": round(max(result["peak_mib"] for result in results))}


def last_invocation(csv_path: Path) -> list[dict]:
    """The rows of the CSV's last invocation (those sharing the last row's ``date``)."""
    rows = read_measurements(csv_path)
    return [row for row in rows if row["date"] == rows[-1]["date"]]


def _verdict(met: bool, on_gpu: bool) -> str:
    return ("met" if met else "not met") if on_gpu else "not judged off a GPU"


def print_hours(rows: list[dict], profile_name: str, on_gpu: bool) -> None:
    """The best ratio to one run of ``rows`` (one invocation's), and the hours of the profile's CIFAR-100 runs of the
    measured model and batch at their fastest setting on one GPU and on :data:`GPUS`
    (:func:`experiments.scale.hours.fastest`), with the targets."""
    best = max(rows, key=lambda row: float(row["ratio_to_one_run"]))
    ratio = float(best["ratio_to_one_run"])
    print(f"\nbest: {runs_text(int(best['concurrency']), int(best['stack']))}, "
          f"{float(best['aggregate_images_per_s']):,.0f} images/s, x{ratio:.2f} one run (target >= x{RATIO_TARGET:g} "
          f"on an H100: {_verdict(ratio >= RATIO_TARGET, on_gpu)})")
    runs, rates = runs_measured_by(plan(get_profile(profile_name), ("cifar",)), rows[0]), Rates.from_rows(rows)
    if not runs:
        print(f"no hours: no run of the {profile_name} profile's CIFAR-100 notebooks trains {rows[0]['model']} at "
              f"batch {rows[0]['batch_size']}")
        return
    for gpus, target in ((1, ONE_GPU_HOURS_TARGET), (GPUS, EIGHT_GPUS_HOURS_TARGET)):
        found = fastest(runs, rates, gpus)
        print(f"{profile_name} profile's CIFAR-100 notebooks ({len(runs)} runs) on {gpus} GPU{'s' * (gpus > 1)}: "
              f"{found.hours:.2f} h with {setting_text(found)}, {counted_text(found)} (target <= {target:g} h: "
              f"{_verdict(found.hours <= target, on_gpu)})")


def add_training_arguments(parser: argparse.ArgumentParser, compile_mode: str) -> None:
    """The options of what each run trains and how (``--device --model --steps --warmup --batch-size --compile
    --compile-mode``, the last defaulting to ``compile_mode``), shared with ``benchmarks.bench_streams``."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--model", default="densenet40_40", help="densenet40_40 (the paper's), small_cnn, ...")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per run first (compilation included)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the step as the engine does (--no-compile: eager)")
    parser.add_argument("--compile-mode", default=compile_mode, choices=COMPILE_MODES)


def training_from(args: argparse.Namespace, device: torch.device, **options) -> Training:
    """The :class:`Training` that :func:`add_training_arguments`' options (and ``--eval-images``) ask for, with
    ``options`` (``cudnn_benchmark``, say)."""
    return Training(device.type, args.model, args.batch_size, args.warmup, args.steps,
                    args.compile_mode if args.compile else None, eval_images=args.eval_images, **options)


def invocation_settings(training: Training, device: torch.device) -> dict:
    """The columns every row of one invocation shares: the stamp, the engine's code, the date, how the GPU is shared
    and what each run trains."""
    return {**stamp(device), "engine_code": engine_code(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": training.model, "compile": training.compile_mode or "eager",
            "gpu_sharing": gpu_sharing(device.type), "batch_size": training.batch_size, "warmup": training.warmup,
            "steps": training.steps, "eval_images": training.eval_images}


def settings_text(settings: dict) -> str:
    """:func:`invocation_settings` as printed first: the device, the model and batch, the compilation, the steps and
    the validation pass."""
    return (f"{settings['device_name']}: {settings['model']}, batch {settings['batch_size']}, compile "
            f"{settings['compile']}, {settings['warmup']} + {settings['steps']} steps per run, a validation pass of "
            f"{settings['eval_images']} images")


def parse_arguments(argv: list[str] | None) -> tuple[argparse.Namespace, torch.device]:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(parser, compile_mode="default")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="processes side by side; one run alone (the baseline) is always measured first")
    parser.add_argument("--stack", type=int, nargs="+", default=[1],
                        help="runs stacked into one model in each process (each with every --concurrency)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN time its algorithms for each convolution first (torch.backends.cudnn.benchmark)")
    parser.add_argument("--eval-images", type=int, default=None,
                        help="images of the timed validation pass (default: the profile's CIFAR-100 validation set; "
                             "0: none)")
    parser.add_argument("--profile", default="gpu", help="the profile whose hours are estimated (default: gpu)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "concurrency.csv")
    args = parser.parse_args(argv)
    if (min(args.concurrency) < 1 or min(args.stack) < 1 or args.steps < 1 or args.warmup < 0
            or (args.eval_images or 0) < 0):
        parser.error(f"--concurrency {args.concurrency}, --stack {args.stack} and --steps {args.steps} should be "
                     f"positive, --warmup {args.warmup} and --eval-images {args.eval_images} at least 0")
    if args.eval_images is None:
        args.eval_images = stand_in_size(get_profile(args.profile).cifar).val
    return args, checked_device(parser, args.device)


def main(argv: list[str] | None = None) -> None:
    args, device = parse_arguments(argv)
    training = training_from(args, device, cudnn_benchmark=args.cudnn_benchmark)
    settings = {**invocation_settings(training, device), "cudnn_benchmark": args.cudnn_benchmark}
    shared = f", the GPU shared by {settings['gpu_sharing']}" if settings["gpu_sharing"] else ""
    print(settings_text(settings) + shared, flush=True)
    one_run_aggregate = None
    measurements = [(1, 1)] + [(stack, concurrency) for stack in sorted(set(args.stack))
                               for concurrency in sorted(set(args.concurrency)) if (stack, concurrency) != (1, 1)]
    for stack, concurrency in measurements:  # one run alone first: the baseline
        results = side_by_side(replace(training, stack=stack), concurrency)
        one_run_aggregate = one_run_aggregate or aggregate_rate(results)
        row = summary_row(results, stack, one_run_aggregate)
        stacked = {"engine_code": engine_code(stacked=True)} if stack > 1 else {}  # the stacking's code as well
        append_csv_row({**settings, **row, **stacked}, FIELDS, args.out)
        print(f"{runs_text(concurrency, stack)}: {rates_text(row)}; peak {row['run_peak_mib']} MiB per process, "
              f"warm-up {row['warmup_s']} s{device_and_validation_text(row, results)}", flush=True)
    print_hours(last_invocation(args.out), args.profile, device.type == "cuda")
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    run_as_command(main)
