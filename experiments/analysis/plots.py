"""Figure helpers shared by the notebooks: level sets on the simplex, mean-with-interval curves, epoch times, accuracy
and gradient sparsity against eps."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.tri as mtri
import pandas as pd

from experiments.analysis.analytic import simplex_grid, to_plane


def level_sets(panels: list[tuple[str, object]], points: int, true_class: int, *, columns: int = 5,
               title: str = "") -> plt.Figure:
    """One triangle per ``(title, values on simplex_grid(points))``, filled level sets in [0, 1], the true class at the
    upper corner."""
    x, y = to_plane(simplex_grid(points), true_class)
    triangulation = mtri.Triangulation(x.numpy(), y.numpy())
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.4 * columns, 2.5 * rows + 0.4), squeeze=False)
    for ax, (name, values) in zip(axes.flat, panels):
        # bins of width 0.1, the outer edges widened so that values of exactly 0 and 1 are filled too
        edges = [-1e-9] + [i / 10 for i in range(1, 10)] + [1 + 1e-9]
        filled = ax.tricontourf(triangulation, values.numpy(), levels=edges, cmap="viridis")
        ax.tricontour(triangulation, values.numpy(), levels=[i / 10 for i in range(1, 10)], colors="white",
                      linewidths=0.3)
        ax.set_title(name, fontsize=8)
        ax.set_aspect("equal")
        ax.axis("off")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(filled, ax=axes, shrink=0.6, label="loss rescaled to [0, 1]")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def interval_curves(ax: plt.Axes, summary: pd.DataFrame, x: str, *, group: str | None = None, labels=None,
                    **style) -> None:
    """Mean against ``x`` with its 95% interval as error bars, one curve per value of ``group``."""
    groups = summary.groupby(group, sort=False) if group else [(None, summary)]
    for name, part in groups:
        part = part.sort_values(x)
        label = (labels or {}).get(name, name)
        half = part["half"].fillna(0.0)
        ax.errorbar(part[x], part["mean"], yerr=half, marker="o", capsize=3, label=label, **style)


def epoch_time_against_k(times: pd.DataFrame, title: str) -> plt.Figure:
    """Fig. 3: epoch time and time in the loss against K, one curve per loss, cross-entropy (no K; the mean of its
    rows) dashed. ``times``: loss, K (NaN for cross-entropy), epoch_seconds, loss_seconds."""
    ce = times[times["loss"] == "cross_entropy"][["epoch_seconds", "loss_seconds"]].mean()
    by_k = times.dropna(subset=["K"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, column, label in zip(axes, ("epoch_seconds", "loss_seconds"),
                                 ("average epoch time (s)", "time in the loss per epoch (s)")):
        for loss, part in by_k.groupby("loss"):
            ax.plot(part["K"], part[column], marker="o", label=loss)
        ax.axhline(ce[column], color="k", ls="--", label="cross_entropy (no K)")
        ax.set(xlabel="K", ylabel=label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


#: Where eps = 0 is drawn on a log axis.
EPSILON_ZERO_AT = 1e-5


def _log_eps(eps) -> list[float]:
    return [max(e, EPSILON_ZERO_AT) for e in eps]


def accuracy_against_epsilon(runs: pd.DataFrame, top5: pd.DataFrame, published: dict[float, float]) -> plt.Figure:
    """Table 2 as a figure: each seed's best validation top-5 against eps, the seeds' mean with its 95% interval
    (``top5``: :func:`~experiments.analysis.summary.summarise` by eps) and the paper's values dashed."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.scatter(_log_eps(runs["epsilon"]), runs["best_val_top5"], color="C0", alpha=0.35, s=14, label="ours, one seed")
    ax.errorbar(_log_eps(top5["epsilon"]), top5["mean"], yerr=top5["half"].fillna(0), color="C0", marker="o",
                capsize=3, label="ours, mean and 95% interval")
    ax.plot(_log_eps(published), list(published.values()), "k--", marker="s", label="paper (thesis Table 4.2)")
    ax.set(xscale="log", ylim=(0, 100), xlabel=f"eps (eps = 0 drawn at {EPSILON_ZERO_AT:g})",
           ylabel="best val top-5 (%)", title="Table 2 as a figure (noised balanced, K = 5, B = 10)")
    ax.legend(fontsize=8)
    return fig


def gradient_sparsity(sparsity: dict[int, pd.DataFrame], n_classes: int, published: float) -> plt.Figure:
    """Fig. 2: mean non-zero gradient coordinates in the first epoch against eps > 0, one curve per B, eps = 0 as a
    dotted line of the same colour, the paper's value at large eps dashed. ``sparsity``: B -> summary by eps."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for b, values in sparsity.items():
        positive = values[values["epsilon"] > 0]
        (line,) = ax.plot(positive["epsilon"], positive["mean"], marker="o", label=f"B = {b}")
        ax.axhline(values.loc[values["epsilon"] == 0, "mean"].iloc[0], ls=":", color=line.get_color(),
                   label=f"B = {b}, eps = 0")
    ax.axhline(published, color="k", ls="--", lw=0.8, label=f"paper: about {published:g} at large eps (B = 3)")
    ax.set(xscale="log", xlabel="eps", ylabel=f"non-zero gradient coordinates (of {n_classes})",
           title="Fig. 2: gradient sparsity in the first epoch (noised balanced, K = 5)")
    ax.legend(fontsize=8)
    return fig
