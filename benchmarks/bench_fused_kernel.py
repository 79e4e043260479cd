"""Forward+backward time of the noised hinge loss on the fused Triton kernel against the PyTorch path, pytopk,
cross-entropy and the memory-bandwidth floor, measured in one process on one device.

The floor of one step is reading the scores and writing their gradient, ``2 x batch x L x 4`` bytes in
float32, at the copy bandwidth measured in the same run (``dst.copy_(src)`` of a 2 GiB tensor on CUDA).
Ratios printed: fused / floor, pytopk / fused, torch / fused, fused / cross-entropy.

    python benchmarks/bench_fused_kernel.py                    # the issue's grid on CUDA
    python benchmarks/bench_fused_kernel.py --grid headline    # batch 256, L 10^4, K 5, B 10
    python benchmarks/bench_fused_kernel.py --logit-scale 20   # wide logits: the kernel's exact pruning at work
    TRITON_INTERPRET=1 python benchmarks/bench_fused_kernel.py --device cpu --grid smoke   # the script itself, on CPU

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
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _measure import append_csv_row, median_seconds  # noqa: E402

from experiments.provenance import STAMP_FIELDS, stamp  # noqa: E402
from topk.losses import noised_hinge  # noqa: E402
from topk.operators import CHUNK_ELEMENTS  # noqa: E402

GRIDS = {
    "issue": {"batch": (256, 4096), "n_classes": (100, 1000, 10**4, 10**5, 10**6), "k": (1, 5, 50), "n_samples": (3, 10, 50)},
    "headline": {"batch": (256,), "n_classes": (10**4,), "k": (5,), "n_samples": (10,)},
    "smoke": {"batch": (8,), "n_classes": (100, 3000), "k": (1, 5), "n_samples": (3,)},
}
EPSILON = 1.0
FIELDS = [*STAMP_FIELDS, "logit_scale", "batch", "n_classes", "k", "n_samples", "method", "status", "ms", "floor_ms",
          "copy_gb_per_s"]


def _pytopk_loss():
    try:
        from pytopk.functional import bal_noised_topk_loss
        from pytopk.noised_topk import _noised_topk
    except ImportError:
        print("pytopk is not installed: measuring without it (pip install pytopk==0.1.0)", file=sys.stderr)
        return None

    def loss(s, y, k, n_samples):  # what pytopk.BalNoisedTopK.forward does
        z = torch.randn(*s.shape, n_samples, device=s.device)
        return bal_noised_topk_loss(s, y, k, EPSILON, _noised_topk, z)

    return loss


def methods() -> dict:
    """Each method with the bytes it needs beyond the scores and their gradient, as a function of the config."""
    table = {
        "fused": (lambda s, y, k, m: noised_hinge(s, y, k, EPSILON, m, backend="triton"), lambda b, n, m: 0),
        "torch": (lambda s, y, k, m: noised_hinge(s, y, k, EPSILON, m, backend="torch"), lambda b, n, m: 2 * 4 * max(CHUNK_ELEMENTS, b * n)),
        "cross_entropy": (lambda s, y, k, m: F.cross_entropy(s, y), lambda b, n, m: 2 * 4 * b * n),
    }
    if (pytopk := _pytopk_loss()) is not None:
        table["pytopk"] = (pytopk, lambda b, n, m: 3 * 4 * b * n * m)  # noise, perturbed scores, sorted copy
    return table


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


def _done(out: Path) -> set[tuple]:
    if not out.exists():
        return set()
    with out.open() as handle:
        return {(r["device"], float(r["logit_scale"]), int(r["batch"]), int(r["n_classes"]), int(r["k"]),
                 int(r["n_samples"]), r["method"]) for r in csv.DictReader(handle)}


def run(grid: dict, device: torch.device, out: Path, budget_s: float, logit_scale: float) -> None:
    provenance = stamp(device)
    bandwidth = copy_bandwidth(device)
    print(f"{provenance['device_name']}: copy bandwidth {bandwidth / 1e9:.0f} GB/s; torch {torch.__version__}", flush=True)
    done, table = _done(out), methods()
    for batch, n_classes, k, n_samples in itertools.product(*grid.values()):
        if k + 1 > n_classes:
            continue
        floor = 2 * 4 * batch * n_classes / bandwidth
        config = {**provenance, "logit_scale": logit_scale, "batch": batch, "n_classes": n_classes, "k": k,
                  "n_samples": n_samples, "floor_ms": round(floor * 1e3, 5), "copy_gb_per_s": round(bandwidth / 1e9, 1)}
        free = _free_bytes(device)
        s = y = None
        times = {}
        for method, (loss, extra_bytes) in table.items():
            if (device.type, logit_scale, batch, n_classes, k, n_samples, method) in done:
                continue
            needed = 2 * 4 * batch * n_classes + extra_bytes(batch, n_classes, n_samples)
            if needed > 0.8 * free:
                append_csv_row({**config, "method": method, "status": f"skipped: needs {needed / 2**30:.1f} GiB"}, FIELDS, out)
                continue
            if s is None:
                g = torch.Generator(device=device).manual_seed(0)
                s = (logit_scale * torch.randn(batch, n_classes, device=device, generator=g)).requires_grad_()
                y = torch.randint(0, n_classes, (batch,), device=device, generator=g)

            def step():
                s.grad = None
                loss(s, y, k, n_samples).backward()

            try:
                times[method] = median_seconds(step, device, min_repeats=3, budget_s=budget_s)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                append_csv_row({**config, "method": method, "status": "out of memory"}, FIELDS, out)
                continue
            append_csv_row({**config, "method": method, "status": "ok", "ms": round(times[method] * 1e3, 5)}, FIELDS, out)
        if "fused" in times:
            ratios = [f"fused {times['fused'] * 1e3:9.3f} ms = floor x{times['fused'] / floor:6.2f}"]
            ratios += [f"{m} / fused x{times[m] / times['fused']:.3g}" for m in ("pytopk", "torch", "cross_entropy") if m in times]
            print(f"scale {logit_scale:g} batch {batch:5d} L {n_classes:8d} K {k:2d} B {n_samples:2d}: " + ", ".join(ratios), flush=True)


def summarise(out: Path, device_type: str) -> None:
    """The issue's targets for L >= 10^4, from every measured row of the CSV on ``device_type``."""
    with out.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["device"] == device_type and r["status"] == "ok"
                and int(r["n_classes"]) >= 10**4]
    ms = {(r["logit_scale"], r["batch"], r["n_classes"], r["k"], r["n_samples"], r["method"]): float(r["ms"]) for r in rows}
    floors = {(r["logit_scale"], r["batch"], r["n_classes"], r["k"], r["n_samples"]): float(r["floor_ms"]) for r in rows}
    fused = {config: ms[(*config, "fused")] for config in floors if (*config, "fused") in ms}
    if not fused:
        return
    to_floor = max(fused[c] / floors[c] for c in fused)
    print(f"L >= 10^4, {len(fused)} configurations: fused / floor at most x{to_floor:.2f} (target <= 2)")
    speedups = [ms[(*c, "pytopk")] / fused[c] for c in fused if (*c, "pytopk") in ms]
    if speedups:
        print(f"  pytopk / fused at least x{min(speedups):.1f} over {len(speedups)} (target >= 10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="issue")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget per method and configuration")
    parser.add_argument("--logit-scale", type=float, default=1.0,
                        help="scores are N(0, scale^2); wide rows (e.g. 20) let the kernel's exact pruning skip tiles")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fused_kernel.csv")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: use --device cpu with TRITON_INTERPRET=1 to check the script")
    run(GRIDS[args.grid], device, args.out, args.budget_s, args.logit_scale)
    summarise(args.out, device.type)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
