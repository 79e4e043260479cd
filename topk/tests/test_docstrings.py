"""Every ``>>>`` example in the library's docstrings runs and prints what it shows. The modules are discovered,
so a new module's examples are tested without being listed here."""

import doctest
import importlib
import inspect
import importlib.util
import pkgutil
import pydoc
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


@pytest.mark.parametrize("name", sorted(topk.losses.LOSSES))
def test_help_on_a_loss_module_shows_its_function_s_documentation_not_nn_module_s(name):
    spec = topk.losses.LOSSES[name]
    module = getattr(spec.constructor, "__self__", spec.constructor)  # LDAM.from_class_counts: LDAM
    shown = pydoc.render_doc(module, renderer=pydoc.plaintext)
    assert "Initialize internal Module state" not in shown
    function = module.loss_function
    assert f"The loss :func:`topk.losses.{function.__name__}` as a module" in shown
    assert function.__doc__.strip().splitlines()[0].strip() in shown


def test_build_loss_keywords_are_listed_by_the_registry_with_their_defaults():
    noised = topk.losses.LOSSES["noised_imbalanced"].keywords  # a classmethod: its own and its class's
    assert list(noised)[:4] == ["k", "epsilon", "n_samples", "max_margin"] and "margins" not in noised
    assert noised["scale"] == 1.0 and noised["reduction"] == "mean" and noised["k"] is inspect.Parameter.empty
    assert list(topk.losses.LOSSES["cross_entropy"].keywords) == ["reduction"]
    assert topk.losses.LOSSES["ldam"].keywords.keys() == {"max_margin", "scale", "reduction"}
