"""The generated blocks of how long things took on a CPU: the set-up commands, the main job (the committed figures'
manifests, a run from an empty store, other machines' runs), the executors, the compile times and a CPU training
step, from ``benchmarks/results/`` and ``figures/``; registered in :data:`experiments.publishing.readme.BLOCKS`."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.analysis import compare
from experiments.paths import (BENCHMARK_RESULTS, CALIBRATED, FIGURES, PROJECT_ROOT, TRAINING_CODE,
                               TRAINING_CODE_TEXT)
from experiments.provenance import changed_since, short_commit
from experiments.publishing.result_rows import (DEFAULT_PROFILE, engine_staleness, read_rows, short_stamp_text,
                                                stale_text)

#: What ``make test`` runs (the Makefile's test folders), as git pathspecs: a timing of it made with other contents of
#: these is stale.
TEST_SUITE = ("topk/tests", "data_prep/tests", "experiments/tests", "benchmarks/tests", "Makefile", "pyproject.toml")
#: What the runs of a profile train with, as git pathspecs: the training's code and what tuning chose.
TRAINED_WITH = (*TRAINING_CODE, str(CALIBRATED.relative_to(PROJECT_ROOT)))


def _stale_since(commit: str, files: tuple[str, ...], what: str, command: str) -> str:
    """A warning that a timing made at ``commit`` is stale, ``what`` having changed since (``files``, as committed),
    naming the ``command`` that measures it again; nothing where they did not change or git cannot tell."""
    return stale_text(commit, what, command) if changed_since(commit, files, uncommitted=False) is True else ""


def setup_time(path: Path = BENCHMARK_RESULTS / "setup_time.csv") -> str:
    """The two set-up commands' times on a fresh clone, with the processor they were measured on: the install, and
    the range of ``make test``'s runs after it (``python -m benchmarks.bench_setup_time``)."""
    rows = read_rows(path)
    installs, tests = [r for r in rows if r["step"] == "install"], [r for r in rows if r["step"] == "test"]
    if not installs or not tests:
        return f"*No `{path.name}` in `benchmarks/results/`: run `python -m benchmarks.bench_setup_time`.*"
    install = installs[-1]
    minutes = sorted(float(row["seconds"]) / 60 for row in tests)
    spread = f"{minutes[0]:.1f} min" if len(minutes) == 1 else f"{minutes[0]:.1f} to {minutes[-1]:.1f} min"
    failed = sum(row["passed"] != "True" for row in tests)
    outcome = f", and {failed} of its runs FAILED" if failed else ""
    runs = "one run" if len(minutes) == 1 else f"{len(minutes)} runs"
    stale = _stale_since(tests[-1]["commit"], TEST_SUITE, "the tests", "python -m benchmarks.bench_setup_time")
    return (f"{stale}On a fresh clone, {install['device_name']} with {install['cores']} cores: the install (`make venv`) took "
            f"{float(install['seconds']) / 60:.1f} min and `make test` {spread}{outcome} ({runs}; `{path.name}`, "
            f"commit {short_commit(tests[-1]['commit'])}).")


def figures_time(figures: Path = FIGURES / DEFAULT_PROFILE,
                 empty_store: Path = BENCHMARK_RESULTS / f"empty_store_{DEFAULT_PROFILE}",
                 executor: Path = BENCHMARK_RESULTS / f"executors_{DEFAULT_PROFILE}") -> str:
    """How long the main job ran, from its manifests: the run behind the committed figures, a ``make paper-figures``
    from an empty results store on a fresh clone (its manifests, table CSVs and verdicts copied to ``empty_store``),
    and the same on other machines (copied beside it, to ``machine_NAME_PROFILE/``); how each one's
    tables and verdicts, and those of the notebooks run on the ``local`` executor's store (``executor``,
    :mod:`benchmarks.bench_executors`), compare with the committed ones; and the range of the runs from an empty
    store, with their processors."""
    machines = sorted(empty_store.parent.glob(f"machine_*_{DEFAULT_PROFILE}"))
    lines = [_manifests_line(f"The committed `{DEFAULT_PROFILE}` figures", figures / "manifests",
                             f"figures/{DEFAULT_PROFILE}/manifests/")]
    from_empty = [folder for folder in (empty_store, *machines) if any((folder / "manifests").glob("*.json"))]
    for folder in from_empty:
        where = "on a fresh clone" if folder == empty_store else "on another fresh clone"  # its processor follows
        lines += [_manifests_line(f"`make paper-figures` from an empty results store {where}", folder / "manifests",
                                  f"benchmarks/results/{folder.name}/"),
                  _rerun_line("That run's", figures, folder)]
    if any((executor / "claims").glob("*.json")):
        lines.append(_rerun_line("The notebooks on the runs `train --executor local --jobs 2` trained "
                                 f"(`benchmarks/results/{executor.name}/`)", figures, executor))
    if len(from_empty) > 1:
        lines.append(_range_line([folder / "manifests" for folder in from_empty]))
    return "\n".join(lines)


def main_job_time(empty_store: Path = BENCHMARK_RESULTS / f"empty_store_{DEFAULT_PROFILE}") -> str:
    """The README's line on how long ``make paper-figures`` takes: the executor's and the notebooks' minutes of the run
    from an empty results store on a fresh clone (its manifests), with its processor and commit."""
    manifests = _manifests(empty_store / "manifests")
    if not manifests:
        return f"*No run of `make paper-figures` from an empty store is recorded in `benchmarks/results/{empty_store.name}/`.*"
    processors = _notebooks_processors(manifests)
    commits = ", ".join(sorted({short_commit(m["commit"]) for m in manifests}))
    return (f"*Its training and notebooks took {_minutes(sum(m['seconds'] for m in manifests))} from an empty results "
            f"store on {', '.join(processors)}, the install and the report on top; another processor may take several "
            f"times longer ([how long](docs/reproducing.md#how-long-it-took), `benchmarks/results/{empty_store.name}/`, "
            f"commit {commits}).*")


def _range_line(folders: list[Path]) -> str:
    """The range of the main job's times from an empty store over the runs whose manifests are in ``folders``."""
    runs = [_manifests(folder) for folder in folders]
    minutes = [sum(m["seconds"] for m in manifests) / 60 for manifests in runs]
    processors = _notebooks_processors([m for manifests in runs for m in manifests])
    return (f"- Expect {min(minutes):.0f} to {max(minutes):.0f} minutes for the training and the notebooks from an "
            f"empty store: the range of these {len(runs)} runs ({'; '.join(processors)})")


def _manifests(folder: Path) -> list[dict]:
    """The manifests (the executor's and the notebooks') in ``folder``."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def _notebooks_processors(manifests: list[dict]) -> list[str]:
    """The processors the notebooks of ``manifests`` ran on (those that name one), each once."""
    return sorted({_processor(m) for m in manifests if "cpus" in m and "executor" not in m})


def _rerun_line(what: str, figures: Path, rerun: Path) -> str:
    """How a rerun's tables and verdicts compare with the committed figures (:mod:`experiments.analysis.compare`),
    or that the committed figures are the rerun's own."""
    if _same_files(figures / "manifests", rerun / "manifests"):
        return "- The committed figures are that run's own (same manifests)"
    tables, _, claims = compare.compare(figures, rerun)
    identical = [table for table in tables if table.identical]
    beyond = [table.name for table in tables if table.outside]
    differ = [table.name for table in tables if not table.identical and not table.outside]
    named = lambda names: f" ({', '.join(names)})" if names else ""  # noqa: E731
    same = sum(ours == theirs for ours, theirs in claims.values())
    return (f"- {what}: of {len(tables)} tables, {len(identical)} byte-identical to the committed ones, "
            f"{len(differ)} within the seeds' noise{named(differ)}, {len(beyond)} beyond it{named(beyond)}; "
            f"{same} of {len(claims)} verdicts the same")


def _same_files(one: Path, other: Path) -> bool:
    """Whether two folders hold the same JSON files, byte for byte."""
    files = sorted(path.name for path in one.glob("*.json"))
    return files == sorted(path.name for path in other.glob("*.json")) and all(
        (one / name).read_bytes() == (other / name).read_bytes() for name in files)


def _manifests_line(what: str, directory: Path, shown: str) -> str:
    """Minutes in all of the executor (where one trained the runs first) and the notebooks whose manifests are in
    ``directory``, where they ran, and how many runs were trained there or read back from the results store (trained
    before, by the executor, or by an earlier notebook)."""
    manifests = _manifests(directory)
    if not manifests:
        return f"*No manifest in `{shown}`: run `make paper-figures`.*"
    seconds = sum(m["seconds"] for m in manifests)
    executor = [m for m in manifests if "executor" in m]
    notebooks = [m for m in manifests if "executor" not in m]
    recorded = [m["runs"] for m in notebooks if "runs" in m]
    runs = (f"{sum(r['trained'] for r in recorded)} runs trained in them and {sum(r['from_store'] for r in recorded)} "
            f"read back from the results store" if len(recorded) == len(notebooks)
            else f"runs not counted in {len(notebooks) - len(recorded)} of them, which predate the count")
    where = sorted({f"{_processor(m) if 'cpus' in m else m['device']}, {m['threads']} torch threads" for m in notebooks})
    steps = [f"the `{m['executor']}` executor ({_workers(m)}{m['runs']['trained']} runs trained, "
             f"{_minutes(m['seconds'])}{_threads_each(m)})" for m in executor]
    steps += [f"{len(notebooks)} notebooks"] * bool(notebooks)
    details = [runs] * bool(notebooks) + where + [f"commit {', '.join(sorted({short_commit(m['commit']) for m in manifests}))}"]
    return f"- {what}: {', then '.join(steps)}, {_minutes(seconds)} in all ({'; '.join(details)}; `{shown}`)"


def _processor(manifest: dict) -> str:
    """Where a manifest's run went: the processor (the device for manifests that predate its name) and its cores."""
    return f"{manifest.get('machine') or manifest['device']}, {manifest['cpus']} cores"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 90 else f"{seconds:.0f} seconds"


def _threads_each(manifest: dict) -> str:
    return f", {manifest['threads']} torch threads each" if manifest.get("threads") else ""  # none: Slurm's tasks


def _workers(manifest: dict) -> str:
    return f"{manifest['workers']} workers, " if manifest.get("workers") else ""


def executors_time(path: Path = BENCHMARK_RESULTS / f"executors_{DEFAULT_PROFILE}.csv") -> str:
    """The default profile trained from an empty store by the inline and the local executor in one script run
    (:mod:`benchmarks.bench_executors`): their times, and how many records they computed alike."""
    rows = {row["executor"]: row for row in read_rows(path)}
    if not {"inline", "local"} <= set(rows):
        return (f"*No `{path.name}` in `benchmarks/results/`: run `python -m benchmarks.bench_executors "
                f"{DEFAULT_PROFILE} --jobs 2`.*")
    inline, local = rows["inline"], rows["local"]
    identical, differing = int(local["records_identical"]), int(local["records_differing"])
    stale = _stale_since(local["commit"], TRAINED_WITH, "the training's code or calibration",
                         f"python -m benchmarks.bench_executors {DEFAULT_PROFILE} --jobs 2")
    return (f"{stale}*The {DEFAULT_PROFILE} profile's {local['runs']} trainings from an empty store on {local['device_name']}, "
            f"{local['cores']} cores: `inline` {float(inline['seconds']) / 60:.0f} min, `local --jobs {local['jobs']}` "
            f"{float(local['seconds']) / 60:.0f} min (x{float(local['ratio_to_inline']):.2f}); {identical} of "
            f"{identical + differing} records computed alike, bit for bit"
            + (" (the others differ: inline trains with the machine's threads, each worker with its share, "
               "and this processor's kernels sum in an order that depends on the thread count)" if differing else "")
            + f" (`{path.name}`, commit {short_commit(local['commit'])}).*")


def compile_time(path: Path = BENCHMARK_RESULTS / "compile_time_cpu.csv") -> str:
    """Seconds of each loss's first compiled training step (a compilation), its second, and one at a batch one
    smaller (a recompilation), on a CPU (:mod:`benchmarks.bench_compile_time`)."""
    rows = read_rows(path)
    if not rows:
        return f"*No `{path.name}` in `benchmarks/results/`: run `python -m benchmarks.bench_compile_time`.*"
    lines = ["| loss | first step (compiles) | second step | a batch one smaller (compiles again) |", "|---|---|---|---|"]
    lines += [f"| {row['loss']} | {float(row['first_step_s']):.1f} s | {1e3 * float(row['second_step_s']):.1f} ms | "
              f"{float(row['short_batch_step_s']):.1f} s |" for row in rows]
    row = rows[0]
    lines += ["", f"*{row['model']}, batch {row['batch']}, `torch.compile` mode default; {row['device_name']}, "
                  f"{row['cpu_threads']} torch threads, torch {row['torch']}, commit {short_commit(row['commit'])} "
                  f"(`{path.name}`).*"]
    stale = _stale_since(row["commit"], TRAINING_CODE, TRAINING_CODE_TEXT, "python -m benchmarks.bench_compile_time")
    return (f"{stale.rstrip()}\n\n" if stale else "") + "\n".join(lines)  # a table starts its own paragraph


def cpu_step(path: Path = BENCHMARK_RESULTS / "cpu_step.csv") -> str:
    """The default profile's training step on a CPU as the engine runs it, against the variants that change how it
    runs, not what it trains (:mod:`benchmarks.bench_cpu_step`), and the bound of their gains multiplied."""
    rows = read_rows(path)
    if not rows:
        return f"*No `{path.name}` in `benchmarks/results/`: run `python -m benchmarks.bench_cpu_step`.*"
    lines = ["| variant | threads | ms per step | speed against the engine's step | first loss differs by |",
             "|---|---|---|---|---|"]
    lines += [f"| {row['variant']} | {row['threads']} | {float(row['ms_per_step']):.1f} | "
              f"x{float(row['ratio_to_engine']):.2f} | {float(row['first_loss_difference']):.1e} |" for row in rows]
    engine = rows[0]
    lines += ["", f"*{engine['profile']} profile's CIFAR-100 step: {engine['model']}, {engine['image_size']} px, batch "
                  f"{engine['batch']}; {short_stamp_text(engine)} (`{path.name}`).*"]
    ratios = {row["variant"]: float(row["ratio_to_engine"]) for row in rows}
    if {"channels_last", "1 thread"} <= set(ratios):
        runs = int(engine["threads"])  # one one-thread run per thread the engine's step had
        lines += ["", f"If the gains multiplied, {runs} one-thread runs side by side in channels-last would train at "
                      f"x{runs * ratios['1 thread'] * ratios['channels_last']:.1f} the engine's speed: an upper "
                      f"bound, as the runs share the memory bandwidth, and the data, evaluation and notebooks' own "
                      f"time stay."]
    return engine_staleness(engine, "python -m benchmarks.bench_cpu_step") + "\n".join(lines)
