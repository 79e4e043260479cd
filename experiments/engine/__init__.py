"""The training engine: a run's typed config, the models, the batches, the one training loop and the results store."""
