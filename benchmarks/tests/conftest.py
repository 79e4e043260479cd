"""The benchmark scripts' tests draw figures without a display: Matplotlib's Agg backend, chosen before any import of
pyplot."""

import matplotlib

matplotlib.use("Agg")
