"""The paper's experiments, in floors; a module imports from its own floor or lower ones, never back up
(``experiments/tests/test_layers.py`` checks it):

0. :mod:`experiments.paths` and :mod:`experiments.provenance`: where files are, where a result came from;
1. :mod:`experiments.engine`: a run's typed config, the models, the batches, the one training loop, the results store;
2. :mod:`experiments.spec`: the paper's numbers and claims, the profiles (scales), the tuned values a profile carries
   (:mod:`experiments.spec.tuned`), the grids of runs behind each figure and table;
3. :mod:`experiments.tuning`: the steps run once per profile, which choose those tuned values;
4. :mod:`experiments.analysis`: from records to results (summaries, claims' verdicts, analytic items, plots);
5. :mod:`experiments.probes` and :mod:`experiments.scale`: runs beside the notebooks', a whole profile's runs;
6. :mod:`experiments.publishing`: what the reader sees (the report, the README's and docs' generated blocks);
7. :mod:`experiments.harness`, the notebooks' one entry, and the command line (``python -m experiments``).

Importing the package loads nothing: ``python -m experiments.publishing.report`` needs neither torch's training stack
nor the datasets. Import what you use, e.g. ``from experiments.engine.train import run``.
"""
