"""The paper's experiments: the training engine (:mod:`experiments.train`, driven by a
:class:`~experiments.config.RunConfig`), the results store, the notebooks' harness, the claims and the report.

Importing the package loads nothing: ``python -m experiments.report`` needs neither torch's training stack nor the
datasets. Import what you use, e.g. ``from experiments.train import run``.
"""
