"""Every ``>>>`` example in the library's docstrings runs and prints what it shows."""

import doctest
import importlib

import pytest

MODULES = ["topk.operators", "topk.losses.functional", "topk.losses.modules", "topk.losses.registry",
           "topk.metrics", "topk.layers"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": importlib.import_module("torch")})
    assert result.attempted > 0
    assert result.failed == 0
