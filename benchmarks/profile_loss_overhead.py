"""Where a loss's forward+backward spends its time at a small size: the host (Python, dispatch, launches) or the device.

For each loss, in one process: the wall time of a step with a synchronisation, the host time to enqueue it without
one, and the device time of its kernels (``torch.profiler``, summed over the step's kernels); then the profiler's
table of the host-side operators by self time. A step whose enqueue time is close to its wall time and far above its
kernels' time is bound by the host: the kernels wait for the launches.

    python -m benchmarks.profile_loss_overhead [--batch 256] [--classes 1000] [--k 5] [--samples 10] [--rows 25]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from topk.losses import noised_hinge, smooth_hinge


def losses(k: int, n_samples: int) -> dict:
    return {
        "cross_entropy": lambda s, y: F.cross_entropy(s, y),
        "noised_triton": lambda s, y: noised_hinge(s, y, k, 1.0, n_samples, backend="triton"),
        "noised_torch": lambda s, y: noised_hinge(s, y, k, 1.0, n_samples, backend="torch"),
        "smooth_hinge_triton": lambda s, y: smooth_hinge(s, y, k, 1.0, backend="triton"),
    }


def _median_ms(call, repeats: int, synchronise: bool) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if synchronise:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25, help="rows of each profiler table")
    args = parser.parse_args()
    device = torch.device("cuda")
    s = torch.randn(args.batch, args.classes, device=device, requires_grad=True)
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; batch {args.batch}, L {args.classes}, "
          f"K {args.k}, B {args.samples}")
    for name, loss in losses(args.k, args.samples).items():
        def step():
            s.grad = None
            loss(s, y).backward()

        for _ in range(10):
            step()
        wall, enqueue = _median_ms(step, 50, True), _median_ms(step, 50, False)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        device_ms = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"\n== {name}: wall {wall:.3f} ms, enqueue {enqueue:.3f} ms, device {device_ms / 20 / 1e3:.3f} ms "
              f"in {kernels / 20:.0f} kernels per step")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
