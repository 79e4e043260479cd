"""How much stand-in image memory the runs side by side may hold: each run's process renders its stand-in's images in
the machine's memory and keeps them, and a CUDA run holds them on its GPU too (the engine's in-memory batches)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from experiments.scale.plan import PlannedRun

#: The share of a device's memory that the stand-in images of the runs training on it at once may take; the rest is
#: left to their models, activations, compiled graphs and CUDA contexts. A rule with room to spare, not a measurement.
IMAGES_SHARE = 0.5


def images_budget(device: str) -> int:
    """The bytes of stand-in images that the runs on ``device`` may hold at once: :data:`IMAGES_SHARE` of the GPU's
    memory (``cuda:N``), or of the machine's (``cpu``, :func:`machine_memory`)."""
    if device.startswith("cuda"):
        return int(IMAGES_SHARE * torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return int(IMAGES_SHARE * machine_memory())


def machine_memory(proc: Path = Path("/proc/self"), cgroups: Path = Path("/sys/fs/cgroup")) -> int:
    """The bytes of memory this process may use: the machine's, or less where its memory cgroup or one above it limits
    it (a container, a Slurm job's ``--mem``); ``proc`` and ``cgroups`` are where Linux shows them."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min([physical, *cgroup_limits(proc, cgroups)])


def cgroup_limits(proc: Path, cgroups: Path) -> list[int]:
    """The memory limits of this process's cgroup and of those above it, in bytes: cgroup v2's ``memory.max``, v1's
    ``memory.limit_in_bytes`` ("max", and v1's huge unset value, are no limit that matters)."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return []
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # the v2 hierarchy
            root, name = cgroups, "memory.max"
        elif "memory" in controllers.split(","):
            root, name = cgroups / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = root / path.strip("/")
        for level in [folder, *folder.parents]:
            try:
                value = (level / name).read_text().strip()
            except OSError:
                value = ""
            if value.isdigit():
                limits.append(int(value))
            if level == root:
                break
    return limits


def group_image_bytes(group: list[PlannedRun]) -> int:
    """The stand-in images a group's process holds (one copy, which its stacked runs share); 0 on real data, read from
    its files."""
    return max((run.image_bytes or 0 for run in group), default=0)
