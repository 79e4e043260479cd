"""The library as ``pip install topk`` on PyTorch's CPU-only wheels gives it, without Triton: the tests whose path
depends on whether Triton imports (those that name it, a backend or the fused kernel) run again with Triton hidden.
The kernels' own tests skip there; every other test must pass on the PyTorch path. One test of the suite, in a
process of its own, so that ``make test`` runs it beside the others."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MENTIONS_TRITON = re.compile("triton|backend|fused", re.IGNORECASE)
#: Hides Triton from a Python process started with this folder first on its ``PYTHONPATH``.
HIDE_TRITON = "import sys\nsys.modules['triton'] = None  # `import triton` raises ModuleNotFoundError\n"


def triton_dependent_test_files() -> list[Path]:
    """The test files that name Triton, a backend or the fused kernel, this one left out."""
    return sorted(path for path in HERE.glob("test_*.py")
                  if path.name != Path(__file__).name and MENTIONS_TRITON.search(path.read_text()))


def _environment_hiding_triton(folder: Path) -> dict:
    """This process's environment with Triton hidden (by a ``sitecustomize.py`` written into ``folder``, first on
    ``PYTHONPATH``), and CUDA with it: PyTorch's CPU-only wheels lack both, while its CUDA wheels bring Triton (and
    inductor needs it to compile for a GPU). One torch thread, and the optional dependencies optional."""
    (folder / "sitecustomize.py").write_text(HIDE_TRITON)
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("PYTEST_XDIST") and name != "TOPK_REQUIRE_OPTIONAL"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), environment.get("PYTHONPATH")]))
    environment["OMP_NUM_THREADS"] = "1"
    environment["CUDA_VISIBLE_DEVICES"] = ""
    return environment


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton here: the suite runs without it")
def test_the_tests_that_depend_on_triton_pass_with_triton_hidden(tmp_path):
    environment = _environment_hiding_triton(tmp_path)
    hidden = subprocess.run([sys.executable, "-c", "import triton"], env=environment, capture_output=True, text=True)
    assert hidden.returncode != 0 and "import of triton halted" in hidden.stderr, hidden.stderr
    files = triton_dependent_test_files()
    assert {"test_fused.py", "test_smooth_hinge_kernel.py", "test_graph_capture.py"} <= {path.name for path in files}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "-rfEs",
                          *map(str, files)], cwd=HERE.parents[1], env=environment, capture_output=True, text=True,
                         timeout=1200)
    failed = "\n".join(line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR")))
    assert run.returncode == 0, failed + "\n" + run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout) and "could not import 'triton'" in run.stdout, run.stdout[-3000:]
