"""Host time of an eager forward + backward of the noised hinge through the registered custom operators against the
direct calls of ``topk._ops.call`` (the same implementation and gradient without the operator's dispatch),
interleaved in one process, at a size where the host's time is all there is (batch 8 x L 100, K 5, B 10).

On a CPU the fused kernel's launch is replaced by a stub that only fills its outputs (Triton's interpreter would
otherwise be what is timed), so its row measures everything around the launch; on CUDA nothing is replaced.

    python benchmarks/bench_dispatch.py [--device cpu|cuda] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from topk import _ops, fused  # noqa: E402
from topk.losses import noised_hinge  # noqa: E402


class _LaunchStub:
    """Stands for the fused kernel on a CPU: fills the values and positions it would write, launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **options: (args[5].zero_(), args[6].zero_())


def _median_us(call, repeats: int, synchronise) -> float:
    times = []
    for _ in range(repeats):
        synchronise()
        start = time.perf_counter()
        call()
        synchronise()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=300, help="steps timed per round and method")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused path's checks accept CPU scores; the launch is stubbed
        fused._kernel = lambda: _LaunchStub()
    synchronise = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    s = torch.randn(8, 100, device=device, requires_grad=True)
    y = torch.randint(0, 100, (8,), device=device)
    losses = {"fused kernel": lambda: noised_hinge(s, y, 5, 1.0, 10, backend="triton"),
              "PyTorch path": lambda: noised_hinge(s, y, 5, 1.0, 10, backend="torch")}
    if device.type == "cpu":
        losses["CPU kernel"] = lambda: noised_hinge(s, y, 5, 1.0, 10)

    def step(loss):
        s.grad = None
        loss().backward()

    for loss in (*losses.values(), lambda: F.cross_entropy(s, y)):
        for _ in range(20):
            step(loss)
    times = {(name, way): [] for name in losses for way in ("operators", "direct")}
    cross_entropy = []
    for _ in range(args.rounds):
        cross_entropy.append(_median_us(lambda: step(lambda: F.cross_entropy(s, y)), args.repeats, synchronise))
        for name, loss in losses.items():
            with _ops.through_operators():
                times[name, "operators"].append(_median_us(lambda: step(loss), args.repeats, synchronise))
            times[name, "direct"].append(_median_us(lambda: step(loss), args.repeats, synchronise))
    print(f"{device.type}, torch {torch.__version__}: cross-entropy {statistics.median(cross_entropy):.0f} us"
          + (" (fused kernel's launch stubbed)" if device.type == "cpu" else ""))
    for name in losses:
        through, direct = statistics.median(times[name, "operators"]), statistics.median(times[name, "direct"])
        print(f"{name}: through the operators {through:.0f} us, direct {direct:.0f} us, "
              f"operators / direct x{through / direct:.2f}")


if __name__ == "__main__":
    main()
