"""The benchmark scripts' tests draw figures without a display (Matplotlib's Agg backend, chosen before any import of
pyplot) and, without a GPU, run the Triton kernels in Triton's interpreter (chosen before Triton is first imported,
as in ``topk/tests/conftest.py``: the scripts run in this process)."""

import os

import matplotlib
import torch

matplotlib.use("Agg")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
