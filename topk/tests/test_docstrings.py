"""Every ``>>>`` example in the library's docstrings runs and prints what it shows. The modules are discovered,
so a new module's examples are tested without being listed here."""

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import topk


def _modules_with_examples() -> list[str]:
    """Read from the source files, not imported: a kernel module imports Triton, which a CPU-only install lacks."""
    names = [info.name for info in pkgutil.walk_packages(topk.__path__, "topk.") if ".tests" not in info.name]
    return [name for name in names if ">>>" in Path(importlib.util.find_spec(name).origin).read_text()]


MODULES = _modules_with_examples()


def test_discovery_finds_the_modules_with_examples():
    assert {"topk.operators", "topk.losses.functional", "topk.elementary_symmetric", "topk.metrics"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": importlib.import_module("torch")})
    assert result.attempted > 0
    assert result.failed == 0
