"""Verdicts on the paper's claims (:data:`experiments.spec.paper.CLAIMS`), computed from the reproduced results.

A claim is split into parts, each a test on the reproduced means with the threshold written in its evidence line;
the claim is reproduced when every part holds, not reproduced when one fails. A part whose statistic lies within its
own noise of the threshold neither holds nor fails: the claim is then "inconclusive at this profile", with the
numbers, rather than a verdict a rerun could flip. The noise is one standard error of the statistic from the seeds
(a difference ``a - c b`` of two means: ``sqrt(se_a^2 + c^2 se_b^2)``; claim 3 takes its largest), the drift of a
repeated timing for claim 4's ratios, and three standard errors for claim 7's Monte Carlo estimates. A frame without
standard errors (one seed, or published numbers) has no noise: its means decide. The thresholds read
the paper's words ("fails", "little impact", "barely depends") as numbers, once, here.
"""

from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass, replace

import pandas as pd

from experiments.analysis import timings

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
INCONCLUSIVE, NOT_RUN = "inconclusive at this profile", "not run at this profile"
STATUSES = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)

FAILS_BELOW = 0.5  #: "fails to learn": below half the best setting's accuracy
LEARNS_ABOVE = 0.9  #: "learns": at least 90% of the best setting's accuracy
LITTLE_IMPACT_POINTS = 1.0  #: "little impact": means within 1 point, or two standard errors of a mean if wider
FLAT_RATIO = 1.15  #: "barely depends on K": epoch time at the largest K within 15% of K = 1's
GROWS_RATIO = 1.25  #: "grows with K": epoch time at the largest K at least 25% above K = 1's
TAIL_FAILURE_RATIO = 0.6  #: "fails on tail classes": few-shot accuracy below 60% of cross-entropy's (paper: 52%, 27%)


@dataclass(frozen=True)
class Verdict:
    claim: int
    status: str
    evidence: tuple[str, ...]
    training: bool = True  #: judged from trained models (False: analytic)

    @classmethod
    def from_parts(cls, claim: int, parts: list[tuple[bool | None, str]], training: bool = True) -> "Verdict":
        """From ``(holds, evidence)`` parts, ``holds`` None where the evidence is within its noise of the threshold:
        not reproduced if one part fails, else inconclusive if one is undecided, else reproduced."""
        outcomes = [ok for ok, _ in parts]
        status = (NOT_REPRODUCED if not parts or False in outcomes else INCONCLUSIVE if None in outcomes
                  else REPRODUCED)
        marks = {True: "✓ ", False: "✗ ", None: "? "}
        return cls(claim, status, tuple(marks[ok] + text for ok, text in parts), training)

    def noting(self, note: str | None) -> "Verdict":
        """This verdict with ``note`` as one more evidence line that decides nothing (no mark); unchanged for None."""
        return self if note is None else replace(self, evidence=(*self.evidence, f"note: {note}"))

    def not_run(self, why: str) -> "Verdict":
        return self._overruled(NOT_RUN, why)

    def inconclusive(self, why: str) -> "Verdict":
        return self._overruled(INCONCLUSIVE, why)

    def _overruled(self, status: str, why: str) -> "Verdict":
        return replace(self, status=status, evidence=(f"{why}; the check alone would have said '{self.status}'",
                                                      *self.evidence))

    def to_dict(self) -> dict:
        return {**asdict(self), "evidence": list(self.evidence)}

    def to_html(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.evidence)
        return f"<p><b>Claim {self.claim}: {self.status}</b></p><ul>{items}</ul>"


def _decided(statistic: float, threshold: float, noise: float, below: bool) -> bool | None:
    """Whether ``statistic`` is at most (``below``) or at least ``threshold``; None when they are within ``noise`` (a
    noise of 0: the statistic decides, a tie included)."""
    if noise > 0 and abs(statistic - threshold) <= noise:
        return None
    return statistic <= threshold if below else statistic >= threshold


def _by(frame: pd.DataFrame, column: str, value: str = "mean") -> dict:
    return dict(zip(frame[column], frame[value]))


def _errors(frame: pd.DataFrame, column: str, value: str = "se") -> dict:
    """The standard error of each mean of ``frame`` by ``column`` (0 where none is known: the mean then decides)."""
    errors = frame[value] if value in frame else [math.nan] * len(frame)
    return {key: error if math.isfinite(error) else 0.0 for key, error in zip(frame[column], errors)}


Comparison = tuple[bool | None, float]  #: whether a comparison of two means holds (None: undecided), and its noise


def _compare(a: float, se_a: float, b: float, se_b: float, *, above: bool, strict: bool,
             scale: float = 1.0) -> Comparison:
    """Whether mean ``a`` is above (``above``) or below ``scale`` x mean ``b`` (``strict``: not equal to it), with the
    noise it was judged with, the standard error of ``a - scale b``: ``sqrt(se_a^2 + scale^2 se_b^2)``. None where the
    difference is within it of 0 (a noise of 0: the means decide, as published numbers do); False where a mean is
    missing (NaN: a diverged run)."""
    difference, noise = a - scale * b, math.hypot(se_a, scale * se_b)
    if not math.isfinite(difference):
        return False, noise
    if noise > 0 and abs(difference) <= noise:
        return None, noise
    signed = difference if above else -difference
    return (signed > 0 if strict else signed >= 0), noise


def _every(comparisons: list[Comparison]) -> bool | None:
    """Whether every comparison holds: False if one fails, else None if one is undecided, else True."""
    outcomes = [holds for holds, _ in comparisons]
    return False if False in outcomes else None if None in outcomes else True


def _undecided_text(comparisons: list[Comparison], names: list[str]) -> str:
    """The evidence's note on the comparisons within their noise, each with it: empty where none is."""
    within = [f"{name} ({noise:.2f})" for name, (holds, noise) in zip(names, comparisons) if holds is None]
    return f"; within one standard error: {', '.join(within)}" if within else ""


def _fmt(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1f}"


def _against_best(means: dict, errors: dict, keys: list, share: float, *, above: bool,
                  strict: bool) -> list[Comparison]:
    """Each of ``keys``'s means against ``share`` x the best finite mean of ``means`` (:func:`_compare`). The best
    against a share of itself is one mean, not two: its difference's standard error is (1 - share) x its own."""
    top = max((key for key in means if math.isfinite(means[key])), key=lambda key: means[key])
    return [_compare((1 - share) * means[top], (1 - share) * errors[top], 0.0, 0.0, above=above, strict=strict)
            if key == top else
            _compare(means[key], errors[key], means[top], errors[top], above=above, strict=strict, scale=share)
            for key in keys]


def _fails(means: dict, errors: dict, keys: list) -> list[Comparison]:
    """Whether each of ``keys``'s means is below :data:`FAILS_BELOW` x the best."""
    return _against_best(means, errors, keys, FAILS_BELOW, above=False, strict=True)


def _learns(means: dict, errors: dict, keys: list) -> list[Comparison]:
    """Whether each of ``keys``'s means is at least :data:`LEARNS_ABOVE` x the best."""
    return _against_best(means, errors, keys, LEARNS_ABOVE, above=True, strict=False)


def claim_1(table2: pd.DataFrame) -> Verdict:
    """eps = 0, 1e-4, 1e-3 fail; every eps >= 1e-2 learns. ``table2``: columns epsilon, mean (best val top-5), se
    (optional)."""
    means, errors = _by(table2, "epsilon"), _errors(table2, "epsilon")
    best = max(v for v in means.values() if math.isfinite(v))
    small, large = [e for e in means if 0 < e < 1e-2], [e for e in means if e >= 1e-2]
    listed = lambda keys: ", ".join(f"eps={e:g}: {_fmt(means[e])}" for e in keys)  # noqa: E731
    names = lambda keys: [f"eps={e:g}" for e in keys]  # noqa: E731
    zero, fails, learns = _fails(means, errors, [0.0]), _fails(means, errors, small), _learns(means, errors, large)
    return Verdict.from_parts(1, [
        (_every(zero), f"eps = 0 fails: {_fmt(means[0.0])} < {FAILS_BELOW} x best ({_fmt(best)})"
                       f"{_undecided_text(zero, ['eps=0'])}"),
        (_every(fails), f"eps in (0, 1e-2) fails: {listed(small)} < {FAILS_BELOW} x best"
                        f"{_undecided_text(fails, names(small))}"),
        (_every(learns), f"eps >= 1e-2 learns, large eps included: {listed(large)} >= {LEARNS_ABOVE} x best"
                         f"{_undecided_text(learns, names(large))}"),
    ])


def claim_2(figure2: pd.DataFrame, n_samples: int, n_classes: int, table2: pd.DataFrame) -> Verdict:
    """Few non-zero gradient coordinates (``figure2``: epsilon, mean, se optional), rising with eps, and learning
    succeeds (``table2``: every eps >= 1e-2 within 90% of the best)."""
    nonzero, nonzero_errors = _by(figure2, "epsilon"), _errors(figure2, "epsilon")
    positive = [e for e in sorted(nonzero) if e > 0]
    learned, learned_errors = _by(table2, "epsilon"), _errors(table2, "epsilon")
    large = [e for e in learned if e >= 1e-2]
    few = [_compare(nonzero[e], nonzero_errors[e], n_samples + 1, 0.0, above=False, strict=False) for e in nonzero]
    rises = [_compare(nonzero[positive[-1]], nonzero_errors[positive[-1]], nonzero[positive[0]],
                      nonzero_errors[positive[0]], above=True, strict=True)]
    learns = _learns(learned, learned_errors, large)
    finite = lambda values: [v for v in values if math.isfinite(v)] or [math.nan]  # noqa: E731
    return Verdict.from_parts(2, [
        (_every(few), f"at most B + 1 = {n_samples + 1} of {n_classes} coordinates are non-zero: max "
                      f"{max(finite(nonzero.values())):.2f}{_undecided_text(few, [f'eps={e:g}' for e in nonzero])}"),
        (_every(rises), f"the count rises with eps: {nonzero[positive[0]]:.2f} at eps={positive[0]:g}, "
                        f"{nonzero[positive[-1]]:.2f} at eps={positive[-1]:g}"
                        f"{_undecided_text(rises, ['the rise'])}"),
        (_every(learns), f"learning succeeds with these gradients: best val top-5 for eps >= 1e-2 within "
                         f"{LEARNS_ABOVE} x best ({_fmt(max(finite(learned.values())))}): min "
                         f"{_fmt(min(finite(learned[e] for e in large)))}"
                         f"{_undecided_text(learns, [f'eps={e:g}' for e in large])}"),
    ])


def claim_3(table3: pd.DataFrame) -> Verdict:
    """B has little impact, B in 3..10 is enough. ``table3``: B, mean, se (best val top-5; se may be NaN). A difference
    of two means has a standard error of about sqrt(2) x that of a mean: that is each part's noise."""
    means = _by(table3, "B")
    largest_se = max((s for s in table3.get("se", []) if math.isfinite(s)), default=0.0)
    tolerance = max(LITTLE_IMPACT_POINTS, 2 * largest_se)
    noise = math.sqrt(2) * largest_se
    spread = max(means.values()) - min(means.values())
    small_best = max(v for b, v in means.items() if 3 <= b <= 10)
    gap = max(means.values()) - small_best
    spread_holds, gap_holds = (_decided(value, tolerance, noise, below=True) for value in (spread, gap))
    within = f" (within the noise, {noise:.2f})" if noise else ""
    return Verdict.from_parts(3, [
        (spread_holds, f"the means over B span {spread:.2f} points against {tolerance:.2f} (1 point, or 2 standard "
                       f"errors of a mean if larger){within if spread_holds is None else ''}"),
        (gap_holds, f"the best B in 3..10 ({_fmt(small_best)}) is {gap:.2f} below the best B "
                    f"({_fmt(max(means.values()))}), against {tolerance:.2f}{within if gap_holds is None else ''}"),
    ])


def claim_4(figure3: pd.DataFrame, device: str = "cuda", noise: float = 0.0) -> Verdict:
    """Noised loss flat in K, smoothed hinge growing. ``figure3``: loss, K, epoch_seconds (one row per point). Epoch
    times of training runs made one after the other on a CPU (``device``) that other processes share are no basis for
    a timing claim: the verdict is then inconclusive, with the numbers; the GPU figure judges it. ``noise``: how far
    the ratio of two points' times may be off (relative); a ratio within it of its threshold is undecided."""
    parts = []
    for loss, group in figure3.dropna(subset=["K"]).groupby("loss"):
        group = group.sort_values("K")
        first, last = group.iloc[0], group.iloc[-1]
        if first["K"] == last["K"]:  # one K: nothing to see flat or growing (a GPU measurement of one point, say)
            parts.append((None, f"{loss}: epoch time measured at K={first['K']:g} alone, no trend in K"))
            continue
        ratio = last["epoch_seconds"] / first["epoch_seconds"]
        flat = loss.startswith("noised")
        threshold = FLAT_RATIO if flat else GROWS_RATIO
        holds = _beyond_noise(ratio, threshold, noise, at_most=flat)
        within = f", within the baseline's drift of {noise:.0%}: undecided" if holds is None else ""
        parts.append((holds, f"{loss}: epoch time at K={last['K']:g} is x{ratio:.2f} that at K={first['K']:g} "
                             f"({'flat: <=' if flat else 'grows: >='} x{threshold}{within})"))
    verdict = Verdict.from_parts(4, parts)
    if device == "cpu":
        return verdict.inconclusive("single epoch times of runs made one after the other on a shared CPU, not "
                                    "interleaved and repeated: judged from the GPU figure "
                                    "(python -m benchmarks.bench_epoch_time)")
    return verdict


def _beyond_noise(ratio: float, threshold: float, noise: float, at_most: bool) -> bool | None:
    """Whether ``ratio`` is at most (``at_most``) or at least ``threshold`` with the ratio itself off by up to
    ``noise`` (relative) either way; None where the noise could put it on either side."""
    low, high = ratio / (1 + noise), ratio * (1 + noise)
    if at_most:
        return True if high <= threshold else False if low > threshold else None
    return True if low >= threshold else False if high < threshold else None


def claim_4_measured(times: pd.DataFrame) -> Verdict:
    """Claim 4 on epoch times measured outside training (``python -m benchmarks.bench_epoch_time`` on a GPU): the same
    test, valid at any profile since a timing does not depend on how long the model was trained, with the noise of a
    ratio of two points taken as the drift of cross-entropy measured first and last, the ratio of two measurements of
    one point (:func:`timings.baseline_drift`; none where it was measured once). The noised loss is judged in the library's default implementation; its PyTorch-path rows
    ("(torch path)") are left out."""
    drift = timings.baseline_drift(times.to_dict("records"))
    default = times[~times["loss"].str.endswith("(torch path)")]
    return replace(claim_4(default[["loss", "K", "epoch_seconds"]], noise=abs(drift or 0.0)), training=False)


def claim_5(table4: pd.DataFrame) -> Verdict:
    """Under label noise p > 0, both top-5 losses beat CE on top-5; noised >= smoothed for p >= 0.2.
    ``table4``: loss, p, mean (test top-5), se (optional)."""
    keyed = table4.assign(key=list(zip(table4["loss"], table4["p"])))
    means, errors = _by(keyed, "key"), _errors(keyed, "key")
    noisy = sorted({p for _, p in means if p > 0})

    def beats(a: str, b: str, p: float, strict: bool) -> Comparison:
        return _compare(means[a, p], errors[a, p], means[b, p], errors[b, p], above=True, strict=strict)

    parts = []
    for loss in ("smooth_hinge", "noised_balanced"):
        comparisons = [beats(loss, "cross_entropy", p, strict=True) for p in noisy]
        parts.append((_every(comparisons), f"{loss} > CE for every p > 0 (test top-5, {loss} vs CE): " + ", ".join(
            f"p={p:g}: {_fmt(means[loss, p])} vs {_fmt(means['cross_entropy', p])}" for p in noisy)
            + _undecided_text(comparisons, [f"p={p:g}" for p in noisy])))
    later = [p for p in noisy if p >= 0.2]
    comparisons = [beats("noised_balanced", "smooth_hinge", p, strict=False) for p in later]
    parts.append((_every(comparisons), "noised >= smoothed for p >= 0.2 (noised vs smoothed): " + ", ".join(
        f"p={p:g}: {_fmt(means['noised_balanced', p])} vs {_fmt(means['smooth_hinge', p])}" for p in later)
        + _undecided_text(comparisons, [f"p={p:g}" for p in later])))
    return Verdict.from_parts(5, parts)


def claim_6(table5: pd.DataFrame) -> Verdict:
    """The smoothed hinge fails on few-shot classes for K = 3, 5; noised imbalanced beats LDAM, focal and CE for every
    K. ``table5``: loss, K, mean (macro top-K), few (few-shot macro top-K mean), se and few_se (optional)."""
    keyed = table5.assign(key=list(zip(table5["loss"], table5["K"])))
    mean, mean_se = _by(keyed, "key"), _errors(keyed, "key")
    few, few_se = _by(keyed, "key", "few"), _errors(keyed, "key", "few_se")
    ks = sorted({k for _, k in mean})
    parts = []
    for k in [k for k in ks if k >= 3]:
        fails = [_compare(few["smooth_hinge", k], few_se["smooth_hinge", k], few["cross_entropy", k],
                          few_se["cross_entropy", k], above=False, strict=True, scale=TAIL_FAILURE_RATIO)]
        parts.append((_every(fails), f"K={k}: smoothed hinge few-shot {_fmt(few['smooth_hinge', k])} < "
                                     f"{TAIL_FAILURE_RATIO} x CE's ({_fmt(few['cross_entropy', k])})"
                                     f"{_undecided_text(fails, ['the few-shot ratio'])}"))
    for k in ks:
        rivals = ("ldam", "focal", "cross_entropy")
        beaten = [_compare(mean["noised_imbalanced", k], mean_se["noised_imbalanced", k], mean[rival, k],
                           mean_se[rival, k], above=True, strict=True) for rival in rivals]
        parts.append((_every(beaten), f"K={k}: noised imbalanced > {', '.join(rivals)} (macro top-{k}): "
                      f"{_fmt(mean['noised_imbalanced', k])} vs " + ", ".join(_fmt(mean[r, k]) for r in rivals)
                      + _undecided_text(beaten, list(rivals))))
    return Verdict.from_parts(6, parts)


def claim_7(bound: pd.DataFrame) -> Verdict:
    """Prop. 3.5's bound. ``bound``: K, L, epsilon, observed (|mean top_{K,eps} - top_K| estimate), standard_error,
    bound; the observed gap minus 3 standard errors must not exceed the bound."""
    margin = bound["observed"] - 3 * bound["standard_error"] - bound["bound"]
    worst = bound.loc[(bound["observed"] / bound["bound"]).idxmax()]
    return Verdict.from_parts(7, [(bool((margin <= 0).all()),
                                   f"{int((margin <= 0).sum())} of {len(bound)} (K, L, eps) points within the bound; "
                                   f"the tightest uses {worst['observed'] / worst['bound']:.0%} of it "
                                   f"(K={worst['K']:g}, L={worst['L']:g}, eps={worst['epsilon']:g})")],
                              training=False)
