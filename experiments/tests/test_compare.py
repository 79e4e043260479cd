"""Two runs' figures compared table by table: byte-identical, within the seeds' noise, or beyond it, and the
verdicts side by side (:mod:`experiments.analysis.compare`)."""

import json

import pytest

from experiments.analysis import compare

HEADER = "test top5 (%),p=0 ours,p=0 paper,p=0.2 ours,p=0.2 paper\n"


def _figures(folder, table: str, status: str = "reproduced", timing: str = "1.25"):
    (folder / "claims").mkdir(parents=True)
    (folder / "table4.csv").write_text(HEADER + table)
    (folder / "fig3.csv").write_text(f"loss,K,epoch_seconds\nCE,5,{timing}\n")
    (folder / "claims" / "claim5.json").write_text(json.dumps({"claim": 5, "status": status}))
    return folder


@pytest.mark.parametrize("one, other, agree", [
    ("94.6 ± 0.8", "94.6 ± 0.8", True),
    ("94.6 ± 0.8", "93.5 ± 0.8", True),  # 1.1 <= sqrt(0.8^2 + 0.8^2) = 1.13
    ("94.6 ± 0.8", "93.4 ± 0.8", False),
    ("88.5 ± 3.6", "89.6 ± 1.2", True),  # the other machine's Table 4 cell of the issue
    ("94.28", "94.28", True), ("94.28", "94.29", False),  # no interval: equal or not
    ("60.1-90.0 (3 seeds)", "85.0 ± 1.0", True), ("60.1-70.0 (3 seeds)", "85.0 ± 1.0", False),
    ("-", "-", True), ("-", "85.0 ± 1.0", False),
    ("45.2 ± 1.0 (30.1/40.2/50.3)", "46.0 ± 1.0 (31.0/40.2/50.3)", True),
])
def test_two_cells_agree_within_the_interval_of_their_difference(one, other, agree):
    assert compare.within_noise(one, other) is agree


def test_tables_are_identical_within_noise_or_beyond_and_verdicts_side_by_side(tmp_path):
    a = _figures(tmp_path / "a", "CE,94.6 ± 0.8,94.2,92.0 ± 0.8,87.6\n")
    same = _figures(tmp_path / "same", "CE,94.6 ± 0.8,94.2,92.0 ± 0.8,87.6\n")
    near = _figures(tmp_path / "near", "CE,94.1 ± 0.9,94.2,92.5 ± 0.6,87.6\n", timing="2.50")
    far = _figures(tmp_path / "far", "CE,94.6 ± 0.8,94.2,89.0 ± 0.5,87.6\n", status="not reproduced")
    tables, unmatched, claims = compare.compare(a, same)
    assert [t.verdict for t in tables] == ["byte-identical", "byte-identical"] and unmatched == []
    tables, _, claims = compare.compare(a, near)
    assert [t.verdict for t in tables] == ["the same numbers; 1 timings differ (machine-dependent, not judged)",
                                           "2 of 5 cells differ, all within the seeds' noise"]
    assert claims == {5: ("reproduced", "reproduced")}
    tables, _, claims = compare.compare(a, far)
    assert tables[1].outside == ["CE / p=0.2 ours: 92.0 ± 0.8 vs 89.0 ± 0.5"]
    assert claims == {5: ("reproduced", "not reproduced")}
    text = compare.markdown(a, far, ("this machine", "another"))
    assert "1 beyond it; verdicts not all the same" in text and "| 5 | reproduced | not reproduced |" in text


def test_the_command_refuses_a_folder_that_is_not_there(tmp_path, capsys):
    assert compare.main([str(tmp_path / "none"), str(tmp_path)]) == 2
    assert "is not a folder of figures" in capsys.readouterr().err
