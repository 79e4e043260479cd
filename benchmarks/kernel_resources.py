"""Compile the Triton kernels (the fused kernel of :mod:`topk.fused` and its gradient's, the smoothed hinge's of
:mod:`topk._esp_kernel`) ahead of time for an NVIDIA target and report their resources.

No GPU is needed: Triton compiles to PTX and its bundled ``ptxas`` assembles it for the target, whose
``-v`` report gives the registers per thread and any spill to local memory. This is the static half of
the GPU work; the timings need the device (:mod:`benchmarks.bench_fused_kernel`).

    python -m benchmarks.kernel_resources [--arch 90] [--check]

``--check`` exits 1 if a float32, float16 or bfloat16 configuration spills (the training dtypes; the float64
path, kept for exact tests, is reported but not checked). Run without ``TRITON_INTERPRET`` set. The smoothed
hinge's kernels run in float32 (float64 for float64 scores) whatever the scores' dtype.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from experiments.provenance import git_commit, short_commit
from topk import _esp_launch, fused

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}

#: (scores dtype, k as passed to the kernel (K + 1 of the loss), n_samples, explicit noise, rows split in chunks)
CONFIGURATIONS = [
    (torch.float32, 2, 3, False, False),
    (torch.float32, 6, 10, False, False),
    (torch.float32, 6, 10, False, True),
    (torch.float32, 51, 50, False, False),
    (torch.float16, 6, 10, False, False),
    (torch.bfloat16, 6, 3, False, True),
    (torch.float64, 6, 10, True, False),
]


def _compile(kernel, signature: dict[str, str], constants: dict[str, object], arch: int, options: dict):
    """``kernel`` compiled for ``sm_<arch>`` with the argument types of ``signature`` and the ``constants``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=kernel, signature={**signature, **dict.fromkeys(constants, "constexpr")},
                       constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def compile_kernel(dtype: torch.dtype, k: int, n_samples: int, has_noise: bool, chunked: bool, arch: int):
    """The kernel compiled for ``sm_<arch>`` with the launch plan the library would choose."""
    plan = fused.launch_plan(256, 10**5 if chunked else 1000, n_samples, k, dtype, torch.device("cpu"),
                             n_chunks=8 if chunked else 1)
    scores = TRITON_TYPES[dtype]
    accumulate = "fp64" if dtype == torch.float64 else "fp32"
    signature = {
        "s_ptr": f"*{scores}", "noise_ptr": f"*{scores}", "seed_ptr": "*i64", "floor_ptr": f"*{scores}",
        "out_values_ptr": f"*{accumulate}", "out_positions_ptr": "*i32", "epsilon": "fp64",
        **dict.fromkeys(("n_rows", "n_classes", "n_samples", "row_stride", "floor_stride", "chunk_length", "n_chunks"),
                        "i32"),
        "reach": "fp32", "slack": "fp32",
    }
    constants = {"K": k, "HAS_NOISE": has_noise, "FINAL": not chunked, "PRUNE": not has_noise, "BLOCK_B": plan.block_samples,
                 "BLOCK_L": plan.block_classes, "BLOCK_K": plan.block_k}
    return plan, _compile(fused._kernel(), signature, constants, arch, fused.compile_options(plan))


#: (gradient dtype, labels given): the fused kernel's gradient (:func:`topk.fused.kth_gradient`) at B = GRADIENT_SAMPLES
GRADIENT_SAMPLES = 10
GRADIENT_CONFIGURATIONS = [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True), (torch.float64, True)]


def compile_gradient_kernel(dtype: torch.dtype, has_labels: bool, arch: int):
    """The gradient's kernel compiled for ``sm_<arch>`` as :func:`topk.fused.kth_gradient` launches it at
    B = GRADIENT_SAMPLES."""
    grad = f"*{TRITON_TYPES[dtype]}"
    signature = {"weight_ptr": grad, "grad_ptr": grad, "grad_stride": "i32", "positions_ptr": "*i32",
                 "labels_ptr": "*i64", "out_ptr": grad, **dict.fromkeys(("n_rows", "n_classes", "n_samples"), "i32")}
    constants = {"HAS_LABELS": has_labels, "BLOCK_B": fused.gradient_block_samples(GRADIENT_SAMPLES),
                 "BLOCK_L": fused.GRADIENT_BLOCK_L}
    return _compile(fused._gradient_kernel(), signature, constants, arch, fused.GRADIENT_COMPILE_OPTIONS)


#: (kernel of :mod:`topk._esp_kernel`, its dtype, K of the smoothed hinge, whole loss or the pair alone): every block
#: size up to ``fused.MAX_K`` in float32, and float64 (the exact tests' dtype) at two sizes
ESP_CONFIGURATIONS = [(name, dtype, k, loss) for name in ("log_esp_chunks", "log_esp_combine", "log_esp_backward")
                      for loss in (False, True)
                      for dtype, sizes in ((torch.float32, (2, 5, 10, 50, 127)), (torch.float64, (2, 5)))
                      for k in sizes] + [("hinge_shift", dtype, None, True) for dtype in (torch.float32, torch.float64)]


def compile_esp_kernel(name: str, dtype: torch.dtype, k: int | None, loss: bool, arch: int):
    """A kernel of :mod:`topk._esp_kernel` compiled for ``sm_<arch>`` in ``dtype``, as the loss launches it (``loss``:
    the whole smoothed hinge of each row, else the pair of polynomials; ``k``: None for the shift's kernel)."""
    from topk import _esp_kernel

    kernel = getattr(_esp_kernel, name)
    signature = {**{arg: f"*{TRITON_TYPES[dtype]}" for arg in kernel.arg_names if arg.endswith("_ptr")},
                 "label_ptr": "*i64", **{arg: "i32" for arg in ("n", "span", "n_chunks") if arg in kernel.arg_names},
                 **{arg: "fp64" for arg in ("scale", "tau", "alpha_over_tau", "ceiling", "lowest")
                    if arg in kernel.arg_names}}
    if name == "hinge_shift":
        constants, options = {"READ": _esp_launch.ESP_READ}, _esp_launch.SHIFT_COMPILE_OPTIONS
    else:
        constants = {"ABSENT": _esp_launch.ESP_ABSENT, "BLOCK": _esp_launch.esp_block(k),
                     "LOSS": loss, "K": k, "SLICE": _esp_launch.combine_slice(k)}
        constants = {arg: value for arg, value in constants.items() if arg in kernel.arg_names}
        options = (_esp_launch.combine_compile_options(k) if name == "log_esp_combine"
                   else _esp_launch.ESP_COMPILE_OPTIONS)
    return _compile(kernel, signature, constants, arch, options)


def ptxas_report(ptx: str, arch: int) -> dict[str, int]:
    """Registers per thread and spill bytes from ``ptxas -v`` for ``sm_<arch>a``."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        run = subprocess.run([str(ptxas), "-v", "--gpu-name", f"sm_{arch}a", str(source), "-o", str(Path(folder) / "k.o")],
                             capture_output=True, text=True, check=True)
    number = lambda pattern: int(re.search(pattern, run.stderr).group(1))  # noqa: E731
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads")}


def _report_row(label: str, dtype: torch.dtype, k: str, n_samples: str, noise: str, chunked: str, block: str,
                compiled, arch: int, start: float) -> bool:
    """Print one kernel's row of the report (compiled since ``start``); whether it spills where it must not (any dtype
    but float64)."""
    report = ptxas_report(compiled.asm["ptx"], arch)
    print(f"{label:23s} {TRITON_TYPES[dtype]:8s} {k} {n_samples}  {noise:5s}  {chunked:7s}  {block:13s} "
          f"{report['registers']:5d}  {report['spill_stores']:5d}/{report['spill_loads']:<5d}"
          f"  {time.perf_counter() - start:8.1f}")
    return dtype != torch.float64 and report["spill_stores"] + report["spill_loads"] > 0


def main() -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200) or 80 (A100)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a configuration other than float64 spills")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter does not compile")
    import triton

    commit = short_commit(git_commit())
    print(f"triton {triton.__version__} (torch {torch.__version__}, commit {commit}), kernels of topk.fused and "
          f"topk._esp_kernel for sm_{args.arch}: fused tile of {fused.TILE_ELEMENTS} values, {fused.NUM_WARPS} warps, "
          f"at most {fused.MAX_REGISTERS} registers")
    print("kernel                  dtype     k   B  noise  chunked  block(BxLxK)   regs  spill(st/ld)  compile_s")
    spilled = False
    for dtype, k, n_samples, has_noise, chunked in CONFIGURATIONS:
        start = time.perf_counter()
        plan, compiled = compile_kernel(dtype, k, n_samples, has_noise, chunked, args.arch)
        spilled |= _report_row("fused", dtype, f"{k:3d}", f"{n_samples:3d}", str(has_noise), str(chunked),
                               f"{plan.block_samples}x{plan.block_classes}x{plan.block_k}", compiled, args.arch, start)
    for dtype, has_labels in GRADIENT_CONFIGURATIONS:
        start = time.perf_counter()
        compiled = compile_gradient_kernel(dtype, has_labels, args.arch)
        spilled |= _report_row(f"kth_gradient ({'labels' if has_labels else 'none'})", dtype, "  -",
                               f"{GRADIENT_SAMPLES:3d}", "-", "-",
                               f"{fused.gradient_block_samples(GRADIENT_SAMPLES)}x{fused.GRADIENT_BLOCK_L}", compiled,
                               args.arch, start)
    for name, dtype, k, loss in ESP_CONFIGURATIONS:
        start = time.perf_counter()
        compiled = compile_esp_kernel(name, dtype, k, loss, args.arch)
        block = f"{_esp_launch.ESP_READ}" if k is None else f"1x1x{_esp_launch.esp_block(k)}"
        spilled |= _report_row(f"{name} ({'loss' if loss else 'pair'})", dtype, "  -" if k is None else f"{k:3d}",
                               "  -", "-", "-", block, compiled, args.arch, start)
    return 1 if args.check and spilled else 0


if __name__ == "__main__":
    sys.exit(main())
