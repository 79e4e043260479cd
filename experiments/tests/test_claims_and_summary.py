"""The verdicts read the paper's words as thresholds: fed the paper's own published numbers, every claim holds, and
each breaks when the numbers that support it are changed. Means and 95% intervals over seeds."""

import math

import pandas as pd
import pytest

from experiments.analysis import claims, summary
from experiments.spec import paper


def _frame(values: dict, column: str) -> pd.DataFrame:
    return pd.DataFrame({column: list(values), "mean": list(values.values()), "half": [0.2] * len(values),
                         "se": [0.1] * len(values)})


def test_mean_interval_is_the_student_t_95_interval():
    mean, half, n = summary.mean_interval([1.0, 2.0, 3.0])
    assert (mean, n) == (2.0, 3) and half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert summary.mean_interval([5.0, float("nan")]) == (5.0, pytest.approx(float("nan"), nan_ok=True), 1)
    assert summary.format_estimate(*summary.mean_interval([4.0])) == "4.0 (n=1)"


def test_estimate_counts_diverged_runs_and_gives_shot_group_means():
    runs = pd.DataFrame([
        {"loss": "a", "status": "done", "acc": 50.0, "acc_few": 10.0, "acc_medium": 40.0, "acc_many": 80.0},
        {"loss": "a", "status": "done", "acc": 52.0, "acc_few": 12.0, "acc_medium": 42.0, "acc_many": 82.0},
        {"loss": "a", "status": "diverged"},
        {"loss": "b", "status": "done", "acc": 1.0},
    ])
    text = summary.estimate(runs, "acc", groups="acc", loss="a")
    assert text.startswith("51.0 ± 12.7 (11.0/41.0/81.0)") and text.endswith("[1 diverged]")
    assert summary.estimate(runs, "acc", loss="c") == "-"


def test_label_noise_fit_table_shows_each_loss_fit_per_p_and_a_dash_for_runs_stored_before_it():
    runs = pd.DataFrame([{"loss": "ce", "p": 0.4, "status": "done", "flipped_fit_noisy": v, "flipped_fit_clean": 60.0}
                         for v in (7.0, 9.0)] + [{"loss": "hinge", "p": 0.4, "status": "done"}])
    table = summary.label_noise_fit_table(runs, [("ce", "CE"), ("hinge", "Hinge")], [(0.4, "p=0.4")])
    assert table.loc["CE", ("p=0.4", "noisy label")] == summary.format_estimate(*summary.mean_interval([7.0, 9.0]))
    assert table.loc["CE", ("p=0.4", "true class")] == "60.0 ± 0.0"
    assert table.loc["Hinge", ("p=0.4", "noisy label")] == "-"


def test_crowded_classes_table_shows_each_seed_in_order_and_a_dash_for_runs_stored_before_it():
    runs = pd.DataFrame([{"loss": "hinge", "p": 0.4, "seed": s, "status": "done", "test_crowded_top1": c1,
                          "test_crowded_top5": c5} for s, c1, c5 in ((1, 0, 0), (0, 1, 4))]
                        + [{"loss": "ce", "p": 0.4, "seed": 0, "status": "done"}])
    table = summary.crowded_classes_table(runs, [("ce", "CE"), ("hinge", "Hinge")], [(0.4, "p=0.4")], "p",
                                          lambda p: (1, 5))
    assert table.loc["Hinge", ("p=0.4", "top-5")] == "4 / 0"
    assert table.loc["Hinge", ("p=0.4", "top-1")] == "1 / 0"
    assert table.loc["CE", ("p=0.4", "top-5")] == "-"
    by_k = summary.crowded_classes_table(runs.rename(columns={"p": "K"}).assign(K=5), [("hinge", "Hinge")],
                                         [(5, "K=5")], "K", lambda k: sorted({1, k}))
    assert list(by_k.columns) == [("K=5", "top-1"), ("K=5", "top-5")] and by_k.iloc[0, 1] == "4 / 0"


def test_a_crowding_note_lists_the_levels_with_crowded_classes_and_decides_nothing():
    runs = pd.DataFrame([{"loss": "noised", "p": p, "seed": s, "test_crowded_top5": c}
                         for p, counts in ((0.0, (0, 0)), (0.4, (2, 4))) for s, c in zip((1, 0), counts)]
                        + [{"loss": "ce", "p": 0.4, "seed": 0, "test_crowded_top5": 0}])
    note = summary.crowding_note(runs, "p", 5, loss="noised")
    assert "p=0.4: 4, 2 " in note and "p=0:" not in note  # seeds in order
    assert summary.crowding_note(runs, "p", 5, loss="ce") is None
    assert summary.crowding_note(runs.drop(columns="test_crowded_top5"), "p", 5) is None  # stored before
    verdict = claims.claim_1(_frame(paper.TABLE_2, "epsilon"))
    noted = verdict.noting(note)
    assert noted.status == verdict.status and noted.evidence == (*verdict.evidence, f"note: {note}")
    assert verdict.noting(None) == verdict


def test_an_interval_wider_than_the_scale_shows_the_seeds_range_instead():
    runs = pd.DataFrame([{"p": 0, "status": "done", "acc": a} for a in (13.0, 83.0)] +
                        [{"p": 1, "status": "done", "acc": a} for a in (95.0, 96.0)])
    assert summary.estimate(runs, "acc", p=0) == "13.0-83.0 (2 seeds)"  # 48.0 ± 444.7 would leave [0, 100]
    assert summary.estimate(runs, "acc", p=1) == "95.5 ± 6.4"


def test_comparison_table_puts_ours_beside_the_paper_and_writes_markdown():
    table = summary.comparison_table([("x", "X")], [(1, "K=1"), (5, "K=5")], ours=lambda r, c: f"o{c}",
                                     paper=lambda r, c: f"p{c}", row_name="loss", column_name="K")
    assert list(table.loc["X"]) == ["o1", "p1", "o5", "p5"]
    assert summary.to_markdown(table).splitlines()[0] == "| loss | K=1 ours | K=1 paper | K=5 ours | K=5 paper |"


def test_markdown_gives_each_level_of_a_row_index_its_own_column():
    table = pd.DataFrame({"chosen": ["x3", "x10"]},
                         index=pd.MultiIndex.from_tuples([("cifar", "ce top5"), ("cifar", "hinge top5")],
                                                         names=["data", "loss"]))
    assert summary.to_markdown(table).splitlines() == [
        "| data | loss | chosen |", "|---|---|---|", "| cifar | ce top5 | x3 |", "| cifar | hinge top5 | x10 |"]


def test_claim_1_holds_on_table_2_and_breaks_if_eps_0_learns():
    assert claims.claim_1(_frame(paper.TABLE_2, "epsilon")).status == claims.REPRODUCED
    learned = claims.claim_1(_frame({**paper.TABLE_2, 0.0: 90.0}, "epsilon"))
    assert learned.status == claims.NOT_REPRODUCED and learned.evidence[0].startswith("✗ eps = 0 fails")
    # eps = 1e-2 at 85 against 0.9 x 94.46 = 85.01: within one standard error (here 0.1 and 0.9 x 0.1), then beyond it
    near = claims.claim_1(_frame({**paper.TABLE_2, 1e-2: 85.0}, "epsilon"))
    assert near.status == claims.INCONCLUSIVE and near.evidence[2].endswith("within one standard error: eps=0.01 (0.13)")
    far = claims.claim_1(_frame({**paper.TABLE_2, 1e-2: 84.5}, "epsilon"))
    assert far.status == claims.NOT_REPRODUCED and far.evidence[2].startswith("✗ eps >= 1e-2 learns")
    assert claims.claim_1(_frame({**paper.TABLE_2, 1e-2: 85.0}, "epsilon").drop(columns="se")).status == \
        claims.NOT_REPRODUCED  # no standard errors (published numbers, one seed): the means decide
    for diverged in (0.0, 1e-2):  # a diverged setting (NaN) neither fails nor learns: the part fails, as before
        verdict = claims.claim_1(_frame({**paper.TABLE_2, diverged: float("nan")}, "epsilon"))
        assert verdict.status == claims.NOT_REPRODUCED and "n/a" in " ".join(verdict.evidence)
    # low accuracies with wide seeds: the best against 0.9 x itself is one mean (its SE x 0.1), not two: decided
    low = _frame({0.0: 2.0, 1e-4: 2.0, 1e-3: 2.0, 1e-2: 30.0}, "epsilon").assign(se=2.5)  # 30 - 27 < hypot(2.5, 2.25)
    assert claims.claim_1(low).status == claims.REPRODUCED


def test_claim_2_needs_sparse_gradients_rising_with_eps_and_learning():
    sparsity = _frame({0.0: 2.0, 1e-4: 2.0, 1e-2: 2.8, 1.0: 3.9, 100.0: 3.95}, "epsilon").assign(se=0.01)
    table2 = _frame(paper.TABLE_2, "epsilon")
    assert claims.claim_2(sparsity, 3, 100, table2).status == claims.REPRODUCED
    near = claims.claim_2(sparsity.assign(se=0.1), 3, 100, table2)  # 3.95 against B + 1 = 4, one SE 0.1 away
    assert near.status == claims.INCONCLUSIVE and near.evidence[0].startswith("? at most B + 1")
    assert near.evidence[0].endswith("within one standard error: eps=100 (0.10)")
    exact = _frame({0.0: 2.0, 1e-2: 2.8, 100.0: 4.0}, "epsilon").assign(se=0.0)  # every seed at B + 1: no noise, a tie
    assert claims.claim_2(exact, 3, 100, table2).status == claims.REPRODUCED
    dense = _frame({0.0: 2.0, 1e-4: 2.0, 1.0: 60.0}, "epsilon")
    assert claims.claim_2(dense, 3, 100, table2).status == claims.NOT_REPRODUCED


def test_claim_3_holds_on_table_3_and_breaks_when_b_matters():
    assert claims.claim_3(_frame(paper.TABLE_3, "B")).status == claims.REPRODUCED
    assert claims.claim_3(_frame({**paper.TABLE_3, 1: 80.0}, "B")).status == claims.NOT_REPRODUCED
    noisy = _frame({**paper.TABLE_3, 1: 91.0}, "B").assign(se=2.0)  # 3.6 points apart, within 2 standard errors
    assert claims.claim_3(noisy).status == claims.INCONCLUSIVE  # ... and 0.4 from that tolerance, noise 2.8
    assert claims.claim_3(_frame(paper.TABLE_3, "B").assign(se=0.3)).status == claims.REPRODUCED  # span 0.44 vs 1 +- 0.42


def test_claim_3_is_inconclusive_either_side_of_its_threshold_within_the_noise():
    """The two quick runs that flipped (issue 16): span 1.20 against 1.36, span 1.60 against 1.00, se 0.68 and 0.45."""
    flipped = [{1: 90.0, 3: 91.2, 10: 90.5}, {1: 89.4, 3: 91.0, 10: 90.2}]
    verdicts = [claims.claim_3(_frame(means, "B").assign(se=se)) for means, se in zip(flipped, (0.68, 0.45))]
    assert [v.status for v in verdicts] == [claims.INCONCLUSIVE] * 2
    assert verdicts[1].evidence[0].startswith("? the means over B span 1.60 points against 1.00")
    assert claims.claim_3(_frame({1: 87.0, 3: 91.0, 10: 91.0}, "B").assign(se=0.45)).status == claims.NOT_REPRODUCED


def test_claim_4_flat_noised_time_and_growing_smoothed_time():
    rows = [("noised_balanced B=3", 1, 60.0), ("noised_balanced B=3", 50, 62.0),
            ("smooth_hinge", 1, 70.0), ("smooth_hinge", 50, 200.0)]
    frame = pd.DataFrame(rows, columns=["loss", "K", "epoch_seconds"])
    assert claims.claim_4(frame).status == claims.REPRODUCED
    frame.loc[1, "epoch_seconds"] = 120.0
    assert claims.claim_4(frame).status == claims.NOT_REPRODUCED
    on_cpu = claims.claim_4(frame, device="cpu")  # sequential runs on a shared CPU: no basis for a timing claim
    assert on_cpu.status == claims.INCONCLUSIVE and "would have said 'not reproduced'" in on_cpu.evidence[0]
    one_k = claims.claim_4(frame[frame["K"] == 50])  # a GPU measurement of one K (NOTES §20): no trend to judge
    assert one_k.status == claims.INCONCLUSIVE and "measured at K=50 alone" in " ".join(one_k.evidence)


def test_claim_4_on_a_gpu_is_undecided_within_the_drift_of_its_bracketed_baseline():
    """bench_epoch_time measures cross-entropy first and last (repeat 0 and 1): how far it moved is the noise of one
    point. A ratio that noise could put on either side of its threshold is undecided; far from it, judged."""
    def times(ce_last, noised_at_50):
        rows = [("cross_entropy", None, 5.0, 0, ""), ("noised_balanced B=3", 1, 5.0, 0, "auto"),
                ("noised_balanced B=3", 50, noised_at_50, 0, "auto"), ("noised_balanced B=3 (torch path)", 50, 50.0, 0,
                                                                       "torch"),
                ("smooth_hinge", 1, 5.0, 0, ""), ("smooth_hinge", 50, 10.0, 0, ""), ("cross_entropy", None, ce_last, 1, "")]
        return pd.DataFrame(rows, columns=["loss", "K", "epoch_seconds", "repeat", "backend"])

    steady = claims.claim_4_measured(times(ce_last=5.05, noised_at_50=5.5))  # drift 1%: x1.10 is flat
    assert steady.status == claims.REPRODUCED and not steady.training
    drifting = claims.claim_4_measured(times(ce_last=4.36, noised_at_50=5.5))  # drift 12.8%: x1.10 could be x1.24
    assert drifting.status == claims.INCONCLUSIVE
    assert "within the baseline's drift of 13%: undecided" in " ".join(drifting.evidence)
    far = claims.claim_4_measured(times(ce_last=4.36, noised_at_50=10.0))  # x2.0 is beyond any such drift
    assert far.status == claims.NOT_REPRODUCED


def test_claim_5_holds_on_table_4_and_breaks_if_ce_wins_under_noise():
    table4 = pd.DataFrame([{"loss": loss, "p": p, "mean": values[i][0]} for loss, values in paper.TABLE_4.items()
                           for i, p in enumerate(paper.LABEL_NOISE)])
    assert claims.claim_5(table4).status == claims.REPRODUCED
    smooth = table4.loc[(table4["loss"] == "smooth_hinge") & (table4["p"] == 0.3), "mean"].item()
    ce_at_p3 = (table4["loss"] == "cross_entropy") & (table4["p"] == 0.3)
    table4["se"] = 0.5  # a difference of two means: one standard error sqrt(2) x 0.5 = 0.71
    table4.loc[ce_at_p3, "mean"] = smooth + 0.5
    near = claims.claim_5(table4)
    assert near.status == claims.INCONCLUSIVE and near.evidence[0].endswith("within one standard error: p=0.3 (0.71)")
    table4.loc[ce_at_p3, "mean"] = smooth + 1.0
    assert claims.claim_5(table4).status == claims.NOT_REPRODUCED
    table4.loc[ce_at_p3, "mean"] = 95.0
    assert claims.claim_5(table4).status == claims.NOT_REPRODUCED
    table4.loc[ce_at_p3, "mean"] = 80.0
    smooth_at_p4 = (table4["loss"] == "smooth_hinge") & (table4["p"] == 0.4)
    table4.loc[smooth_at_p4, "mean"] = float("nan")  # diverged: it neither beats CE nor loses to the noised loss
    assert [line[0] for line in claims.claim_5(table4).evidence] == ["✗", "✓", "✗"]


def test_claim_6_holds_on_table_5_and_breaks_if_ldam_wins():
    table5 = pd.DataFrame([{"loss": loss, "K": k, "mean": v[0], "few": v[2][0]}
                           for k, row in paper.TABLE_5.items() for loss, v in row.items()])
    assert claims.claim_6(table5).status == claims.REPRODUCED
    ldam_at_3 = (table5["loss"] == "ldam") & (table5["K"] == 3)
    noised = table5.loc[(table5["loss"] == "noised_imbalanced") & (table5["K"] == 3), "mean"].item()
    table5 = table5.assign(se=1.0, few_se=1.0)
    table5.loc[ldam_at_3, "mean"] = noised - 1.0  # within sqrt(2) x 1.0 of the noised loss's
    near = claims.claim_6(table5)
    assert near.status == claims.INCONCLUSIVE and any(line.endswith("within one standard error: ldam (1.41)")
                                                      for line in near.evidence)
    table5.loc[ldam_at_3, "mean"] = 70.0
    assert claims.claim_6(table5).status == claims.NOT_REPRODUCED
    table5.loc[ldam_at_3, "mean"] = noised - 5.0
    table5.loc[(table5["loss"] == "smooth_hinge") & (table5["K"] == 5), "few"] = float("nan")  # diverged
    assert claims.claim_6(table5).evidence[1].startswith("✗ K=5: smoothed hinge few-shot n/a")


def test_claim_7_allows_three_standard_errors_and_no_more():
    frame = pd.DataFrame([{"K": 1, "L": 10, "epsilon": 1.0, "observed": 1.0, "standard_error": 0.1, "bound": 0.8}])
    assert claims.claim_7(frame).status == claims.REPRODUCED  # 1.0 - 0.3 <= 0.8
    frame["standard_error"] = 0.01
    assert claims.claim_7(frame).status == claims.NOT_REPRODUCED


def test_a_verdict_not_run_keeps_what_the_check_computed():
    verdict = claims.Verdict.from_parts(3, [(True, "a"), (False, "b")])
    assert verdict.status == claims.NOT_REPRODUCED and verdict.evidence == ("✓ a", "✗ b")
    skipped = verdict.not_run("too short")
    assert skipped.status == claims.NOT_RUN and "would have said 'not reproduced'" in skipped.evidence[0]
    assert skipped.evidence[1:] == verdict.evidence


def test_epoch_time_overheads_put_ours_beside_the_papers_over_cross_entropy():
    times = pd.DataFrame([("cross_entropy", None, 10.0), ("noised_balanced B=3", 1, 10.2), ("noised_balanced B=3", 5, 10.5),
                          ("smooth_hinge", 5, 13.0)], columns=["loss", "K", "epoch_seconds"])
    table = summary.epoch_time_overheads(times, paper.FIGURE_3["K=5"], k=5)
    assert table.loc["noised_balanced B=3", "ours: vs CE at K=5"] == "+5.0%"
    assert table.loc["smooth_hinge", "ours: vs CE at K=5"] == "+30.0%"
    assert table.loc["smooth_hinge", "paper: vs CE at K=5"] == f"{81 / 65 - 1:+.1%}"
    assert table.loc["cross_entropy", "ours: vs CE at K=5"] == table.loc["cross_entropy", "paper: vs CE at K=5"] == "-"
    assert table.loc["noised_balanced B=3", "K=1 (s)"] == 10.2


def test_macro_top_k_means_average_the_seeds_per_loss_and_k():
    runs = pd.DataFrame([{"loss": "ce", "K": 1, "test_macro_top1": a, "test_macro_top1_few": b}
                         for a, b in ((40.0, 10.0), (42.0, 14.0))])
    assert summary.macro_top_k_means(runs).to_dict("records") == [
        {"loss": "ce", "K": 1, "mean": 41.0, "se": 1.0, "few": 12.0, "few_se": 2.0}]


def test_gradient_sparsity_by_b_is_drawn_and_tabled():
    import matplotlib

    matplotlib.use("Agg")
    from experiments.analysis import plots

    runs = pd.DataFrame({"epsilon": [0.0, 0.0, 0.1, 1.0], "first_epoch_grad_nonzero": [2.0, 2.2, 3.0, 3.9]})
    sparsity = summary.gradient_sparsity({3: runs, 10: runs.assign(first_epoch_grad_nonzero=5.0)})
    table = summary.gradient_sparsity_table(sparsity)
    assert table.loc[0.0, ("B=3", "mean")] == 2.1 and table.loc[0.0, ("B=3", "n")] == 2
    assert table.loc[1.0, ("B=10", "mean")] == 5.0
    figure = plots.gradient_sparsity(sparsity, 100, paper.FIGURE_2_LARGE_EPSILON_NONZERO)
    assert len(figure.axes[0].lines) == 2 * 2 + 1  # a curve and an eps = 0 line per B, the paper's line
    top5 = summary.summarise(runs.assign(best_val_top5=[10.0, 12.0, 90.0, 93.0]), ["epsilon"], "best_val_top5")
    figure = plots.accuracy_against_epsilon(runs.assign(best_val_top5=1.0), top5, paper.TABLE_2)
    assert figure.axes[0].get_xscale() == "log"
