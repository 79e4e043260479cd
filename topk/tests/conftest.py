"""Shared test settings: hypothesis profiles, devices, dtypes."""

import os

import pytest
import torch

# Without a GPU the Triton kernel of topk.fused runs in Triton's interpreter, which must be chosen before
# triton is first imported (its library functions, e.g. tl.randn, are built at import time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import HealthCheck, settings

from topk.tests.optional import require

# `ci` (used by `make test`): derandomized, so a run is reproducible; `dev`: more examples.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(scope="module")
def kernel_device():
    """Where the Triton kernels run: CUDA when present, else the CPU under Triton's interpreter (set above). Skipped
    without Triton (PyTorch's CPU-only wheels have none), except under TOPK_REQUIRE_OPTIONAL=1."""
    require("triton")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    return torch.device("cpu")
