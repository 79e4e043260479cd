"""Fixtures shared by the experiments' tests."""

import contextlib

import pytest
import torch


@contextlib.contextmanager
def deterministic_algorithms():
    """Torch's deterministic mode for the block, off again after it (a run compared bit for bit with another)."""
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.fixture
def deterministic():
    with deterministic_algorithms():
        yield
