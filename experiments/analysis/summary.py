"""Seeds to numbers: the mean and 95% interval of a metric over seeds, and tables that put them beside the paper's."""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def standard_error(values) -> float:
    """The standard error of the mean of the finite ``values`` (sample standard deviation over sqrt(n)); NaN for
    n < 2."""
    finite = _finite(values)
    n = len(finite)
    if n < 2:
        return math.nan
    mean = sum(finite) / n
    return math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) / math.sqrt(n)


def mean_interval(values) -> tuple[float, float, int]:
    """``(mean, half-width of the 95% Student t interval, n)`` of the finite ``values``; the half-width is NaN for n < 2."""
    finite = _finite(values)
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(finite) / n
    if n < 2:
        return mean, math.nan, 1
    return mean, float(stats.t.ppf(0.975, n - 1)) * standard_error(finite), n


def summarise(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """One row per group of ``by``: ``mean``, ``half`` (95% interval half-width), ``se`` (standard error of the mean)
    and ``n`` (seeds) of ``value``. Rows whose run diverged count as missing values (they lower ``n``)."""
    rows = []
    for key, group in frame.groupby(by, dropna=False, sort=False):
        mean, half, n = mean_interval(group[value])
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "mean": mean, "half": half,
                     "se": standard_error(group[value]),
                     "n": n, "runs": len(group)})
    return pd.DataFrame(rows)


def format_estimate(mean: float, half: float = math.nan, n: int | None = None, digits: int = 1) -> str:
    """``"93.3 ± 0.4"``; ``"93.3"`` without an interval; ``"-"`` for no value; ``" (n=1)"`` flags a single seed."""
    if mean is None or not math.isfinite(mean):
        return "-"
    text = f"{mean:.{digits}f}"
    if half is not None and math.isfinite(half):
        text += f" ± {half:.{digits}f}"
    if n == 1:
        text += " (n=1)"
    return text


def format_published(value, digits: int = 1) -> str:
    """A published number: ``x``, ``(mean, half)`` or ``(mean, half, (few, medium, many))``."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}"
    text = format_estimate(value[0], value[1], digits=digits)
    if len(value) > 2:
        text += " (" + "/".join(f"{v:.1f}" for v in value[2]) + ")"
    return text


def column_labels(frame: pd.DataFrame) -> list[str]:
    """One label per column: a two-level column ``("p=0.1", "ours")`` becomes ``"p=0.1 ours"``."""
    return [" ".join(map(str, c)).strip() if isinstance(c, tuple) else str(c) for c in frame.columns]


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``frame`` (index included, as the first columns: one per level)."""
    header = [str(name or "") for name in frame.index.names] + column_labels(frame)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        keys = index if frame.index.nlevels > 1 else (index,)
        lines.append("| " + " | ".join([str(key) for key in keys] + [str(v) for v in row]) + " |")
    return "\n".join(lines) + "\n"


def comparison_table(rows, columns, ours, paper, *, row_name: str, column_name) -> pd.DataFrame:
    """Reproduced and published numbers side by side: one row per ``rows`` entry (a ``(key, label)`` pair), two
    columns ("ours", "paper") per ``columns`` entry (also ``(key, label)``). ``ours(row, column)`` and
    ``paper(row, column)`` give the cell texts."""
    table = pd.DataFrame(
        {(column_label, source): [(ours if source == "ours" else paper)(row, column) for row, _ in rows]
         for column, column_label in columns for source in ("ours", "paper")},
        index=pd.Index([label for _, label in rows], name=row_name))
    table.columns.names = [column_name, ""]
    return table


SHOT_GROUPS = ("few", "medium", "many")


def select(runs: pd.DataFrame, **where) -> pd.DataFrame:
    """The rows of ``runs`` (one per seed) whose columns equal every ``column=value`` of ``where``."""
    mask = pd.Series(True, index=runs.index)
    for column, value in where.items():
        mask &= runs[column] == value
    return runs[mask]


#: The range of the accuracies the tables show, in percent.
PERCENT = (0.0, 100.0)


def estimate(runs: pd.DataFrame, value: str, *, digits: int = 1, groups: str | None = None,
             bounds: tuple[float, float] = PERCENT, **where) -> str:
    """``"mean ± half"`` of ``value`` over the seeds matching ``where``; with ``groups`` (a column prefix), the few /
    medium / many-shot means of ``<groups>_<group>`` follow in parentheses; diverged runs are counted in the text.
    Where the 95% interval is wider than the scale ``bounds`` (2-3 seeds far apart), it says less than the seeds
    themselves: their range is shown instead, ``"min-max (n seeds)"``."""
    rows = select(runs, **where)
    values = rows.get(value, pd.Series(dtype=float))
    mean, half, n = mean_interval(values)
    if n > 1 and math.isfinite(half) and 2 * half > bounds[1] - bounds[0]:
        finite = [float(v) for v in values if v is not None and math.isfinite(v)]
        text = f"{min(finite):.{digits}f}-{max(finite):.{digits}f} ({n} seeds)"
    else:
        text = format_estimate(mean, half, n, digits=digits)
    if groups:
        text += " (" + "/".join(_mean_text(rows.get(f"{groups}_{g}")) for g in SHOT_GROUPS) + ")"
    diverged = int((rows["status"] != "done").sum())
    return text + (f" [{diverged} diverged]" if diverged else "")


def label_noise_fit_table(runs: pd.DataFrame, losses, noise_levels) -> pd.DataFrame:
    """For each loss and label noise p (``(key, label)`` pairs), the share of the flipped training images that the
    selected model predicts as their noisy label and as their true class (:func:`experiments.engine.train.flipped_label_fit`),
    over seeds; "-" for runs stored before it was recorded."""
    table = pd.DataFrame(
        {(p_label, shown): [estimate(runs, column, loss=loss, p=p) for loss, _ in losses]
         for p, p_label in noise_levels
         for shown, column in (("noisy label", "flipped_fit_noisy"), ("true class", "flipped_fit_clean"))},
        index=pd.Index([label for _, label in losses], name="flipped training images predicted as (%)"))
    table.columns.names = ["label noise", ""]
    return table


def _crowded_per_seed(rows: pd.DataFrame, k: int) -> list[str]:
    """Each run's number of classes crowding the top ``k`` (:func:`crowded_classes_table`), in seed order; "-" for a run
    stored before it was recorded."""
    values = rows.sort_values("seed").get(f"test_crowded_top{k}", pd.Series(dtype=float))
    return ["-" if pd.isna(v) else str(int(v)) for v in values]


def crowded_classes_table(runs: pd.DataFrame, losses, levels, column: str, ks) -> pd.DataFrame:
    """For each loss (``(key, label)`` pairs) and each level of ``column`` (``(value, label)`` pairs: label noise p, or
    the K a loss was trained for), the number of classes in the top K of more than half the test images
    (:meth:`topk.metrics.TopKCoverage.crowded_classes`) for every K of ``ks(value)``, each seed's in seed order; "-"
    for runs stored before it was recorded. On balanced classes a model that ranks by the image holds each class in
    about K / L of the top Ks: a crowded class is in them whatever the image."""
    def seeds(loss, value, k) -> str:
        return " / ".join(_crowded_per_seed(select(runs, loss=loss, **{column: value}), k)) or "-"

    table = pd.DataFrame({(label, f"top-{k}"): [seeds(loss, value, k) for loss, _ in losses]
                          for value, label in levels for k in ks(value)},
                         index=pd.Index([label for _, label in losses], name="crowded classes, per seed"))
    table.columns.names = [column, ""]
    return table


def crowding_note(runs: pd.DataFrame, column: str, k: int, **where) -> str | None:
    """A line for a verdict: at each level of ``column`` where a seed's selected model has classes in the top ``k`` of
    more than half the test images, those counts per seed (in seed order); None where no run has any, or none
    recorded them."""
    rows = select(runs, **where)
    counts = f"test_crowded_top{k}"
    if counts not in rows or not (rows[counts].fillna(0) > 0).any():
        return None
    levels = [f"{column}={value:g}: " + ", ".join(_crowded_per_seed(part, k))
              for value, part in rows.groupby(column) if (part[counts].fillna(0) > 0).any()]
    return (f"classes in the top {k} of more than half the test images, per seed, where there are any: "
            + "; ".join(levels) + " (a top-K hinge pushes down only the (K+1)-th class)")


def _mean_text(values) -> str:
    mean = mean_interval(values if values is not None else [])[0]
    return f"{mean:.1f}" if math.isfinite(mean) else "-"


def epoch_time_table(times: pd.DataFrame) -> pd.DataFrame:
    """Fig. 3's data: epoch seconds by loss (rows) and K (columns "K=k (s)"), cross-entropy (no K; the mean of its
    rows, measured first and last by ``benchmarks.bench_epoch_time``) on every column. ``times``: loss, K (NaN for
    cross-entropy), epoch_seconds."""
    by_k = times.dropna(subset=["K"]).astype({"K": int})
    table = by_k.pivot_table(index="loss", columns="K", values="epoch_seconds")
    table.columns = [f"K={k} (s)" for k in table.columns]
    table.loc["cross_entropy"] = times[times["loss"] == "cross_entropy"]["epoch_seconds"].mean()
    return table.round(2)


def epoch_time_overheads(times: pd.DataFrame, published: dict[str, float], k: int = 5) -> pd.DataFrame:
    """:func:`epoch_time_table` with each loss's epoch-time overhead over cross-entropy at ``k``, ours (mean epoch
    seconds) beside the paper's (``published``: loss -> seconds, cross-entropy included); "-" where either is
    missing."""
    table = epoch_time_table(times)
    means = times.dropna(subset=["K"]).astype({"K": int}).groupby(["loss", "K"])["epoch_seconds"].mean()
    ce = times[times["loss"] == "cross_entropy"]["epoch_seconds"].mean()

    def ours(loss: str) -> str:
        return f"{means[loss, k] / ce - 1:+.1%}" if (loss, k) in means.index else "-"

    def paper(loss: str) -> str:
        if loss == "cross_entropy" or loss not in published:
            return "-"
        return f"{published[loss] / published['cross_entropy'] - 1:+.1%}"

    table[f"ours: vs CE at K={k}"] = [ours(loss) for loss in table.index]
    table[f"paper: vs CE at K={k}"] = [paper(loss) for loss in table.index]
    return table


def macro_top_k_means(runs: pd.DataFrame) -> pd.DataFrame:
    """Claim 6's numbers: per loss and K, the seeds' mean test macro-average top-K (``mean``) and its few-shot part
    (``few``), from the run columns ``test_macro_top<K>`` and ``test_macro_top<K>_few``, each with the standard error
    of its mean (``se``, ``few_se``)."""
    return pd.DataFrame([{"loss": loss, "K": k, "mean": part[f"test_macro_top{k}"].mean(),
                          "se": standard_error(part[f"test_macro_top{k}"]), "few": part[f"test_macro_top{k}_few"].mean(),
                          "few_se": standard_error(part[f"test_macro_top{k}_few"])}
                         for (loss, k), part in runs.groupby(["loss", "K"])])


def gradient_sparsity(runs_by_samples: dict[int, pd.DataFrame]) -> dict[int, pd.DataFrame]:
    """Fig. 2's numbers: for each number of samples B, :func:`summarise` of the first epoch's non-zero gradient
    coordinates per example, by eps."""
    return {b: summarise(runs, ["epsilon"], "first_epoch_grad_nonzero") for b, runs in runs_by_samples.items()}


def gradient_sparsity_table(sparsity: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """Fig. 2's data as a table: eps (rows) by B (columns ``B=<b>``, with its mean and number of seeds)."""
    return pd.concat({f"B={b}": v.set_index("epsilon")[["mean", "n"]] for b, v in sparsity.items()}, axis=1).round(3)
