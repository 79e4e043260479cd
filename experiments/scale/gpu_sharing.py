"""How processes side by side share a GPU, and what a user putting several runs on each GPU should know of it.

Without NVIDIA's Multi-Process Service (MPS) the driver runs one process's kernels at a time (time-slicing): runs
side by side only fill the gaps between one run's launches, and a CUDA-graph step (``reduce-overhead``) leaves none.
Under MPS their kernels run at once (measured: ``docs/reproducing.md``, runs side by side on one GPU).
"""

from __future__ import annotations

from pathlib import Path

#: Where the measurements of runs side by side are, for the notes below.
MEASURED_IN = "docs/reproducing.md#runs-side-by-side-on-one-gpu"


def gpu_sharing(device_type: str, proc: Path = Path("/proc")) -> str:
    """``"mps"`` while a process of NVIDIA's Multi-Process Service (its control daemon or server) is among those this
    machine shows, else ``"time-slicing"``; empty for a device that is not CUDA. What it reads is that a daemon is
    there, not that each process connects to it."""
    if device_type != "cuda":
        return ""
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("nvidia-cuda-mps"):  # -control, -server (a name is cut at 15 characters)
                return "mps"
        except OSError:  # the process ended meanwhile
            continue
    return "time-slicing"


def side_by_side_note(per_gpu: int | None, sharing: str) -> str:
    """The note for ``per_gpu`` runs on each GPU shared by ``sharing``: empty unless several runs would take turns
    on a GPU without MPS."""
    if not per_gpu or per_gpu < 2 or sharing != "time-slicing":
        return ""
    return (f"note: {per_gpu} runs on each GPU without NVIDIA's Multi-Process Service: the driver runs one process's "
            "kernels at a time, so runs compiled as CUDA graphs go no faster side by side than one after another "
            f"({MEASURED_IN}); start it first (`nvidia-cuda-mps-control -d`, and `echo quit | "
            "nvidia-cuda-mps-control` after), or train with PER_GPU=1")
