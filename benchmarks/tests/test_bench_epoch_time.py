"""Fig. 3's epoch benchmark (:mod:`benchmarks.bench_epoch_time`): its baseline measured first and last, and the
overheads it judges only when that baseline held still."""

from benchmarks._fig3_setup import points
from benchmarks.bench_epoch_time import _identity, bracketed, print_targets
from experiments.analysis.timings import baseline_drift


def _row(loss, seconds, repeat=0, k="", backend=""):
    return {"loss": loss, "backend": backend, "K": k, "images": 45000, "repeat": repeat, "epoch_seconds": seconds}


def test_cross_entropy_opens_and_closes_the_points():
    chosen = bracketed(points([5], [3], ["auto"]))
    assert [(point["loss"], point["repeat"]) for point in chosen] == [
        ("cross_entropy", 0), ("smooth_hinge", 0), ("noised_balanced B=3", 0), ("cross_entropy", 1)]


def test_the_drift_is_the_closing_baseline_over_the_opening_one():
    rows = [_row("cross_entropy", 5.0), _row("smooth_hinge", 4.0, k=5), _row("cross_entropy", 4.5, repeat=1)]
    assert abs(baseline_drift(rows) - (-0.1)) < 1e-12
    assert baseline_drift(rows[:2]) is None  # a resumed run that did not measure both


def test_overheads_are_judged_against_the_mean_baseline_only_when_it_held_still(capsys):
    held = [_row("cross_entropy", 4.0), _row("noised_balanced B=3", 4.1, k=5, backend="auto"),
            _row("cross_entropy", 4.04, repeat=1)]
    print_targets(held, on_gpu=True)
    out = capsys.readouterr().out
    assert "cross-entropy: 4.02 s per epoch of 45,000 images (4.00 s and 4.04 s, first and last" in out
    assert "H100/H200: met)" in out and "no overhead verdict" not in out
    assert "+2.0% over cross-entropy  (target <= +2%)" in out  # 4.1 / 4.02 - 1
    moved = [_row("cross_entropy", 5.35), _row("noised_balanced B=3", 4.42, k=5, backend="auto"),
             _row("cross_entropy", 4.5, repeat=1)]
    print_targets(moved, on_gpu=True)
    out = capsys.readouterr().out
    assert "no overhead verdict: cross-entropy moved -15.9% between its first and last measurement" in out
    assert "-10.3% over cross-entropy\n" in out and "target <= +2%" not in out  # 4.42 / 4.925 - 1


def test_a_lone_baseline_gives_its_time_but_no_overhead_verdict(capsys):
    print_targets([_row("cross_entropy", 4.0), _row("noised_balanced B=3", 4.04, k=5, backend="auto")], on_gpu=True)
    out = capsys.readouterr().out
    assert "cross-entropy: 4.00 s per epoch of 45,000 images (4.00 s; target <= 5.0 s on an H100/H200: met)" in out
    assert "no overhead verdict: cross-entropy was not measured both first and last" in out
    assert "+1.0% over cross-entropy\n" in out


def test_a_point_is_done_only_at_the_same_commit_and_engine():
    row = {"device_name": "gpu", "commit": "a" * 40, "engine_code": "e1", "model": "m", "compile": "default",
           "loss": "cross_entropy", "backend": "", "K": "", "batch_size": 64, "images": 45000}
    assert _identity(row) == _identity({**row, "repeat": "0", "batch_size": "64"})  # as read back from the CSV
    assert _identity(row) != _identity({**row, "repeat": 1})
    assert _identity(row) != _identity({**row, "commit": "b" * 40})
    assert _identity(row) != _identity({**row, "engine_code": "e2"})
