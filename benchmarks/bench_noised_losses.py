"""Forward+backward time and peak extra memory of the noised hinge loss against pytopk and cross-entropy.

All three are measured in the same process, interleaved, on the same inputs; the ratios printed are
pytopk / topk (speed-up) and topk / pytopk (memory). Not a test: timings depend on the machine.

    python -m benchmarks.bench_noised_losses                 # the full grid on CPU (and CUDA if present)
    python -m benchmarks.bench_noised_losses --headline      # batch 128, L 1000, K 5, B 10, logits x2, eps 0.2

Scores are ``logit_scale x N(0, 1)``: standard normal with eps = 1, and a trained network's spread with the paper's
eps = 0.2 (CIFAR-100), where the exact candidate pruning of :mod:`topk._bounded_noise` leaves few classes to perturb.
pytopk and cross-entropy cost the same on both.

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

from benchmarks._measure import interleaved_median_seconds, peak_extra_bytes, selected_devices
from experiments.engine.store import write_csv
from experiments.provenance import STAMP_FIELDS, stamp
from topk.losses import noised_hinge

#: (logit scale, eps) pairs: standard normal scores with eps = 1; a trained network's spread with the paper's eps.
INPUTS = ((1.0, 1.0), (5.0, 0.2))
GRID = {"inputs": INPUTS, "batch": (128, 1024), "n_classes": (100, 1000, 10_000, 100_000), "k": (1, 5, 10, 50),
        "n_samples": (3, 10, 50)}
HEADLINE = {"inputs": ((2.0, 0.2),), "batch": (128,), "n_classes": (1000,), "k": (5,), "n_samples": (10,)}
#: The issue's CPU target at the headline configuration: pytopk / topk.
SPEEDUP_TARGET = 10.0
FIELDS = [*STAMP_FIELDS, "logit_scale", "epsilon", "batch", "n_classes", "k", "n_samples", "method", "status", "ms",
          "peak_extra_mb"]


def _methods():
    methods = {
        "topk": lambda s, y, k, m, eps: noised_hinge(s, y, k, eps, m),
        "cross_entropy": lambda s, y, k, m, eps: F.cross_entropy(s, y),
    }
    try:
        from pytopk.functional import bal_noised_topk_loss
        from pytopk.noised_topk import _noised_topk
    except ImportError:
        print("pytopk is not installed: measuring without it (pip install pytopk==0.1.0)", file=sys.stderr)
    else:
        def pytopk_loss(s, y, k, m, eps):  # what pytopk.BalNoisedTopK.forward does
            z = torch.randn(*s.shape, m, device=s.device)
            return bal_noised_topk_loss(s, y, k, eps, _noised_topk, z)
        methods["pytopk"] = pytopk_loss
    return methods


def _inputs(device, batch, n_classes, logit_scale):
    g = torch.Generator(device=device).manual_seed(0)
    s = (logit_scale * torch.randn(batch, n_classes, device=device, generator=g)).requires_grad_()
    return s, torch.randint(0, n_classes, (batch,), device=device, generator=g)


def _step(loss, s, y, k, n_samples, epsilon):
    s.grad = None
    loss(s, y, k, n_samples, epsilon).backward()


def _memory_of(spec: str) -> None:
    """Child process: one warm-up step, then print the peak extra bytes of one more."""
    config = json.loads(spec)
    device = torch.device(config["device"])
    s, y = _inputs(device, config["batch"], config["n_classes"], config["logit_scale"])
    loss = _methods()[config["method"]]
    step = lambda: _step(loss, s, y, config["k"], config["n_samples"], config["epsilon"])  # noqa: E731
    step()
    print(peak_extra_bytes(step, device, __spec__.name, config))


def run(grid: dict, devices: list[torch.device], max_elements: int, out: Path) -> list[dict]:
    methods = _methods()
    rows = []
    for device in devices:
        provenance = stamp(device)
        for (scale, epsilon), batch, n_classes, k, n_samples in itertools.product(*grid.values()):
            if k + 1 > n_classes:
                continue
            config = {"device": device.type, "logit_scale": scale, "epsilon": epsilon, "batch": batch,
                      "n_classes": n_classes, "k": k, "n_samples": n_samples}
            if batch * n_classes * n_samples > max_elements:
                rows.append({**provenance, **config, "method": "all",
                             "status": f"skipped: noise has {batch * n_classes * n_samples:.2e} numbers"})
                continue
            # each method on its own copy of the inputs: a step frees its own previous gradient, not another method's
            # (whose cost would otherwise be charged to whichever method ran next)
            inputs = {name: _inputs(device, batch, n_classes, scale) for name in methods}
            steps = {name: lambda loss=loss, inputs=inputs[name]: _step(loss, *inputs, k, n_samples, epsilon)
                     for name, loss in methods.items()}
            result = {}
            for name, seconds in interleaved_median_seconds(steps, device).items():
                peak = peak_extra_bytes(steps[name], device, __spec__.name, {"method": name, **config})
                result[name] = (seconds, peak)
                rows.append({**provenance, **config, "method": name, "status": "ok", "ms": round(seconds * 1e3, 4),
                             "peak_extra_mb": round(peak / 2**20, 2)})
            line = ", ".join(f"{name} {t * 1e3:8.2f} ms {m / 2**20:8.1f} MB" for name, (t, m) in result.items())
            ratios = ""
            if "pytopk" in result:
                speedup = result["pytopk"][0] / result["topk"][0]
                memory_ratio = result["topk"][1] / result["pytopk"][1] if result["pytopk"][1] > 0 else float("nan")
                ratios = f" | speed-up vs pytopk x{speedup:.2f}, memory topk/pytopk {memory_ratio:.2f}"
            print(f"{device.type} x{scale:g} eps {epsilon:g} batch {batch:5d} L {n_classes:6d} K {k:2d} B {n_samples:2d}: "
                  f"{line}{ratios}", flush=True)
            write_csv(rows, FIELDS, out)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headline", action="store_true", help="only batch 128, L 1000, K 5, B 10")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--max-elements", type=int, default=1 << 26, help="skip configurations with a larger noise tensor")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "noised_losses.csv")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        return _memory_of(args.memory_of)
    devices = selected_devices(args.device)
    rows = run(HEADLINE if args.headline else GRID, devices, args.max_elements, args.out)
    print_target(rows)
    print(f"CSV: {args.out}")


def print_target(rows: list[dict]) -> None:
    """The CPU target: at the headline configuration, pytopk / topk >= SPEEDUP_TARGET."""
    headline = {key: values[0] for key, values in HEADLINE.items()}
    ms = {row["method"]: row["ms"] for row in rows if row["status"] == "ok" and row["device"] == "cpu"
          and (row["logit_scale"], row["epsilon"]) == headline["inputs"]
          and all(row[key] == headline[key] for key in ("batch", "n_classes", "k", "n_samples"))}
    if "topk" in ms and "pytopk" in ms:
        speedup = ms["pytopk"] / ms["topk"]
        print(f"headline on CPU: pytopk / topk = x{speedup:.1f} (target >= x{SPEEDUP_TARGET:g}): "
              f"{'met' if speedup >= SPEEDUP_TARGET else 'not met'}")


if __name__ == "__main__":
    main()
