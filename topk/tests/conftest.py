"""Shared test settings: hypothesis profiles, devices, dtypes, and what keeps the CPU-only run fast (one torch thread
per xdist worker, the Triton interpreter's language patch made once per launch)."""

import importlib.util
import os
import sys

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


@pytest.fixture(autouse=True)
def torch_threads_per_worker():
    """Each test runs on the machine's cores shared among the xdist workers (``pytest -n 2`` on 2 cores: one torch
    thread each). With more threads than free cores, torch's OpenMP threads spin at every barrier: on a busy 2-core
    machine the quadrature of :class:`topk.tests.reference.ExactPerturbedRanks` (8 classes) took 2.3 s of CPU on
    torch's default 2 threads and 0.08 s on one. Restored after the test, so that the other packages' tests in the
    same worker keep torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, (os.cpu_count() or 1) // workers)))
    yield
    torch.set_num_threads(threads)


def _patch_the_interpreters_language_once_per_launch():
    """Triton's interpreter patches ``triton.language`` (``inspect.getmembers`` over its modules, a few milliseconds)
    at every call of a ``@triton.jit`` device function (``InterpretedFunction.__call__``), not only at the launch:
    the noise tests' kernel makes about 40 such calls per program (its helpers, and ``tl.randn4x``'s), and they took
    40% of those tests' time. Within one launch a second patch through the same module's globals changes nothing
    (the first one is not undone before the launch ends), so it is skipped; each launch still patches and restores as
    Triton does, and the kernels' arithmetic is untouched. Written for Triton 3.8's interpreter; a no-op where its
    functions are missing, and on a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    from triton.runtime import interpreter

    if getattr(interpreter, "_topk_tests_patch", False) or not all(
            hasattr(interpreter, name) for name in ("_patch_lang", "GridExecutor", "_LangPatchScope")):
        return
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = {"launching": False, "patched": set()}

    def patch_once(fn):
        key = id(fn.__globals__)
        if state["launching"] and key in state["patched"]:
            return interpreter._LangPatchScope()  # nothing to restore: nothing was changed
        scope = patch_lang(fn)
        if state["launching"]:
            state["patched"].add(key)
        return scope

    def launch_patching_once(self, *args, **kwargs):
        state["launching"], state["patched"] = True, set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["launching"], state["patched"] = False, set()

    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_patching_once
    interpreter._topk_tests_patch = True


@pytest.fixture(autouse=True)
def _interpreter_patching_once_per_launch():
    """The patch above, made once Triton is imported (by ``kernel_device``, which makes it too, or by an earlier
    test): it stays for the worker's session."""
    if "triton" in sys.modules:
        _patch_the_interpreters_language_once_per_launch()


@pytest.fixture(scope="module")
def kernel_device():
    """Where the Triton kernels run: CUDA when present, else the CPU under Triton's interpreter (set above). Skipped
    without Triton (PyTorch's CPU-only wheels have none), except under TOPK_REQUIRE_OPTIONAL=1."""
    require("triton")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    _patch_the_interpreters_language_once_per_launch()  # before the module's fixtures launch anything
    return torch.device("cpu")
