"""Where the engine's training step spends the device's time: how many kernels a step runs, their summed time against
the step's, and how much of it goes to short kernels.

NOTES section 14 found a full H200 (4 and 8 DenseNet-40-40 runs under MPS reach the same aggregate) at under a tenth
of its arithmetic peak and, by a count of the bytes, about half its memory bandwidth: the short kernels are the
likelier bound. This measures it. One run trains as ``bench_concurrency`` trains it (the engine's ``train_epoch``
over its in-memory batches, compiled by ``compile_step``); after ``--warmup`` steps, ``--steps`` steps are timed
without the profiler, then the same number under ``torch.profiler``. The device's work items are its kernels on
CUDA (memory copies and sets included) and the operators' own time on a CPU. Printed: the step's wall time, the
items per step and their summed time (busy: their share of the step), the share of that time in items shorter than
10, 50 and 200 microseconds, the shares of the vendor libraries' kernels, inductor's and the others (on CUDA, with
the most a faster choice of library kernels could gain), and the items that take the most time. One row per invocation is appended to ``--out``.

    python -m benchmarks.profile_training_step --device cuda --compile-mode reduce-overhead
    python -m benchmarks.profile_training_step --device cpu --model small_cnn --steps 2 --warmup 1 --no-compile
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from itertools import islice
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks._fig3_setup import checked_device
from benchmarks._measure import append_csv_row
from benchmarks.bench_concurrency import Training, process_training
from experiments.analysis.timings import engine_code, library_bound_text
from experiments.engine.train import COMPILE_MODES, compile_step, train_epoch
from experiments.provenance import STAMP_FIELDS, stamp

#: The item lengths (microseconds) below which the share of the step's device time is reported.
SHORT_US = (10, 50, 200)
#: Who wrote a kernel, by its name: the vendor libraries' (cuDNN's and cuBLAS's convolutions and matrix products, the
#: only kernels ``max-autotune``'s templates compete with), inductor's generated Triton kernels, and the rest (ATen's
#: own kernels, copies, memory sets).
LIBRARY_MARKERS = ("xmma", "cutlass", "nvjet", "gemm", "cudnn", "cublas", "convolve", "winograd")
ORIGINS = ("library", "triton", "other")
FIELDS = [*STAMP_FIELDS, "engine_code", "date", "model", "compile", "batch_size", "warmup", "steps", "step_ms",
          "items_per_step", "items_ms_per_step", "busy", *(f"share_under_{limit}us" for limit in SHORT_US),
          *(f"share_{origin}" for origin in ORIGINS)]


def device_items(events, device: torch.device) -> list[tuple[str, float]]:
    """Each work item of the profiled steps as (name, microseconds): the kernels on CUDA, else the operators' own
    (self) time. Named ranges (``record_function``, such as the optimiser's ``Optimizer.step#SGD.step``) are not
    items: on CUDA the profiler draws them over the kernels they launched, which would count those twice."""
    if device.type == "cuda":
        return [(event.name, event.time_range.elapsed_us()) for event in events
                if event.device_type == DeviceType.CUDA and not event.is_user_annotation]
    return [(event.name, event.self_cpu_time_total) for event in events
            if event.device_type == DeviceType.CPU and not event.is_user_annotation and event.self_cpu_time_total > 0]


def summarise(items: list[tuple[str, float]], steps: int, step_ms: float) -> dict:
    """Per step: the items, their summed milliseconds and that sum's share of ``step_ms`` (busy); the share of the
    items' time in items shorter than each of :data:`SHORT_US`."""
    total_us = sum(us for _, us in items)
    if not items or total_us <= 0:
        raise ValueError("the profiler recorded no device work: on CUDA it reads the kernels through CUPTI, which this "
                         "torch or driver did not give it")
    shares = {f"share_under_{limit}us": round(sum(us for _, us in items if us < limit) / total_us, 4)
              for limit in SHORT_US}
    origins = {f"share_{origin}": round(sum(us for name, us in items if origin_of(name) == origin) / total_us, 4)
               for origin in ORIGINS}
    return {"step_ms": round(step_ms, 4), "items_per_step": round(len(items) / steps, 1),
            "items_ms_per_step": round(total_us / 1e3 / steps, 4), "busy": round(total_us / 1e3 / steps / step_ms, 4),
            **shares, **origins}


def origin_of(name: str) -> str:
    """Which of :data:`ORIGINS` wrote the kernel ``name`` (:data:`LIBRARY_MARKERS`)."""
    if name.startswith("triton_"):
        return "triton"
    return "library" if any(marker in name.lower() for marker in LIBRARY_MARKERS) else "other"


def heaviest(items: list[tuple[str, float]], steps: int, rows: int) -> list[tuple[str, float, float, float]]:
    """The ``rows`` names that take the most time: (name, calls per step, mean microseconds, share of the time)."""
    by_name: dict[str, list[float]] = defaultdict(list)
    for name, us in items:
        by_name[name].append(us)
    total_us = sum(us for _, us in items)
    ranked = sorted(by_name.items(), key=lambda pair: -sum(pair[1]))[:rows]
    return [(name, len(times) / steps, sum(times) / len(times), sum(times) / total_us) for name, times in ranked]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="densenet40_40")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first (compilation included)")
    parser.add_argument("--steps", type=int, default=50, help="steps timed, then as many profiled")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="compile the step as the engine does (--no-compile: eager)")
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES)
    parser.add_argument("--rows", type=int, default=20, help="the heaviest items listed")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "step_profile.csv")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        parser.error(f"--steps {args.steps} and --batch-size {args.batch_size} should be positive, --warmup "
                     f"{args.warmup} at least 0")
    device = checked_device(parser, args.device)
    mode = args.compile_mode if args.compile else None
    training = Training(device.type, args.model, args.batch_size, args.warmup, args.steps, mode)
    model, optimiser, loss, batches = process_training(0, training, device)
    model, loss = compile_step(model, loss, mode) if mode else (model, loss)

    def train(steps: int) -> float:  # train_epoch reads the device at its end: nothing is left queued
        start = time.perf_counter()
        train_epoch(model, loss, islice(batches, steps), optimiser, device, progress=False, epoch=0)
        return time.perf_counter() - start

    train(args.warmup)
    step_ms = 1e3 * train(args.steps) / args.steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        train(args.steps)
    items = device_items(profiler.events(), device)
    try:
        summary = summarise(items, args.steps, step_ms)
    except ValueError as error:
        parser.exit(3, f"error: {error}\n")
    row = {**stamp(device), "engine_code": engine_code(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "model": args.model, "compile": mode or "eager", "batch_size": args.batch_size, "warmup": args.warmup,
           "steps": args.steps, **summary}
    append_csv_row(row, FIELDS, args.out)
    print(f"{row['device_name']}: {args.model}, batch {args.batch_size}, compile {row['compile']}: a step "
          f"{row['step_ms']:.3f} ms; {row['items_per_step']:g} device items a step, {row['items_ms_per_step']:.3f} ms "
          f"in all (busy {row['busy']:.0%}); of that time "
          + ", ".join(f"{row[f'share_under_{limit}us']:.0%} in items under {limit} us" for limit in SHORT_US))
    if device.type == "cuda":
        print(library_bound_text(row))
    print(f"{'calls/step':>10} {'mean us':>9} {'share':>6}  name")
    for name, calls, mean_us, share in heaviest(items, args.steps, args.rows):
        print(f"{calls:10.1f} {mean_us:9.1f} {share:6.1%}  {name[:110]}")
    print(f"CSV: {args.out}")
    return row


if __name__ == "__main__":
    main()
