"""Timing scripts for the topk losses, each run from the repository root as ``python -m benchmarks.NAME``."""
