"""The numbers of the README and of ``docs/`` are generated from committed results (:mod:`experiments.publishing.readme`):
the committed pages match them, each block lives in one page, and a changed result makes its block stale. Their Python
examples run as a user would paste them. The README stays a door: short, with exactly the two set-up commands."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from experiments.analysis import timings
from experiments.probes import crowding, label_noise_capacity
from experiments.publishing import gpu_blocks, readme, result_rows, time_blocks
from experiments.spec import grids
from experiments.spec.profiles import GPU
from experiments.spec.profiles import get_profile
from experiments import paths, provenance
from experiments.paths import FIGURES, PROJECT_ROOT

#: Every ```python block of the README and of docs/*.md, with where it is.
EXAMPLES = [(path.relative_to(PROJECT_ROOT).as_posix(), example) for path in readme.documents()
            for example in re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.M | re.S)]


@pytest.mark.parametrize("where, example", EXAMPLES,
                         ids=[f"{where}-{number}" for number, (where, _) in enumerate(EXAMPLES)])
def test_the_readmes_python_examples_run(where, example):
    if '"cuda"' in example and not torch.cuda.is_available():
        pytest.skip("a CUDA example")
    done = subprocess.run([sys.executable, "-c", example], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{where}: {done.stderr[-3000:]}"


def test_the_readmes_examples_are_found_and_one_runs_without_a_gpu():
    readmes = [example for where, example in EXAMPLES if where == "README.md"]
    assert any('"cuda"' not in example for example in readmes), readmes
    assert any('"cuda"' in example for where, example in EXAMPLES if where.startswith("docs/")), EXAMPLES


def test_the_readme_is_a_door_with_the_two_set_up_commands():
    text = readme.README.read_text()
    assert len(text.splitlines()) <= 150
    commands = [line.split("#")[0].strip() for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text,
                                                                    flags=re.M | re.S) for line in block.splitlines()]
    assert [command for command in commands if command] == ["make paper-figures", "make test"]
    assert "https://proceedings.mlr.press/v162/garcin22a.html" in text and "@inproceedings" in text
    assert "[LICENSE](LICENSE)" in text


def test_the_committed_readme_and_docs_match_the_committed_results():
    if not provenance.full_history():  # the blocks' stale marks ask git about the commits their rows name
        pytest.skip("a shallow clone or no checkout: the stale marks cannot be told (git clone without --depth)")
    assert readme.stale() == {}


def test_each_block_lives_in_exactly_one_document_and_the_readme_holds_the_headlines():
    where = readme.placement()
    assert set(where) == set(readme.BLOCKS)
    in_readme = ("verdict-summary", "performance-headline", "setup-time", "executors-time", "gpu-hours", "main-job-time")
    assert all(where[name] == readme.README for name in in_readme)
    assert all(path.parent == readme.DOCS for name, path in where.items() if name not in in_readme)


def _documents(tmp_path, **pages):
    paths = []
    for name, text in pages.items():
        path = tmp_path / f"{name}.md"
        path.write_text(text)
        paths.append(path)
    return paths


def test_a_block_in_two_documents_in_none_or_unknown_is_a_clear_error(tmp_path):
    blocks = {"one": lambda: "1", "two": lambda: "2"}
    block = lambda name: f"<!-- generated: {name} -->\nold\n<!-- end: {name} -->\n"  # noqa: E731
    paths = _documents(tmp_path, readme=block("one"), page=block("two"))
    assert {name: path.name for name, path in readme.placement(paths, blocks).items()} == {"one": "readme.md",
                                                                                          "two": "page.md"}
    assert readme.stale(paths, blocks) == {str(paths[0]): ["one"], str(paths[1]): ["two"]}
    for pages, message in (({"readme": block("one"), "page": block("one") + block("two")}, "is in"),
                           ({"readme": block("one")}, "no document has block 'two'"),
                           ({"readme": block("one") + block("two") + block("three")}, "'three' that nothing writes"),
                           ({"readme": block("one") + block("two") + "<!-- generated: four -->"}, "has no '<!-- end")):
        for path in tmp_path.glob("*.md"):
            path.unlink()
        with pytest.raises(ValueError, match=message):
            readme.placement(_documents(tmp_path, **pages), blocks)
    written = readme.regenerate(block("one") + block("two"), blocks)
    assert written == "<!-- generated: one -->\n1\n<!-- end: one -->\n<!-- generated: two -->\n2\n<!-- end: two -->\n"
    assert readme.stale_blocks(written, blocks) == []


def test_a_changed_verdict_makes_the_verdict_block_stale(tmp_path):
    figures = tmp_path / "quick"
    (figures / "claims").mkdir(parents=True)
    source = FIGURES / "quick" / "claims"
    for path in source.glob("claim*.json") if source.exists() else []:
        shutil.copy(path, figures / "claims" / path.name)
    verdict = {"claim": 3, "status": "reproduced", "evidence": ["✓ B = 1 to 100 within 0.5"], "commit": "a" * 40}
    (figures / "claims" / "claim3.json").write_text(json.dumps(verdict))
    blocks = {"verdicts": lambda: readme.verdicts(figures), "verdict-summary": lambda: readme.verdict_summary(figures)}
    where = readme.placement()
    texts = {name: readme.regenerate(where[name].read_text(), {name: blocks[name]}) for name in blocks}
    assert "| 3 | B has little impact on accuracy; a small B (3 to 10) is enough | reproduced | ✓ B = 1 to 100" in \
        texts["verdicts"]
    assert "| 3 | Table 3 | B has little impact on accuracy; a small B (3 to 10) is enough | reproduced | ✓ B = 1 to " \
           "100 within 0.5 |" in texts["verdict-summary"]
    assert all(readme.stale_blocks(text, {name: blocks[name]}) == [] for name, text in texts.items())
    verdict["status"] = "not reproduced"
    (figures / "claims" / "claim3.json").write_text(json.dumps(verdict))
    assert [readme.stale_blocks(text, {name: blocks[name]}) for name, text in texts.items()] == [["verdicts"],
                                                                                               ["verdict-summary"]]


def test_the_summary_quotes_the_line_that_decided_each_verdict_cut_at_a_word():
    evidence = ["✓ passed first", "✗ failed first: 1.0 against 2.0", "✗ failed second", "data: the stand-in"]
    assert readme.one_line({"status": "not reproduced", "evidence": evidence}) == evidence[1]
    assert readme.one_line({"status": "reproduced", "evidence": evidence}) == evidence[0]
    assert readme.one_line({"status": "inconclusive at this profile", "evidence": ["timings of a shared CPU"]}) \
        == "timings of a shared CPU"
    assert readme.one_line({"status": "not run at this profile", "evidence": []}) == "no evidence recorded"
    long = "✗ the means over B span 6.60 points against 2.16 (1 point, or 2 standard errors)"
    assert readme.one_line({"status": "not reproduced", "evidence": [long]}, limit=40) == "✗ the means over B span 6.60 points …"
    assert long.startswith(readme.one_line({"status": "not reproduced", "evidence": [long]}, limit=40)[:-2])


def test_headline_block_reads_the_csv_with_its_stamp(tmp_path):
    fields = {"device": "cpu", "device_name": "test-cpu", "commit": "b" * 40, "python": "3", "torch": "9.9",
              "triton": "none", "topk": "0", **readme.NOISED_HEADLINE, "status": "ok", "peak_extra_mb": "1.0"}
    rows = [{**fields, "method": "topk", "ms": "2.0"}, {**fields, "method": "pytopk", "ms": "30.0"}]
    with (tmp_path / "noised_losses.csv").open("w") as handle:
        handle.write(",".join(rows[0]) + "\n" + "\n".join(",".join(r.values()) for r in rows) + "\n")
    text = readme.noised_headline(tmp_path)
    assert "pytopk / topk = x15.0 (target x10: met)" in text and "test-cpu (cpu), torch 9.9" in text
    assert "commit bbbbbbbbbb" in text


def _csv(path, rows):
    with path.open("w") as handle:
        handle.write(",".join(rows[0]) + "\n" + "\n".join(",".join(r.values()) for r in rows) + "\n")


def test_the_gpu_block_shows_each_profiled_step_with_what_faster_library_kernels_could_gain(tmp_path):
    stamp = {"device": "cuda", "device_name": "test-gpu", "commit": "c" * 40, "python": "3", "torch": "9.9",
             "triton": "3", "topk": "0"}
    profiled = {"model": "densenet40_40", "compile": "reduce-overhead", "batch_size": "64", "steps": "50", "step_ms": "6.0",
                "items_per_step": "700", "items_ms_per_step": "5.0", "busy": "0.83", "share_under_50us": "0.77",
                "share_library": "0.6", "share_triton": "0.3", "share_other": "0.1"}
    _csv(tmp_path / "step_profile.csv", [{**stamp, **profiled}, {**stamp, **profiled, "device": "cpu"}])
    text = gpu_blocks.gpu_results(tmp_path)
    assert text.count("profiled (`step_profile.csv`; test-gpu") == 1  # the CUDA row alone
    assert "700 kernels and copies a step summing 5.00 ms (83% of the timed step)" in text
    assert "60% in the vendor libraries' kernels" in text
    assert "at most x2.50 faster." in text


def test_performance_headline_gives_three_numbers_each_from_its_csv_with_its_stamp(tmp_path):
    assert "run `make bench`" in readme.performance_headline(tmp_path)
    stamp = {"device": "cpu", "device_name": "test-cpu", "commit": "b" * 40, "python": "3", "torch": "9.9",
             "triton": "none", "topk": "0"}
    _csv(tmp_path / "noised_losses.csv", [{**stamp, **readme.NOISED_HEADLINE, "method": m, "status": "ok", "ms": ms,
                                          "peak_extra_mb": "1"} for m, ms in (("topk", "2.0"), ("pytopk", "30.0"))])
    _csv(tmp_path / "smooth_hinge.csv", [{**stamp, **readme.SMOOTH_HEADLINE, "method": m, "status": "ok", "ms": ms,
                                         "peak_extra_mb": "1", "grad_error_x1": "1e-7", "grad_error_x20": error}
                                        for m, ms, error in (("smooth_hinge", "5.0", "1e-6"), ("reference", "20.0", "0.02"))])
    _csv(tmp_path / "training_step.csv", [{**stamp, "device": "cuda", "device_name": "test-gpu", "model": "densenet40_40",
                                          "mode": mode, "compiler": "", "loss": f"noised_balanced B={b}", "backend": "auto",
                                          "K": "5", "B": b, "batch_size": "64", "steps": "9", "ms_per_step": "6.1",
                                          "overhead_vs_ce": overhead}
                                         for mode, b, overhead in (("eager", "10", "0.5"), ("compiled", "3", "0.2"),
                                                                   ("compiled", "10", "0.015"))])
    lines = readme.performance_headline(tmp_path).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("- **x15.0 faster than the published `pytopk`**") and "test-cpu" in lines[0]
    assert lines[1].startswith("- **+1.5% over cross-entropy**: a compiled training step of densenet40_40 (batch 64) "
                               "with the noised loss at K 5, B 10") and "test-gpu, torch 9.9, commit bbbbbbbbbb" in lines[1]
    assert lines[2].startswith("- **x4.0 faster than Berrada et al.'s smoothed hinge**") and "1.0e-06 / 2.0e-02" in lines[2]


def test_a_library_benchmark_made_before_topk_changed_is_marked_stale_and_the_newest_current_step_headlines(
        tmp_path, monkeypatch):
    changed = {"e" * 40: True, "f" * 40: False}  # the library changed since commit eee..., not since fff...
    monkeypatch.setattr(result_rows, "changed_since",
                        lambda commit, files, uncommitted: changed.get(commit) if files == paths.LIBRARY_CODE else None)
    monkeypatch.setattr(result_rows, "_library_changed_since",  # a cache of its own, the module's left as it was
                        result_rows.functools.lru_cache(result_rows._library_changed_since.__wrapped__))
    stamp = {"device": "cpu", "device_name": "test-cpu", "commit": "e" * 40, "python": "3", "torch": "9.9",
             "triton": "none", "topk": "0"}
    _csv(tmp_path / "noised_losses.csv", [{**stamp, **readme.NOISED_HEADLINE, "method": m, "status": "ok", "ms": ms,
                                          "peak_extra_mb": "1"} for m, ms in (("topk", "2.0"), ("pytopk", "30.0"))])
    step = {**stamp, "device": "cuda", "device_name": "test-gpu", "model": "densenet40_40", "mode": "compiled",
            "compiler": "", "loss": "noised_balanced B=10", "backend": "auto", "K": "5", "B": "10", "batch_size": "64",
            "steps": "9", "ms_per_step": "6.1"}
    _csv(tmp_path / "training_step.csv", [{**step, "overhead_vs_ce": "0.05"},
                                         {**step, "commit": "f" * 40, "overhead_vs_ce": "0.01"},
                                         {**step, "overhead_vs_ce": "0.09"}])  # the last row, made before the change
    noised, step_line = readme.performance_headline(tmp_path).splitlines()
    assert noised.startswith("- **Stale:** made at commit eeeeeeeeee, and `topk/` changed since; rerun "
                             "`python -m benchmarks.bench_noised_losses --headline`. **x15.0 faster")
    assert step_line.startswith("- **+1.0% over cross-entropy**") and "commit ffffffffff" in step_line
    assert readme.noised_headline(tmp_path).endswith("commit eeeeeeeeee.* **Stale:** made at commit eeeeeeeeee, and "
                                                     "`topk/` changed since; rerun "
                                                     "`python -m benchmarks.bench_noised_losses --headline`.")
    assert gpu_blocks.gpu_results(tmp_path).count("**Stale:** made at commit eeeeeeeeee") == 1  # one measurement
    assert result_rows.newest_current([{"commit": "e" * 40, "n": 1}, {"commit": "e" * 40, "n": 2}])["n"] == 2
    assert result_rows.newest_current([]) is None


def test_setup_time_block_gives_the_install_and_the_range_of_the_test_runs_with_the_processor(tmp_path):
    stamp = {"device": "cpu", "device_name": "Test CPU (AVX2)", "commit": "c" * 40, "python": "3", "torch": "9.9",
             "triton": "none", "topk": "0", "cores": "2"}
    rows = [{**stamp, "step": "install", "command": "make venv", "seconds": "120.0", "passed": "True"},
            {**stamp, "step": "test", "command": "make test", "seconds": "360.0", "passed": "True"},
            {**stamp, "step": "test", "command": "make test", "seconds": "282.0", "passed": "True"}]
    _csv(tmp_path / "setup.csv", rows)
    text = time_blocks.setup_time(tmp_path / "setup.csv")
    assert text.startswith("On a fresh clone, Test CPU (AVX2) with 2 cores: the install (`make venv`) took 2.0 min")
    assert "`make test` 4.7 to 6.0 min (2 runs; `setup.csv`, commit cccccccccc)." in text and "FAILED" not in text
    _csv(tmp_path / "setup.csv", rows[:2] + [{**rows[2], "passed": "False"}])
    assert "and 1 of its runs FAILED" in time_blocks.setup_time(tmp_path / "setup.csv")


def test_a_timing_made_before_what_it_times_changed_is_marked_stale(tmp_path, monkeypatch):
    changed = {}
    monkeypatch.setattr(time_blocks, "changed_since", lambda commit, files, uncommitted: changed.get(files))
    stamp = {"device": "cpu", "device_name": "Test CPU", "commit": "c" * 40, "python": "3", "torch": "9.9",
             "triton": "none", "topk": "0", "cores": "2"}
    _csv(tmp_path / "setup.csv", [{**stamp, "step": step, "command": "make", "seconds": "60", "passed": "True"}
                                  for step in ("install", "test")])
    _csv(tmp_path / "executors.csv", [{**stamp, "profile": "quick", "executor": executor, "jobs": "2", "runs": "9",
                                       "train_images": "9", "seconds": "60", "images_per_s": "1", "ratio_to_inline": "1",
                                       "records_identical": "9", "records_differing": "0"}
                                      for executor in ("inline", "local")])
    assert time_blocks.setup_time(tmp_path / "setup.csv").startswith("On a fresh clone")
    assert time_blocks.executors_time(tmp_path / "executors.csv").startswith("*The quick profile's 9 trainings")
    compile_row = {**stamp, "cpu_threads": "2", "model": "small_cnn", "loss": "cross_entropy", "options": "{}",
                   "batch": "64", "backend": "inductor", "first_step_s": "20", "second_step_s": "0.01",
                   "short_batch_step_s": "19"}
    _csv(tmp_path / "compile.csv", [compile_row])
    assert time_blocks.compile_time(tmp_path / "compile.csv").startswith("| loss |")
    changed = {time_blocks.TEST_SUITE: True, time_blocks.TRAINED_WITH: True, paths.TRAINING_CODE: True}
    assert time_blocks.compile_time(tmp_path / "compile.csv").startswith(
        "**Stale:** made at commit cccccccccc, and the training's code (the engine, the losses) changed since; rerun "
        "`python -m benchmarks.bench_compile_time`.\n\n| loss |")  # the table after a blank line: rendered as one
    assert time_blocks.setup_time(tmp_path / "setup.csv").startswith(
        "**Stale:** made at commit cccccccccc, and the tests changed since; rerun `python -m benchmarks.bench_setup_time`.")
    assert time_blocks.executors_time(tmp_path / "executors.csv").startswith(
        "**Stale:** made at commit cccccccccc, and the training's code or calibration changed since; rerun "
        "`python -m benchmarks.bench_executors quick --jobs 2`.")


def test_cpu_step_block_gives_each_variant_and_the_bound_of_the_gains_multiplied(tmp_path):
    stamp = {"device": "cpu", "device_name": "Test CPU (AVX2)", "commit": "d" * 40, "python": "3", "torch": "9.9",
             "triton": "none", "topk": "0", "profile": "quick", "model": "small_cnn", "image_size": "16",
             "batch": "64"}
    rows = [{**stamp, "threads": threads, "variant": variant, "ms_per_step": ms, "ratio_to_engine": ratio,
             "first_loss_difference": difference}
            for threads, variant, ms, ratio, difference in (("2", "engine", "10.0", "1.0", "0.0"),
                                                            ("2", "channels_last", "8.0", "1.25", "0.0"),
                                                            ("1", "1 thread", "16.0", "0.625", "0.0"))]
    _csv(tmp_path / "cpu_step.csv", rows)
    text = time_blocks.cpu_step(tmp_path / "cpu_step.csv")
    assert "| channels_last | 2 | 8.0 | x1.25 | 0.0e+00 |" in text and "Test CPU (AVX2), torch 9.9" in text
    assert "would train at x1.6 the engine's speed" in text  # 2 x 0.625 x 1.25
    assert text.startswith("**Stale:** it was made before the rows named the engine's code")
    _csv(tmp_path / "cpu_step.csv", [{**row, "engine_code": timings.engine_code()} for row in rows])
    assert time_blocks.cpu_step(tmp_path / "cpu_step.csv").startswith("| variant |")  # today's engine
    assert "No `missing.csv`" in time_blocks.cpu_step(tmp_path / "missing.csv")


def _profile_time_rows(profile: str, hours: dict, device: str = "cuda") -> list[dict]:
    """A profile time estimate's rows as ``bench_profile_time`` writes them, with today's images of each notebook and
    setup and the given hours by notebook (0 for the others)."""
    from experiments.analysis.workload import profile_work

    fields = {"device": device, "device_name": "test-gpu", "commit": "c" * 40, "python": "3", "torch": "9.9",
              "triton": "3", "topk": "0", "profile": profile}
    return [{**fields, "notebook": work.notebook, "setup": work.setup, "train_images": str(work.train_images),
             "eval_images": str(work.eval_images), "hours": str(hours.get(work.notebook, 0.0))}
            for work in profile_work(get_profile(profile))]


def test_profile_time_block_sums_the_notebooks_apart_from_the_choice_and_the_calibration_point(tmp_path):
    smoke = _profile_time_rows("smoke", {"table3_samples": 2.5, "table9_imagenet": 1.25})
    _csv(tmp_path / "profile_time_smoke_cuda.csv", smoke)
    text = gpu_blocks.profile_time(tmp_path)
    assert ("- `smoke` profile: training notebooks 3.75 h, one calibration point on every seed 0.00 h (test-gpu "
            "(cuda)") in text
    quick = _profile_time_rows("quick", {"table3_samples": 2.5, "calibration point": 4.0,
                                         "learning-rate choice": 0.5}, "cpu")
    _csv(tmp_path / "profile_time_quick_cpu.csv", quick)
    choices, points = (sum(row["notebook"] == name for row in quick) for name in ("learning-rate choice",
                                                                                 "calibration point"))
    assert choices > 1 and points > 1  # a row per setup: their hours add up
    assert (f"- `quick` profile: training notebooks 2.50 h, the learning-rate choice's other runs {0.5 * choices:.2f} h "
            f"(trained only when the choice is made again), one calibration point on every seed {4 * points:.2f} h"
            in gpu_blocks.profile_time(tmp_path))


def test_a_profile_time_estimate_of_other_images_than_todays_is_shown_stale(tmp_path):
    rows = _profile_time_rows("smoke", {"table3_samples": 2.5})
    changed = [{**row, "eval_images": str(int(row["eval_images"]) - 1) if row["notebook"] == "table3_samples"
                else row["eval_images"]} for row in rows]
    for stale in (changed, rows[1:]):  # an image count changed; a notebook missing
        _csv(tmp_path / "profile_time_smoke_cpu.csv", stale)
        assert gpu_blocks.profile_time(tmp_path).startswith(
            "- **Stale:** its images are not those `experiments/analysis/workload.py` counts today; rerun `make "
            "profile-time PROFILE=smoke DEVICE=cuda`. `smoke` profile:")


def test_until_the_gpu_profile_is_timed_its_cifar_steps_give_a_lower_bound(tmp_path):
    from experiments.spec.profiles import GPU
    from experiments.analysis.workload import profile_work

    header = "device,device_name,commit,python,torch,triton,topk,model,mode,loss,batch_size,ms_per_step\n"
    stamp = "cuda,test-gpu," + "e" * 40 + ",3,9.9,3,0,densenet40_40"
    rows = [f"{stamp},compiled,cross_entropy,64,6.0", f"{stamp},compiled,cross_entropy,64,8.0",
            f"{stamp},eager,cross_entropy,64,20.0", f"{stamp},compiled,smooth_hinge,64,9.0"]
    (tmp_path / "training_step.csv").write_text(header + "\n".join(rows) + "\n")
    images = sum(w.train_images for w in profile_work(GPU, ("cifar",)) if w.notebook in grids.NOTEBOOK_GRIDS)
    text = gpu_blocks.profile_time(tmp_path)
    assert f"at least {images / 64 * 7.0 / 3.6e6:.0f} h on test-gpu ({images:,} training images at 7.00 ms per batch " \
           "of 64" in text and "mean of 2" in text
    other = f"cuda,other-gpu,{'f' * 40},3,9.9,3,0,densenet40_40,compiled,cross_entropy,64,5.0"
    (tmp_path / "training_step.csv").write_text(header + "\n".join(rows + [other]) + "\n")
    lines = gpu_blocks.profile_time(tmp_path).splitlines()  # one bound per GPU and commit, each with its own stamp
    assert len(lines) == 2 and "on test-gpu" in lines[0] and "on other-gpu" in lines[1] and "mean of 1" in lines[1]
    assert "commit ffffffffff" in lines[1] and "commit ffffffffff" not in lines[0]
    (tmp_path / "profile_time_gpu_cuda.csv").write_text("profile,notebook,hours\n")  # measured: no bound any more
    assert "at least" not in gpu_blocks.profile_time(tmp_path)


def test_the_executors_time_comes_first_and_counts_in_the_main_jobs(tmp_path):
    (tmp_path / "manifests").mkdir()
    common = {"profile": "quick", "commit": "d" * 40, "device": "cpu", "cpus": 2, "machine": "x86_64"}
    (tmp_path / "manifests" / "a.json").write_text(json.dumps({**common, "threads": 2, "seconds": 300, "runs": {
        "trained": 0, "from_store": 7}}))
    (tmp_path / "manifests" / "executor.json").write_text(json.dumps({**common, "threads": 1, "seconds": 1500,
        "executor": "local", "workers": 2, "runs": {"trained": 7, "from_store": 0, "failed": 0}}))
    text = time_blocks.figures_time(tmp_path, tmp_path / "empty")
    assert "the `local` executor (2 workers, 7 runs trained, 25 minutes, 1 torch threads each), then 1 notebooks, " \
           "30 minutes in all (0 runs trained in them and 7 read back from the results store; x86_64, 2 cores, 2 " \
           "torch threads; commit dddddddddd" in text


def test_the_readmes_main_job_time_sums_the_fresh_clones_manifests(tmp_path):
    empty = tmp_path / "empty_store_quick"
    assert "No run of `make paper-figures` from an empty store is recorded" in time_blocks.main_job_time(empty)
    (empty / "manifests").mkdir(parents=True)
    common = {"profile": "quick", "commit": "d" * 40, "device": "cpu", "cpus": 2, "machine": "x86_64"}
    (empty / "manifests" / "a.json").write_text(json.dumps({**common, "threads": 2, "seconds": 300}))
    (empty / "manifests" / "executor.json").write_text(json.dumps({**common, "threads": 1, "seconds": 1500,
                                                                  "executor": "local", "workers": 2}))
    assert time_blocks.main_job_time(empty).startswith("*Its training and notebooks took 30 minutes from an empty "
                                                       "results store on x86_64, 2 cores, the install and the report")
    assert "`benchmarks/results/empty_store_quick/`, commit dddddddddd).*" in time_blocks.main_job_time(empty)


def test_another_machines_run_is_listed_compared_and_gives_the_range(tmp_path):
    def run_folder(folder, seconds, machine, table):
        (folder / "manifests").mkdir(parents=True)
        (folder / "claims").mkdir()
        (folder / "manifests" / "a.json").write_text(json.dumps({
            "profile": "quick", "commit": "d" * 40, "device": "cpu", "threads": 2, "cpus": 2, "machine": machine,
            "seconds": seconds, "runs": {"trained": 5, "from_store": 0}}))
        (folder / "claims" / "claim5.json").write_text(json.dumps({"claim": 5, "status": "reproduced"}))
        (folder / "table4.csv").write_text(table)

    figures, empty = tmp_path / "figures", tmp_path / "empty_store_quick"
    run_folder(figures, 600, "Fast CPU", "loss,top5\nCE,1 ± 0.5\n")
    run_folder(empty, 660, "Fast CPU", "loss,top5\nCE,1 ± 0.5\n")
    assert "Expect" not in time_blocks.figures_time(figures, empty, tmp_path / "none")  # one run: no range
    run_folder(tmp_path / "machine_slow_quick", 1800, "Slow CPU", "loss,top5\nCE,1.2 ± 0.5\n")
    lines = time_blocks.figures_time(figures, empty, tmp_path / "none").splitlines()
    assert lines[3].startswith("- `make paper-figures` from an empty results store on another fresh clone: 1 "
                               "notebooks, 30 minutes in all") and "Slow CPU, 2 cores" in lines[3]
    assert lines[4] == ("- That run's: of 1 tables, 0 byte-identical to the committed ones, 1 within the seeds' noise "
                        "(table4), 0 beyond it; 1 of 1 verdicts the same")
    assert lines[5] == ("- Expect 11 to 30 minutes for the training and the notebooks from an empty store: the range of "
                        "these 2 runs (Fast CPU, 2 cores; Slow CPU, 2 cores)")


def test_figures_time_block_sums_the_manifests_and_says_where_their_runs_came_from(tmp_path):
    (tmp_path / "manifests").mkdir()
    common = {"profile": "quick", "commit": "d" * 40, "device": "cpu", "threads": 2, "cpus": 2, "machine": "x86_64"}
    for name, seconds, runs in (("a", 600, {"trained": 3, "from_store": 1}), ("b", 1200, {"trained": 5, "from_store": 0})):
        (tmp_path / "manifests" / f"{name}.json").write_text(json.dumps({**common, "seconds": seconds, "runs": runs}))
    text = time_blocks.figures_time(tmp_path, tmp_path / "empty")
    assert "2 notebooks, 30 minutes in all (8 runs trained in them and 1 read back from the results store; x86_64, " \
           "2 cores, 2 torch threads; commit dddddddddd" in text and "empty results store" not in text
    (tmp_path / "empty" / "manifests").mkdir(parents=True)
    (tmp_path / "empty" / "manifests" / "a.json").write_text(json.dumps({**common, "seconds": 2400, "runs": {
        "trained": 170, "from_store": 30}}))
    for root, table, status in ((tmp_path, "1,2\n", "reproduced"), (tmp_path / "empty", "1,2\n", "reproduced")):
        (root / "claims").mkdir(exist_ok=True)
        (root / "table4.csv").write_text(table)
        (root / "claims" / "claim5.json").write_text(json.dumps({"claim": 5, "status": status}))
    (tmp_path / "fig3.csv").write_text("loss,epoch_seconds\nCE,0.51\n")
    (tmp_path / "empty" / "fig3.csv").write_text("loss,epoch_seconds\nCE,0.52\n")
    rerun = time_blocks.figures_time(tmp_path, tmp_path / "empty")
    assert text + "\n- `make paper-figures` from an empty results store on a fresh clone: 1 notebooks, 40 minutes in " \
        "all (170 runs trained in them and 30 read back" in rerun
    assert rerun.endswith("- That run's: of 2 tables, 1 byte-identical to the committed ones, 1 within the seeds' "
                          "noise (fig3), 0 beyond it; 1 of 1 verdicts the same")
    (tmp_path / "claims" / "claim5.json").write_text(json.dumps({"claim": 5, "status": "not reproduced"}))
    assert time_blocks.figures_time(tmp_path, tmp_path / "empty").endswith("0 of 1 verdicts the same")
    local = tmp_path / "local"
    (local / "claims").mkdir(parents=True)
    (local / "table4.csv").write_text("1,3\n")
    (local / "claims" / "claim5.json").write_text(json.dumps({"claim": 5, "status": "not reproduced"}))
    assert time_blocks.figures_time(tmp_path, tmp_path / "empty", local).endswith(
        "`train --executor local --jobs 2` trained (`benchmarks/results/local/`): of 1 tables, 0 byte-identical to the "
        "committed ones, 0 within the seeds' noise, 1 beyond it (table4); 1 of 1 verdicts the same")
    for name in ("a", "b"):  # the committed figures copied from the empty-store run: nothing to compare
        (tmp_path / "empty" / "manifests" / f"{name}.json").write_bytes((tmp_path / "manifests" / f"{name}.json").read_bytes())
    assert time_blocks.figures_time(tmp_path, tmp_path / "empty").endswith("The committed figures are that run's own (same "
                                                                      "manifests)")
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "a.json").write_text(json.dumps({**common, "seconds": 40, "runs": {"trained": 0,
                                                                                            "from_store": 9}}))
    assert "1 notebooks, 40 seconds in all (0 runs trained" in time_blocks._manifests_line("x", tmp_path / "quick", "q/")
    older = {key: value for key, value in common.items() if key not in ("cpus", "machine")}
    (tmp_path / "manifests" / "c.json").write_text(json.dumps({**older, "seconds": 0}))
    assert "runs not counted in 1 of them" in time_blocks.figures_time(tmp_path, tmp_path / "empty")


def test_a_figure_table_block_is_the_notebooks_table_with_its_stamp(tmp_path):
    assert "run `make paper-figures`" in readme.figure_table(readme.LABEL_NOISE_FIT, tmp_path)
    table = "**Flipped training labels**\n\n| loss | p=0.1 noisy label |\n|---|---|\n| CE | 7.4 ± 0.3 |\n\n*quick profile*\n"
    (tmp_path / f"{readme.LABEL_NOISE_FIT}.md").write_text(table)
    assert readme.figure_table(readme.LABEL_NOISE_FIT, tmp_path) == table.strip()


def test_a_readme_without_a_block_is_a_clear_error(tmp_path):
    (tmp_path / "README.md").write_text("no blocks here")
    with pytest.raises(ValueError, match="no document has block 'verdict-summary'"):
        readme.placement(readme.documents(tmp_path))


def test_calibration_block_gives_ce_s_gap_at_the_calibration_s_rate_and_at_the_one_it_chose(tmp_path):
    targets = [{"label": label, "published": published, "cell": [], "metric": ["top", label], "fitted": fitted,
                "ours": ours} for label, published, ours, fitted in (("top-1", 72.0, 73.0, True),
                                                                     ("top-5", 90.0, 89.0, True),
                                                                     ("macro", 50.0, 51.0, False))]
    entry = {"dataset": "imagenet_like", "knobs": {"pixel_noise": 0.6}, "targets": targets, "rms_gap_fitted": 1.0,
             "points": [], "commit": "f" * 40}
    (tmp_path / "quick.json").write_text(json.dumps({"profile": "quick", "setups": {"imagenet": entry}}))
    chosen = {"top-1": {"ours": 74.0, "multiplier": 3.0}, "top-5": {"ours": 90.0, "multiplier": 1.0},
              "macro": {"ours": 80.0, "multiplier": 3.0}}  # held out: not in the fitted gap
    (tmp_path / "lr.json").write_text(json.dumps({"profile": "quick",
                                                  "setups": {"imagenet": {"cross_entropy": chosen}}}))
    row = next(line for line in readme.calibration(tmp_path / "quick.json", tmp_path / "lr.json").splitlines()
               if line.startswith("| `imagenet_like`"))
    assert row.endswith("| 1.0 points (the grid's learning rate) | 1.4 points (x1, x3) |")
    entry["ce_multipliers"] = {"cross_entropy top1": 3.0}
    (tmp_path / "quick.json").write_text(json.dumps({"profile": "quick", "setups": {"imagenet": entry}}))
    row = next(line for line in readme.calibration(tmp_path / "quick.json", tmp_path / "none.json").splitlines()
               if line.startswith("| `imagenet_like`"))
    assert row.endswith("| 1.0 points (x3 the grid's learning rate) | not measured |")


@pytest.mark.parametrize("module, block", [(crowding, "crowding"), (label_noise_capacity, "label-noise-capacity")],
                         ids=["crowding", "label_noise_capacity"])
def test_a_probe_made_of_other_runs_than_the_current_setups_says_so_where_it_is_shown(module, block):
    """The committed docs show a probe's table as stale, with why, exactly when its rows are not the runs the
    current stand-ins, calibration, learning rates and grids give, by today's training code: never a stale number
    passed off as current."""
    if not provenance.full_history():  # which code trained the rows is asked of git about the commits they name
        pytest.skip("a shallow clone or no checkout: the stale marks cannot be told (git clone without --depth)")
    stale = readme.probe_staleness(module, result_rows.read_rows(module.path_for(result_rows.DEFAULT_PROFILE)))
    shown = readme._pattern(block).search(readme.placement()[block].read_text()).group(2)
    assert ("**Stale:**" in shown) == (stale is not None), stale
    if stale:
        assert stale in shown


def test_a_probe_made_on_other_setups_is_shown_stale_with_why(tmp_path):
    configs = crowding.configs(get_profile(result_rows.DEFAULT_PROFILE))
    current = [{"key": config.key()} for config in configs]
    assert readme.probe_staleness(crowding, current) is None
    assert "2 of its 100 rows name no run" in readme.probe_staleness(crowding, [{}, {"key": ""}, *current[2:]])
    other = [{"key": configs[0].replace(seed=99).key()}, *current[1:]]
    assert readme.probe_staleness(crowding, other).startswith("1 of its 100 rows are runs of other setups than the "
                                                               "current ones, and 1 of the current runs are missing")


def test_a_probe_trained_by_earlier_code_is_shown_stale_with_its_commit(monkeypatch):
    """The run keys hold no code: rows of today's setups that an earlier engine or library trained are stale too,
    naming the commit, and rows whose commit git cannot place (None) are not called stale."""
    current = [{"key": config.key(), "commit": "a" * 40}
               for config in crowding.configs(get_profile(result_rows.DEFAULT_PROFILE))]
    monkeypatch.setattr(readme, "changed_since", lambda commit, files, uncommitted: commit == "b" * 40)
    assert readme.probe_staleness(crowding, current) is None
    earlier = [*current[:-2], {**current[-2], "commit": "b" * 40}, {**current[-1], "commit": "b" * 40 + "-dirty"}]
    assert readme.probe_staleness(crowding, earlier) == ("made at commit bbbbbbbbbb, and the training's code (the "
                                                         "engine, the losses) changed since")
    monkeypatch.setattr(readme, "changed_since", lambda commit, files, uncommitted: None)
    assert readme.probe_staleness(crowding, earlier) is None


def _concurrency_rows(commit: str, engine_code: str) -> list[dict]:
    stamp = {"device": "cuda", "device_name": "test-gpu", "commit": commit, "python": "3", "torch": "9.9",
             "triton": "3", "topk": "0", "engine_code": engine_code, "date": "2026-01-01T00:00:00",
             "model": "densenet40_40", "compile": "default", "gpu_sharing": "time-slicing", "batch_size": "64",
             "warmup": "1", "steps": "2"}
    return [{**stamp, "concurrency": str(n), "aggregate_images_per_s": str(rate), "ratio_to_one_run": str(rate / 1000)}
            for n, rate in ((1, 1000.0), (2, 1800.0), (4, 3600.0), (8, 3000.0))]


@pytest.fixture
def tiny_plan(monkeypatch):
    """The blocks' plan replaced by four runs that stack together (3.6e6 training images, 360,000 validated, 40,000
    tested each) and one trained alone (360,000 training images), so that every hours below is worked out by hand."""
    from experiments.tests.test_hours import planned

    paper = {"model": "densenet40_40", "model_options": {}, "batch_size": 64}  # what the measurements train
    runs = (*(planned(seed, 3_600_000, 360_000, 40_000, **paper) for seed in range(4)),
            planned(4, 360_000, 0, 0, notebook="fig3_epoch_time", **paper))
    monkeypatch.setattr(gpu_blocks, "_gpu_cifar_runs", lambda: runs)
    from experiments.scale.plan import CalibrationFirst

    # a calibration of two moves that trains three of the notebooks' runs, four where it averages every seed
    first = CalibrationFirst("cifar", [list(runs[:1]), list(runs[1:3])], list(runs[3:]), list(runs[:3]))
    every = CalibrationFirst("cifar", [list(runs[:1]), list(runs[1:4])], list(runs[4:]), list(runs[:4]))
    monkeypatch.setattr(gpu_blocks, "_gpu_cifar_calibration", lambda searched: first if searched else every)
    return runs


#: What the blocks say the hours count when only the training rate was measured.
TRAINING_ONLY = "(estimated: training counted; compilation, validation and testing not measured"


def test_the_concurrency_block_gives_each_ratio_and_the_hours_at_the_fastest_setting(tmp_path, tiny_plan):

    assert "gpu_session.sh concurrency" in gpu_blocks.concurrency(tmp_path / "concurrency.csv")
    rows = _concurrency_rows("a" * 40, timings.engine_code())
    _csv(tmp_path / "concurrency.csv", rows)
    text = gpu_blocks.concurrency(tmp_path / "concurrency.csv")
    # one GPU: 4 workers at 900 images/s each train the 4 runs at once (4000 s), then the lone one at 1000 (360 s);
    # 8 GPUs: one run on each of 4 GPUs (3600 s), then the lone one
    assert text.startswith("- test-gpu, densenet40_40, batch 64, the engine's step (`default`): one run 1,000 "
                           "images/s; side by side 2 x1.80, 4 x3.60, 8 x3.00 (target >= x3 on an H100); the `gpu` "
                           "profile's CIFAR-100 notebooks (5 runs, 14,760,000 training images, 1,440,000 validated, "
                           "160,000 tested at most) would take 1.2 h on one test-gpu with `PER_GPU=4 STACK=1` and "
                           f"1.1 h on 8 with `PER_GPU=1 STACK=1` {TRAINING_ONLY}; targets 8 h and 1 h; "
                           "`concurrency.csv`: test-gpu (cuda)")
    assert "Stale" not in text and "commit aaaaaaaaaa" in text
    measured = [{**rows[0], "eval_images_per_s": "10000", "warmup_s": "40"}]  # one run alone, everything timed
    _csv(tmp_path / "concurrency.csv", measured)
    # each of the 4 runs: 3600 + 400,000 / 10,000 + 40 s, one after another (8 GPUs: at once); the lone run 360 + 40 s
    assert gpu_blocks.concurrency(tmp_path / "concurrency.csv").startswith(
        "- test-gpu, densenet40_40, batch 64, the engine's step (`default`): one run 1,000 images/s; the `gpu` "
        "profile's CIFAR-100 notebooks (5 runs, 14,760,000 training images, 1,440,000 validated, 160,000 tested at "
        "most) would take 4.2 h on one test-gpu and 1.1 h on 8, both with `PER_GPU=1 STACK=1` (estimated: training, "
        "compilation, validation and testing counted; targets")


def test_the_concurrency_block_names_the_fastest_current_setting_across_compile_modes(tmp_path, tiny_plan,
                                                                                      monkeypatch):
    """Invocations with other compile modes (and MPS) are compared: the fastest current one is named, a stale one is
    not."""

    graphs = [{**row, "compile": "reduce-overhead", "gpu_sharing": "mps", "date": "2026-01-02T00:00:00",
               "aggregate_images_per_s": str(4 * float(row["aggregate_images_per_s"]))}
              for row in _concurrency_rows("a" * 40, timings.engine_code())[:2]]
    stale = [{**row, "engine_code": "0" * 12, "date": "2026-01-03T00:00:00", "aggregate_images_per_s": "9999"}
             for row in _concurrency_rows("b" * 40, "0" * 12)[:1]]
    not_the_profiles = [{**row, "date": "2026-01-04T00:00:00", "aggregate_images_per_s": "99999", **change}
                        for change in ({"device": "cpu", "device_name": "a-cpu"}, {"model": "small_cnn"},
                                       {"batch_size": "256"})
                        for row in _concurrency_rows("a" * 40, timings.engine_code())[:1]]
    _csv(tmp_path / "concurrency.csv", [*_concurrency_rows("a" * 40, timings.engine_code()), *graphs, *stale,
                                        *not_the_profiles])
    # one GPU: 2 workers at 3,600 images/s each, two rounds of 1000 s, the lone run 90 s (0.58 h; the first
    # invocation's best: 1.21 h); 8 GPUs: one run on each of 4 at 4,000 images/s, 900 s, then 90 s (0.28 h)
    hours = ("0.6 h on one test-gpu with `PER_GPU=2 STACK=1`, `reduce-overhead` under MPS and 0.3 h on 8 with "
             f"`PER_GPU=1 STACK=1`, `reduce-overhead` under MPS {TRAINING_ONLY}")
    last = gpu_blocks.concurrency(tmp_path / "concurrency.csv").splitlines()[-1]
    assert last == f"- **Fastest with today's engine on the test-gpu:** {hours})"
    line = gpu_blocks.gpu_hours(tmp_path / "concurrency.csv")  # the README's line, from the same rows
    assert line.startswith(f"*The `gpu` profile's CIFAR-100 notebooks would take {hours}; test-gpu (cuda), torch 9.9")
    # with the calibration first at each estimate's setting: on one GPU 3.6e6 images at 4,000 images/s, then two runs
    # at 3,600 each, then the notebooks' run left alone on the pool and the lone run (900 + 1000 + 900 + 90 s); on 8,
    # 900 s a move, then 900 + 90 s; averaging every seed, the fourth run trains in the second move: on one GPU the
    # same 900 + 1000 + 900 + 90 s, on 8 GPUs 900 s a move, then 90 s
    assert ("commit aaaaaaaaaa); with the [calibration](docs/reproducing.md#the-calibrations-hours) of its stand-in "
            "first (`make calibrate`: at least 3 runs in 2 moves, each waiting for the last, 3 of them the notebooks' "
            "own, where the seeds at the search's start agree so closely that it averages one), at least 0.8 h on one "
            "and 0.8 h on 8 (4 runs and 0.8 h on one and 0.5 h on 8 where it needs all 4 seeds) (`concurrency.csv`"
            ) in line
    other_gpu = [{**row, "device_name": "other-gpu"} for row in _concurrency_rows("a" * 40, timings.engine_code())]
    _csv(tmp_path / "concurrency.csv", [*graphs, *other_gpu])
    line = gpu_blocks.gpu_hours(tmp_path / "concurrency.csv")  # one line in the README whatever the GPU models
    assert "\n" not in line and "on one test-gpu" in line and "; in " in line and "on one other-gpu" in line
    _csv(tmp_path / "concurrency.csv", stale)
    line = gpu_blocks.gpu_hours(tmp_path / "concurrency.csv")  # what the earlier engine measured, said to be stale
    # 4 x 360.04 s, then 36.0 s: 0.41 h
    assert line.startswith("*The `gpu` profile's training time is not measured with today's engine (with an earlier "
                           "one, its CIFAR-100 notebooks would have taken 0.4 h on one test-gpu")
    assert "commit bbbbbbbbbb); with the [calibration](docs/reproducing.md#the-calibrations-hours) of its" in line
    assert " on 8 where it needs all 4 seeds); stale): run `bash benchmarks/gpu_session.sh" in line
    _csv(tmp_path / "concurrency.csv", not_the_profiles)
    assert gpu_blocks.gpu_hours(tmp_path / "concurrency.csv").startswith(
        "*The `gpu` profile's training time is not measured with today's engine: run")
    _csv(tmp_path / "concurrency.csv", graphs)
    monkeypatch.setattr(gpu_blocks, "_gpu_cifar_calibration", lambda searched: None)  # once its calibration is committed
    assert "); its stand-in's calibration is committed: nothing to train before them (`concurrency.csv`" in \
        gpu_blocks.gpu_hours(tmp_path / "concurrency.csv")


def test_the_fastest_estimate_counts_the_most_parts_then_the_fewest_hours(tmp_path, tiny_plan):
    """An invocation that timed the validation and the warm-up is preferred to a faster one that did not; the
    estimates on one GPU and on eight are chosen apart."""

    measured = [{**row, "eval_images_per_s": "10000", "warmup_s": "40"}
                for row in _concurrency_rows("a" * 40, timings.engine_code())[:1]]
    faster = [{**row, "date": "2026-01-02T00:00:00", "aggregate_images_per_s": "2000"}
              for row in _concurrency_rows("a" * 40, timings.engine_code())[:1]]
    _csv(tmp_path / "concurrency.csv", [*measured, *faster])
    assert gpu_blocks.concurrency(tmp_path / "concurrency.csv").splitlines()[-1] == (
        "- **Fastest with today's engine on the test-gpu:** 4.2 h on one test-gpu and 1.1 h on 8, both with `PER_GPU=1 "
        "STACK=1`, `default` (estimated: training, compilation, validation and testing counted)")


@pytest.mark.parametrize("engine_code, why", [("0" * 12, "the engine's epoch changed since"),
                                              ("", "it was made before the rows named the engine's code")])
def test_an_engine_timing_made_with_other_engine_code_is_shown_stale(tmp_path, engine_code, why):
    _csv(tmp_path / "concurrency.csv", _concurrency_rows("a" * 40, engine_code))
    assert gpu_blocks.concurrency(tmp_path / "concurrency.csv").startswith(f"- **Stale:** {why} (`experiments/engine/")


def test_runs_stacked_into_one_model_are_named_so_and_judged_by_the_stacking_code_too(tmp_path, tiny_plan):
    """A stacked row's ratio is listed apart from the side-by-side ones, its rate can make the fastest setting, and
    it is stale when the stacking's code changed though the engine's did not."""

    alone, side_by_side = ({**row, "stack": "1", "cudnn_benchmark": "False"}
                           for row in _concurrency_rows("a" * 40, timings.engine_code())[:2])
    stacked = [{**alone, "engine_code": timings.engine_code(stacked=True), "stack": str(stack),
                "concurrency": str(processes), "aggregate_images_per_s": str(rate), "ratio_to_one_run": str(rate / 1000)}
               for processes, stack, rate in ((1, 4, 2500.0), (2, 4, 2000.0))]
    _csv(tmp_path / "concurrency.csv", [alone, side_by_side, *stacked])
    text = gpu_blocks.concurrency(tmp_path / "concurrency.csv")
    assert ("one run 1,000 images/s; side by side 2 x1.80; stacked into one model 4 x2.50, 2 x 4 x2.00 (target >= x3 "
            "on an H100)") in text and "Stale" not in text
    # one GPU: the 4 runs as one stack at 2,500 images/s, 5760 s, then the lone run, 360 s; 8 GPUs: a run on each of
    # four, 3600 s, then the lone one
    fastest = (
        "- **Fastest with today's engine on the test-gpu:** 1.7 h on one test-gpu with `PER_GPU=1 STACK=4`, `default` "
        f"and 1.1 h on 8 with `PER_GPU=1 STACK=1`, `default` {TRAINING_ONLY})")
    assert text.splitlines()[-1] == fastest
    timed_by_cudnn = [{**row, "cudnn_benchmark": "True", "date": "2026-01-02T00:00:00", "aggregate_images_per_s": "9999"}
                      for row in (alone, *stacked)]  # faster, but make never lets cuDNN time its algorithms
    _csv(tmp_path / "concurrency.csv", [alone, side_by_side, *stacked, *timed_by_cudnn])
    text = gpu_blocks.concurrency(tmp_path / "concurrency.csv")
    assert "`default`, `cudnn.benchmark`): one run 9,999 images/s" in text and text.splitlines()[-1] == fastest
    changed = [{**row, "engine_code": "0" * 12} for row in stacked]  # made before the stacking's last change
    _csv(tmp_path / "concurrency.csv", [alone, side_by_side, *changed])
    text = gpu_blocks.concurrency(tmp_path / "concurrency.csv")
    assert text.startswith("- **Stale:** the engine's epoch changed since (") and "`experiments/engine/stacked.py`" in text
    # the current rows alone: two workers at 900 images/s, two rounds of 4000 s, then 360 s
    assert "2.3 h on one test-gpu with `PER_GPU=2 STACK=1`" in text.splitlines()[-1]


def test_fig3_epochs_name_the_baseline_measured_again_last(tmp_path):

    stamp = {"device": "cuda", "device_name": "test-gpu", "commit": "c" * 40, "python": "3", "torch": "9.9",
             "triton": "3", "topk": "0", "engine_code": timings.engine_code(), "model": "densenet40_40",
             "compile": "reduce-overhead", "batch_size": "64", "images": "45000", "epochs": "2", "loss_seconds": "0.01"}
    _csv(tmp_path / "fig3_epoch_time.csv", [
        {**stamp, "loss": "cross_entropy", "backend": "", "K": "", "B": "", "repeat": "0", "epoch_seconds": "5.35"},
        {**stamp, "loss": "smooth_hinge", "backend": "", "K": "5", "B": "", "repeat": "0", "epoch_seconds": "4.95"},
        {**stamp, "loss": "cross_entropy", "backend": "", "K": "", "B": "", "repeat": "1", "epoch_seconds": "4.50"}])
    lines = gpu_blocks._epochs(tmp_path).splitlines()
    assert lines[-3].endswith("(reduce-overhead), cross_entropy: 5.35 s")
    assert lines[-2].endswith("smooth_hinge (K = 5): 4.95 s")
    assert lines[-1].endswith("cross_entropy (measured again last): 4.50 s")


def test_the_calibration_work_block_says_which_stand_ins_are_calibrated_and_what_the_others_train(monkeypatch):
    """Each stand-in of the ``gpu`` profile: calibrated (nothing to train), or its shortest calibration's moves and
    runs, and the training images of those that are not the notebooks' own against the notebooks'."""
    from experiments.scale import plan as planning

    to_make = planning.calibrations_to_make(GPU)
    every = planning.calibrations_to_make(GPU, searched=None)
    monkeypatch.setattr(planning, "calibrations_to_make", lambda profile, searched=1: {
        "cifar": (to_make if searched else every)["cifar"]})
    lines = gpu_blocks.calibration_work().splitlines()
    assert lines[0] == ("- `cifar100_like`: not calibrated; at least 48 runs in 5 moves searching on one seed, 12 of "
                        "them the notebooks' own, the 36 others 485,913,600 training images, x0.48 those of its "
                        "notebooks' 119 runs; 156 runs on all 4 seeds, 12 of them the notebooks' own, the 144 others "
                        "1,943,654,400 training images, "
                        "x1.94 those of its notebooks' 119 runs")
    assert lines[1] == "- `plantnet_like`: calibrated (`experiments/calibrated/gpu.json`): nothing to train first"
    assert len(lines) == len(GPU.calibrated_setups)


def test_the_search_seeds_block_gives_the_seeds_the_rule_takes_at_the_committed_spread_and_the_papers(tmp_path):
    """Each stand-in's most scattered fitted number (held-out ones left out), its upper limit and the seeds the rule
    takes there; a seed's NaN (a diverged run) gives no spread, so every seed; the paper's CE on CIFAR-100 from its 95%
    half-widths."""
    (tmp_path / "calibration_seeds.csv").write_text(
        "data,CE number,role,each seed (%)\n"
        'a_like,"top-1",fitted,"70.0, 71.0, 72.0"\n'  # standard deviation 1: every seed
        'a_like,"top-5",fitted,"90.0, 90.0, 90.0"\n'
        'a_like,"top-1, p = 0.2",held out,"10.0, 50.0, 90.0"\n'  # held out: not read
        'b_like,"top-1",fitted,"70.0, 70.1, 70.2"\n'  # standard deviation 0.1, limit 0.21: one seed
        'c_like,"top-1",fitted,"70.0, 70.1"\n'  # 0.07 over 2 seeds, limit x3.95: still one
        'd_like,"top-1",fitted,"70.0, nan"\n')
    lines = readme.search_seeds(tmp_path).splitlines()
    assert lines[0].endswith("at the spread's 80% upper confidence limit:")
    assert lines[1].endswith("the largest standard deviation of a fitted number over its 3 seeds 1.00 points (upper "
                             "limit 2.12): 3 of 3 seeds")
    assert lines[2].endswith("over its 3 seeds 0.10 points (upper limit 0.21): 1 of 3 seeds")
    assert lines[3].endswith("over its 2 seeds 0.07 points (upper limit 0.28): 1 of 2 seeds")
    assert lines[4].endswith("no spread over its 2 seeds (one seed, or a number that is not finite): 2 of 2 seeds")
    assert lines[5].endswith("the largest standard deviation of a fitted number over its 4 seeds 0.25 points (upper "
                             "limit 0.43): 1 of 4 seeds")  # CE's 0.4 half-width, top-1
    assert readme.search_seeds(tmp_path / "none").startswith("*No `calibration_seeds.csv`")


def test_the_docs_notebook_table_names_every_output_each_notebook_wrote():
    """docs/reproducing.md's table of notebooks against the committed quick manifests' outputs (claims aside)."""
    text = (PROJECT_ROOT / "docs" / "reproducing.md").read_text()
    section = text.split("## The notebooks and what they write", 1)[1].split("| notebook (`notebooks/`) |", 1)[1]
    table = section.split("\n\n", 1)[0]  # the first table of the section
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    listed = {row[0].strip("| `"): set(re.findall(r"`([^`]+)`", row[-1])) for row in rows}
    manifests = {path.stem: json.loads(path.read_text()) for path in (FIGURES / "quick" / "manifests").glob("*.json")}
    written = {notebook: {name.rsplit(".", 1)[0] for name in manifest["outputs"] if not name.startswith("claims/")}
               for notebook, manifest in manifests.items() if "executor" not in manifest}
    assert listed == written


def test_the_test_suite_whose_time_goes_stale_is_the_one_make_test_runs():
    recipe = (PROJECT_ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    folders = [word for word in recipe.split() if word.endswith("/tests")]
    assert folders and tuple(folders) == time_blocks.TEST_SUITE[:len(folders)]
    assert set(time_blocks.TEST_SUITE[len(folders):]) == {"Makefile", "pyproject.toml"}
