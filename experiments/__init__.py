"""The paper's experiments: the training engine (:mod:`experiments.engine.train`, driven by a
:class:`~experiments.engine.config.RunConfig`), the results store, the notebooks' harness, the claims and the report.

Importing the package loads nothing: ``python -m experiments.publishing.report`` needs neither torch's training stack nor the
datasets. Import what you use, e.g. ``from experiments.engine.train import run``.
"""
