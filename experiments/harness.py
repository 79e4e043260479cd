"""What a notebook calls, and its one entry into the package: run a grid of cells through the results store, and
write its figures, tables and claim verdicts to ``figures/<profile>/`` with the profile and the data that made them.
A notebook holds parameters, calls to this module and presentation, nothing else; what else it uses of the package
(the grids, the paper's numbers, the summaries, ...) it imports from here (:data:`NOTEBOOK_IMPORTS`).

    from experiments import harness
    from experiments.harness import grids

    ctx = harness.start("table3_samples", profile="quick")
    frame = ctx.run(grids.table3(ctx.profile))     # one row per run, accuracies in percent
    ctx.save_table(table, "table3", "Table 3: ...")
"""

from __future__ import annotations

import html
import json
import math
import os
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt  # headless without a display; the inline backend under papermill
import pandas as pd
import torch

from data_prep import MissingDataError
from experiments.analysis import analytic, claims, plots, summary, timings
from experiments.analysis.claims import Verdict
from experiments.analysis.summary import column_labels, to_markdown
from experiments.engine.config import RunConfig
from experiments.engine.store import ResultsStore
from experiments.engine.run_claim import train_once
from experiments.engine.train import COMPILE_MODES
from experiments.paths import CALIBRATION_SEEDS, CROWDED_CLASSES, FIGURES, LABEL_NOISE_FIT, RESULTS
from experiments.provenance import device_name, git_commit, short_commit
from experiments.publishing import latex
from experiments.spec import grids, paper
from experiments.spec.grids import Cell
from experiments.spec.profiles import SETUPS, Profile, get_profile
from experiments.tuning import calibration, fixed_point, learning_rates

#: What the notebooks import from this module beside :func:`start`: the package's modules and names they present.
NOTEBOOK_IMPORTS = ("analytic", "calibration", "claims", "fixed_point", "grids", "latex", "learning_rates", "paper",
                    "plots", "summary", "timings", "CALIBRATION_SEEDS", "CROWDED_CLASSES", "LABEL_NOISE_FIT")

DEVICES = ("cpu", "cuda")
#: A figure's stamp is wrapped at this many characters per inch of the figure's width (its 7-point text), at least
#: :data:`STAMP_MIN_CHARACTERS`: a line no wider than the axes, which ``bbox_inches="tight"`` would widen otherwise.
STAMP_CHARACTERS_PER_INCH, STAMP_MIN_CHARACTERS = 15, 60


def start(notebook: str, profile: str = "smoke", *, data_root: str | None = None, device: str = "cpu",
          store: str | Path | None = None, figures: str | Path | None = None, threads: int = 0,
          workers: int | None = None, compile_mode: str | None = None) -> "Context":
    """The context of one notebook run: its profile, where results and outputs go, the device, CPU threads, the
    processes reading image folders (default: the machine's cores) and the ``torch.compile`` mode of training."""
    return Context(notebook, get_profile(profile), data_root=data_root, device=device,
                   store=Path(store) if store else RESULTS / profile, figures=Path(figures) if figures else FIGURES / profile,
                   threads=threads, workers=workers, compile_mode=compile_mode)


class Context:
    def __init__(self, notebook: str, profile: Profile, *, data_root, device: str, store: Path, figures: Path,
                 threads: int, workers: int | None = None, compile_mode: str | None = None):
        if device not in DEVICES and not device.startswith("cuda:"):
            raise ValueError(f"'device' should be one of {DEVICES} or 'cuda:N', got {device!r}")
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"'compile_mode' should be None or one of {COMPILE_MODES}, got {compile_mode!r}")
        if threads:
            torch.set_num_threads(threads)
        self.notebook, self.profile, self.device = notebook, profile, device
        self.workers, self.compile_mode = workers, compile_mode
        self.data_root = Path(data_root) if data_root else None
        self.store, self.figures = ResultsStore(store), figures
        self.data: list[str] = []  # descriptions of the datasets this notebook's runs used
        self.setup: str | None = None  # the profile's setup this notebook trains (:meth:`describe`)
        self.outputs: list[str] = []
        self.runs = {"trained": 0, "from_store": 0}  # this notebook's runs, by where their records came from
        self.run_commits: set[str] = set()  # the commits that trained them (their records' provenance)
        self.datasets: set[str] = set()  # the datasets they trained on, for the setups the manifest names
        self.started = time.time()
        # a notebook that reads every run from the store needs no GPU (a cluster's login node, after the executor)
        self.no_cuda_here = device.startswith("cuda") and not torch.cuda.is_available()
        self.commit, self.machine = git_commit(), device_name("cpu" if self.no_cuda_here else device)
        (figures / "claims").mkdir(parents=True, exist_ok=True)
        (figures / "manifests").mkdir(parents=True, exist_ok=True)
        self._write_manifest()

    # -- runs ---------------------------------------------------------------------------------------------------
    def run(self, cells: list[Cell], *, progress: bool = True) -> pd.DataFrame:
        """Train (or read back) every cell; one row per cell: its labels, then :func:`flatten` of its record. A run
        whose loss became NaN is a row with ``status = "diverged"`` and no metrics, not a failed notebook."""
        rows = []
        for i, cell in enumerate(cells, 1):
            tick, trained_before = time.perf_counter(), self.runs["trained"]
            try:
                row = flatten(self.record(cell.config, self._root(cell)))
            except FloatingPointError as error:
                row = {"status": "diverged", "error": str(error)}
            rows.append({**cell.labels, **row})
            cached = self.runs["trained"] == trained_before
            if progress:
                how = "from the store" if cached else f"trained in {time.perf_counter() - tick:.1f} s"
                print(f"[{i}/{len(cells)}] {cell.config.loss} {cell.labels}: {row['status']}, {how}", flush=True)
        frame = pd.DataFrame(rows)
        self.data = sorted(set(self.data) | set(frame.get("data", pd.Series(dtype=str)).dropna()))
        self._write_manifest()
        return frame

    def record(self, config: RunConfig, data_root: Path | None = None) -> dict:
        """One run's record, trained or read back from the store and counted in the manifest either way (``data_root``:
        the real dataset's folder, None on a synthetic stand-in). It trains under the store's claim: while an executor
        or another notebook trains the same run, this waits for its record instead of training it twice."""
        self.datasets.add(config.dataset)
        cached = self.store.holds_outcome(config)  # read back, a NaN included
        if not cached and self.no_cuda_here:
            raise ValueError(f"run {config.key()} is not in the store {self.store.root}, and device {self.device!r} "
                             "was asked for to train it, but torch sees no CUDA device here: train the profile's runs "
                             "where there is one (make train, EXECUTOR=slurm), then run the notebooks anywhere")
        try:
            record = train_once(config, self.store, device=self.device, data_root=data_root, num_workers=self.workers,
                                compile_mode=self.compile_mode)
        except FloatingPointError:  # a NaN is an outcome too, of the commit that trained it
            if commit := self.store.divergence_commit(config.training_key()):
                self.run_commits.add(commit)
            raise
        finally:
            self.runs["from_store" if cached else "trained"] += 1
        self.run_commits.add(record["provenance"]["git_commit"])
        return record

    def _root(self, cell: Cell) -> Path | None:
        if cell.setup.synthetic:
            return None
        if self.data_root is None:
            raise MissingDataError(
                f"the {self.profile.name} profile trains on the real {cell.setup.dataset!r}: pass the data root "
                f"(make paper-figures PROFILE={self.profile.name} DATA=path) after preparing it with "
                f"`python -m data_prep {cell.setup.dataset} --root path/{cell.setup.data_subdir}`")
        return self.data_root / cell.setup.data_subdir

    def describe(self, setup) -> None:
        """Show what this profile trains: the data, the model and the schedule (the paper's are in the notebook's text)."""
        self.setup = next(name for name in SETUPS if getattr(self.profile, name) is setup)
        config = setup.config("cross_entropy", setup.seeds[0])  # the schedule's fields every run of the setup shares
        options = f" {config.model_options}" if config.model_options else ""
        _display_html(f"<p><b>{self.profile.name} profile:</b> {config.dataset} {config.dataset_options or ''}, "
                      f"{config.model}{options}, {config.epochs} epochs, batch {config.batch_size}, lr {config.lr} "
                      f"(x{config.lr_gamma:g} at {list(config.milestones)}), weight decay {config.weight_decay}, "
                      f"seeds {list(setup.seeds)}, SGD with Nesterov momentum {config.momentum:g}, "
                      f"on {self.device}.</p><p>Data: {html.escape(learning_rates.summary_line(self.profile, self.setup))}."
                      f"</p>")

    # -- outputs ------------------------------------------------------------------------------------------------
    def stamp(self, data: str | None = None) -> str:
        """The line every output carries: profile, the commit that made it, and data."""
        used = data or (_data_line(self.data) if self.data else "no data (analytic)")
        return f"{self.profile.name} profile · commit {short_commit(self.commit)} · {used}"

    def save_figure(self, fig: plt.Figure, name: str, *, data: str | None = None) -> None:
        """``figures/<name>.png`` and ``.pdf``, with the profile and data written under the axes."""
        width = max(STAMP_MIN_CHARACTERS, int(STAMP_CHARACTERS_PER_INCH * fig.get_figwidth()))
        stamp = textwrap.fill(self.stamp(data), width=width, break_long_words=False, break_on_hyphens=False)
        fig.text(0.01, 0.0, stamp, fontsize=7, color="0.35", ha="left", va="top")  # under the axes, as wide as they
        for suffix in ("png", "pdf"):
            fig.savefig(self.figures / f"{name}.{suffix}", dpi=150 if suffix == "png" else None, bbox_inches="tight",
                        metadata={"CreationDate": None} if suffix == "pdf" else None)  # no date: reruns differ by content only
        self._add_output(f"{name}.png", f"{name}.pdf")

    def save_table(self, table: pd.DataFrame, name: str, title: str, *, data: str | None = None,
                   show: bool = True) -> None:
        """``figures/<name>.csv`` and ``.md`` (title, table, then the profile and data); shown unless ``show=False``."""
        table.set_axis(column_labels(table), axis=1).to_csv(self.figures / f"{name}.csv")  # one header row
        (self.figures / f"{name}.md").write_text(f"**{title}**\n\n{to_markdown(table)}\n*{self.stamp(data)}*\n")
        self._add_output(f"{name}.csv", f"{name}.md")
        if show:
            _display_html(f"<p><b>{title}</b></p>{table.to_html()}<p><i>{self.stamp(data)}</i></p>")

    def judge(self, verdict: Verdict, *, data: str | None = None) -> None:
        """Write a claim's verdict to ``figures/claims/claim<N>.json``; on the smoke profile (and any profile too short
        to train), training claims are "not run at this profile", with what the check computed kept as evidence.
        ``data`` names evidence that did not come from this profile's runs (e.g. GPU timings)."""
        if verdict.training and self.setup is not None:
            verdict = replace(verdict, evidence=(*verdict.evidence,
                                                 f"data: {learning_rates.summary_line(self.profile, self.setup)}"))
        if verdict.training and not self.profile.judges_training:
            verdict = verdict.not_run(f"the {self.profile.name} profile trains too little to test a training claim")
        payload = {**verdict.to_dict(), "profile": self.profile.name, "notebook": self.notebook, "commit": self.commit,
                   "data": self.stamp(data)}
        path = self.figures / "claims" / f"claim{verdict.claim}.json"
        path.write_text(json.dumps(payload, indent=1))
        self._add_output(f"claims/{path.name}")
        _display_html(verdict.to_html())

    def _add_output(self, *names: str) -> None:
        self.outputs += [n for n in names if n not in self.outputs]
        self._write_manifest()

    def _write_manifest(self) -> None:
        manifest = {"notebook": self.notebook, "profile": self.profile.name, "commit": self.commit, "device": self.device,
                    "data": self.data, "outputs": self.outputs, "seconds": round(time.time() - self.started, 1),
                    "runs": self.runs, "run_commits": sorted(self.run_commits), "setups": self._setups(),
                    "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": self.machine,
                    "pid": os.getpid()}
        (self.figures / "manifests" / f"{self.notebook}.json").write_text(json.dumps(manifest, indent=1))

    def _setups(self) -> dict[str, str]:
        """The profile's setups whose data this notebook's runs trained on, each with its
        :meth:`~experiments.spec.profiles.Setup.trained_fingerprint` (difficulty and learning rates included)."""
        return {name: getattr(self.profile, name).trained_fingerprint() for name in SETUPS
                if getattr(self.profile, name).dataset in self.datasets}


def flatten(record: dict) -> dict:
    """The numbers of a run record that tables and figures use; accuracies in percent."""
    history, config = record["history"], record["config"]
    row = {"status": "done", "key": record["key"], "selected_epoch": record["selected_epoch"],
           "data": record["data"]["description"], "synthetic": record["data"]["synthetic"],
           "epoch_seconds": sum(h["epoch_seconds"] for h in history) / len(history),
           "loss_seconds": sum(h["loss_seconds"] for h in history) / len(history),
           "first_epoch_grad_nonzero": history[0].get("grad_nonzero", math.nan),
           "num_classes": record["data"]["num_classes"]}
    for k in config["eval_ks"]:
        row[f"best_val_top{k}"] = 100 * max(h["val"]["top"][str(k)] for h in history)
    test = record["test"]
    row.update({f"test_top{k}": 100 * v for k, v in test["top"].items()})
    row.update({f"test_macro_top{k}": 100 * v for k, v in test["macro_top"].items()})
    row.update({f"test_crowded_top{k}": n for k, n in test.get("crowded_classes", {}).items()})
    for group, values in test["macro_top_by_group"].items():
        row[f"classes_{group}"] = values["n_classes"]
        row.update({f"test_macro_top{k}_{group}": math.nan if v is None else 100 * v  # None: no class in the group
                    for k, v in values.items() if k != "n_classes"})
    if (fit := record.get("label_noise_fit")) and fit["flipped"]:
        row["flipped_fit_noisy"], row["flipped_fit_clean"] = 100 * fit["fits_noisy"], 100 * fit["fits_clean"]
    return row


def _data_line(descriptions: list[str]) -> str:
    """Several datasets that differ only in their last fields (label noise) as one line: the shared fields, then the
    variants."""
    fields = [d.split(", ") for d in descriptions]
    shared = 0
    while all(len(f) > shared and f[shared] == fields[0][shared] for f in fields):
        shared += 1
    if len(descriptions) == 1 or shared == 0:
        return "; ".join(descriptions)
    variants = [", ".join(f[shared:]) or "as is" for f in fields]
    return ", ".join(fields[0][:shared]) + "; variants: " + " | ".join(variants)


def _display_html(html: str) -> None:
    try:
        from IPython.display import HTML, display
    except ImportError:  # outside Jupyter: the files are the output
        return
    display(HTML(html))
