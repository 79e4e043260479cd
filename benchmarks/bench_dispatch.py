"""Host time of an eager forward + backward of the noised hinge through the registered custom operators against the
direct calls of ``topk._ops.call`` (the same implementation and gradient without the operator's dispatch),
interleaved in one process (``_measure.interleaved_median_seconds``), at a size where the host's time is all there
is (batch 8 x L 100, K 5, B 10). Before timing, it counts what one step dispatches: the ATen operators (a
``TorchDispatchMode``, so each is a kernel launch on CUDA) and the Triton launches.

On a CPU the fused kernels' launches are replaced by stubs that only fill their outputs (Triton's interpreter would
otherwise be what is timed), so its row measures everything around the launch; on CUDA nothing is replaced.

    python -m benchmarks.bench_dispatch [--device cpu|cuda] [--budget-s 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from benchmarks._measure import interleaved_median_seconds
from topk import _ops, fused
from topk.losses import noised_hinge


class _LaunchStub:
    """Stands for a Triton kernel on a CPU: fills the outputs it would write (arguments ``outputs``), launches
    nothing."""

    def __init__(self, *outputs: int):
        self.outputs = outputs

    def __getitem__(self, grid):
        def fill(*args, **options):
            with _disable_current_modes():  # not counted by count_dispatches: no such fill runs on a GPU
                for i in self.outputs:
                    args[i].zero_()
        return fill


class _CountOperators(TorchDispatchMode):
    """Counts every ATen operator dispatched while active (autograd's backward included), by name and whether it is a
    view (no kernel runs)."""

    def __init__(self):
        super().__init__()
        self.operators = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators[str(func.overloadpacket), func.is_view] += 1
        return func(*args, **(kwargs or {}))


class _CountLaunches:
    """Wraps a Triton kernel, counting its launches in ``counter[name]``."""

    def __init__(self, kernel, name: str, counter: Counter):
        self.kernel, self.name, self.counter = kernel, name, counter

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def counted(*args, **options):
            self.counter[self.name] += 1
            return launch(*args, **options)
        return counted


def count_dispatches(step) -> tuple[Counter, Counter]:
    """The ATen operators and the Triton launches of one call of ``step``."""
    launches, kernels = Counter(), (fused._kernel, fused._gradient_kernel)
    fused._kernel = lambda: _CountLaunches(kernels[0](), "forward kernel", launches)
    fused._gradient_kernel = lambda: _CountLaunches(kernels[1](), "gradient kernel", launches)
    try:
        with _CountOperators() as mode:
            step()
    finally:
        fused._kernel, fused._gradient_kernel = kernels
    return mode.operators, launches


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--budget-s", type=float, default=2.0, help="timing budget per method (5 to 50 rounds)")
    args = parser.parse_args()
    device = torch.device(args.device)
    with _launches_stubbed() if device.type == "cpu" else contextlib.nullcontext():
        measure(device, args.budget_s)


@contextlib.contextmanager
def _launches_stubbed():
    """On a CPU: the fused path's checks accept CPU scores (as under Triton's interpreter) and its launches only fill
    their outputs; both undone on leaving."""
    kernels, environment = (fused._kernel, fused._gradient_kernel), os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    fused._kernel = lambda: _LaunchStub(4, 5)  # the values and positions
    fused._gradient_kernel = lambda: _LaunchStub(5)  # the gradient
    try:
        yield
    finally:
        fused._kernel, fused._gradient_kernel = kernels
        if environment is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = environment


def measure(device: torch.device, budget_s: float) -> None:
    """Print what one step of each path dispatches, and its host time through the operators and direct."""
    s = torch.randn(8, 100, device=device, requires_grad=True)
    y = torch.randint(0, 100, (8,), device=device)
    losses = {"fused kernel": lambda: noised_hinge(s, y, 5, 1.0, 10, backend="triton"),
              "PyTorch path": lambda: noised_hinge(s, y, 5, 1.0, 10, backend="torch")}
    if device.type == "cpu":
        losses["CPU kernel"] = lambda: noised_hinge(s, y, 5, 1.0, 10)

    def step(loss):
        s.grad = None
        loss().backward()

    def through_operators(loss):
        with _ops.through_operators():
            step(loss)

    calls = {"cross_entropy": lambda: step(lambda: F.cross_entropy(s, y))}
    for name, loss in losses.items():
        calls[name, "operators"] = lambda loss=loss: through_operators(loss)
        calls[name, "direct"] = lambda loss=loss: step(loss)
    for name, loss in losses.items():
        operators, launches = count_dispatches(lambda loss=loss: step(loss))
        computing = {op: n for (op, view), n in sorted(operators.items()) if not view}
        print(f"{name}, one forward + backward: {sum(computing.values())} ATen operators besides views "
              f"({', '.join(f'{op} x{n}' for op, n in computing.items())}), "
              f"{sum(n for (_, view), n in operators.items() if view)} views, {sum(launches.values())} Triton launches")
    seconds = interleaved_median_seconds(calls, device, budget_s=budget_s)
    print(f"{device.type}, torch {torch.__version__}: cross-entropy {1e6 * seconds['cross_entropy']:.0f} us"
          + (" (fused kernel's launch stubbed)" if device.type == "cpu" else ""))
    for name in losses:
        through, direct = seconds[name, "operators"], seconds[name, "direct"]
        print(f"{name}: through the operators {1e6 * through:.0f} us, direct {1e6 * direct:.0f} us, "
              f"operators / direct x{through / direct:.2f}")


if __name__ == "__main__":
    main()
