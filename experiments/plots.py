"""Figure helpers shared by the notebooks: level sets on the simplex, mean-with-interval curves, epoch times."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.tri as mtri
import pandas as pd

from experiments.analytic import simplex_grid, to_plane


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
    """Fig. 3: epoch time and time in the loss against K, one curve per loss, cross-entropy (no K) dashed.
    ``times``: loss, K (NaN for cross-entropy), epoch_seconds, loss_seconds."""
    ce = times[times["loss"] == "cross_entropy"].iloc[0]
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
