"""Where a compiled training keeps its compilations: inductor's cache (``torch.compile``'s generated kernels, compiled
graphs and autotuning choices; the folder ``TORCHINDUCTOR_CACHE_DIR`` names) in the user's own cache folder,
``~/.cache/topk/torchinductor`` (under ``$XDG_CACHE_HOME`` when set).

Torch's default is a folder in the machine's temporary folder: every Slurm task on a fresh node, and every machine,
compiles each graph again (``max-autotune`` for minutes: ``benchmarks/NOTES.md`` §15). A cluster's home folders are
shared by its nodes, as Triton's own default cache (``~/.triton``) assumes, so there a graph compiles once for all the
user's tasks. Inductor writes each entry to a temporary file renamed into place, so many writers are safe; an entry's
key holds the graph, the compile options, torch's and Triton's versions and the GPU's properties, so runs, versions and
GPU models do not mix.

Not the results store, though it is shared too: the cache holds code that inductor loads and runs, and the store's
other writers must not choose code that runs as you (docs/reproducing.md, "Sharing a store"). The folder is made
readable and writable by its owner alone, and can be removed at any time: the next compilation makes it again. Where
it cannot be made (no home, a read-only one), torch's default stays, with a warning.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

#: The environment variable that names inductor's cache folder; set by the user to a folder of their own, it wins.
VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def user_compile_cache() -> Path:
    """``$XDG_CACHE_HOME/topk/torchinductor``, by default ``~/.cache/topk/torchinductor``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root).resolve() / "topk" / "torchinductor"


def chosen_cache() -> str | None:
    """The folder ``TORCHINDUCTOR_CACHE_DIR`` names, unless it is torch's own default: a ``torchinductor_<user>``
    folder, which importing inductor sets (here, or in the process that submitted this Slurm task, whose temporary
    folder may differ from this node's)."""
    chosen = os.environ.get(VARIABLE)
    if chosen is None or os.path.basename(os.path.normpath(chosen)) == os.path.basename(default_cache_dir()):
        return None
    return chosen


def share_compilations() -> str:
    """Make this process's compilations use :func:`user_compile_cache` (made owner-only if new), unless the user chose
    another folder (:func:`chosen_cache`); return the folder in use."""
    if chosen_cache() is None:
        try:
            folder = user_compile_cache()
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except (OSError, RuntimeError) as error:  # RuntimeError: no home folder to be found
            warnings.warn(f"compilations stay in torch's default folder, not shared between machines: {error}",
                          stacklevel=2)
            os.environ[VARIABLE] = default_cache_dir()
        else:
            os.environ[VARIABLE] = str(folder)
    return os.environ[VARIABLE]
