"""Fig. 3 from ``benchmarks/bench_epoch_time.py``: the script's CSV is read back, drawn and judged (here with a real
CPU run of the script on a small model; on a GPU the notebook reads the CUDA rows the same way)."""

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

from experiments import claims, paths, plots, summary, timings  # noqa: E402


def test_epoch_time_benchmark_is_read_back_drawn_and_judged(tmp_path):
    out = tmp_path / "fig3.csv"
    command = [sys.executable, str(paths.PROJECT_ROOT / "benchmarks" / "bench_epoch_time.py"), "--device", "cpu",
               "--model", "small_cnn", "--batch-size", "16", "--images", "64", "--epochs", "1", "--compile", "eager",
               "--ks", "1", "5", "--samples", "3", "--out", str(out)]
    for _ in range(2):  # the second call finds every point done and appends nothing
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
    assert timings.load_epoch_times(out, device="cuda") is None
    times = timings.load_epoch_times(out, device="cpu")
    # cross-entropy, then for K = 1 and 5: the smoothed hinge and the noised loss (auto and torch path)
    assert len(times) == 1 + 2 * 3
    assert set(times["loss"]) == {"cross_entropy", "smooth_hinge", "noised_balanced B=3",
                                  "noised_balanced B=3 (torch path)"}
    assert (times["epoch_seconds"] > 0).all() and (times["loss_seconds"] > 0).all()
    assert "(64, augmented on the device)" in timings.describe(times)
    assert "small_cnn, batch 16, the last of 1 whole epochs of the training engine (eager" in timings.describe(times)
    table = summary.epoch_time_table(times)
    assert list(table.columns) == ["K=1 (s)", "K=5 (s)"] and len(table) == 4
    assert (table.loc["cross_entropy"] == round(times["epoch_seconds"].iloc[0], 2)).all()
    figure = plots.epoch_time_against_k(times, "test")
    assert len(figure.axes[0].lines) == 3 + 1  # three losses with K, cross-entropy's line
    verdict = claims.claim_4_measured(times)
    assert not verdict.training
    assert not any("torch path" in line for line in verdict.evidence)
    assert len(verdict.evidence) == 2  # the smoothed hinge and the noised loss


def test_training_step_benchmark_writes_each_loss_with_its_overhead_over_cross_entropy(tmp_path):
    """``benchmarks/bench_training_step.py`` on CPU with a small model, eager and compiled (``aot_eager``, fast to
    compile): one row per mode and loss, each with its overhead over the same mode's cross-entropy step."""
    import csv

    out = tmp_path / "step.csv"
    command = [sys.executable, str(paths.PROJECT_ROOT / "benchmarks" / "bench_training_step.py"), "--device", "cpu",
               "--model", "small_cnn", "--batch-size", "8", "--steps", "2", "--warmup", "1", "--ks", "5",
               "--samples", "3", "--compiler", "aot_eager", "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["mode"], row["loss"]) for row in rows] == [
        (mode, loss) for mode in ("eager", "compiled") for loss in ("cross_entropy", "smooth_hinge", "noised_balanced B=3")]
    for row in rows:
        ce = next(r for r in rows if r["mode"] == row["mode"] and r["loss"] == "cross_entropy")
        assert float(row["ms_per_step"]) > 0
        assert abs(float(row["overhead_vs_ce"]) - (float(row["ms_per_step"]) / float(ce["ms_per_step"]) - 1)) < 1e-3
    assert "vs CE" in run.stdout
