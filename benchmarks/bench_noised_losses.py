"""Forward+backward time and peak extra memory of the noised hinge loss against pytopk and cross-entropy.

All three are measured in the same process, interleaved, on the same inputs; the ratios printed are
pytopk / topk (speed-up) and topk / pytopk (memory). Not a test: timings depend on the machine.

    python benchmarks/bench_noised_losses.py                 # the full grid on CPU (and CUDA if present)
    python benchmarks/bench_noised_losses.py --headline      # batch 128, L 1000, K 5, B 10 only

Peak extra memory is measured as `_measure.py` describes. Configurations whose noise tensor would exceed
--max-elements numbers are skipped and listed as such.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import topk.operators
from _measure import median_seconds, peak_extra_bytes, selected_devices, write_csv
from topk.losses import noised_hinge

GRID = {"batch": (128, 1024), "n_classes": (100, 1000, 10_000, 100_000), "k": (1, 5, 10, 50), "n_samples": (3, 10, 50)}
HEADLINE = {"batch": (128,), "n_classes": (1000,), "k": (5,), "n_samples": (10,)}
EPSILON = 1.0
FIELDS = ["device", "batch", "n_classes", "k", "n_samples", "method", "status", "ms", "peak_extra_mb"]


def _methods():
    methods = {
        "topk": lambda s, y, k, m: noised_hinge(s, y, k, EPSILON, m),
        "cross_entropy": lambda s, y, k, m: F.cross_entropy(s, y),
    }
    try:
        from pytopk.functional import bal_noised_topk_loss
        from pytopk.noised_topk import _noised_topk
    except ImportError:
        print("pytopk is not installed: measuring without it (pip install pytopk==0.1.0)", file=sys.stderr)
    else:
        def pytopk_loss(s, y, k, m):  # what pytopk.BalNoisedTopK.forward does
            z = torch.randn(*s.shape, m, device=s.device)
            return bal_noised_topk_loss(s, y, k, EPSILON, _noised_topk, z)
        methods["pytopk"] = pytopk_loss
    return methods


def _inputs(device, batch, n_classes):
    g = torch.Generator(device=device).manual_seed(0)
    s = torch.randn(batch, n_classes, device=device, generator=g).requires_grad_()
    return s, torch.randint(0, n_classes, (batch,), device=device, generator=g)


def _step(loss, s, y, k, n_samples):
    s.grad = None
    loss(s, y, k, n_samples).backward()


def _memory_of(spec: str) -> None:
    """Child process: one warm-up step, then print the peak extra bytes of one more."""
    config = json.loads(spec)
    device = torch.device(config["device"])
    s, y = _inputs(device, config["batch"], config["n_classes"])
    loss = _methods()[config["method"]]
    _step(loss, s, y, config["k"], config["n_samples"])
    topk.operators._scratch.__dict__.clear()  # count topk's CPU noise buffer, which the warm-up step created
    print(peak_extra_bytes(lambda: _step(loss, s, y, config["k"], config["n_samples"]), device, __file__, config))


def run(grid: dict, devices: list[torch.device], max_elements: int, out: Path) -> list[dict]:
    methods = _methods()
    rows = []
    for device in devices:
        for batch, n_classes, k, n_samples in itertools.product(*grid.values()):
            if k + 1 > n_classes:
                continue
            config = {"device": device.type, "batch": batch, "n_classes": n_classes, "k": k, "n_samples": n_samples}
            if batch * n_classes * n_samples > max_elements:
                rows.append({**config, "method": "all", "status": f"skipped: noise has {batch * n_classes * n_samples:.2e} numbers"})
                continue
            s, y = _inputs(device, batch, n_classes)
            result = {}
            for name, loss in methods.items():
                seconds = median_seconds(lambda: _step(loss, s, y, k, n_samples), device)
                peak = peak_extra_bytes(lambda: _step(loss, s, y, k, n_samples), device, __file__, {"method": name, **config})
                result[name] = (seconds, peak)
                rows.append({**config, "method": name, "status": "ok", "ms": round(seconds * 1e3, 4), "peak_extra_mb": round(peak / 2**20, 2)})
            line = ", ".join(f"{name} {t * 1e3:8.2f} ms {m / 2**20:8.1f} MB" for name, (t, m) in result.items())
            ratios = ""
            if "pytopk" in result:
                speedup = result["pytopk"][0] / result["topk"][0]
                memory_ratio = result["topk"][1] / result["pytopk"][1] if result["pytopk"][1] > 0 else float("nan")
                ratios = f" | speed-up vs pytopk x{speedup:.2f}, memory topk/pytopk {memory_ratio:.2f}"
            print(f"{device.type} batch {batch:5d} L {n_classes:6d} K {k:2d} B {n_samples:2d}: {line}{ratios}", flush=True)
            write_csv(rows, FIELDS, out)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headline", action="store_true", help="only batch 128, L 1000, K 5, B 10")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--max-elements", type=int, default=1 << 26, help="skip configurations with a larger noise tensor")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "noised_losses.csv")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        return _memory_of(args.memory_of)
    devices = selected_devices(args.device)
    run(HEADLINE if args.headline else GRID, devices, args.max_elements, args.out)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
