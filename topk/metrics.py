"""Streaming top-K metrics: accumulate batch by batch with ``update``, then ``compute``.

- :class:`TopKAccuracy`: top-K accuracy for several K at once.
- :class:`MacroTopKAccuracy`: top-K accuracy per class, then averaged over classes; also restricted to the
  few-shot (< 20 training images), medium-shot (20 to 100) and many-shot (> 100) classes, the groups of
  Garcin et al. (ICML 2022, Tables 5 and 6).
- :class:`TopKCoverage`: the share of inputs whose top K holds each class, and the classes crowding most top Ks
  (a top-K hinge loss penalises only the (K+1)-th score, so classes above it can stay in every input's top K).
- :class:`AverageKThreshold` and :class:`AverageKAccuracy`: average-K accuracy, the threshold set on the
  validation softmax probabilities as in Garcin's thesis (2023, ch. 5, Algorithm 1) and reused on test.

Tie rule (deterministic and exact): when the true class ties with other classes at the boundary of the
top K, it gets the fraction of the tied positions that fall inside the top K, i.e. the expected accuracy
under uniformly random tie-breaking. With ``g`` classes scoring strictly higher and ``t`` others tied
with it, the credit is ``clamp((K - g) / (t + 1), 0, 1)``. Constant scores thus get K / L, chance level.
Sums are kept in float64, so the result does not depend on how the data were split into batches, and on the
scores' device: ``update`` reads nothing on the host (a NaN score is reported by ``compute``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import torch

from topk._validation import check_int, check_labels, check_real, check_scores

__all__ = [
    "topk_credit",
    "shot_groups",
    "TopKAccuracy",
    "MacroTopKAccuracy",
    "TopKCoverage",
    "AverageKThreshold",
    "AverageKAccuracy",
    "SHOT_GROUP_BOUNDS",
]

#: Few-shot: fewer than 20 training images; many-shot: more than 100 (Garcin et al., 2022, Table 5).
SHOT_GROUP_BOUNDS = (20, 100)


def _check_ks(ks: int | Iterable[int]) -> tuple[int, ...]:
    """One K or several, as a tuple of positive integers."""
    if isinstance(ks, numbers.Integral):
        ks = (ks,)
    try:
        ks = tuple(ks)
    except TypeError:
        raise TypeError(f"'ks' should be a positive integer or a sequence of them, got {ks!r}") from None
    if not ks:
        raise ValueError("'ks' should hold at least one K, got an empty sequence")
    return tuple(check_int(k, "ks", 1) for k in ks)


def _check_score_shape(scores: torch.Tensor) -> torch.Tensor:
    """A (batch, L) floating tensor (its values are not read)."""
    check_scores(scores, "scores")
    if scores.dim() != 2:
        raise ValueError(f"'scores' should have shape (batch, L), got {tuple(scores.shape)}")
    return scores


def _check_score_matrix(scores: torch.Tensor) -> torch.Tensor:
    """A (batch, L) floating tensor without NaN (read on the host)."""
    _check_score_shape(scores)
    if bool(torch.isnan(scores).any()):
        raise ValueError(NAN_SCORES)
    return scores


NAN_SCORES = "'scores' contain NaN: the model diverged or its output is corrupted"


def _check_class_count(scores: torch.Tensor, num_classes: int) -> None:
    """A (batch, L) tensor has ``num_classes`` columns (other shapes are refused by the shape checks)."""
    if scores.dim() == 2 and scores.shape[1] != num_classes:
        raise ValueError(f"'scores' should have {num_classes} classes, got shape {tuple(scores.shape)}")


def _check_batch(scores: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    """Shapes, dtypes and the labels' range (an asynchronous assertion); the scores' values are not read."""
    _check_score_shape(scores)
    if max(ks) > scores.shape[1]:
        raise ValueError(f"'ks' should not exceed the number of classes {scores.shape[1]}, got {max(ks)}")
    return check_labels(labels, scores, "labels")


def _credit(scores: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    true_scores = scores.gather(1, labels.unsqueeze(1))  # [batch, 1]
    higher = (scores > true_scores).sum(1, dtype=torch.float64)  # g
    tied = (scores == true_scores).sum(1, dtype=torch.float64)  # t + 1 (the true class itself)
    k = torch.tensor(ks, dtype=torch.float64, device=scores.device)
    return ((k - higher.unsqueeze(1)) / tied.unsqueeze(1)).clamp(0.0, 1.0)


def topk_credit(scores: torch.Tensor, labels: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """Per-sample top-K credit in [0, 1] for each K in ``ks``, shape ``(batch, len(ks))`` in float64.

    1 when the true class is in the top K, 0 when not, and the tie rule of this module in between.
    """
    ks = _check_ks(ks)
    labels = _check_batch(scores, labels, ks)
    _check_score_matrix(scores)
    return _credit(scores, labels, ks)


class _DeviceSums:
    """Sums kept on the device of the scores they come from, and whether a NaN score was seen: ``update`` reads
    nothing on the host; ``compute`` reads once."""

    def _accumulate(self, scores: torch.Tensor) -> None:
        if self._nan is None:
            self._nan = torch.zeros((), dtype=torch.bool, device=scores.device)
            self._to_device(scores.device)
        self._nan |= torch.isnan(scores).any()

    def _check_seen(self) -> None:
        if self._nan is not None and bool(self._nan):
            raise ValueError(NAN_SCORES)


class TopKAccuracy(_DeviceSums):
    """Top-K accuracy for several K at once.

    >>> metric = TopKAccuracy(ks=(1, 2))
    >>> metric.update(torch.tensor([[0.1, 0.5, 0.4], [0.7, 0.2, 0.1]]), torch.tensor([2, 0]))
    >>> metric.compute()
    {1: 0.5, 2: 1.0}
    """

    def __init__(self, ks: Sequence[int] = (1, 5)):
        self.ks = _check_ks(ks)
        self.reset()

    def reset(self) -> None:
        self._credit = torch.zeros(len(self.ks), dtype=torch.float64)
        self._count, self._nan = 0, None

    def _to_device(self, device: torch.device) -> None:
        self._credit = self._credit.to(device)

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        labels = _check_batch(scores, labels, self.ks)
        self._accumulate(scores)
        self._credit += _credit(scores, labels, self.ks).sum(0)
        self._count += scores.shape[0]

    def compute(self) -> dict[int, float]:
        if self._count == 0:
            raise RuntimeError("TopKAccuracy.compute() called before any update()")
        self._check_seen()
        return {k: float(c / self._count) for k, c in zip(self.ks, self._credit.cpu())}


def shot_groups(train_class_counts: Sequence[int] | torch.Tensor,
                bounds: tuple[int, int] = SHOT_GROUP_BOUNDS) -> dict[str, torch.Tensor]:
    """Boolean class masks ``few`` (count < 20), ``medium`` (20 to 100) and ``many`` (> 100)."""
    counts = torch.as_tensor(train_class_counts)
    if counts.dim() != 1 or counts.is_floating_point() and not bool(torch.isfinite(counts).all()):
        raise ValueError(f"'train_class_counts' should be a 1-d sequence of counts, got {counts.tolist()}")
    if bool((counts < 0).any()):
        raise ValueError(f"'train_class_counts' should be >= 0, got {counts.min().item()}")
    if counts.is_floating_point() and bool((counts != counts.round()).any()):
        raise ValueError(f"'train_class_counts' should be whole numbers of examples, got "
                         f"{counts[counts != counts.round()][0].item()}")
    low, high = bounds
    return {"few": counts < low, "medium": (counts >= low) & (counts <= high), "many": counts > high}


class MacroTopKAccuracy(_DeviceSums):
    """Macro-average top-K accuracy: top-K accuracy of each class, averaged over the classes.

    Classes absent from the evaluated data are left out of the average (``compute`` reports how many
    classes were averaged). ``compute_by_group`` gives the same average within the shot groups of
    :func:`shot_groups`.
    """

    def __init__(self, ks: Sequence[int], num_classes: int):
        self.ks = _check_ks(ks)
        self.num_classes = check_int(num_classes, "num_classes", 1)
        self.reset()

    def reset(self) -> None:
        self._credit = torch.zeros(self.num_classes, len(self.ks), dtype=torch.float64)
        self._count = torch.zeros(self.num_classes, dtype=torch.float64)
        self._nan = None

    def _to_device(self, device: torch.device) -> None:
        self._credit, self._count = self._credit.to(device), self._count.to(device)

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        _check_class_count(scores, self.num_classes)
        labels = _check_batch(scores, labels, self.ks)
        self._accumulate(scores)
        self._credit.index_add_(0, labels, _credit(scores, labels, self.ks))
        self._count.index_add_(0, labels, torch.ones_like(labels, dtype=torch.float64))

    def per_class(self) -> torch.Tensor:
        """Shape ``(num_classes, len(ks))``, on the CPU; NaN for classes never seen (they have no accuracy)."""
        self._check_seen()
        return (self._credit / self._count.unsqueeze(1)).cpu()

    def _average(self, classes: torch.Tensor) -> dict:
        seen = classes & (self._count.cpu() > 0)
        n_seen = int(seen.sum())
        values = self.per_class()[seen].mean(0) if n_seen else torch.full((len(self.ks),), float("nan"))
        return {"n_classes": n_seen, **{k: float(v) for k, v in zip(self.ks, values)}}

    def compute(self) -> dict:
        """``{"n_classes": classes averaged, K: macro-average top-K accuracy, ...}``."""
        if int((self._count > 0).sum()) == 0:  # the one read of the device
            raise RuntimeError("MacroTopKAccuracy.compute() called before any update()")
        return self._average(torch.ones(self.num_classes, dtype=torch.bool))

    def compute_by_group(self, train_class_counts: Sequence[int] | torch.Tensor) -> dict[str, dict]:
        """``{"all": ..., "few": ..., "medium": ..., "many": ...}``, each as :meth:`compute`.

        A group with no evaluated class reports ``n_classes = 0`` and NaN accuracies (not a number to average).
        """
        groups = shot_groups(train_class_counts)
        if groups["few"].numel() != self.num_classes:
            raise ValueError(f"'train_class_counts' should have {self.num_classes} entries, got {groups['few'].numel()}")
        return {"all": self.compute(), **{name: self._average(mask) for name, mask in groups.items()}}


def _membership_sums(scores: torch.Tensor, ks: tuple[int, ...]) -> torch.Tensor:
    """Each class's top-K credit summed over the rows, shape ``(L, len(ks))`` in float64: the tie rule of this module
    applied to every class, ``clamp((K - g) / (t + 1), 0, 1)`` with ``g`` classes scoring strictly higher and ``t``
    others tied (a row's credits sum to K). One ``(batch, L)`` credit at a time."""
    ascending = scores.sort(1).values
    not_above = torch.searchsorted(ascending, scores, right=True)  # L - g
    below = torch.searchsorted(ascending, scores)  # L - g - (t + 1)
    higher = (scores.shape[1] - not_above).to(torch.float64)
    tied = (not_above - below).to(torch.float64)
    return torch.stack([((k - higher) / tied).clamp(0.0, 1.0).sum(0) for k in ks], dim=1)


class TopKCoverage(_DeviceSums):
    """The share of inputs whose top K holds each class, for several K at once (ties: the module's rule).

    A classifier of balanced classes holds each class in about K / L of the top Ks. A top-K hinge loss penalises
    only the (K+1)-th score, so it can settle on classes that sit in every input's top K whatever the input, leaving
    the true class the places that remain: :meth:`crowded_classes` counts the classes in the top K of more than a
    given share of the inputs.

    >>> metric = TopKCoverage(ks=(1, 2), num_classes=3)
    >>> metric.update(torch.tensor([[0.9, 0.5, 0.1], [0.8, 0.1, 0.7]]))
    >>> metric.compute()[2].tolist()
    [1.0, 0.5, 0.5]
    >>> metric.crowded_classes(share=0.5)
    {1: 1, 2: 1}
    """

    def __init__(self, ks: Sequence[int], num_classes: int):
        self.ks = _check_ks(ks)
        self.num_classes = check_int(num_classes, "num_classes", 1)
        if max(self.ks) > self.num_classes:
            raise ValueError(f"'ks' should not exceed 'num_classes' {self.num_classes}, got {max(self.ks)}")
        self.reset()

    def reset(self) -> None:
        self._credit = torch.zeros(self.num_classes, len(self.ks), dtype=torch.float64)
        self._count, self._nan = 0, None

    def _to_device(self, device: torch.device) -> None:
        self._credit = self._credit.to(device)

    def update(self, scores: torch.Tensor) -> None:
        _check_score_shape(scores)
        _check_class_count(scores, self.num_classes)
        self._accumulate(scores)
        self._credit += _membership_sums(scores, self.ks)
        self._count += scores.shape[0]

    def compute(self) -> dict[int, torch.Tensor]:
        """For each K, the share of the inputs whose top K holds each class: a float64 CPU tensor of ``num_classes``
        entries that sum to K."""
        if self._count == 0:
            raise RuntimeError("TopKCoverage.compute() called before any update()")
        self._check_seen()
        shares = (self._credit / self._count).cpu()
        return {k: shares[:, i] for i, k in enumerate(self.ks)}

    def crowded_classes(self, share: float = 0.5) -> dict[int, int]:
        """For each K, how many classes are in the top K of more than ``share`` of the inputs."""
        if check_real(share, "share", 0.0) >= 1:
            raise ValueError(f"'share' should be in [0, 1), got {share}")
        return {k: int((shares > share).sum()) for k, shares in self.compute().items()}


def _probabilities(scores: torch.Tensor, from_logits: bool) -> torch.Tensor:
    _check_score_matrix(scores)
    return torch.softmax(scores.double(), dim=1) if from_logits else scores.double()


class AverageKThreshold:
    """The average-K threshold of Garcin's thesis (ch. 5, Algorithm 1), computed on validation data.

    All validation probabilities are flattened and sorted in decreasing order; with ``n`` samples and
    ``m = floor(K n)``, the threshold is the midpoint of entries ``m`` and ``m + 1`` (1-based), so that
    keeping the classes whose probability is at least the threshold returns K classes per sample on
    average. ``K`` may be fractional (e.g. 4.1); it must satisfy ``1 <= K n < n L``.

    >>> threshold = AverageKThreshold(1, from_logits=False)
    >>> threshold.update(torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]]))
    >>> round(threshold.compute(), 6)  # midpoint of the 2nd and 3rd largest of (0.6, 0.5, 0.4, 0.3, 0.1, 0.1)
    0.45
    """

    def __init__(self, k: float, *, from_logits: bool = True):
        self.k = check_real(k, "k", low=0.0, strict=True)
        self.from_logits = from_logits
        self._chunks: list[torch.Tensor] = []
        self._n_samples = 0

    def update(self, scores: torch.Tensor) -> None:
        probabilities = _probabilities(scores, self.from_logits)
        self._chunks.append(probabilities.flatten().cpu())
        self._n_samples += probabilities.shape[0]

    def compute(self) -> float:
        if not self._chunks:
            raise RuntimeError("AverageKThreshold.compute() called before any update()")
        flat = torch.cat(self._chunks)
        rank = int(self.k * self._n_samples)  # m = floor(K n)
        if rank < 1 or rank >= flat.numel():
            raise ValueError(f"'k' * n_samples should be in [1, n_samples * L) = [1, {flat.numel()}), "
                             f"got {self.k} * {self._n_samples}")
        largest = torch.topk(flat, rank + 1).values  # sorted, decreasing
        return float((largest[rank - 1] + largest[rank]) / 2)


class AverageKAccuracy:
    """Average-K accuracy with a fixed threshold (from :class:`AverageKThreshold` on validation data).

    A sample is correct when its true class's probability is at least the threshold (thesis Eq. 5.17);
    ``compute`` also reports the mean number of classes returned, which is close to K when the
    validation and test distributions agree.

    >>> metric = AverageKAccuracy(0.45, from_logits=False)
    >>> metric.update(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5]]), torch.tensor([1, 2]))
    >>> metric.compute()
    {'accuracy': 0.5, 'mean_set_size': 1.0}
    """

    def __init__(self, threshold: float, *, from_logits: bool = True):
        self.threshold = check_real(threshold, "threshold")
        self.from_logits = from_logits
        self._correct = 0
        self._returned = 0
        self._count = 0

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        probabilities = _probabilities(scores, self.from_logits)
        labels = check_labels(labels, probabilities, "labels")
        kept = probabilities >= self.threshold
        self._correct += int(kept.gather(1, labels.unsqueeze(1)).sum())
        self._returned += int(kept.sum())
        self._count += probabilities.shape[0]

    def compute(self) -> dict[str, float]:
        if self._count == 0:
            raise RuntimeError("AverageKAccuracy.compute() called before any update()")
        return {"accuracy": self._correct / self._count, "mean_set_size": self._returned / self._count}
