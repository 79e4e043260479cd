"""The fused kernel's target summary (``experiments.analysis.kernel_targets``) on hand-made rows of the benchmark's CSV."""

from experiments.analysis import kernel_targets


def _row(method, ms, n_classes=10**4, scale="1.0"):
    return {"device": "cuda", "logit_scale": scale, "epsilon": "1.0", "batch": "256", "n_classes": str(n_classes),
            "k": "5", "n_samples": "10", "method": method, "status": "ok", "ms": str(ms), "floor_ms": "0.5",
            "noise_floor_ms": "1.0"}


def test_summary_judges_large_l_against_the_larger_floor_and_counts_slower_configurations():
    rows = [_row("fused", 4.0), _row("pytopk", 40.0), _row("torch", 3.0), _row("fused_graph", 1.5),
            _row("fused", 2.0, n_classes=100), _row("pytopk", 1.0, n_classes=100)]
    (line,) = kernel_targets.summary(rows, "cuda")
    assert "fused / max(floors) x4.0 to x4.0 over 1 configurations" in line
    assert "pytopk / fused x10.0 to x10.0" in line
    assert "as CUDA-graph replays x1.5 to x1.5 max(floors)" in line
    # slower than torch at L 10^4, slower than pytopk at L 100: both counted, out of the two fused rows
    assert "slower than the PyTorch path or pytopk in 2 of 2 configurations" in line


def test_summary_skips_other_devices_and_failed_rows():
    rows = [_row("fused", 4.0), {**_row("fused", 1.0, scale="5.0"), "status": "out of memory"}]
    assert kernel_targets.summary(rows, "cpu") == []
    assert len(kernel_targets.summary(rows, "cuda")) == 1
