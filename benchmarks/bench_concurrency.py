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
included) and waits at a barrier; then all time ``--steps`` steps at once, each by the wall clock over its own window
(ended by a synchronisation). A run's images/s is its steps x batch over its window; the aggregate is their sum.
After a second barrier, while every run still holds its memory, each process reads its peak (CUDA: torch's peak
allocated; CPU: the process's peak resident set) and, on CUDA, the whole device's used memory
(``torch.cuda.mem_get_info``: every process's context and cache). One run is always measured first: it is the
baseline of the ratios printed and written, from the same invocation.

    python -m benchmarks.bench_concurrency                                 # CUDA, compiled DenseNet-40-40, 1 2 4 8
    python -m benchmarks.bench_concurrency --compile-mode reduce-overhead --concurrency 1 --stack 2 4 8
    python -m benchmarks.bench_concurrency --device cpu --model small_cnn --concurrency 1 2 --steps 3 --warmup 1 \\
        --no-compile                                                       # check the script

``--cudnn-benchmark`` lets cuDNN time its algorithms for each convolution's shapes first (``torch.backends.cudnn.
benchmark``). A row per measurement (processes x stacked runs) is appended to ``--out`` as it finishes; the rows of one invocation share its ``date``. At the
end, :func:`profile_hours` divides the training images of the ``gpu`` profile's planned runs (its notebooks':
:func:`experiments.analysis.workload.notebook_train_images`), of its CIFAR-100 part and of the whole profile, by the
best aggregate rate of the last invocation: evaluation is left out, and the whole profile's other setups train other
models, so its figure is a rough one. Eight GPUs are taken to give eight times one GPU's rate: the runs are independent.

Targets, judged on a GPU only: on an H100 the best concurrency gives >= 3x the images per second of one run, and the
``gpu`` profile's CIFAR-100 part fits in 8 h on one H100 and in 1 h on eight.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import resource
import time
import traceback
from dataclasses import dataclass, replace
from functools import cache
from itertools import chain, count, islice
from multiprocessing.connection import wait
from pathlib import Path

import torch

from benchmarks._fig3_setup import checked_device, paper_model, paper_model_and_optimiser, paper_optimiser
from benchmarks._measure import append_csv_row
from benchmarks.bench_epoch_time import cifar_shaped
from experiments.analysis.timings import (EIGHT_GPUS_HOURS_TARGET, GPUS, ONE_GPU_HOURS_TARGET, RATIO_TARGET,
                                          TRAIN_IMAGES, engine_code, runs_text)
from experiments.analysis.workload import notebook_train_images
from experiments.engine.batches import order_seed
from experiments.engine.stacked import StackedLosses, StackedModels, side_by_side_batches
from experiments.engine.train import COMPILE_MODES, compile_step, train_epoch
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.scale.executors import cpu_threads
from experiments.spec.profiles import get_profile
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "engine_code", "date", "model", "compile", "gpu_sharing", "cudnn_benchmark", "batch_size", "warmup",
          "steps", "concurrency", "stack",
          "run_images_per_s_mean", "run_images_per_s_min", "aggregate_images_per_s", "ratio_to_one_run",
          "run_peak_mib", "device_used_mib", "device_total_mib"]
MIB = 2 ** 20


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


def timed_training(index: int, training: Training, threads: int, barrier) -> dict:
    """In one process: warm up, then time ``training.steps`` steps between the barriers shared with the other runs."""
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = training.cudnn_benchmark
    device = torch.device(training.device)
    model, optimiser, loss, batches = process_training(index, training, device)
    if training.compile_mode is not None:
        model, loss = compile_step(model, loss, training.compile_mode)

    def train(steps: int) -> None:  # train_epoch reads the device at its end: nothing is left queued
        train_epoch(model, loss, islice(batches, steps), optimiser, device, progress=False, epoch=0)

    train(training.warmup)
    barrier.wait()
    start = time.perf_counter()
    train(training.steps)
    seconds = time.perf_counter() - start
    barrier.wait()  # every run still holds its memory
    return {"images_per_s": training.steps * training.batch_size * training.stack / seconds, "peak_mib": peak_mib(device),
            **device_memory_mib(device)}


def gpu_sharing(device: torch.device, proc: Path = Path("/proc")) -> str:
    """How processes side by side share a GPU: ``"mps"`` while a process of NVIDIA's Multi-Process Service (its
    control daemon or server, through which kernels of several processes run at once) is among those this machine
    shows, else ``"time-slicing"`` (the driver runs one process's kernels at a time); empty on a CPU. What it reads
    is that a daemon was there, as ``gpu_session.sh concurrency-mps`` starts it, not that each run connected to it."""
    if device.type != "cuda":
        return ""
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("nvidia-cuda-mps"):  # -control, -server (a name is cut at 15 characters)
                return "mps"
        except OSError:  # the process ended meanwhile
            continue
    return "time-slicing"


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


def summary_row(results: list[dict], stack: int, one_run_aggregate: float) -> dict:
    """The CSV columns of one measurement (without the stamp and the settings): ``results`` of the processes, each
    training ``stack`` runs; a run's images/s is its process's over ``stack``."""
    aggregate = aggregate_rate(results)
    return {"concurrency": len(results), "stack": stack,
            "run_images_per_s_mean": round(aggregate / (len(results) * stack), 1),
            "run_images_per_s_min": round(min(result["images_per_s"] for result in results) / stack, 1),
            "aggregate_images_per_s": round(aggregate, 1), "ratio_to_one_run": round(aggregate / one_run_aggregate, 4),
            "run_peak_mib": round(max(result["peak_mib"] for result in results)),
            "device_used_mib": max(result["device_used_mib"] for result in results),
            "device_total_mib": results[0]["device_total_mib"]}


@cache
def planned_images(profile_name: str) -> dict[str, int]:
    """Training images (full batches, all epochs) of a profile's planned runs: its CIFAR-100 notebooks' and all its
    notebooks' (:func:`experiments.analysis.workload.notebook_train_images`)."""
    profile = get_profile(profile_name)
    return {"cifar100": notebook_train_images(profile, ("cifar",)), "profile": notebook_train_images(profile)}


def last_invocation(csv_path: Path) -> list[dict]:
    """The rows of the CSV's last invocation (those sharing the last row's ``date``)."""
    with Path(csv_path).open() as handle:
        rows = list(csv.DictReader(handle))
    return [row for row in rows if row["date"] == rows[-1]["date"]]


def profile_hours(csv_path: Path, profile_name: str = "gpu") -> dict:
    """A profile's (default ``gpu``) training hours at the best aggregate rate of the CSV's last invocation, on one GPU and on
    :data:`GPUS` (eight times the rate), for its CIFAR-100 part and for the whole profile; evaluation left out."""
    rows = last_invocation(csv_path)
    best = max(rows, key=lambda row: float(row["aggregate_images_per_s"]))
    rate = float(best["aggregate_images_per_s"])
    images = planned_images(profile_name)
    hours = {"profile": profile_name, "device_name": best["device_name"], "model": best["model"], "compile": best["compile"],
             "best_concurrency": int(best["concurrency"]), "best_stack": int(best.get("stack") or 1), "images_per_s": rate,
             "ratio_to_one_run": float(best["ratio_to_one_run"]),
             "cifar100_images": images["cifar100"], "profile_images": images["profile"]}
    for part in ("cifar100", "profile"):
        hours[f"{part}_hours_1_gpu"] = images[part] / rate / 3600
        hours[f"{part}_hours_{GPUS}_gpus"] = images[part] / (GPUS * rate) / 3600
    return hours


def _verdict(met: bool, on_gpu: bool) -> str:
    return ("met" if met else "not met") if on_gpu else "not judged off a GPU"


def print_hours(hours: dict, on_gpu: bool) -> None:
    """The hours of :func:`profile_hours` and the targets."""
    one, eight, ratio = hours["cifar100_hours_1_gpu"], hours[f"cifar100_hours_{GPUS}_gpus"], hours["ratio_to_one_run"]
    print(f"\nbest: {runs_text(hours['best_concurrency'], hours['best_stack'])}, {hours['images_per_s']:,.0f} images/s, x{ratio:.2f} one "
          f"run (target >= x{RATIO_TARGET:g} on an H100: {_verdict(ratio >= RATIO_TARGET, on_gpu)})")
    print(f"{hours['profile']} profile's CIFAR-100 part, {hours['cifar100_images']:,} training images: {one:.2f} h on one GPU "
          f"(target <= {ONE_GPU_HOURS_TARGET:g} h: {_verdict(one <= ONE_GPU_HOURS_TARGET, on_gpu)}), {eight:.2f} h on "
          f"{GPUS} (target <= {EIGHT_GPUS_HOURS_TARGET:g} h: {_verdict(eight <= EIGHT_GPUS_HOURS_TARGET, on_gpu)})")
    print(f"whole {hours['profile']} profile, {hours['profile_images']:,} training images at this model's rate (its other setups "
          f"train other models): {hours['profile_hours_1_gpu']:.1f} h on one GPU, "
          f"{hours[f'profile_hours_{GPUS}_gpus']:.1f} h on {GPUS}")
    print(f"(training only, evaluation left out; {GPUS} GPUs at {GPUS}x one GPU's rate: the runs are independent)")


def parse_arguments(argv: list[str] | None) -> tuple[argparse.Namespace, torch.device]:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--model", default="densenet40_40", help="densenet40_40 (the paper's), small_cnn, ...")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="processes side by side; one run alone (the baseline) is always measured first")
    parser.add_argument("--stack", type=int, nargs="+", default=[1],
                        help="runs stacked into one model in each process (each with every --concurrency)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN time its algorithms for each convolution first (torch.backends.cudnn.benchmark)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per run first (compilation included)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the step as the engine does (--no-compile: eager)")
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES)
    parser.add_argument("--profile", default="gpu", help="the profile whose hours are estimated (default: gpu)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "concurrency.csv")
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1 or min(args.stack) < 1 or args.steps < 1 or args.warmup < 0:
        parser.error(f"--concurrency {args.concurrency}, --stack {args.stack} and --steps {args.steps} should be "
                     f"positive, --warmup {args.warmup} at least 0")
    return args, checked_device(parser, args.device)


def main(argv: list[str] | None = None) -> None:
    args, device = parse_arguments(argv)
    training = Training(device.type, args.model, args.batch_size, args.warmup, args.steps,
                        args.compile_mode if args.compile else None, cudnn_benchmark=args.cudnn_benchmark)
    settings = {**stamp(device), "engine_code": engine_code(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "model": args.model, "compile": training.compile_mode or "eager", "gpu_sharing": gpu_sharing(device),
                "cudnn_benchmark": args.cudnn_benchmark, "batch_size": args.batch_size, "warmup": args.warmup, "steps": args.steps}
    shared = f", the GPU shared by {settings['gpu_sharing']}" if settings["gpu_sharing"] else ""
    print(f"{settings['device_name']}: {args.model}, batch {args.batch_size}, compile {settings['compile']}, "
          f"{args.warmup} + {args.steps} steps per run{shared}", flush=True)
    one_run_aggregate = None
    measurements = [(1, 1)] + [(stack, concurrency) for stack in sorted(set(args.stack))
                               for concurrency in sorted(set(args.concurrency)) if (stack, concurrency) != (1, 1)]
    for stack, concurrency in measurements:  # one run alone first: the baseline
        results = side_by_side(replace(training, stack=stack), concurrency)
        one_run_aggregate = one_run_aggregate or aggregate_rate(results)
        row = summary_row(results, stack, one_run_aggregate)
        stacked = {"engine_code": engine_code(stacked=True)} if stack > 1 else {}  # the stacking's code as well
        append_csv_row({**settings, **row, **stacked}, FIELDS, args.out)
        used = f", device {row['device_used_mib']} / {row['device_total_mib']} MiB" if row["device_used_mib"] else ""
        print(f"{runs_text(concurrency, stack)}: {row['run_images_per_s_mean']:9.1f} images/s per run (min "
              f"{row['run_images_per_s_min']:.1f}), aggregate {row['aggregate_images_per_s']:9.1f} images/s, "
              f"x{row['ratio_to_one_run']:.2f} one run; peak {row['run_peak_mib']} MiB per process{used}", flush=True)
    print_hours(profile_hours(args.out, args.profile), device.type == "cuda")
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
