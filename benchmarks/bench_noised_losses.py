"""Forward+backward time and peak extra memory of the noised hinge loss against pytopk and cross-entropy.

All three are measured in the same process, interleaved, on the same inputs; the ratios printed are
pytopk / topk (speed-up) and topk / pytopk (memory). Not a test: timings depend on the machine.

    python benchmarks/bench_noised_losses.py                 # the full grid on CPU (and CUDA if present)
    python benchmarks/bench_noised_losses.py --headline      # batch 128, L 1000, K 5, B 10 only

Peak extra memory is the peak during one forward+backward minus the memory held before it: on CUDA from
the caching allocator's statistics; on CPU from the peak resident set (VmHWM, reset through
/proc/self/clear_refs; Linux only) of a child process run with MALLOC_MMAP_THRESHOLD_=65536, so that
glibc maps every block over 64 KiB separately and returns it on free (the timing process keeps glibc's
defaults). Configurations whose noise tensor would
exceed --max-elements numbers are skipped and listed as such.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import topk.operators
from topk.losses import noised_hinge

GRID = {"batch": (128, 1024), "n_classes": (100, 1000, 10_000, 100_000), "k": (1, 5, 10, 50), "n_samples": (3, 10, 50)}
HEADLINE = {"batch": (128,), "n_classes": (1000,), "k": (5,), "n_samples": (10,)}
EPSILON = 1.0


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


class _PeakMemory:
    """Peak extra bytes during a call, on CUDA (allocator statistics) or CPU (VmHWM of this process)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_available = Path("/proc/self/clear_refs").exists()

    @staticmethod
    def _status_kb(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
        raise RuntimeError(f"{field} not in /proc/self/status")

    def measure(self, call, method: str, config: dict) -> float:
        if self.device.type == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != str(_MMAP_THRESHOLD):
            return _measure_cpu_memory_in_child(method, config)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            call()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - before
        if not self.cpu_available:
            return float("nan")
        Path("/proc/self/clear_refs").write_text("5")
        before = self._status_kb("VmRSS")
        call()
        return (self._status_kb("VmHWM") - before) * 1024.0


_MMAP_THRESHOLD = 65536


def _measure_cpu_memory_in_child(method: str, config: dict) -> float:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(_MMAP_THRESHOLD)}
    child = subprocess.run([sys.executable, __file__, "--memory-of", json.dumps({"method": method, **config})],
                           env=env, capture_output=True, text=True, check=True)
    return float(child.stdout.strip().splitlines()[-1])


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
    print(_PeakMemory(device).measure(lambda: _step(loss, s, y, config["k"], config["n_samples"]), config["method"], config))


def _time(call, device, min_repeats=5, budget_s=2.0) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    call()
    sync()
    start = time.perf_counter()
    call()
    sync()
    first = time.perf_counter() - start
    repeats = int(max(min_repeats, min(50, budget_s / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(grid: dict, devices: list[torch.device], max_elements: int, out: Path) -> list[dict]:
    methods = _methods()
    rows = []
    for device in devices:
        memory = _PeakMemory(device)
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
                seconds = _time(lambda: _step(loss, s, y, k, n_samples), device)
                peak = memory.measure(lambda: _step(loss, s, y, k, n_samples), name, config)
                result[name] = (seconds, peak)
                rows.append({**config, "method": name, "status": "ok", "ms": round(seconds * 1e3, 4), "peak_extra_mb": round(peak / 2**20, 2)})
            line = ", ".join(f"{name} {t * 1e3:8.2f} ms {m / 2**20:8.1f} MB" for name, (t, m) in result.items())
            ratios = ""
            if "pytopk" in result:
                speedup = result["pytopk"][0] / result["topk"][0]
                memory_ratio = result["topk"][1] / result["pytopk"][1] if result["pytopk"][1] > 0 else float("nan")
                ratios = f" | speed-up vs pytopk x{speedup:.2f}, memory topk/pytopk {memory_ratio:.2f}"
            print(f"{device.type} batch {batch:5d} L {n_classes:6d} K {k:2d} B {n_samples:2d}: {line}{ratios}", flush=True)
            _write(rows, out)
    return rows


def _write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = ["device", "batch", "n_classes", "k", "n_samples", "method", "status", "ms", "peak_extra_mb"]
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(out)  # a killed run leaves the last complete CSV


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
    devices = [torch.device("cpu")] if args.device in ("cpu", "all") else []
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, devices {[d.type for d in devices]}")
    run(HEADLINE if args.headline else GRID, devices, args.max_elements, args.out)
    print(f"CSV: {args.out}")


if __name__ == "__main__":
    main()
