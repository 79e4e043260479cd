"""Top-K losses for deep learning.

The noise-smoothed top-K operator and calibrated hinge losses of Garcin, Servajean, Joly & Salmon,
"Stochastic smoothing of the top-K calibrated hinge loss for deep imbalanced classification" (ICML 2022),
the baselines of its Table 1 (:mod:`topk.losses`) and the top-K metrics (:mod:`topk.metrics`).

The operators follow the paper's notation: :func:`top_k` is the K-th largest score of each row (``top_K(s)``),
:func:`top_sum_k` the sum of the K largest; neither is :func:`torch.topk`.
"""

from topk import layers, losses, metrics
from topk.operators import smooth_top_k, smooth_top_sum_k, top_k, top_sum_k

__all__ = ["layers", "losses", "metrics", "top_k", "top_sum_k", "smooth_top_k", "smooth_top_sum_k"]
__version__ = "0.1.0"
