"""Runs side by side in one process, each trained by a thread of its own on a CUDA stream of its own: what MPS gave
(NOTES section 14: 4 ``reduce-overhead`` runs x1.37 one run), without a daemon a cluster's user may not be allowed to
start.

Without MPS the driver runs one process's kernels at a time, so processes side by side gain nothing once each step is
a CUDA graph (x0.95 and x0.96, NOTES sections 11 and 15). The streams of one process share its context: their kernels
can run at once, as under MPS. Each thread trains as ``benchmarks.bench_concurrency``'s processes do
(:func:`benchmarks.bench_concurrency.timed_training`: the engine's step, compiled by its ``compile_step``, warm-up,
``--steps`` timed steps between barriers, then the validation passes), with inductor's CUDA-graph trees, which are
kept per thread (:mod:`experiments.engine.cuda_graph_threads`), though the step marker the engine sets (``torch.compiler.cudagraph_mark_step_begin``) is one for the
process: one thread's step can end another's graph generation midway (NOTES, "Still to do on a GPU"). The threads
also share the interpreter: each step's host work (a graph replay, the optimiser, the augmentation's launches) waits
for the GIL. One run alone (one thread) is measured first in
the same process: it is the baseline of the ratios. A row per measurement is appended to ``--out``.

    python -m benchmarks.bench_streams --compile-mode reduce-overhead                # CUDA: 1, 2, 4 and 8 threads
    python -m benchmarks.bench_streams --device cpu --model small_cnn --threads 2 --steps 3 --warmup 1 --no-compile

Not yet an executor option: if the streams gain, the ``local`` executor would train ``PER_GPU`` runs as threads.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import traceback
from pathlib import Path

import torch

from benchmarks._fig3_setup import checked_device
from benchmarks._measure import append_csv_row
from benchmarks.bench_concurrency import (Training, add_training_arguments, aggregate_rate,
                                         device_and_validation_text, invocation_settings, rate_columns, rates_text,
                                         settings_text, timed_training, training_from)
from experiments.analysis.workload import stand_in_size
from experiments.engine.cuda_graph_threads import give_this_thread_cuda_graph_trees
from experiments.provenance import STAMP_FIELDS
from experiments.spec.profiles import get_profile

FIELDS = [*STAMP_FIELDS, "engine_code", "date", "model", "compile", "gpu_sharing", "batch_size", "warmup", "steps",
          "threads", "warmup_s", "run_images_per_s_mean", "run_images_per_s_min", "aggregate_images_per_s",
          "ratio_to_one_run", "process_peak_mib", "device_used_mib", "device_total_mib", "eval_images",
          "eval_images_per_s"]


def own_stream(device: torch.device):
    """A context in which the calling thread's work goes to a new CUDA stream (nothing on a CPU)."""
    return torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext()


def in_threads(training: Training, runs: int) -> list[dict]:
    """Each thread's measurement (:func:`~benchmarks.bench_concurrency.timed_training`) with ``runs`` threads of this
    process training at once, each on its own stream; raises with every failed run's traceback (a failure breaks
    the barrier, so the others stop too)."""
    device, barrier, results = torch.device(training.device), threading.Barrier(runs), [None] * runs
    cpu_threads = torch.get_num_threads()  # one pool for the process: each thread's set_num_threads sets it again
    warmup_turn = threading.Lock()  # the runs compile and warm up one after the other

    def run(index: int) -> None:
        try:
            give_this_thread_cuda_graph_trees()
            with own_stream(device):
                results[index] = timed_training(index, training, cpu_threads, barrier, warmup_turn)
        except Exception:  # reported below, with the others'
            barrier.abort()
            results[index] = f"run {index}:\n{traceback.format_exc()}"

    threads = [threading.Thread(target=run, args=(index,), name=f"streams-run-{index}") for index in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failures = [result for result in results if isinstance(result, str)]
    if failures:  # the first failure's own traceback first, then the broken barriers it caused
        failures.sort(key=lambda text: "BrokenBarrierError" in text)
        raise RuntimeError(f"{len(failures)} of {runs} runs failed:\n" + "\n".join(failures))
    return results


def summary_row(results: list[dict], one_run_aggregate: float) -> dict:
    """The CSV columns of one measurement (without the stamp and the settings): the threads,
    :func:`~benchmarks.bench_concurrency.rate_columns` and the process's peak, which every thread reads alike."""
    return {"threads": len(results), **rate_columns(results, 1, one_run_aggregate),
            "process_peak_mib": round(max(result["peak_mib"] for result in results))}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(parser, compile_mode="reduce-overhead")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="runs as threads of this process; one run alone (the baseline) is always measured first")
    parser.add_argument("--eval-images", type=int, default=stand_in_size(get_profile("gpu").cifar).val,
                        help="images of the timed validation pass (default: the gpu profile's; 0: none)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "streams.csv")
    args = parser.parse_args(argv)
    if min(args.threads) < 1 or args.steps < 1 or args.warmup < 0 or args.eval_images < 0 or args.batch_size < 1:
        parser.error(f"--threads {args.threads}, --steps {args.steps} and --batch-size {args.batch_size} should be "
                     f"positive, --warmup {args.warmup} and --eval-images {args.eval_images} at least 0")
    device = checked_device(parser, args.device)
    training = training_from(args, device)
    settings = invocation_settings(training, device)
    print(settings_text(settings) + ", runs as threads of one process on their own streams", flush=True)
    rows, one_run_aggregate = [], None
    for runs in [1, *sorted(set(args.threads) - {1})]:  # one run alone first: the baseline
        torch._dynamo.reset()  # each measurement compiles its own models, as a fresh process would
        results = in_threads(training, runs)
        one_run_aggregate = one_run_aggregate or aggregate_rate(results)
        row = {**settings, **summary_row(results, one_run_aggregate)}
        append_csv_row(row, FIELDS, args.out)
        rows.append(row)
        print(f"{runs} run{'s as threads' * (runs > 1)}: {rates_text(row)}; process peak {row['process_peak_mib']} "
              f"MiB, warm-up {row['warmup_s']} s{device_and_validation_text(row, results)}", flush=True)
    print(f"CSV: {args.out}")
    return rows


if __name__ == "__main__":
    main()
