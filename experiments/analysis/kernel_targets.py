"""Issue 14's targets for the fused kernel, judged from the rows of ``python -m benchmarks.bench_fused_kernel``'s
CSV: for L >= 10^4, fused within 2x the larger of its memory and noise floors and 10x faster than pytopk; nowhere
slower than the PyTorch path or pytopk. Used by the benchmark's summary and the generated block of docs/performance.md
alike."""

from __future__ import annotations

FLOOR_TARGET, PYTOPK_TARGET = 2.0, 10.0
LARGE_L = 10**4


def key(row: dict) -> tuple:
    """A configuration and method of the CSV, whatever the types its fields were read or written with."""
    return (row["device"], float(row["logit_scale"]), float(row["epsilon"]), int(row["batch"]), int(row["n_classes"]),
            int(row["k"]), int(row["n_samples"]), row["method"])


def _larger_floor(row: dict) -> float:
    return max(float(row["floor_ms"]), float(row["noise_floor_ms"]))


def summary(rows: list[dict], device_type: str) -> list[str]:
    """One line per kind of input (logit scale, eps): how far the measured configurations with L >= 10^4 are from the
    targets, and over the whole grid how many configurations are slower than the alternatives."""
    rows = [r for r in rows if r["device"] == device_type and r["status"] == "ok"]
    ms = {key(r): float(r["ms"]) for r in rows}
    other = lambda r, method: ms.get(key({**r, "method": method}))  # noqa: E731
    lines = []
    for scale, epsilon in sorted({(float(r["logit_scale"]), float(r["epsilon"])) for r in rows}):
        fused = [r for r in rows
                 if r["method"] == "fused" and (float(r["logit_scale"]), float(r["epsilon"])) == (scale, epsilon)]
        large = [r for r in fused if int(r["n_classes"]) >= LARGE_L]
        if not large:
            continue
        to_floor = [float(r["ms"]) / _larger_floor(r) for r in large]
        speedups = [other(r, "pytopk") / float(r["ms"]) for r in large if other(r, "pytopk")]
        slower = [r for r in fused
                  if any(other(r, m) is not None and other(r, m) < float(r["ms"]) for m in ("torch", "pytopk"))]
        line = (f"x{scale:g} logits, eps {epsilon:g}: for L >= 10^4, fused / max(floors) x{min(to_floor):.1f} to "
                f"x{max(to_floor):.1f} over {len(large)} configurations (target <= {FLOOR_TARGET:g})")
        if speedups:
            line += f", pytopk / fused x{min(speedups):.1f} to x{max(speedups):.1f} (target >= {PYTOPK_TARGET:g})"
        replayed = [other(r, "fused_graph") / _larger_floor(r) for r in large if other(r, "fused_graph")]
        if replayed:
            line += f", as CUDA-graph replays x{min(replayed):.1f} to x{max(replayed):.1f} max(floors)"
        lines.append(line + f"; slower than the PyTorch path or pytopk in {len(slower)} of {len(fused)} configurations "
                     "(target 0)")
    return lines
