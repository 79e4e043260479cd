"""Forward+backward time of the noised hinge loss on the fused Triton kernel against the PyTorch path, pytopk,
cross-entropy and two floors, measured in one process on one device.

- memory floor: reading the scores and writing their gradient, ``2 x batch x L x 4`` bytes in float32, at the copy
  bandwidth measured in the same run (``dst.copy_(src)`` of a 2 GiB tensor on CUDA);
- noise floor: a bare kernel drawing the ``batch x L x B`` normals of an unpruned step with ``tl.randn4x`` and
  summing them (``_noise_floor.py``), measured for each configuration.

The scores are ``logit_scale x N(0, 1)`` with a given eps: standard normal with eps = 1, and a trained network's
spread with the paper's eps (0.2 on CIFAR-100, 1e-2 on Pl@ntNet), where the exact pruning leaves few candidates.
On CUDA the fused step is also timed as the replay of a CUDA graph that captured it (``fused_graph``): the device's
time without the host's, which dominates a short eager step (``NOTES.md`` §6).
Ratios printed: fused / each floor, pytopk / fused, torch / fused, fused / cross-entropy, fused_graph / the floors.

    python -m benchmarks.bench_fused_kernel                    # the issue's grid on CUDA, every kind of input
    python -m benchmarks.bench_fused_kernel --grid headline    # batch 256, L 10^4, K 5, B 10
    python -m benchmarks.bench_fused_kernel --grid focus       # B 10, K 5 and 50, batch 256 and 4096, L 10^3 to 10^6
    TRITON_INTERPRET=1 python -m benchmarks.bench_fused_kernel --device cpu --grid smoke   # the script itself, on CPU

Every finished configuration is appended to the CSV at once (``--out``); a rerun skips the configurations
already there, so an interrupted run loses nothing. A method whose working set would not fit in the
device's free memory (pytopk materialises ``n_samples x batch x L`` noise and sorts it) is recorded as
skipped. On CPU the kernel runs in Triton's interpreter: those times check the script, not the kernel.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks._measure import append_csv_row, median_seconds
from experiments.analysis import kernel_targets
from experiments.analysis.kernel_targets import key
from experiments.provenance import STAMP_FIELDS, stamp
from topk.losses import noised_hinge
from topk.operators import CHUNK_ELEMENTS

#: (logit scale, eps): standard normal scores with eps = 1; a trained network's spread with the paper's eps values.
INPUTS = ((1.0, 1.0), (5.0, 0.2), (20.0, 0.01))
GRIDS = {
    "issue": {"inputs": INPUTS, "batch": (256, 4096), "n_classes": (100, 1000, 10**4, 10**5, 10**6), "k": (1, 5, 50),
              "n_samples": (3, 10, 50)},
    "headline": {"inputs": INPUTS, "batch": (256,), "n_classes": (10**4,), "k": (5,), "n_samples": (10,)},
    # the grid at B = 10 and K in {5, 50}: what a device call of ten minutes covers after a kernel change
    "focus": {"inputs": INPUTS, "batch": (256, 4096), "n_classes": (1000, 10**4, 10**5, 10**6), "k": (5, 50),
              "n_samples": (10,)},
    # where backend="auto" should leave the fused kernel for PyTorch: ranks between the focus grid's 5 and 50
    "crossover": {"inputs": ((5.0, 0.2),), "batch": (1024, 4096), "n_classes": (1000, 10**4), "k": (10, 20, 30, 50),
                  "n_samples": (10,)},
    "smoke": {"inputs": ((1.0, 1.0), (20.0, 0.01)), "batch": (2,), "n_classes": (100, 1000), "k": (1, 5),
              "n_samples": (3,)},
}
FIELDS = [*STAMP_FIELDS, "logit_scale", "epsilon", "batch", "n_classes", "k", "n_samples", "method", "status", "ms",
          "floor_ms", "noise_floor_ms", "copy_gb_per_s"]


def _pytopk_loss():
    try:
        from pytopk.functional import bal_noised_topk_loss
        from pytopk.noised_topk import _noised_topk
    except ImportError:
        print("pytopk is not installed: measuring without it (pip install pytopk==0.1.0)", file=sys.stderr)
        return None

    def loss(s, y, k, n_samples, epsilon):  # what pytopk.BalNoisedTopK.forward does
        z = torch.randn(*s.shape, n_samples, device=s.device)
        return bal_noised_topk_loss(s, y, k, epsilon, _noised_topk, z)

    return loss


#: Methods timed as the replay of a CUDA graph that captured their step.
GRAPH_REPLAYED = {"fused_graph"}


def methods(device: torch.device) -> dict:
    """Each method with the bytes it needs beyond the scores and their gradient, as a function of the config."""
    fused_loss = lambda s, y, k, m, eps: noised_hinge(s, y, k, eps, m, backend="triton")  # noqa: E731
    table = {"fused": (fused_loss, lambda b, n, m: 0)}
    if device.type == "cuda":
        table["fused_graph"] = (fused_loss, lambda b, n, m: 2 * 4 * b * n)  # the graph's own gradient
    table |= {
        "torch": (lambda s, y, k, m, eps: noised_hinge(s, y, k, eps, m, backend="torch"),
                  lambda b, n, m: 2 * 4 * max(CHUNK_ELEMENTS, b * n)),
        "cross_entropy": (lambda s, y, k, m, eps: F.cross_entropy(s, y), lambda b, n, m: 2 * 4 * b * n),
    }
    if (pytopk := _pytopk_loss()) is not None:
        table["pytopk"] = (pytopk, lambda b, n, m: 3 * 4 * b * n * m)  # noise, perturbed scores, sorted copy
    return table


def captured(step: Callable[[], None]) -> Callable[[], None]:
    """The replay of a CUDA graph that captured ``step`` (after three warm-up calls on a side stream, as
    ``torch.cuda.graph`` requires); each replay draws fresh noise."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: the CUDA allocator's view, or the host's available pages (Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of ``dst.copy_(src)`` (read + write) on ``device``."""
    numel = (2**29 if device.type == "cuda" else 2**24)
    source, target = torch.empty(numel, device=device), torch.empty(numel, device=device)
    seconds = median_seconds(lambda: target.copy_(source), device, min_repeats=10, budget_s=1.0)
    return 2 * 4 * numel / seconds


def noise_floor(n_normals: int, device: torch.device, budget_s: float) -> float:
    """Seconds to draw ``n_normals`` with ``tl.randn4x`` and sum them (``_noise_floor.py``)."""
    from benchmarks._noise_floor import draw_normals, programs

    seed = torch.tensor([1], dtype=torch.int64, device=device)
    out = torch.empty(programs(n_normals), dtype=torch.float32, device=device)
    return median_seconds(lambda: draw_normals(n_normals, seed, out), device, min_repeats=3, budget_s=budget_s)


def _done(out: Path) -> set[tuple]:
    if not out.exists():
        return set()
    with out.open() as handle:
        return {key(row) for row in csv.DictReader(handle)}


def run(grid: dict, device: torch.device, out: Path, budget_s: float) -> None:
    provenance = stamp(device)
    bandwidth = copy_bandwidth(device)
    print(f"{provenance['device_name']}: copy bandwidth {bandwidth / 1e9:.0f} GB/s; torch {torch.__version__}", flush=True)
    done, table = _done(out), methods(device)
    for (scale, epsilon), batch, n_classes, k, n_samples in itertools.product(*grid.values()):
        if k + 1 > n_classes:
            continue
        floor = 2 * 4 * batch * n_classes / bandwidth
        config = {**provenance, "logit_scale": scale, "epsilon": epsilon, "batch": batch, "n_classes": n_classes,
                  "k": k, "n_samples": n_samples, "floor_ms": round(floor * 1e3, 5),
                  "copy_gb_per_s": round(bandwidth / 1e9, 1)}
        todo = {m: v for m, v in table.items() if key({**config, "method": m}) not in done}
        if not todo:
            continue
        noise = noise_floor(batch * n_classes * n_samples, device, budget_s)
        config["noise_floor_ms"] = round(noise * 1e3, 5)
        free = _free_bytes(device)
        s = y = None
        times = {}
        for method, (loss, extra_bytes) in todo.items():
            needed = 2 * 4 * batch * n_classes + extra_bytes(batch, n_classes, n_samples)
            if needed > 0.8 * free:
                append_csv_row({**config, "method": method, "status": f"skipped: needs {needed / 2**30:.1f} GiB"}, FIELDS, out)
                continue
            if s is None:
                g = torch.Generator(device=device).manual_seed(0)
                s = (scale * torch.randn(batch, n_classes, device=device, generator=g)).requires_grad_()
                y = torch.randint(0, n_classes, (batch,), device=device, generator=g)

            def step():
                s.grad = None
                loss(s, y, k, n_samples, epsilon).backward()

            try:
                timed = captured(step) if method in GRAPH_REPLAYED else step
                times[method] = median_seconds(timed, device, min_repeats=3, budget_s=budget_s)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                append_csv_row({**config, "method": method, "status": "out of memory"}, FIELDS, out)
                continue
            except RuntimeError as error:  # a capture refused: recorded, the other methods still measured
                append_csv_row({**config, "method": method, "status": f"failed: {str(error)[:120]}"}, FIELDS, out)
                continue
            append_csv_row({**config, "method": method, "status": "ok", "ms": round(times[method] * 1e3, 5)}, FIELDS, out)
        if "fused" in times:
            ratios = [f"fused {times['fused'] * 1e3:9.3f} ms = memory floor x{times['fused'] / floor:6.2f}, "
                      f"noise floor x{times['fused'] / noise:6.2f}"]
            ratios += [f"{m} / fused x{times[m] / times['fused']:.3g}" for m in ("pytopk", "torch", "cross_entropy") if m in times]
            if "fused_graph" in times:
                ratios.append(f"replayed {times['fused_graph'] * 1e3:.3f} ms = max(floors) "
                              f"x{times['fused_graph'] / max(floor, noise):.2f}")
            print(f"x{scale:g} eps {epsilon:g} batch {batch:5d} L {n_classes:8d} K {k:2d} B {n_samples:2d}: "
                  + ", ".join(ratios), flush=True)


def summarise(out: Path, device_type: str) -> None:
    """The issue's targets, from every measured row of the CSV on ``device_type``, per kind of input."""
    with out.open() as handle:
        print("\n".join(kernel_targets.summary(list(csv.DictReader(handle)), device_type)))


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="issue")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget per method and configuration")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fused_kernel.csv")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: use --device cpu with TRITON_INTERPRET=1 to check the script")
    run(GRIDS[args.grid], device, args.out, args.budget_s)
    summarise(args.out, device.type)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
