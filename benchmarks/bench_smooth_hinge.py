"""Forward+backward time, peak extra memory and float32 gradient error of Berrada et al.'s smoothed top-k hinge:
ours against the reference implementation (github oval-group/smooth-topk), the noised hinge and cross-entropy.

Everything is measured in one process, interleaved, on the same inputs (batch 128, standard normal scores,
tau = 1, alpha = 1). Printed ratios are reference / ours (speed-up). Not a test: timings depend on the machine.

    python -m benchmarks.bench_smooth_hinge --reference PATH     # the grid K x L on CPU (and CUDA if present)
    python -m benchmarks.bench_smooth_hinge --headline ...       # K 5, L 1000 only

PATH is a checkout of github oval-group/smooth-topk kept outside this project (never commit it); it needs
`pip install future`. Without --reference the reference rows are left out.

Rows:
- smooth_hinge: `topk.losses.smooth_hinge` on the tree of `log_elementary_symmetric`; smooth_hinge_triton (CUDA,
  K > 1): the same loss on the kernel of `topk._esp_kernel`, and smooth_hinge_triton_compiled, that under
  `torch.compile(fullgraph=True)`; reference: their SmoothTopkSVM (SmoothTop1SVM for K = 1), whose
  hard/smooth switch is part of its cost; noised: `noised_hinge` with epsilon 1, B = 10; cross_entropy.
- esp_saved_weights / esp_autograd: the backward choice of `log_elementary_symmetric` alone (the sum of
  log sigma_{K-1} and log sigma_K of s / K, forward+backward), so the two can be compared.
- grad_error_x1, grad_error_x20: max |g32 - g64| / max |g64| of the float32 gradient of the loss against our
  float64 one (itself checked against subset enumeration by the tests), for standard normal scores and for
  scores 20 times larger (the size of a trained network's logits), where the reference loses accuracy.
Peak extra memory is measured as `_measure.py` describes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks._measure import interleaved_median_seconds, peak_extra_bytes, selected_devices
from experiments.engine.store import write_csv
from experiments.provenance import STAMP_FIELDS, stamp
from topk import fused
from topk.elementary_symmetric import log_elementary_symmetric
from topk.losses import noised_hinge, smooth_hinge

GRID = {"n_classes": (100, 1000, 10_000), "k": (1, 2, 5, 10, 20, 50)}
HEADLINE = {"n_classes": (1000,), "k": (5,)}
BATCH, TAU, ALPHA = 128, 1.0, 1.0
ERROR_SCALES = (1, 20)
FIELDS = [*STAMP_FIELDS, "batch", "n_classes", "k", "method", "status", "ms", "peak_extra_mb",
          *(f"grad_error_x{scale}" for scale in ERROR_SCALES)]


def import_reference(path: Path):
    """oval-group/smooth-topk's `topk.svm`. Its package is also named `topk`: it is imported with ours set
    aside, then ours is put back (the reference's functions keep their own modules)."""
    ours = {name: module for name, module in sys.modules.items() if name == "topk" or name.startswith("topk.")}
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(path))
    try:
        return importlib.import_module("topk.svm")
    finally:
        sys.path.remove(str(path))
        for name in [name for name in sys.modules if name == "topk" or name.startswith("topk.")]:
            del sys.modules[name]
        sys.modules.update(ours)


def _reference_loss(svm, n_classes: int, k: int, device: torch.device):
    if k + int(1 + 0.2 * k) > n_classes:  # the reference's approximation needs L >= k + p
        return None
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Setting tau to ..."
        module = svm.SmoothTop1SVM(n_classes, alpha=ALPHA, tau=TAU) if k == 1 else svm.SmoothTopkSVM(
            n_classes, alpha=ALPHA, tau=TAU, k=k)
        if device.type == "cuda":
            module = module.cuda()  # their .cpu() raises; .cuda() works
    return lambda s, y: module(s, y)


def _methods(k: int, n_classes: int, device: torch.device, svm) -> dict:
    """The measured losses; ``svm`` is the reference's `topk.svm` module, or None to leave it out."""
    methods = {
        "smooth_hinge": lambda s, y: smooth_hinge(s, y, k, TAU, ALPHA, backend="torch"),
        "noised": lambda s, y: noised_hinge(s, y, k, 1.0, 10),
        "cross_entropy": lambda s, y: F.cross_entropy(s, y),
        "esp_saved_weights": lambda s, y: log_elementary_symmetric(s / k, k)[..., k - 1:].sum(),
        "esp_autograd": lambda s, y: log_elementary_symmetric(s / k, k, backward="autograd")[..., k - 1:].sum(),
    }
    if device.type == "cuda" and fused.available() and k > 1:
        methods["smooth_hinge_triton"] = lambda s, y: smooth_hinge(s, y, k, TAU, ALPHA, backend="triton")
        # The ops around the kernel (the shift, the masks, the softplus, the reduction) fused by Inductor.
        methods["smooth_hinge_triton_compiled"] = torch.compile(methods["smooth_hinge_triton"], fullgraph=True)
    if svm is not None:
        reference = _reference_loss(svm, n_classes, k, device)
        if reference is not None:
            methods["reference"] = reference
    return methods


def _inputs(device: torch.device, n_classes: int, dtype=torch.float32, scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    s = scale * torch.randn(BATCH, n_classes, generator=g, dtype=torch.float64)
    y = torch.randint(0, n_classes, (BATCH,), generator=g)
    return s.to(device, dtype).requires_grad_(), y.to(device)


def _step(loss, s, y):
    s.grad = None
    loss(s, y).backward()


def _exact_gradient(device, n_classes, k, scale) -> torch.Tensor:
    """Our float64 gradient of the loss (checked against subset enumeration by the tests)."""
    exact, y = _inputs(device, n_classes, torch.float64, scale)
    smooth_hinge(exact, y, k, TAU, ALPHA).backward()
    return exact.grad


def _gradient_error(loss, exact_grad, device, n_classes, scale) -> float:
    s, y = _inputs(device, n_classes, scale=scale)
    _step(loss, s, y)
    return ((s.grad.double() - exact_grad).abs().max() / exact_grad.abs().max()).item()


def _memory_of(spec: str) -> None:
    """Child process: one warm-up step, then print the peak extra bytes of one more."""
    config = json.loads(spec)
    device = torch.device(config["device"])
    svm = import_reference(Path(config["reference"])) if config["method"] == "reference" else None
    loss = _methods(config["k"], config["n_classes"], device, svm)[config["method"]]
    s, y = _inputs(device, config["n_classes"])
    _step(loss, s, y)
    print(peak_extra_bytes(lambda: _step(loss, s, y), device, __spec__.name, config))


def run(grid: dict, devices: list[torch.device], reference: Path | None, out: Path) -> list[dict]:
    rows = []
    svm = import_reference(reference) if reference is not None else None
    for device in devices:
        provenance = stamp(device)
        for n_classes, k in itertools.product(*grid.values()):
            config = {"device": device.type, "batch": BATCH, "n_classes": n_classes, "k": k}
            torch._dynamo.reset()  # each configuration compiles its own graph: none counts against the recompile limit
            methods = _methods(k, n_classes, device, svm)
            exact = {scale: _exact_gradient(device, n_classes, k, scale) for scale in ERROR_SCALES}
            if reference is not None and "reference" not in methods:
                rows.append({**provenance, **config, "method": "reference",
                             "status": "skipped: needs L >= k + int(1 + 0.2 k)"})
            inputs = {name: _inputs(device, n_classes) for name in methods}  # each frees its own gradient
            steps = {name: lambda loss=loss, inputs=inputs[name]: _step(loss, *inputs) for name, loss in methods.items()}
            result = {}
            for name, seconds in interleaved_median_seconds(steps, device).items():
                loss = methods[name]
                spec = {**config, "method": name, "reference": str(reference) if reference else ""}
                peak = peak_extra_bytes(steps[name], device, __spec__.name, spec)
                errors = {}
                if name in ("smooth_hinge", "smooth_hinge_triton", "reference"):
                    errors = {f"grad_error_x{c}": _gradient_error(loss, exact[c], device, n_classes, c)
                              for c in ERROR_SCALES}
                result[name] = (seconds, peak, errors)
                rows.append({**provenance, **config, "method": name, "status": "ok", "ms": round(seconds * 1e3, 4),
                             "peak_extra_mb": round(peak / 2**20, 2), **errors})
            line = ", ".join(f"{name} {t * 1e3:7.2f} ms {m / 2**20:6.1f} MB" for name, (t, m, _) in result.items())
            errors = " | grad error (x1, x20) " + ", ".join(
                f"{name} {' '.join(f'{e:.1e}' for e in errs.values())}" for name, (_, _, errs) in result.items() if errs)
            ratio = "".join(f" | {name} / cross_entropy x{result[name][0] / result['cross_entropy'][0]:.1f} (target x5)"
                            for name in ("smooth_hinge", "smooth_hinge_triton", "smooth_hinge_triton_compiled")
                            if name in result)
            if "reference" in result:
                ratio += f" | speed-up vs reference x{result['reference'][0] / result['smooth_hinge'][0]:.2f}"
            print(f"{device.type} L {n_classes:6d} K {k:2d}: {line}{errors}{ratio}", flush=True)
            write_csv(rows, FIELDS, out)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, help="checkout of github oval-group/smooth-topk (outside the project)")
    parser.add_argument("--headline", action="store_true", help="only K 5, L 1000")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "smooth_hinge.csv")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        return _memory_of(args.memory_of)
    if args.reference is not None and not (args.reference / "topk" / "svm.py").exists():
        parser.error(f"--reference {args.reference} is not a checkout of oval-group/smooth-topk (no topk/svm.py in it)")
    devices = selected_devices(args.device)
    run(HEADLINE if args.headline else GRID, devices, args.reference, args.out)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
