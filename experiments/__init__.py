"""What the notebooks share: the models, the one training loop driven by a :class:`RunConfig`, and the results store."""

from experiments.config import RunConfig
from experiments.store import ResultsStore
from experiments.train import evaluate, run

__all__ = ["RunConfig", "ResultsStore", "run", "evaluate"]
