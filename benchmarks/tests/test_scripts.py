"""The benchmark scripts, each run on CPU on a small case: every row it writes carries its provenance
(:mod:`experiments.provenance`), a rerun skips what is already measured, and what reads the CSV back (Fig. 3)
draws and judges it. The timings themselves are meaningless here; the scripts are what is tested."""

import contextlib
import csv
import io
import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from experiments.analysis import claims, plots, summary, timings
from experiments.provenance import STAMP_FIELDS, git_commit

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *arguments: str) -> SimpleNamespace:
    """``python -m benchmarks.<script> arguments``, the module run as ``__main__`` as ``python -m`` runs it, in this
    process (an interpreter started for each script would import torch again: about 4 s each); its output in
    ``stdout``. Fails on a non-zero exit status. The arguments, the environment and torch's CPU random stream are
    restored after it, for the worker's next test (a script that patches a module undoes that itself)."""
    printed, arguments_before, environment = io.StringIO(), sys.argv, dict(os.environ)
    sys.argv = [script, *arguments]
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            # imported already by another test: run again as __main__, a copy of its own, as `python -m` would
            warnings.filterwarnings("ignore", "'benchmarks.* found in sys.modules", RuntimeWarning)
            runpy.run_module(f"benchmarks.{script}", run_name="__main__", alter_sys=True)
    except SystemExit as stopped:
        assert stopped.code in (None, 0), f"exit status {stopped.code}:\n{printed.getvalue()}"
    finally:
        sys.argv = arguments_before
        os.environ.clear()
        os.environ.update(environment)
    return SimpleNamespace(stdout=printed.getvalue())


def _rows(path: Path) -> list[dict]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        assert {field: row[field] for field in ("device", "commit", "torch")} == {
            "device": "cpu", "commit": git_commit(), "torch": torch.__version__}
        assert all(row[field] for field in STAMP_FIELDS)
    return rows


def test_kernel_compiles_for_sm90_without_register_spills():
    """Every launch configuration of ``benchmarks.kernel_resources`` compiles for the H100/H200 target (sm_90a, by
    Triton and its bundled ptxas; no GPU needed) and, in the training dtypes, keeps all its values in registers.
    Checked with the installed Triton (the committed reports: ``benchmarks/results/kernel_resources_*.txt``)."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.kernel_resources", "--arch", "90", "--check"], cwd=ROOT,
                         env=environment, capture_output=True, text=True, timeout=600)  # a process whose Triton compiles
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("\n") >= 2 + 7 + 20, run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA, run the script itself")
def test_fused_kernel_benchmark_appends_each_configuration_once(tmp_path):
    """``benchmarks.bench_fused_kernel`` on its smoke grid (the kernel interpreted on CPU): one CSV row per method and
    configuration, and a rerun skips what is already there."""
    out = tmp_path / "bench.csv"
    for _ in range(2):
        _run("bench_fused_kernel", "--device", "cpu", "--grid", "smoke", "--budget-s", "0.01", "--out", str(out))
    rows = _rows(out)
    methods = {row["method"] for row in rows}
    assert {"fused", "torch", "cross_entropy"} <= methods
    assert len(rows) == 8 * len(methods)  # 2 kinds of input x 2 class counts x 2 values of k, each method once
    assert all(row["status"] == "ok" and float(row["ms"]) > 0 and float(row["noise_floor_ms"]) > 0 for row in rows)
    assert {(row["logit_scale"], row["epsilon"]) for row in rows} == {("1.0", "1.0"), ("20.0", "0.01")}


def test_the_epoch_times_read_back_are_the_last_measurements_alone(tmp_path):
    """Two measurements at one commit with another engine (or model, batch, images, epochs): only the last one's rows
    are read back, so that its baseline's drift pairs its own first and closing cross-entropy."""
    columns = ["device", "device_name", "commit", "compile", "engine_code", "model", "batch_size", "images", "epochs",
               "loss", "backend", "K", "repeat", "epoch_seconds", "loss_seconds"]
    common = ["cuda", "H200", "abc", "reduce-overhead"]
    rows = [[*common, "old", "densenet40_40", 64, 45000, 2, "cross_entropy", "", "", 0, 9.0, 0.01],
            [*common, "new", "densenet40_40", 64, 45000, 2, "cross_entropy", "", "", 0, 5.0, 0.01],
            [*common, "new", "densenet40_40", 64, 45000, 2, "smooth_hinge", "", 5, 0, 5.2, 0.02],
            [*common, "new", "densenet40_40", 64, 45000, 2, "noised_balanced B=3", "auto", 5, 0, 5.1, 0.04],
            [*common, "new", "densenet40_40", 64, 45000, 2, "cross_entropy", "", "", 1, 4.9, 0.01]]
    path = tmp_path / "fig3_epoch_time.csv"
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    times = timings.load_epoch_times(path)
    assert list(times["engine_code"]) == ["new"] * 4
    assert abs(timings.baseline_drift(times.to_dict("records")) - (4.9 / 5.0 - 1)) < 1e-12


def test_epoch_time_benchmark_is_read_back_drawn_and_judged(tmp_path):
    """``benchmarks.bench_epoch_time`` on a small model: the rows Fig. 3 and claim 4 are made of."""
    out = tmp_path / "fig3.csv"
    for _ in range(2):  # the second call finds every point done and appends nothing
        _run("bench_epoch_time", "--device", "cpu", "--model", "small_cnn", "--batch-size", "16", "--images", "64",
             "--epochs", "1", "--compile", "eager", "--ks", "1", "5", "--samples", "3", "--out", str(out))
    assert len(_rows(out)) == 1 + 2 * 3 + 1
    assert [row["repeat"] for row in _rows(out) if row["loss"] == "cross_entropy"] == ["0", "1"]
    assert timings.load_epoch_times(out, device="cuda") is None
    times = timings.load_epoch_times(out, device="cpu")
    # cross-entropy, then for K = 1 and 5: the smoothed hinge and the noised loss (auto and torch path), then
    # cross-entropy again
    assert len(times) == 1 + 2 * 3 + 1
    assert set(times["loss"]) == {"cross_entropy", "smooth_hinge", "noised_balanced B=3",
                                  "noised_balanced B=3 (torch path)"}
    assert (times["epoch_seconds"] > 0).all() and (times["loss_seconds"] > 0).all()
    assert "(64, augmented on the device)" in timings.describe(times)
    assert "small_cnn, batch 16, the last of 1 whole epochs of the training engine (eager" in timings.describe(times)
    table = summary.epoch_time_table(times)
    assert list(table.columns) == ["K=1 (s)", "K=5 (s)"] and len(table) == 4
    baseline = times[times["loss"] == "cross_entropy"]["epoch_seconds"]
    assert (table.loc["cross_entropy"] == round((baseline.iloc[0] + baseline.iloc[1]) / 2, 2)).all()
    figure = plots.epoch_time_against_k(times, "test")
    assert len(figure.axes[0].lines) == 3 + 1  # three losses with K, cross-entropy's line
    verdict = claims.claim_4_measured(times)
    assert not verdict.training
    assert not any("torch path" in line for line in verdict.evidence)
    assert len(verdict.evidence) == 2  # the smoothed hinge and the noised loss


def test_training_step_benchmark_writes_each_loss_with_its_overhead_over_cross_entropy(tmp_path):
    """``benchmarks.bench_training_step`` with a small model, eager and compiled (``aot_eager``, fast to compile):
    one row per mode and loss, each with its overhead over the same mode's cross-entropy step."""
    out = tmp_path / "step.csv"
    run = _run("bench_training_step", "--device", "cpu", "--model", "small_cnn", "--batch-size", "8", "--steps", "2",
               "--warmup", "1", "--ks", "5", "--samples", "3", "--compiler", "aot_eager", "--out", str(out))
    rows = _rows(out)
    assert [(row["mode"], row["loss"]) for row in rows] == [
        (mode, loss) for mode in ("eager", "compiled") for loss in ("cross_entropy", "smooth_hinge", "noised_balanced B=3")]
    for row in rows:
        ce = next(r for r in rows if r["mode"] == row["mode"] and r["loss"] == "cross_entropy")
        assert float(row["ms_per_step"]) > 0
        assert abs(float(row["overhead_vs_ce"]) - (float(row["ms_per_step"]) / float(ce["ms_per_step"]) - 1)) < 1e-3
    assert "vs CE" in run.stdout


def test_profile_time_refuses_a_call_of_no_training_step(tmp_path, capsys):
    with pytest.raises(AssertionError, match="exit status 2"):  # argparse's usage error
        _run("bench_profile_time", "smoke", "--device", "cpu", "--steps-per-call", "0", "--out", str(tmp_path / "p.csv"))
    assert "--steps-per-call should be a positive number of training steps, got 0" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()


def test_profile_time_estimate_writes_one_row_per_notebook_and_setup(tmp_path):
    """``benchmarks.bench_profile_time`` on the smoke profile: every row of the workload gets a measured rate and
    hours equal to its images divided by those rates."""
    out = tmp_path / "profile.csv"
    _run("bench_profile_time", "smoke", "--device", "cpu", "--budget", "0.05", "--steps-per-call", "1", "--out",
         str(out))
    rows = _rows(out)
    assert {row["notebook"] for row in rows} == {"table2_fig2_epsilon", "table3_samples", "fig3_epoch_time",
                                                 "table4_table7_label_noise", "table5_table8_plantnet",
                                                 "table6_imagenet_lt", "table9_imagenet"}
    for row in rows:
        assert row["compile"] == "eager"  # make's default on a CPU
        seconds = int(row["train_images"]) / float(row["train_images_per_s"]) + int(row["eval_images"]) / float(
            row["eval_images_per_s"])
        assert float(row["hours"]) == pytest.approx(seconds / 3600, rel=1e-3, abs=1e-4)


def test_dispatch_benchmark_prints_each_path_through_the_operators_and_direct():
    """``benchmarks.bench_dispatch`` on a CPU: a line per path with what one step dispatches (the fused path: one
    launch forward, one backward) and both host times with their ratio."""
    run = _run("bench_dispatch", "--budget-s", "0.01")
    for path, launches in (("fused kernel", 2), ("PyTorch path", 0), ("CPU kernel", 0)):
        counted = re.search(rf"^{path}, one forward \+ backward: (\d+) ATen operators besides views \((.*)\), \d+ views, "
                            rf"(\d+) Triton launches$", run.stdout, re.M)
        assert counted and int(counted[3]) == launches, run.stdout
        named = re.findall(r"aten\.\w+ x(\d+)", counted[2])
        assert "aten.relu x1" in counted[2] and sum(map(int, named)) == int(counted[1])  # the hinge, each op counted
    for path in ("fused kernel", "PyTorch path", "CPU kernel"):
        assert re.search(rf"^{path}: through the operators \d+ us, direct \d+ us, operators / direct x\d", run.stdout,
                         re.M), run.stdout


def test_ddp_noise_benchmark_prints_a_variance_ratio_per_logit_scale():
    run = _run("bench_ddp_noise", "--processes", "2", "--repeats", "3")
    ratios = re.findall(r"^2 processes, logits ([\d.]+) x N\(0, 1\), .*: variance with shared noise / independent "
                        r"x(\d+\.\d\d)$", run.stdout, re.M)
    assert [scale for scale, _ in ratios] == ["0.05", "1", "5"], run.stdout
    assert all(float(ratio) > 0 for _, ratio in ratios)


def test_compile_time_benchmark_writes_each_loss_s_first_second_and_short_batch_step(tmp_path):
    """``benchmarks.bench_compile_time`` on cross-entropy, traced by Dynamo without inductor's code generation (what
    it measures takes minutes on a CPU): a row with the three steps' times, the first (a tracing) the longest."""
    out = tmp_path / "compile.csv"
    _run("bench_compile_time", "--losses", "cross_entropy", "--batch", "4", "--backend", "eager", "--out", str(out))
    [row] = _rows(out)
    assert (row["loss"], row["batch"], row["backend"]) == ("cross_entropy", "4", "eager")
    assert float(row["first_step_s"]) > float(row["second_step_s"]) > 0


def test_cpu_step_benchmark_times_each_variant_against_the_engine_s_step(tmp_path):
    """``benchmarks.bench_cpu_step`` on the smoke profile's step (compiled by ``aot_eager``, fast to compile): a row per
    variant with its ratio to the engine's step, measured in the same rounds, and how far its first loss moved."""
    out = tmp_path / "cpu_step.csv"
    run = _run("bench_cpu_step", "--profile", "smoke", "--compiler", "aot_eager", "--budget-s", "0.01", "--out", str(out))
    rows = _rows(out)
    assert [row["variant"] for row in rows] == ["engine", "channels_last", "compiled", "1 thread"]
    engine = rows[0]
    assert float(engine["ratio_to_engine"]) == 1.0 and float(engine["first_loss_difference"]) == 0.0
    for row in rows:
        assert float(row["ratio_to_engine"]) == pytest.approx(
            float(engine["ms_per_step"]) / float(row["ms_per_step"]), rel=2e-3, abs=2e-3)
        assert row["profile"] == "smoke" and int(row["batch"]) == 64
    assert rows[-1]["threads"] == "1" and "x1.00 the engine's speed" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_profile_time_on_cuda_without_a_gpu_says_where_to_measure_in_one_line():
    run = subprocess.run([sys.executable, "-m", "benchmarks.bench_profile_time", "gpu", "--device", "cuda"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--device cuda, but torch sees no CUDA device here: measure on a machine with a GPU" in run.stderr
