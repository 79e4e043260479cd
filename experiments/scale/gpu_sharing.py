"""How processes side by side share a GPU, and what a user putting several runs on one GPU should know of it.

Without NVIDIA's Multi-Process Service (MPS) the driver runs one process's kernels at a time (time-slicing): runs
side by side only fill the gaps between one run's launches, and a step replayed as a CUDA graph (``reduce-overhead``,
``max-autotune``) leaves none. Under MPS their kernels run at once (measured: ``docs/reproducing.md``, runs side by
side on one GPU).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

#: Where the measurements of runs side by side are, for the note below.
MEASURED_IN = "docs/reproducing.md#runs-side-by-side-on-one-gpu"


def mps_pipe(environ: dict | None = None) -> Path:
    """The control pipe through which CUDA processes find an MPS daemon (``CUDA_MPS_PIPE_DIRECTORY``, else
    ``/tmp/nvidia-mps``)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps") / "control"


def gpu_sharing(device_type: str, proc: Path = Path("/proc"), pipe: Path | None = None) -> str:
    """``"mps"`` while an MPS daemon seems to run: its control pipe exists (what this process's CUDA would connect
    through; a daemon killed without quitting may leave it), or a process of the service (``nvidia-cuda-mps-control``,
    ``-server``) is among those this machine shows; else ``"time-slicing"``; empty for a device that is not CUDA."""
    if device_type != "cuda":
        return ""
    if (pipe or mps_pipe()).exists():
        return "mps"
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("nvidia-cuda-mps"):  # a process's name is cut at 15 characters
                return "mps"
        except OSError:  # the process ended meanwhile
            continue
    return "time-slicing"


def replays_cuda_graphs(compile_mode: str | None) -> bool:
    """Whether ``torch.compile``'s mode replays the step as CUDA graphs (inductor's ``triton.cudagraphs``)."""
    if not compile_mode:
        return False
    import torch._inductor

    try:
        return bool(torch._inductor.list_mode_options(compile_mode).get("triton.cudagraphs", False))
    except RuntimeError:  # a mode inductor does not know compiles nothing
        return False


def side_by_side_note(devices: list[str], compile_mode: str | None, sharing: str) -> str:
    """The note for workers on ``devices`` whose steps are compiled in ``compile_mode``, the GPUs shared by
    ``sharing``: empty unless several runs replaying CUDA graphs would take turns on one GPU without MPS."""
    per_gpu = max((count for device, count in Counter(devices).items() if device.startswith("cuda")), default=0)
    if per_gpu < 2 or sharing != "time-slicing" or not replays_cuda_graphs(compile_mode):
        return ""
    return (f"note: {per_gpu} runs on one GPU without NVIDIA's Multi-Process Service: the driver runs one process's "
            f"kernels at a time, so steps replayed as CUDA graphs ({compile_mode}) go no faster side by side than one "
            f"after another ({MEASURED_IN}); start it first (`nvidia-cuda-mps-control -d`, and `echo quit | "
            "nvidia-cuda-mps-control` after), or train one run per GPU (--per-gpu 1, make's PER_GPU=1)")
