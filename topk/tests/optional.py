"""Optional test dependencies: skipped when missing, except where TOPK_REQUIRE_OPTIONAL=1 (as in `make test`)."""

import importlib
import os

import pytest


def require(module_name: str):
    if os.environ.get("TOPK_REQUIRE_OPTIONAL") == "1":
        return importlib.import_module(module_name)
    return pytest.importorskip(module_name)
