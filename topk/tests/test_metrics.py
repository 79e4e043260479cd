"""Streaming metrics: top-K, macro-average top-K with shot groups, and the thesis's average-K."""

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from topk.metrics import (
    AverageKAccuracy,
    AverageKThreshold,
    MacroTopKAccuracy,
    TopKAccuracy,
    TopKCoverage,
    shot_groups,
    topk_credit,
)


@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_tie_rule_is_the_expected_accuracy_under_random_tie_breaking(n_classes, seed):
    """Brute force: average, over every ordering of the classes used to break ties, of 1{y in top K}."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (3, n_classes), generator=g).double()  # many ties
    labels = torch.randint(0, n_classes, (3,), generator=g)
    ks = list(range(1, n_classes + 1))
    credit = topk_credit(scores, labels, ks)
    for row in range(3):
        orders = list(itertools.permutations(range(n_classes)))
        for column, k in enumerate(ks):
            hits = 0
            for tie_order in orders:
                ranking = sorted(range(n_classes), key=lambda j: (-scores[row, j].item(), tie_order.index(j)))
                hits += labels[row].item() in ranking[:k]
            assert credit[row, column].item() == pytest.approx(hits / len(orders))


@given(st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_coverage_is_the_expected_top_k_membership_under_random_tie_breaking(n_classes, seed):
    """Brute force, as for the accuracy: each class's share of the rows whose top K holds it, averaged over every
    ordering of the classes used to break ties; streamed over two batches."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (4, n_classes), generator=g).double()  # many ties
    ks = list(range(1, n_classes + 1))
    metric = TopKCoverage(ks, n_classes)
    metric.update(scores[:1])
    metric.update(scores[1:])
    orders = list(itertools.permutations(range(n_classes)))
    for k, shares in metric.compute().items():
        expected = torch.zeros(n_classes, dtype=torch.float64)
        for row in scores:
            for tie_order in orders:
                ranking = sorted(range(n_classes), key=lambda j: (-row[j].item(), tie_order.index(j)))
                expected[ranking[:k]] += 1 / (len(orders) * len(scores))
        torch.testing.assert_close(shares, expected)
        assert shares.sum().item() == pytest.approx(k)


def test_crowded_classes_counts_the_classes_in_most_top_ks():
    """Four classes above every other in each row (a top-5 hinge's degenerate solution) are the four crowded classes
    at K = 5 and one of them at K = 1; scores without such classes have none."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(200, 100, generator=g)
    healthy = TopKCoverage((1, 5), 100)
    healthy.update(scores)
    assert healthy.crowded_classes() == {1: 0, 5: 0}
    scores[:, [3, 17, 42, 64]] += 20 * torch.arange(1.0, 5.0)  # class 64 the highest everywhere
    crowded = TopKCoverage((1, 5), 100)
    crowded.update(scores)
    assert crowded.crowded_classes() == {1: 1, 5: 4}
    assert crowded.compute()[1][64].item() == 1.0


def test_constant_scores_get_chance_level():
    metric = TopKAccuracy(ks=(1, 5))
    metric.update(torch.zeros(10, 20), torch.arange(10))
    assert metric.compute() == {1: pytest.approx(1 / 20), 5: pytest.approx(5 / 20)}


def test_streaming_equals_one_batch():
    g = torch.Generator().manual_seed(0)
    scores, labels = torch.randn(100, 12, generator=g), torch.randint(0, 12, (100,), generator=g)
    whole, parts = MacroTopKAccuracy((1, 3), 12), MacroTopKAccuracy((1, 3), 12)
    whole.update(scores, labels)
    for chunk in torch.arange(100).split(7):
        parts.update(scores[chunk], labels[chunk])
    assert whole.compute() == parts.compute()
    micro = TopKAccuracy((1, 3))
    micro.update(scores, labels)
    expected = (torch.topk(scores, 3).indices == labels[:, None]).any(1).double().mean().item()
    assert micro.compute()[3] == pytest.approx(expected)


def test_macro_average_weights_classes_equally_and_skips_absent_classes():
    metric = MacroTopKAccuracy(ks=(1,), num_classes=4)
    scores = torch.tensor([[5.0, 0, 0, 0]] * 3 + [[0, 0, 5.0, 0]])
    metric.update(scores, torch.tensor([0, 0, 0, 1]))  # class 0: 3/3 right, class 1: 0/1, classes 2, 3 absent
    assert metric.compute() == {"n_classes": 2, 1: 0.5}
    assert torch.isnan(metric.per_class()[2:]).all()


def test_shot_groups_bounds_follow_the_paper():
    groups = shot_groups([19, 20, 100, 101, 0])
    assert groups["few"].tolist() == [True, False, False, False, True]
    assert groups["medium"].tolist() == [False, True, True, False, False]
    assert groups["many"].tolist() == [False, False, False, True, False]


def test_macro_by_group():
    metric = MacroTopKAccuracy(ks=(1,), num_classes=3)
    metric.update(torch.eye(3) * 4, torch.tensor([0, 1, 0]))  # class 0: 1/2, class 1: 1/1
    result = metric.compute_by_group([5, 50, 500])
    assert result["few"] == {"n_classes": 1, 1: 0.5}
    assert result["medium"] == {"n_classes": 1, 1: 1.0}
    assert result["many"]["n_classes"] == 0 and result["all"][1] == 0.75


@given(st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_average_k_threshold_returns_k_classes_per_sample_on_validation(k, seed):
    """Without ties, thresholding at the midpoint of entries K n and K n + 1 keeps exactly K n entries."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(30, 8, generator=g, dtype=torch.float64)
    threshold = AverageKThreshold(k)
    for part in logits.split(7):
        threshold.update(part)
    accuracy = AverageKAccuracy(threshold.compute())
    accuracy.update(logits, torch.zeros(30, dtype=torch.long))
    assert accuracy.compute()["mean_set_size"] == k


def test_average_k_accuracy_counts_true_probability_at_least_threshold():
    metric = AverageKAccuracy(0.3, from_logits=False)
    metric.update(torch.tensor([[0.3, 0.7], [0.8, 0.2]]), torch.tensor([0, 1]))
    assert metric.compute() == {"accuracy": 0.5, "mean_set_size": 1.5}


def _nan_seen_at_compute(metric):
    metric.update(torch.tensor([[0.5, 0.0]]), torch.tensor([0]))
    metric.update(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]))  # update reads nothing on the host
    metric.compute()


def _coverage_nan_seen_at_compute():
    metric = TopKCoverage((1,), 2)
    metric.update(torch.tensor([[0.5, 0.0]]))
    metric.update(torch.tensor([[float("nan"), 0.0]]))
    metric.compute()


@pytest.mark.parametrize("make", [
    lambda: _nan_seen_at_compute(TopKAccuracy((1,))),
    lambda: _nan_seen_at_compute(MacroTopKAccuracy((1,), 2)),
    lambda: TopKAccuracy((3,)).update(torch.zeros(1, 2), torch.tensor([0])),
    lambda: TopKAccuracy((1,)).update(torch.zeros(1, 2), torch.tensor([2])),
    lambda: TopKAccuracy(()),
    lambda: AverageKThreshold(0),
    lambda: _coverage_nan_seen_at_compute(),
    lambda: TopKCoverage((3,), 2),
    lambda: TopKCoverage((1,), 3).update(torch.zeros(1, 2)),
    lambda: TopKCoverage((1,), 2).crowded_classes(1.0),
])
def test_metrics_reject_bad_input(make):
    with pytest.raises((ValueError, TypeError)):
        make()


def test_metric_updates_read_nothing_on_the_host():
    """The training loop's metrics accumulate on the scores' device: ``update`` dispatches no host-reading operator
    (one read happens in ``compute``, once per evaluation)."""
    from topk.tests.test_graph_capture import DispatchTrace

    top, macro, coverage = TopKAccuracy((1, 5)), MacroTopKAccuracy((1, 5), 10), TopKCoverage((1, 5), 10)
    scores, labels = torch.randn(16, 10), torch.randint(0, 10, (16,))
    with DispatchTrace() as trace:
        top.update(scores, labels)
        macro.update(scores, labels)
        coverage.update(scores)
    assert trace.ops and trace.host_reads() == []
    assert top.compute()[5] == float((scores.topk(5).indices == labels[:, None]).any(1).double().mean())


def test_compute_before_update_is_an_error():
    with pytest.raises(RuntimeError, match="before any update"):
        TopKAccuracy().compute()
