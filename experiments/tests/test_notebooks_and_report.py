"""The notebooks' plumbing: the catalogue matches the source notebooks, every profile's grids are valid configs, the
harness stops on missing real data and survives a diverged run, and the report marks failures and stays offline."""

import html
import json
import re

import nbformat
import pandas as pd
import pytest
import torch

from data_prep import MissingDataError
from experiments import harness
from experiments.analysis import analytic
from experiments.publishing import catalogue, latex, report
from experiments.spec import grids
from experiments.tuning import calibration, fixed_point, learning_rates
from experiments.analysis.claims import Verdict
from experiments import paths, provenance
from experiments.engine.store import ResultsStore
from experiments.engine.train import run
from experiments.paths import NOTEBOOKS
from experiments.spec.profiles import PROFILES, QUICK, SMOKE

ALL_GRIDS = tuple(grid for notebook_grids in grids.NOTEBOOK_GRIDS.values() for grid in notebook_grids)


def test_every_source_notebook_is_catalogued_output_free_and_has_one_parameters_cell():
    names = sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    assert names == sorted(catalogue.BY_NOTEBOOK)
    for name in names:
        notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert all(not cell.outputs and cell.execution_count is None for cell in code), name
        assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) == 1, name
        assert f'harness.start("{name}"' in code[1].source, name
        used = {grid.__name__ for grid in grids.NOTEBOOK_GRIDS.get(name, ())}
        assert used == set(re.findall(r"grids\.(\w+)\(", "".join(cell.source for cell in code))), name


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_builds_valid_configs_for_every_grid(profile):
    for grid in ALL_GRIDS:
        cells = grid(PROFILES[profile])
        assert cells and len({cell.config.key() for cell in cells}) == len(cells), grid.__name__


def test_shared_runs_have_the_same_config_so_the_store_trains_them_once():
    table3 = {c.config.key() for c in grids.table3(QUICK) if c.labels["B"] == 10}
    clean = {c.config.key() for c in grids.label_noise(QUICK) if c.labels == {"loss": "noised_balanced", "p": 0.0,
                                                                               "seed": c.labels["seed"]}}
    assert table3 and table3 <= clean


def test_a_real_dataset_without_a_data_root_stops_with_the_data_prep_command(tmp_path):
    ctx = harness.start("table3_samples", "paper", store=tmp_path / "store", figures=tmp_path / "figures")
    with pytest.raises(MissingDataError, match="python -m data_prep cifar100 --root"):
        ctx.run(grids.table3(ctx.profile)[:1])


def test_a_diverged_run_is_a_row_not_a_failed_notebook(tmp_path, monkeypatch):
    def diverge(*args, **kwargs):
        raise FloatingPointError("the training loss became NaN in epoch 1")

    monkeypatch.setattr(harness, "train_once", diverge)
    ctx = harness.start("table3_samples", "smoke", store=tmp_path / "store", figures=tmp_path / "figures")
    frame = ctx.run(grids.table3(SMOKE)[:2], progress=False)
    assert list(frame["status"]) == ["diverged", "diverged"] and "NaN" in frame["error"].iloc[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_a_cuda_notebook_without_a_gpu_reads_finished_runs_and_refuses_to_train_a_missing_one(tmp_path):
    """On a cluster's login node after the executor: the runs are in the store, the GPU is not; the notebook reads
    them (a diverged one as a diverged row), and names a missing run instead of training it on the wrong device."""
    cells = grids.table3(SMOKE)[:3]
    store = ResultsStore(tmp_path / "store")
    run(cells[0].config, store)
    store.save_divergence(cells[2].config.training_key(), "the training loss became NaN in epoch 1", "d" * 40)
    ctx = harness.start("table3_samples", "smoke", device="cuda", store=store.root, figures=tmp_path / "figures")
    assert ctx.record(cells[0].config)["key"] == cells[0].config.key() and ctx.runs["from_store"] == 1
    frame = ctx.run(cells[2:], progress=False)
    assert list(frame["status"]) == ["diverged"] and ctx.runs["from_store"] == 2
    manifest = json.loads((tmp_path / "figures" / "manifests" / "table3_samples.json").read_text())
    assert "d" * 40 in manifest["run_commits"]  # the diverged run's commit: a NaN is a result of its code too
    with pytest.raises(ValueError, match=f"run {cells[1].config.key()} is not in the store .*torch sees no CUDA device "
                                         "here: train the profile's runs where there is one"):
        ctx.record(cells[1].config)


def test_the_description_of_a_setup_reads_the_schedule_from_its_config(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(harness, "_display_html", shown.append)
    ctx = harness.start("table3_samples", "smoke", store=tmp_path / "store", figures=tmp_path / "figures")
    config = ctx.profile.cifar.config("cross_entropy", 0)
    ctx.describe(ctx.profile.cifar)
    assert f"momentum {config.momentum:g}," in shown[0] and f"(x{config.lr_gamma:g} at {list(config.milestones)})" in shown[0]
    assert "Data: uncalibrated stand-in cifar100_like" in shown[0]  # smoke trains too little to be calibrated


def test_a_training_verdict_says_how_hard_its_data_is_for_cross_entropy(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "_display_html", lambda html: None)
    ctx = harness.start("table3_samples", "quick", store=tmp_path / "store", figures=tmp_path / "figures")
    ctx.describe(ctx.profile.cifar)
    ctx.judge(Verdict.from_parts(3, [(True, "B has little impact")]))
    evidence = json.loads((tmp_path / "figures" / "claims" / "claim3.json").read_text())["evidence"]
    assert evidence[-1] == f"data: {learning_rates.summary_line(QUICK, 'cifar')}"
    settled = fixed_point.status(QUICK, "cifar")["state"].startswith("settled")  # else both rates are quoted
    assert evidence[-1].startswith(f"data: {calibration.summary_line(QUICK, 'cifar')}")
    assert ("at the learning rate CE chose for the tables" not in evidence[-1]) == settled


def test_a_smoke_run_writes_its_outputs_with_profile_commit_and_data(tmp_path):
    ctx = harness.start("table3_samples", "smoke", store=tmp_path / "store", figures=tmp_path / "figures")
    frame = ctx.run(grids.table3(SMOKE)[:1], progress=False)
    assert frame["status"].iloc[0] == "done" and 0 <= frame["test_top5"].iloc[0] <= 100
    ctx.save_table(frame[["B", "test_top5"]].set_index("B"), "t", "a title", show=False)
    markdown = (tmp_path / "figures" / "t.md").read_text()
    commit = provenance.git_commit()
    assert markdown.startswith("**a title**")
    assert f"smoke profile · commit {provenance.short_commit(commit)} · synthetic CIFAR-100-like" in markdown
    manifest = json.loads((tmp_path / "figures" / "manifests" / "table3_samples.json").read_text())
    assert manifest["outputs"] == ["t.csv", "t.md"] and manifest["profile"] == "smoke" and manifest["commit"] == commit
    assert manifest["runs"] == {"trained": 1, "from_store": 0}
    again = harness.start("table3_samples", "smoke", store=tmp_path / "store", figures=tmp_path / "figures")
    again.run(grids.table3(SMOKE)[:1], progress=False)
    manifest = json.loads((tmp_path / "figures" / "manifests" / "table3_samples.json").read_text())
    assert manifest["runs"] == {"trained": 0, "from_store": 1}
    assert manifest["run_commits"] == [commit]  # the commit that trained the run read back, from its record
    assert manifest["setups"] == {"cifar": SMOKE.cifar.trained_fingerprint()}  # the setup its runs trained with


def _executed(path, outputs):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=outputs)])
    notebook.metadata["papermill"] = {"duration": 1.5}
    nbformat.write(notebook, path)


def test_the_report_marks_failed_and_missing_notebooks_and_loads_nothing_remote(tmp_path):
    executed, figures, out = tmp_path / "executed", tmp_path / "figures", tmp_path / "report"
    executed.mkdir()
    (figures / "manifests").mkdir(parents=True)
    (figures / "claims").mkdir()
    (figures / "table1.csv").write_text("loss,expression\n$\\ell$,$a+b$\n")
    (figures / "table1.md").write_text("**Table 1**\n\n|...|\n\n*smoke profile · no data (analytic)*\n")
    (figures / "manifests" / "table1_losses.json").write_text(json.dumps(
        {"notebook": "table1_losses", "profile": "smoke", "device": "cpu", "data": [],
         "outputs": ["table1.csv", "table1.md"]}))
    _executed(executed / "table1_losses.ipynb", [nbformat.v4.new_output("display_data", {"text/html": "<b>ok</b>"})])
    _executed(executed / "sec32_worked_example.ipynb", [])  # ran, but wrote none of its outputs
    _executed(executed / "table3_samples.failed.ipynb",
              [nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])])
    runs = report.render("smoke", executed, figures, out)
    status = {run.item.notebook: run.status for run in runs}
    assert status["table1_losses"] == report.OK and status["table3_samples"] == report.FAILED
    assert status["table9_imagenet"] == report.MISSING
    problems = report.check(runs)
    assert "table3_samples: failed; ValueError: bad" in problems and not any(p.startswith("table1_") for p in problems)
    assert "sec32_worked_example: missing output figures/worked_example.csv" in problems
    index = (out / "index.html").read_text()
    assert "<math" in index and "the notebook table3_samples failed" in index
    for page in out.glob("*.html"):
        assert "cdnjs" not in page.read_text() and "require.min.js" not in page.read_text()


def test_outputs_that_no_notebook_writes_any_more_are_removed_once_every_notebook_ran(tmp_path, capsys):
    """An earlier run of a notebook wrote fig3_gpu.* and a claim from a GPU measurement since taken back: no manifest
    names them now. They are kept while a notebook failed or did not run (its manifest, listed anew from its start,
    may not name its files yet), and removed once every notebook ran; what a manifest names, and other files, stay.
    The report's command keeps them while notebooks are missing, and says so."""
    figures = tmp_path / "figures"
    (figures / "manifests").mkdir(parents=True)
    (figures / "claims").mkdir()
    for name in ("fig3.csv", "fig3_gpu.csv", "fig3_gpu.png", "claims/claim9.json", "notes.txt"):
        (figures / name).write_text("x")
    (figures / "report").mkdir()  # the published report, a folder: not an output
    (figures / "manifests" / "fig3_epoch_time.json").write_text(json.dumps(
        {"notebook": "fig3_epoch_time", "profile": "smoke", "device": "cpu", "data": [], "outputs": ["fig3.csv"]}))
    assert [path.name for path in report.unclaimed_outputs(figures)] == ["claim9.json", "fig3_gpu.csv", "fig3_gpu.png"]
    executed = tmp_path / "executed"
    executed.mkdir()  # no notebook ran
    assert report.main(["--profile", "smoke", "--executed", str(executed), "--figures", str(figures), "--out",
                        str(tmp_path / "out")]) == 0
    assert "kept 3 files that no notebook's manifest names" in capsys.readouterr().err
    assert len(report.unclaimed_outputs(figures)) == 3
    assert report.remove_unclaimed_outputs(figures, complete=True)[0].startswith("removed ")
    assert sorted(path.relative_to(figures).as_posix() for path in figures.rglob("*") if path.is_file()) == [
        "fig3.csv", "manifests/fig3_epoch_time.json", "notes.txt"]


PROGRESS = "[1/2] cross_entropy {'seed': 0}: done, trained in 6.9 s\n[2/2] cross_entropy {'seed': 1}: done, from the store\n"
EVIDENCE = ["✓ the best B in 3..10 (92.3) is 0.47 below the best B (92.8), against 2.16",
            "✗ the means over B span 6.60 points against 2.16 (1 point, or 2 standard errors of a mean if larger), "
            "which is far more than the paper's spread over B and than the seeds' noise at this profile",
            "data: stand-in cifar100_like calibrated on CE alone"]


def _html(markup):
    return nbformat.v4.new_output("display_data", {"text/html": markup})


def _training_notebook():
    """A notebook as the harness leaves it: its setup, the runs' progress lines, a table, a figure, a verdict; then a
    second section with a table."""
    figure = nbformat.v4.new_output("display_data", {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    verdict = _html("<p><b>Claim 3: not reproduced</b></p><ul>" + "".join(f"<li>{line}</li>" for line in EVIDENCE)
                    + "</ul>")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Table 3: the effect of B"),
        nbformat.v4.new_code_cell("ctx.run(...)", execution_count=1, outputs=[
            _html("<p>the setup</p>"), nbformat.v4.new_output("stream", name="stdout", text=PROGRESS),
            _html("<p><b>Table 3</b></p><table><tr><td>ours-cell</td></tr></table>"), figure, verdict]),
        nbformat.v4.new_markdown_cell("## Seeds"),
        nbformat.v4.new_code_cell("seeds", execution_count=2, outputs=[nbformat.v4.new_output(
            "execute_result", {"text/html": "<table><tr><td>seed table</td></tr></table>"}, execution_count=2)])])
    notebook.metadata["papermill"] = {"duration": 1.5}
    return notebook


def test_a_notebook_page_leads_with_its_tables_and_figures_and_folds_the_progress_lines(tmp_path):
    """Each section shows its tables and figures right under its text, before the setup, the runs' progress lines (one
    closed <details> summing them up) and the verdict; the executed notebook itself is not changed."""
    notebook = _training_notebook()
    before = nbformat.writes(notebook)
    shown = report.for_reading(notebook)
    assert nbformat.writes(notebook) == before
    outputs = [[o.data.get("text/html", "image") for o in cell.get("outputs", [])] for cell in shown.cells]
    assert [cell.cell_type for cell in shown.cells] == ["markdown", "code", "code", "markdown", "code", "code"]
    assert outputs[1] == ["<p><b>Table 3</b></p><table><tr><td>ours-cell</td></tr></table>", "image"]
    assert outputs[2][0] == "<p>the setup</p>" and outputs[2][1].startswith(
        '<details class="run-log"><summary>2 runs: 2 done; 1 trained in 7 s, 1 read from the store</summary><pre>[1/2]')
    assert outputs[4] == ["<table><tr><td>seed table</td></tr></table>"] and outputs[5] == []
    assert all(o.output_type != "stream" for cell in shown.cells for o in cell.get("outputs", []))

    executed, out = tmp_path / "executed", tmp_path / "report"
    executed.mkdir()
    nbformat.write(notebook, executed / "table3_samples.ipynb")
    report.render("smoke", executed, tmp_path / "figures", out)
    page = (out / "table3_samples.html").read_text()
    assert page.index("ours-cell") < page.index("the setup") < page.index("2 runs:") < page.index("Claim 3")
    assert page.count("trained in 6.9 s") == 1 and '<details class="run-log">' in page and "<details open" not in page


def test_the_progress_summary_counts_runs_by_ending_and_by_whether_they_trained():
    lines = ["[1/3] a {}: done, trained in 30.0 s", "[2/3] a {}: diverged, trained in 60.0 s",
             "[3/3] a {}: done, from the store", "a warning"]
    assert report.log_summary(lines) == ("3 runs: 2 done, 1 diverged; 2 trained in 1.5 min, 1 read from the store; "
                                         "1 other printed line")
    assert report.log_summary(["a warning", "another"]) == "2 printed lines"


def test_a_claims_evidence_shows_one_lead_line_and_the_rest_one_click_away(tmp_path):
    """In the index and on the notebook's page: the lead is the evidence's failed check (a claim not reproduced) cut at
    a word boundary, never reworded; every line and the data stamp are in a closed <details>."""
    escaped = lambda text: html.escape(text, quote=False)  # noqa: E731
    lead = report.evidence_lead("not reproduced", EVIDENCE)
    assert lead.endswith(" …") and len(lead) <= report.LEAD_CHARS
    assert EVIDENCE[1].startswith(lead[:-2]) and EVIDENCE[1][len(lead) - 2] == " "
    assert report.evidence_lead("reproduced", EVIDENCE) == report.evidence_lead("reproduced", EVIDENCE[:1]) == EVIDENCE[0]

    executed, figures, out = tmp_path / "executed", tmp_path / "figures", tmp_path / "report"
    executed.mkdir()
    (figures / "claims").mkdir(parents=True)
    (figures / "claims" / "claim3.json").write_text(json.dumps(
        {"claim": 3, "status": "not reproduced", "evidence": EVIDENCE, "profile": "smoke", "data": "the data stamp"}))
    nbformat.write(_training_notebook(), executed / "table3_samples.ipynb")
    report.render("smoke", executed, figures, out)
    for page in ("index.html", "table3_samples.html"):
        text = (out / page).read_text()
        folded = text[text.index(f'<p class="lead">{escaped(lead)}</p><details><summary>the evidence (3 lines)'):]
        assert escaped(EVIDENCE[1]) in folded.split("</details>")[0], page
        assert text.count(escaped(EVIDENCE[1])) == 1, page
    assert "the data stamp" in (out / "index.html").read_text().split("the evidence (3 lines)")[1].split("</details>")[0]


def test_no_page_of_the_report_scrolls_sideways_at_1300_px(tmp_path):
    """Chromium loads every page 1300 px wide: a wide table scrolls in a box of its own, not the page; the check finds
    a page that does scroll sideways."""
    import shutil

    if shutil.which("chromium") is None:
        pytest.skip("no chromium")
    executed, figures, out = tmp_path / "executed", tmp_path / "figures", tmp_path / "report"
    executed.mkdir()
    (figures / "manifests").mkdir(parents=True)
    wide = {f"K={k} ours": [f"36.3 ± 3.5 (3.8/25.8/61.6) run {k}"] for k in range(20)}
    pd.DataFrame(wide, index=pd.Index(["CE"], name="test top-K")).to_csv(figures / "table6.csv")
    (figures / "table6.md").write_text("**Table 6**\n\n|...|\n\n*smoke profile*\n")
    (figures / "manifests" / "table6_imagenet_lt.json").write_text(json.dumps(
        {"notebook": "table6_imagenet_lt", "profile": "smoke", "device": "cpu", "data": [],
         "outputs": ["table6.csv", "table6.md"]}))
    nbformat.write(_training_notebook(), executed / "table6_imagenet_lt.ipynb")
    report.render("smoke", executed, figures, out)
    assert report.sideways_scrolling(sorted(out.glob("*.html"))) == []
    (out / "too_wide.html").write_text("<!DOCTYPE html><body><div style='width: 1400px'>x</div></body>")
    assert report.sideways_scrolling([out / "too_wide.html"]) == [
        "too_wide.html scrolls sideways at 1300 px: 1408 px wide for 1300 px"]


def test_offline_strips_cdn_scripts_and_refuses_other_remote_resources():
    page = '<head><script src="https://cdnjs.cloudflare.com/x.js"></script></head><a href="https://ok.org">link</a>'
    assert report.offline(page) == '<head></head><a href="https://ok.org">link</a>'
    with pytest.raises(ValueError, match="remote resource"):
        report.offline('<img src="https://example.org/x.png">')


def test_latex_cells_become_mathml_and_the_rest_is_escaped():
    assert latex.to_html("a < b: $x^2$").startswith("a &lt; b: <math")
    with pytest.raises(ValueError, match="unbalanced"):
        latex.to_html("$x")


def test_level_sets_cover_the_scaled_simplex_and_are_rescaled_to_unit_range():
    grid = analytic.simplex_grid(10)
    assert grid.shape == (66, 3) and torch.allclose(grid.sum(1), torch.full((66,), 2.0, dtype=torch.float64))
    for panel in analytic.figure_1_panels(2):
        values = analytic.level_set_values(panel, 10, 2, replications=2)
        assert values.min() == 0 and values.max() == 1, panel.title


def test_datasets_differing_by_label_noise_share_one_data_line():
    line = harness._data_line(["synthetic, 16px, seed 0", "synthetic, 16px, seed 0, label noise p = 0.1 (flip 0.08)"])
    assert line == "synthetic, 16px, seed 0; variants: as is | label noise p = 0.1 (flip 0.08)"
    assert harness._data_line(["a, b", "c, d"]) == "a, b; c, d"


def test_code_is_hidden_by_default_whatever_the_body_classes():
    assert report._with_code_toggle('<body class="jp-Notebook" data-x="1">').startswith(
        '<body class="hide-code jp-Notebook" data-x="1">')
    assert report._with_code_toggle("<body>").startswith('<body class="hide-code">')


def test_the_committed_quick_figures_were_made_by_todays_training_code():
    """figures/quick (the README's verdicts, the committed report) and the committed runs the docs compare it with
    (``benchmarks/results/*_quick``) are made again whenever the training's code (:data:`paths.TRAINING_CODE`)
    changes: runs trained by earlier code can give other numbers. Their manifests name the notebook's commit and the
    commits that trained its runs."""
    stale, unknown = {}, set()
    folders = [paths.FIGURES / "quick", *sorted(paths.BENCHMARK_RESULTS.glob("*_quick"))]
    for manifest in [path for folder in folders for path in sorted((folder / "manifests").glob("*.json"))]:
        written = json.loads(manifest.read_text())
        for commit in (written["commit"], *written.get("run_commits", [])):
            changed = provenance.changed_since(commit, paths.TRAINING_CODE)
            if changed is None:
                unknown.add(provenance.short_commit(commit))
            elif changed:
                stale[str(manifest.relative_to(paths.PROJECT_ROOT))] = provenance.short_commit(commit)
    if unknown and not stale:
        pytest.skip(f"git cannot compare this checkout with commit {', '.join(sorted(unknown))} (not a full clone?)")
    assert not stale, (f"made before the last change of the training's code ({' '.join(paths.TRAINING_CODE)}): "
                       f"{stale}; run make paper-figures on a fresh clone and commit its figures/quick "
                       "(docs/reproducing.md says where each copy goes)")


def test_the_committed_quick_figures_were_made_with_todays_calibration():
    """A calibration made again (other knobs, other learning rates) changes what every quick run trains on or at:
    figures/quick and the committed runs compared with it (``benchmarks/results/*_quick``) are then made again. Each
    manifest names the setups its runs trained with (:meth:`Setup.trained_fingerprint`)."""
    stale = {}
    folders = [paths.FIGURES / "quick", *sorted(paths.BENCHMARK_RESULTS.glob("*_quick"))]
    for manifest in [path for folder in folders for path in sorted((folder / "manifests").glob("*.json"))]:
        written, where = json.loads(manifest.read_text()), str(manifest.relative_to(paths.PROJECT_ROOT))
        if "executor" in written:  # its runs are the notebooks' own, whose manifests name their setups
            continue
        if "setups" not in written:
            stale[where] = "names no setups (made before manifests did)"
        for name, fingerprint in written.get("setups", {}).items():
            if getattr(QUICK, name).trained_fingerprint() != fingerprint:
                stale[where] = f"{name} trained with another calibration or setup"
    assert not stale, (f"{stale}: run make paper-figures on a fresh clone and commit its figures/quick "
                       "(docs/reproducing.md says where each copy goes)")


def test_notebooks_run_on_a_private_unix_socket_folder_and_a_failing_cell_fails_the_command(tmp_path):
    """make's papermill runs each kernel over IPC in a 0700 folder of its own, removed afterwards: no localhost port
    for another user or a neighbouring notebook, no ipykernel warning about TCP; papermill's parameters and exit
    status are unchanged."""
    import os
    import subprocess
    import sys

    probe = ("import json, os, ipykernel.connect as c\n"
             "info = json.load(open(c.get_connection_file()))\n"
             "folder = os.path.dirname(info['ip'])\n"
             "print(info['transport'], oct(os.stat(folder).st_mode & 0o777), folder, repr(threads))")
    for name, last_cell in (("ok", "pass"), ("failing", "1 / 0")):
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("threads = None"),
                                                   nbformat.v4.new_code_cell(probe),
                                                   nbformat.v4.new_code_cell(last_cell)])
        notebook.cells[0].metadata["tags"] = ["parameters"]
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(notebook, tmp_path / f"{name}.ipynb")
        ran = subprocess.run([sys.executable, "-m", "experiments.publishing.papermill_ipc", str(tmp_path / f"{name}.ipynb"),
                              str(tmp_path / f"{name}_out.ipynb"), "-k", "python3", "--no-progress-bar",
                              "-p", "threads", "2"], cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(paths.PROJECT_ROOT)})
        assert (ran.returncode == 0) == (name == "ok"), ran.stderr
        assert "TCP" not in ran.stderr, ran.stderr
        executed = nbformat.read(tmp_path / f"{name}_out.ipynb", as_version=4)
        probed = next(cell for cell in executed.cells if cell.source == probe)  # failed: papermill adds a cell on top
        transport, mode, folder, threads = probed.outputs[0]["text"].split()
        assert (transport, mode, threads) == ("ipc", "0o700", "2")
        assert not os.path.exists(folder)
    assert "ZeroDivisionError" in ran.stderr


def test_make_uses_a_given_interpreter_instead_of_creating_the_venv():
    """``make paper-figures PY=python3`` (a machine with its own stack): no .venv is made, that interpreter runs the
    notebooks, and it is first checked for every module the project needs. The profile's runs are trained first by the
    local executor (on CUDA one run per GPU, compiled with CUDA graphs); with ``EXECUTOR=`` empty, by the notebooks."""
    import shutil
    import subprocess
    import sys

    if shutil.which("make") is None:
        pytest.skip("no make")
    # -B: every target out of date, whatever build/ holds from an earlier run
    dry = subprocess.run(["make", "-n", "-B", "paper-figures", "PROFILE=smoke", f"PY={sys.executable}"],
                         cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "-m venv" not in dry.stdout and "pip install --quiet" not in dry.stdout
    assert f"{sys.executable} -c \"import importlib.util" in dry.stdout
    assert f"{sys.executable} -m experiments.publishing.papermill_ipc" in dry.stdout
    assert re.search(r"-m experiments train smoke --executor local --device cpu --jobs \d", dry.stdout)

    def executor(*settings):  # a dry run trains nothing: the training is a sub-make's
        run = subprocess.run(["make", "-n", "-B", "paper-figures", "PROFILE=smoke", f"PY={sys.executable}",
                              *settings], cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=60)
        trains = re.search(r"-m experiments train smoke --executor (\w+)(.*)", run.stdout)
        assert ("rm -f figures/smoke/manifests/executor.json" in run.stdout) == (trains is None), run.stdout
        return trains and " ".join([trains.group(1), *trains.group(2).split()])

    assert executor("DEVICE=cuda") == "local --device cuda --per-gpu 1 --compile reduce-overhead"
    assert executor("DEVICE=cuda", "PER_GPU=2", "COMPILE=default") == "local --device cuda --per-gpu 2 --compile default"
    assert executor("DEVICE=cuda", "STACK=4") == "local --device cuda --per-gpu 1 --compile reduce-overhead --stack 4"
    assert executor("EXECUTOR=") is None and executor("DEVICE=cuda:1") is None  # the notebooks train their own runs
    # GPU 1 alone, its runs on it: one at a time unless PER_GPU says more (not JOBS, one per core, on one GPU)
    assert executor("DEVICE=cuda:1", "EXECUTOR=local") == "local --device cuda:1 --per-gpu 1 --compile reduce-overhead"
    assert executor("UNCALIBRATED=1").endswith("--uncalibrated")
    assert executor("EXECUTOR=slurm").startswith("slurm --device cpu")
    scripts_only = subprocess.run(["make", "-n", "-B", "paper-figures", "PROFILE=smoke", f"PY={sys.executable}",
                                   "EXECUTOR=slurm", "SLURM=--time-min 60 --sbatch-only"], cwd=paths.PROJECT_ROOT,
                                  capture_output=True, text=True, timeout=60)
    assert "--executor slurm --device cpu" in scripts_only.stdout and "--sbatch-only" in scripts_only.stdout
    assert "papermill_ipc" not in scripts_only.stdout  # the tasks are the user's to submit: no notebook runs before
    assert "submit them with sbatch" in scripts_only.stdout
    for settings, command in (((), "plan smoke"), (("STACK=4", "GPUS=8"), "plan smoke --stack 4 --gpus 8")):
        plan = subprocess.run(["make", "--no-print-directory", "-n", "plan", "PROFILE=smoke", f"PY={sys.executable}",
                               *settings], cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=60)
        line = next(line for line in plan.stdout.splitlines() if "-m experiments plan" in line)
        assert line.split("-m experiments ")[1].split() == command.split(), plan.stdout
    lab = subprocess.run(["make", "-n", "lab", f"PY={sys.executable}"], cwd=paths.PROJECT_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert f"{sys.executable} -m jupyter lab notebooks" in lab.stdout, lab.stdout
    report = paths.PROJECT_ROOT / "figures" / "quick" / "report" / "index.html"
    before = report.read_bytes()
    quick = subprocess.run(["make", "-n", "-B", "paper-figures", f"PY={sys.executable}"], cwd=paths.PROJECT_ROOT,
                           capture_output=True, text=True, timeout=60)
    assert "cp build/report/*.html figures/quick/report/" in quick.stdout  # printed, not run: the committed report
    assert report.read_bytes() == before                                   # stays as it is
    missing = subprocess.run(["make", "check-python", "PY=" + sys.executable, "MODULES=torch no_such_module_here"],
                             cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "lacks ['no_such_module_here']" in missing.stderr


def test_the_reports_provenance_names_the_commits_of_the_notebooks_and_of_their_runs():
    """The report's provenance is the results' (each manifest's commit, its runs' commits, its machine), beside the
    rendering's own commit: a report rendered later says when its numbers were made."""
    from types import SimpleNamespace

    manifests = [{"commit": "a" * 40, "run_commits": ["b" * 40, "c" * 40 + "-dirty"], "device": "cpu", "machine": "m1"},
                 {"commit": "a" * 40, "run_commits": ["b" * 40], "device": "cpu", "machine": "m2"}]
    shown = report.provenance("smoke", [SimpleNamespace(manifest=m, seconds=1.0) for m in manifests])
    assert shown["notebooks run at commit"] == "a" * 10
    assert shown["runs trained at commit"] == f"{'b' * 10}, {'c' * 10}-dirty"
    assert shown["notebooks' machines"] == "m1, m2" and shown["rendered at commit"] == provenance.git_commit()
