"""papermill's own command line, with each notebook's kernel on Unix sockets in a private temporary folder (mode
0700, removed after the notebook) instead of localhost TCP ports. On a shared node no other user can reach the
kernel, notebooks started side by side (``make -j``) cannot race for the same free port, and ipykernel no longer
warns, once per notebook, that it runs over TCP without encryption.

    python -m experiments.publishing.papermill_ipc IN.ipynb OUT.ipynb -k python3 -p profile quick   # as papermill
"""

from __future__ import annotations

import sys
import tempfile

from papermill.cli import papermill
from papermill.engines import NBClientEngine, papermill_engines
from traitlets.config import Config

ENGINE = "ipc"


class IPCEngine(NBClientEngine):
    """papermill's nbclient engine, its kernel manager told to bind every channel under a fresh private folder."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        with tempfile.TemporaryDirectory(prefix="topk-kernel-") as sockets:  # short path: a socket's is at most 107
            config = Config({"KernelManager": {"transport": "ipc", "ip": f"{sockets}/kernel"}})
            return super().execute_managed_notebook(nb_man, kernel_name, config=config, **kwargs)


papermill_engines.register(ENGINE, IPCEngine)

if __name__ == "__main__":
    papermill(["--engine", ENGINE, *sys.argv[1:]], prog_name="papermill")
