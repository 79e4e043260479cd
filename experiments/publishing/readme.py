"""The numbers of README.md and docs/*.md, generated from committed results: none in a block is typed by hand.

A block is the text between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``; it lives in exactly one of
:func:`documents` (``README.md`` and ``docs/*.md``), the one that holds its subject, and moves with its section.
:data:`BLOCKS` says what writes each, from the default profile's verdicts (``figures/quick/claims/``) and calibration
(``experiments/calibrated/quick.json``), and the benchmarks' CSVs and reports (``benchmarks/results/``), each row
stamped with its device, commit and versions.

    python -m experiments.publishing.readme            # rewrite the blocks, in every document
    python -m experiments.publishing.readme --check    # exit 1 if a block differs from what the committed results give
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from scipy import stats

from experiments.tuning.calibration import (SEARCH_ERROR, SPREAD_CONFIDENCE, TOLERANCE, rate_text, seed_spread,
                                            spread_limit, unmatched)
from experiments.tuning.calibration import search_seeds as search_seeds_for
from experiments.tuning.learning_rates import fitted_gap_at_chosen_rate, stale_text
from experiments.spec import tuned
from experiments.spec.profiles import get_profile
from experiments.spec.paper import CLAIMS, LABEL_NOISE, TABLE_4, TABLE_7
from experiments.paths import (BENCHMARK_RESULTS, CALIBRATED, CALIBRATION_SEEDS, CROWDED_CLASSES, FIGURES,
                               LABEL_NOISE_FIT, PROJECT_ROOT, TRAINING_CODE, TRAINING_CODE_TEXT)
from experiments.provenance import changed_since, short_commit
from experiments.publishing.gpu_blocks import calibration_work, concurrency, gpu_hours, gpu_results, profile_time
from experiments.publishing.result_rows import (DEFAULT_PROFILE, NOISED_HEADLINE, SMOOTH_HEADLINE, headline_rows,
                                                library_staleness, newest_current, read_rows, short_stamp_text,
                                                stamp_text)
from experiments.publishing.time_blocks import (compile_time, cpu_step, executors_time, figures_time, main_job_time,
                                                setup_time)

README = PROJECT_ROOT / "README.md"
#: The documentation's pages (``docs/*.md``), whose blocks are generated and checked as the README's.
DOCS = PROJECT_ROOT / "docs"
#: The target of the CPU headline (:data:`~experiments.publishing.result_rows.NOISED_HEADLINE`), pytopk / topk.
SPEEDUP_TARGET = 10.0
#: The README's training-step headline (``training_step.csv``): the compiled step with the noised loss on the kernel.
STEP_HEADLINE = {"mode": "compiled", "backend": "auto", "K": "5", "B": "10"}
#: What measures each CSV of the library's benchmarks again.
NOISED_COMMAND = "python -m benchmarks.bench_noised_losses --headline"
SMOOTH_COMMAND = "python -m benchmarks.bench_smooth_hinge --headline --reference PATH"
STEP_COMMAND = "bash benchmarks/gpu_session.sh step compiled"
#: The longest line of evidence the README's verdict summary quotes of a claim.
EVIDENCE_CHARACTERS = 110


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _claim_verdicts(figures: Path):
    """Each claim of the paper with its verdict file under ``figures/claims/`` and the verdict read from it (None when
    the claim was not run)."""
    for claim in CLAIMS:
        path = figures / "claims" / f"claim{claim.number}.json"
        yield claim, path, json.loads(path.read_text()) if path.exists() else None


def verdicts(figures: Path = FIGURES / DEFAULT_PROFILE) -> str:
    """The verdict on each claim at the default profile, from ``claims/claim<N>.json``."""
    lines = ["| # | the paper says | verdict | the numbers |", "|---|---|---|---|"]
    stamps = set()
    for claim, path, verdict in _claim_verdicts(figures):
        if verdict is None:
            lines.append(f"| {claim.number} | {_cell(claim.text)} | not run | no `claims/{path.name}` |")
            continue
        stamps.add(f"commit {short_commit(verdict.get('commit', 'unknown'))}")
        evidence = "; ".join(verdict["evidence"])
        lines.append(f"| {claim.number} | {_cell(claim.text)} | {verdict['status']} | {_cell(evidence)} |")
    made = ", ".join(sorted(stamps)) or "nothing yet"
    return "\n".join(lines) + f"\n\n*From `figures/{DEFAULT_PROFILE}/claims/` ({DEFAULT_PROFILE} profile, {made}).*"


def one_line(verdict: dict, limit: int = EVIDENCE_CHARACTERS) -> str:
    """The line of a verdict's evidence that decided it, cut at a word boundary: the first failed check (``✗``) of a
    claim not reproduced, the first passed one (``✓``) of a claim reproduced, else the first line (the reason a claim
    is inconclusive or not run)."""
    evidence = verdict.get("evidence") or ["no evidence recorded"]
    mark = {"reproduced": "✓", "not reproduced": "✗"}.get(verdict.get("status", ""))
    line = next((item for item in evidence if mark and item.startswith(mark)), evidence[0])
    if len(line) <= limit:
        return line
    cut = line[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + " …"


def verdict_summary(figures: Path = FIGURES / DEFAULT_PROFILE) -> str:
    """The verdict on each claim with one line of its evidence (:func:`one_line`); :func:`verdicts` gives all of it."""
    lines = ["| # | item | the paper says | verdict | deciding evidence |", "|---|---|---|---|---|"]
    stamps = set()
    for claim, path, verdict in _claim_verdicts(figures):
        if verdict is None:
            lines.append(f"| {claim.number} | {claim.source} | {_cell(claim.text)} | not run | no `{path.name}` |")
            continue
        stamps.add(short_commit(verdict.get("commit", "unknown")))
        lines.append(f"| {claim.number} | {claim.source} | {_cell(claim.text)} | {verdict['status']} | "
                     f"{_cell(one_line(verdict))} |")
    made = f"commit {', '.join(sorted(stamps))}" if stamps else "nothing run yet"
    return "\n".join(lines) + f"\n\n*From `figures/{DEFAULT_PROFILE}/claims/` ({DEFAULT_PROFILE} profile, {made}).*"


def performance_headline(results: Path = BENCHMARK_RESULTS) -> str:
    """Three numbers: the noised loss against ``pytopk`` on a CPU, the compiled training step's overhead over
    cross-entropy on a GPU (the newest measurement of today's library), the smoothed hinge against Berrada et al.'s
    code; each from its committed CSV, marked stale where ``topk/`` changed since."""
    lines = []
    noised, _, _ = headline_rows(results / "noised_losses.csv", NOISED_HEADLINE, ())
    if {"topk", "pytopk"} <= set(noised):
        ours, theirs = float(noised["topk"]["ms"]), float(noised["pytopk"]["ms"])
        lines.append(f"- {library_staleness(noised['topk'], NOISED_COMMAND)}"
                     f"**x{theirs / ours:.1f} faster than the published `pytopk`**: the noised loss's forward + "
                     f"backward on a CPU, batch {NOISED_HEADLINE['batch']}, L {NOISED_HEADLINE['n_classes']}, "
                     f"K {NOISED_HEADLINE['k']}, B {NOISED_HEADLINE['n_samples']} ({ours:.2f} ms against "
                     f"{theirs:.2f}; `noised_losses.csv`, {short_stamp_text(noised['topk'])})")
    steps = [r for r in read_rows(results / "training_step.csv") if r["device"] == "cuda"
             and r["loss"].startswith("noised_balanced") and all(r[k] == v for k, v in STEP_HEADLINE.items())]
    if step := newest_current(steps):
        lines.append(f"- {library_staleness(step, STEP_COMMAND)}"
                     f"**{100 * float(step['overhead_vs_ce']):+.1f}% over cross-entropy**: a {step['mode']} training "
                     f"step of {step['model']} (batch {step['batch_size']}) with the noised loss at K {step['K']}, "
                     f"B {step['B']}: {float(step['ms_per_step']):.2f} ms a step, against cross-entropy's in the same "
                     f"run (`training_step.csv`, {short_stamp_text(step)})")
    smooth, _, _ = headline_rows(results / "smooth_hinge.csv", SMOOTH_HEADLINE, ())
    if {"smooth_hinge", "reference"} <= set(smooth):
        ours, theirs = float(smooth["smooth_hinge"]["ms"]), float(smooth["reference"]["ms"])
        error = " / ".join(f"{float(smooth[m]['grad_error_x20']):.1e}" for m in ("smooth_hinge", "reference"))
        lines.append(f"- {library_staleness(smooth['smooth_hinge'], SMOOTH_COMMAND)}"
                     f"**x{theirs / ours:.1f} faster than Berrada et al.'s smoothed hinge**: forward + backward on a "
                     f"CPU, batch {SMOOTH_HEADLINE['batch']}, L {SMOOTH_HEADLINE['n_classes']}, "
                     f"K {SMOOTH_HEADLINE['k']} ({ours:.2f} ms against {theirs:.2f}), float32 gradient error on "
                     f"scores x20, ours / theirs: {error} (`smooth_hinge.csv`, {short_stamp_text(smooth['smooth_hinge'])})")
    return "\n".join(lines) or "*No benchmark result in `benchmarks/results/`: run `make bench`.*"


def calibration(path: Path = CALIBRATED / f"{DEFAULT_PROFILE}.json",
                lr_path: Path = CALIBRATED / f"{DEFAULT_PROFILE}_learning_rates.json") -> str:
    """Each stand-in's chosen knobs and CE's numbers on it against the paper's, fitted and held out, at the learning
    rate of the calibration and at the one CE chose for the tables; then the numbers not matched and why
    (:func:`experiments.tuning.calibration.unmatched`)."""
    if not path.exists():
        return f"*No calibration stored for the {DEFAULT_PROFILE} profile: run `make calibrate`.*"
    lines = ["| stand-in | knobs | CE fitted: ours (paper) | CE held out: ours (paper) | RMS gap, fitted (CE's rate) | "
             "the same at CE's chosen learning rate |", "|---|---|---|---|---|---|"]
    setups = tuned.Calibration.load(path)
    chosen = tuned.LearningRates.load(lr_path)
    for setup, entry in setups.items():
        numbers = {role: "; ".join(f"{t.label} {t.ours:.1f} ({t.published:g})" for t in entry.targets
                                   if t.fitted == role) or "none reported" for role in (True, False)}
        knobs = ", ".join(f"{k} {v:g}" for k, v in entry.knobs.items())
        lines.append(f"| `{entry.dataset}` | {knobs} | {numbers[True]} | {numbers[False]} | "
                     f"{entry.rms_gap_fitted:.1f} points ({rate_text(entry.ce_multipliers)}) | "
                     f"{_at_chosen_rate(entry, chosen.get(setup))} |")
    misses = [f"- `{entry.dataset}`, {row['CE number']} ({row['role']}, {row['gap (points)']:+.1f} points): "
              f"{row['why']}" for entry in setups.values() for row in unmatched(entry)]
    commits = ", ".join(sorted({short_commit(e.commit) for e in setups.values()}))
    stale = stale_text([*setups.values(), *chosen.values()])
    return "\n".join([*lines, "", f"Not matched (fitted: over {TOLERANCE[True]:g} points from the "
                       f"paper's; held out: over {TOLERANCE[False]:g}), and why:", "", *misses]) + (
        f"\n\n*From `experiments/calibrated/{path.name}` (CE runs, the seeds' mean, commit {commits}).*") + (
        f" **{stale[0].upper()}{stale[1:]}.**" if stale else "")


def _at_chosen_rate(entry: tuned.Calibration, chosen: tuned.LearningRates | None) -> str:
    """The RMS gap of CE's fitted numbers at the learning rate it chose (:mod:`experiments.tuning.learning_rates`)."""
    if chosen is None or not chosen.cross_entropy:
        return "not measured"
    rms, _, _, multipliers = fitted_gap_at_chosen_rate(entry, chosen)
    return f"{rms:.1f} points ({multipliers})"


def learning_rates(path: Path = CALIBRATED / f"{DEFAULT_PROFILE}_learning_rates.json") -> str:
    """Each stand-in's learning-rate multiplier chosen for each loss and selection metric on validation data
    (:mod:`experiments.tuning.learning_rates`)."""
    if not path.exists():
        return f"*No learning rates chosen for the {DEFAULT_PROFILE} profile: run `make learning-rates`.*"
    setups = tuned.LearningRates.load(path)
    lines = [f"- `{entry.dataset}` (the grids' rate {_rates(entry)}): "
             + "; ".join(f"{c.choice} x{c.multiplier:g}" for c in entry.choices) for entry in setups.values()]
    tried = ", ".join(sorted({f"x{m:g}" for entry in setups.values() for m in entry.multipliers}, key=lambda m: float(m[1:])))
    commits = ", ".join(sorted({short_commit(e.commit) for e in setups.values()}))
    return "\n".join(lines) + (f"\n\n*From `experiments/calibrated/{path.name}` (best validation value of the first "
                               f"seed's run at {tried}; commit {commits}).*")


def _rates(entry: tuned.LearningRates) -> str:
    return " or ".join(f"{lr:g}" for lr in sorted({c.lr for c in entry.choices}))


def noised_headline(results: Path = BENCHMARK_RESULTS) -> str:
    """Forward + backward of the noised loss, pytopk and cross-entropy at the CPU headline configuration."""
    by_method, _, lines = headline_rows(results / "noised_losses.csv", NOISED_HEADLINE, ("topk", "pytopk", "cross_entropy"))
    if "topk" not in by_method:
        return "*No CPU headline in `benchmarks/results/noised_losses.csv`: run `make bench`.*"
    text = "\n".join(lines) + "\n\n"
    if "pytopk" in by_method:
        speedup = float(by_method["pytopk"]["ms"]) / float(by_method["topk"]["ms"])
        text += (f"pytopk / topk = x{speedup:.1f} (target x{SPEEDUP_TARGET:g}: "
                 f"{'met' if speedup >= SPEEDUP_TARGET else 'not met'}). ")
    return text + f"*{stamp_text(by_method['topk'])}.*" + _stale_after(by_method["topk"], NOISED_COMMAND)


def smooth_headline(results: Path = BENCHMARK_RESULTS) -> str:
    """Forward + backward, memory and float32 gradient error of the smoothed hinge against its reference."""
    by_method, methods, lines = headline_rows(results / "smooth_hinge.csv", SMOOTH_HEADLINE,
                                          ("smooth_hinge", "reference", "noised", "cross_entropy"))
    if "smooth_hinge" not in by_method:
        return "*No CPU headline in `benchmarks/results/smooth_hinge.csv`: run `make bench REFERENCE=path`.*"
    errors = {m: " / ".join(f"{float(by_method[m][c]):.1e}" for c in ("grad_error_x1", "grad_error_x20"))
              if by_method[m].get("grad_error_x1") else "" for m in methods}
    lines.append("| gradient error, x1 / x20 | " + " | ".join(errors[m] for m in methods) + " |")
    text = "\n".join(lines) + "\n\n"
    if "reference" in by_method:
        speedup = float(by_method["reference"]["ms"]) / float(by_method["smooth_hinge"]["ms"])
        text += f"The reference / ours = x{speedup:.1f}. "
    if {"esp_autograd", "esp_saved_weights"} <= set(by_method):
        ratio = float(by_method["esp_autograd"]["ms"]) / float(by_method["esp_saved_weights"]["ms"])
        text += f"Autograd through the recursion / our saved-weights backward = x{ratio:.1f}. "
    return text + f"*{stamp_text(by_method['smooth_hinge'])}.*" + _stale_after(by_method["smooth_hinge"], SMOOTH_COMMAND)


def _stale_after(row: dict, command: str) -> str:
    """A table's stale mark (:func:`~experiments.publishing.result_rows.library_staleness`) after its stamp."""
    stale = library_staleness(row, command).strip()
    return f" {stale}" if stale else ""


def kernel_resources(results: Path = BENCHMARK_RESULTS) -> str:
    """Registers and spills of the fused kernel for sm_90a, from the committed ``kernel_resources_*.txt``."""
    lines = []
    for path in sorted(results.glob("kernel_resources_sm90_triton-*.txt")):
        header, _, *table = path.read_text().splitlines()
        registers = [int(line.split()[-3]) for line in table if line.strip()]
        spills = [line.split()[-2] for line in table if line.strip()]
        spilled = [s for s in spills if s != "0/0"]
        lines.append(f"- {header.split(', kernel')[0]}: {min(registers)}-{max(registers)} registers per thread, "
                     f"{'spills ' + ', '.join(spilled) if spilled else 'no spill'} (`{path.name}`)")
    return "\n".join(lines) or "*No kernel resource report in `benchmarks/results/`.*"


def figure_table(name: str, figures: Path = FIGURES / DEFAULT_PROFILE) -> str:
    """The table ``name`` a notebook wrote in ``figures/<profile>/``, with its title and stamp."""
    path = figures / f"{name}.md"
    if not path.exists():
        return f"*No `{path.name}` in `figures/{DEFAULT_PROFILE}/`: run `make paper-figures`.*"
    return path.read_text().strip()


def search_seeds(figures: Path = FIGURES / DEFAULT_PROFILE) -> str:
    """How many seeds the calibration's search would average (:func:`experiments.tuning.calibration.search_seeds`) at
    the spread of the default profile's CE numbers at its chosen knobs (its committed ``calibration_seeds`` table, the
    values as rounded there) and of the paper's CE on CIFAR-100 (Tables 4 and 7: each 95% half-width over 4 seeds
    taken back to a standard deviation)."""
    rows = [row for row in read_rows(figures / f"{CALIBRATION_SEEDS}.csv") if row["role"] == "fitted"]
    if not rows:
        return f"*No `{CALIBRATION_SEEDS}.csv` in `figures/{DEFAULT_PROFILE}/`: run `make paper-figures`.*"
    lines = [f"The search averages the fewest seeds whose mean has a standard error within {SEARCH_ERROR:g} points, a "
             f"quarter of a fitted number's {TOLERANCE[True]:g}-point tolerance, at the spread's "
             f"{SPREAD_CONFIDENCE:.0%} upper confidence limit:"]
    for data in dict.fromkeys(row["data"] for row in rows):
        numbers = {row["CE number"]: [float(v) for v in row["each seed (%)"].split(", ")]
                   for row in rows if row["data"] == data}
        seeds = len(next(iter(numbers.values())))
        spread = seed_spread([dict(zip(numbers, values)) for values in zip(*numbers.values())], list(numbers))
        lines.append(f"- `{data}` ({DEFAULT_PROFILE} profile, CE at its chosen knobs): {_spread_text(spread, seeds)}")
    t = float(stats.t.ppf(0.975, 3))
    spread = max(table["cross_entropy"][LABEL_NOISE.index(p)][1] * 2 / t for table in (TABLE_4, TABLE_7)
                 for p in (0.0, 0.4))
    lines.append(f"- the paper's CE on CIFAR-100 (the fitted numbers of Tables 4 and 7): {_spread_text(spread, 4)}")
    return "\n".join(lines)


def _spread_text(spread: float | None, seeds: int) -> str:
    """The seeds' spread, its upper limit and the seeds the search takes for it, in words."""
    if spread is None:
        return f"no spread over its {seeds} seeds (one seed, or a number that is not finite): {seeds} of {seeds} seeds"
    return (f"the largest standard deviation of a fitted number over its {seeds} seeds {spread:.2f} points (upper "
            f"limit {spread_limit(spread, seeds):.2f}): {search_seeds_for(spread, seeds)} of {seeds} seeds")


def _probe(module_name: str, runs: Callable[[list[dict]], str], results: Path) -> str:
    """The block of the probe :mod:`experiments.<module_name>`: its table from the committed CSV, then which
    runs (``runs(rows)``) on which devices, commits and torch versions."""
    module = importlib.import_module(f"experiments.probes.{module_name}")
    path = module.path_for(DEFAULT_PROFILE, results)
    rows = read_rows(path)
    if not rows:
        return f"*No `{path.name}` in `benchmarks/results/`: run `python -m experiments.probes.{module_name} {DEFAULT_PROFILE}`.*"
    made = "; ".join(sorted({f"{r['device']}, torch {r['torch']}, commit {short_commit(r['commit'])}" for r in rows}))
    stale = probe_staleness(module, rows)
    warning = f"**Stale:** {stale}; rerun `python -m experiments.probes.{module_name} {DEFAULT_PROFILE}`.\n\n" if stale else ""
    return f"{warning}{module.markdown(rows)}\n\n*{DEFAULT_PROFILE} profile, {runs(rows)}; runs on {made} (`{path.name}`).*"


def probe_staleness(module, rows: list[dict]) -> str | None:
    """Why a probe's committed rows are not made of the runs its current setups give (the run keys in the rows
    against :func:`configs` of the probe at the default profile: a changed stand-in, calibration, learning rate or
    grid changes them) by today's training code (a run's key holds no code: the commits the rows name against
    :data:`~experiments.paths.TRAINING_CODE` as committed), or None when they are."""
    expected = {config.key() for config in module.configs(get_profile(DEFAULT_PROFILE))}
    found = [row.get("key") or None for row in rows]
    if None in found:
        return f"{found.count(None)} of its {len(rows)} rows name no run, written before rows named their run"
    other = [key for key in found if key not in expected]
    missing = expected - set(found)
    if other or missing:
        return (f"{len(other)} of its {len(rows)} rows are runs of other setups than the current ones, and "
                f"{len(missing)} of the current runs are missing (the stand-ins, calibration, learning rates or grids "
                f"changed since)")
    commits = {row["commit"].partition("-dirty")[0] for row in rows if row.get("commit")}
    earlier = sorted(commit for commit in commits if changed_since(commit, TRAINING_CODE, uncommitted=False) is True)
    if earlier:
        made = "commit" if len(earlier) == 1 else "commits"
        return f"made at {made} {', '.join(map(short_commit, earlier))}, and {TRAINING_CODE_TEXT} changed since"
    return None


def label_noise_capacity(results: Path = BENCHMARK_RESULTS) -> str:
    """The capacity probe of the CIFAR-100 stand-in's label noise (:mod:`experiments.probes.label_noise_capacity`)."""
    return _probe("label_noise_capacity", lambda rows: "the tables' first seed", results)


def crowding(results: Path = BENCHMARK_RESULTS) -> str:
    """The probe of classes crowding every top K under the noised losses, and of eps (:mod:`experiments.probes.crowding`)."""
    return _probe("crowding", lambda rows: f"the tables' runs ({len({r['seed'] for r in rows})} seeds at most) and the "
                  "same runs at other eps", results)


#: Each generated block and what writes it; :func:`placement` finds the one document that holds it.
BLOCKS: dict[str, Callable[[], str]] = {
    "verdict-summary": verdict_summary,
    "performance-headline": performance_headline,
    "setup-time": setup_time,
    "verdicts": verdicts,
    "calibration": calibration,
    "noised-headline": noised_headline,
    "smooth-headline": smooth_headline,
    "kernel-resources": kernel_resources,
    "gpu-results": gpu_results,
    "profile-time": profile_time,
    "figures-time": figures_time,
    "main-job-time": main_job_time,
    "label-noise-fit": functools.partial(figure_table, LABEL_NOISE_FIT),
    "crowded-classes": functools.partial(figure_table, CROWDED_CLASSES),
    "calibration-seeds": functools.partial(figure_table, CALIBRATION_SEEDS),
    "search-seeds": search_seeds,
    "label-noise-capacity": label_noise_capacity,
    "crowding": crowding,
    "learning-rates": learning_rates,
    "compile-time": compile_time,
    "executors-time": executors_time,
    "cpu-step": cpu_step,
    "concurrency": concurrency,
    "gpu-hours": gpu_hours,
    "calibration-work": calibration_work,
}

#: A block's markers; its name is lower case, digits and hyphens.
_START = re.compile(r"<!-- generated: ([a-z0-9][a-z0-9-]*) -->")
_END = re.compile(r"<!-- end: ([a-z0-9][a-z0-9-]*) -->")


def documents(root: Path = PROJECT_ROOT) -> list[Path]:
    """The files whose blocks are generated: ``README.md`` and every page of ``docs/``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {re.escape(name)} -->)(.*?)(<!-- end: {re.escape(name)} -->)", re.S)


def blocks_in(text: str) -> list[str]:
    """The names of the blocks ``text`` holds, in order; an unclosed or unpaired marker is an error naming it."""
    starts, ends = _START.findall(text), _END.findall(text)
    for name in starts:
        if not _pattern(name).search(text):
            raise ValueError(f"block {name!r} has no '<!-- end: {name} -->' after its start")
    for name in ends:
        if name not in starts:
            raise ValueError(f"'<!-- end: {name} -->' has no '<!-- generated: {name} -->' before it")
    return starts


def placement(paths: list[Path] | None = None, blocks: dict[str, Callable[[], str]] = BLOCKS) -> dict[str, Path]:
    """Each block's document. A block in no document, in two (or twice in one), or a document naming a block that
    :data:`BLOCKS` does not know, is an error naming it."""
    paths = documents() if paths is None else paths
    where: dict[str, list[Path]] = {}
    for path in paths:
        try:
            names = blocks_in(path.read_text())
        except ValueError as error:
            raise ValueError(f"{_shown(path)}: {error}") from None
        for name in names:
            if name not in blocks:
                raise ValueError(f"{_shown(path)} has a block {name!r} that nothing writes: add it to BLOCKS or remove "
                                 "its markers")
            where.setdefault(name, []).append(path)
    for name in blocks:
        found = where.get(name, [])
        if not found:
            raise ValueError(f"no document has block {name!r}: add '<!-- generated: {name} -->' and "
                             f"'<!-- end: {name} -->' where it goes (README.md or a page of docs/)")
        if len(found) > 1:
            raise ValueError(f"block {name!r} is in {', '.join(_shown(p) for p in found)}: a block lives in one file")
    return {name: found[0] for name, found in where.items()}


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def regenerate(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with each of ``blocks`` that it holds rewritten (the others are left as they are)."""
    for name in blocks_in(text):
        if name in blocks:
            content = "\n" + blocks[name]() + "\n"
            text = _pattern(name).sub(lambda match: match.group(1) + content + match.group(3), text)
    return text


def stale_blocks(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> list[str]:
    """The blocks of ``text`` that differ from what the committed results give."""
    return [name for name in blocks_in(text) if name in blocks
            and _pattern(name).search(regenerate(text, {name: blocks[name]})).group(2) != _pattern(name).search(text).group(2)]


def stale(paths: list[Path] | None = None, blocks: dict[str, Callable[[], str]] = BLOCKS) -> dict[str, list[str]]:
    """The stale blocks of each document that has any, after checking that each block lives in exactly one."""
    paths = documents() if paths is None else paths
    placement(paths, blocks)
    found = {_shown(path): stale_blocks(path.read_text(), blocks) for path in paths}
    return {path: names for path, names in found.items() if names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.publishing.readme", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated block is out of date")
    args = parser.parse_args(argv)
    paths = documents()
    try:
        where = placement(paths)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        found = stale(paths)
        for path, names in found.items():
            print(f"{path}: blocks {names} differ from the committed results: run python -m experiments.publishing.readme",
                  file=sys.stderr)
        return 1 if found else 0
    for path in paths:
        text = path.read_text()
        written = regenerate(text)
        if written != text:
            path.write_text(written)
        names = [name for name, home in where.items() if home == path]
        print(f"{_shown(path)}: {len(names)} blocks regenerated{' (' + ', '.join(names) + ')' if names else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
