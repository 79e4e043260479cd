"""Why label noise may cost the CIFAR-100 stand-in's cross-entropy less than the paper's: a probe of capacity.

From p = 0 to p = 0.4 of superclass label noise, the paper's DenseNet-40-40 loses 14.8 points of CE test top-1 and
10.6 of top-5 (Tables 4 and 7). Networks that can fit random labels lose accuracy under label noise by memorising it
(Zhang et al. 2017): a small model that predicts the true class of most flipped training images (``label_noise_fit``
in the run records) loses less. The reading to test: a network able to memorise the flipped labels loses what the
paper's loses.

:data:`VARIANTS` train the tables' CE runs at p = 0 and p = 0.4 (first seed, the calibrated knobs, CE's chosen
learning rate, selected on validation top-5 as in Table 4) with the profile's model and schedule, then with longer
schedules (milestones scaled alike) and a wider model. For each: test top-1 and top-5, the drop from p = 0 to
p = 0.4 beside the paper's, and the share of flipped training images the selected model predicts as their noisy
label. Claim 5 (the top-5 losses beat CE on top-5 under label noise) is then looked at where CE memorises most: the
tables' smoothed hinge and noised loss runs (:data:`COMPARED`, at their chosen learning rates) with the widest
variant. Nothing here is fitted.

``python -m experiments.probes.label_noise_capacity PROFILE`` trains what the results store lacks and writes
``benchmarks/results/label_noise_capacity_<profile>.csv``, each row stamped with its run's device, commit and
versions; the ``label-noise-capacity`` block of ``docs/stand-ins.md`` is generated from it
(:mod:`experiments.publishing.readme`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.engine.config import RunConfig
from experiments.engine.store import write_csv
from experiments.paths import BENCHMARK_RESULTS
from experiments.probes import command as probe_command
from experiments.provenance import RECORD_STAMP_FIELDS, record_stamp
from experiments.scale import executors
from experiments.spec import grids, paper
from experiments.spec.profiles import Profile

NOISE = 0.4  #: the paper's strongest label noise (Tables 4 and 7), against p = 0
#: The top-5 losses of Table 4, trained with the last of :data:`VARIANTS` beside CE.
COMPARED = ("smooth_hinge", "noised_balanced")


@dataclass(frozen=True)
class Variant:
    """A table's run with ``epoch_factor`` times the epochs (and milestones) and ``width_factor`` times the
    model's width."""

    name: str
    epoch_factor: int
    width_factor: int

    def apply(self, config: RunConfig) -> RunConfig:
        width = config.model_options["width"] * self.width_factor
        return config.replace(epochs=config.epochs * self.epoch_factor,
                              milestones=tuple(m * self.epoch_factor for m in config.milestones),
                              model_options={**config.model_options, "width": width})


VARIANTS = (Variant("the tables' model and schedule", 1, 1), Variant("4x the epochs", 4, 1),
            Variant("16x the epochs", 16, 1), Variant("4x the width, 4x the epochs", 4, 4))

FIELDS = ["loss", "variant", "epochs", "width", "parameters", "p", "selected_epoch", "top1", "top5",
          "flipped_fit_noisy", "flipped_fit_true", "crowded_top5", "last_train_loss", *RECORD_STAMP_FIELDS]


def table_configs(profile: Profile, loss: str = "cross_entropy") -> dict[float, RunConfig]:
    """The tables' runs of ``loss`` (first seed) at p = 0 and :data:`NOISE`, by p (CE's: those the calibration
    fitted)."""
    seed = profile.cifar.seeds[0]
    return {cell.labels["p"]: cell.config for cell in grids.label_noise(profile)
            if cell.labels["loss"] == loss and cell.labels["seed"] == seed
            and cell.labels["p"] in (0, NOISE)}


def refusal(profile: Profile) -> str | None:
    """Why the probe cannot vary ``profile``'s runs (None: it can): it widens the stand-in profiles' small CNN."""
    model = table_configs(profile)[0]
    if "width" in model.model_options:
        return None
    return (f"the {profile.name} profile's CIFAR-100 runs train {model.model}, which has no width to vary: the probe "
            "asks why the stand-in profiles' small CNN loses less to label noise than the paper's DenseNet, so it "
            "runs on smoke or quick")


def row(variant: Variant, p: float, record: dict) -> dict:
    """One CSV row of ``variant`` at noise ``p`` from its run's ``record`` (percentages)."""
    config, fit, provenance = record["config"], record.get("label_noise_fit") or {}, record["provenance"]
    share = lambda key: "" if fit.get(key) is None else f"{100 * fit[key]:.1f}"  # noqa: E731
    return {"loss": config["loss"], "variant": variant.name, "epochs": config["epochs"],
            "width": config["model_options"]["width"], "parameters": provenance["parameters"], "p": p,
            "selected_epoch": record["selected_epoch"], "top1": f"{100 * record['test']['top']['1']:.1f}",
            "top5": f"{100 * record['test']['top']['5']:.1f}", "flipped_fit_noisy": share("fits_noisy"),
            "flipped_fit_true": share("fits_clean"),
            "crowded_top5": record["test"].get("crowded_classes", {}).get("5", ""),
            "last_train_loss": f"{record['history'][-1]['train_loss']:.3f}", **record_stamp(record)}


#: What the probe trains: CE with every variant, then each compared loss with the widest.
MEASURED = (("cross_entropy", VARIANTS), *((loss, VARIANTS[-1:]) for loss in COMPARED))


def measure(profile: Profile, train, variants=VARIANTS, loss: str = "cross_entropy") -> list[dict]:
    """A :func:`row` of ``loss`` for every variant at p = 0 and :data:`NOISE`; ``train(config)`` gives a run's
    record."""
    configs = table_configs(profile, loss)
    return [row(variant, p, train(variant.apply(configs[p]))) for variant in variants for p in sorted(configs)]


def configs(profile: Profile) -> list[RunConfig]:
    """Every run of :data:`MEASURED` at ``profile``: what the probe's CSV's rows must be made of to be current."""
    return [variant.apply(config) for loss, variants in MEASURED for variant in variants
            for config in table_configs(profile, loss).values()]


def path_for(profile_name: str, results: Path = BENCHMARK_RESULTS) -> Path:
    return results / f"label_noise_capacity_{profile_name}.csv"


def _pair(rows: list[dict], loss: str, variant: str) -> tuple[dict, dict]:
    """The rows of ``loss`` and ``variant`` at p = 0 and at :data:`NOISE`."""
    return tuple(next(r for r in rows if (r["loss"], r["variant"]) == (loss, variant) and float(r["p"]) == p)
                 for p in (0, NOISE))


def _change(clean: dict, noisy: dict, metric: str) -> str:
    return f"{clean[metric]} -> {noisy[metric]} ({float(noisy[metric]) - float(clean[metric]):+.1f})"


def _crowded(row: dict) -> str:
    count = row.get("crowded_top5", "")
    return "-" if count in ("", None) else str(count)


def markdown(rows: list[dict]) -> str:
    """CE per variant: top-1 and top-5 at p = 0 and :data:`NOISE`, their drops beside the paper's (Tables 7 and 4),
    and the flipped training images the selected model predicts as their noisy label and as their true class. Then,
    where other losses were trained with a variant, each loss's top-5 there beside Table 4's, and the classes its
    models hold in the top 5 of more than half the test images ("-" for a CSV written before they were recorded)."""
    noisy_index = paper.LABEL_NOISE.index(NOISE)
    paper_pair = lambda table, loss: (table[loss][0][0], table[loss][noisy_index][0])  # noqa: E731
    paper_drop = {k: b - a for k, (a, b) in (("1", paper_pair(paper.TABLE_7, "cross_entropy")),
                                           ("5", paper_pair(paper.TABLE_4, "cross_entropy")))}
    lines = [f"| CE on the CIFAR-100 stand-in | parameters | epochs (selected at p = 0, {NOISE}) | "
             f"top-1, p = 0 -> {NOISE} (drop; paper {paper_drop['1']:+.1f}) | "
             f"top-5, p = 0 -> {NOISE} (drop; paper {paper_drop['5']:+.1f}) | "
             f"flipped images predicted as the noisy label / the true class (%) |", "|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["variant"] for r in rows if r["loss"] == "cross_entropy"):
        clean, noisy = _pair(rows, "cross_entropy", name)
        lines.append(f"| {name} | {int(clean['parameters']):,} | {clean['epochs']} ({clean['selected_epoch']}, "
                     f"{noisy['selected_epoch']}) | {_change(clean, noisy, 'top1')} | {_change(clean, noisy, 'top5')} "
                     f"| {noisy['flipped_fit_noisy']} / {noisy['flipped_fit_true']} |")
    for name in dict.fromkeys(r["variant"] for r in rows if r["loss"] != "cross_entropy"):
        losses = dict.fromkeys(r["loss"] for r in rows if r["variant"] == name)
        lines += ["", f"| {name}: loss | top-5, p = 0 -> {NOISE} | the paper's (Table 4) | top-1, p = 0 -> {NOISE} | "
                      f"flipped images predicted as the noisy label / the true class (%) | "
                      f"classes crowding the top 5, p = 0 -> {NOISE} |", "|---|---|---|---|---|---|"]
        for loss in losses:
            clean, noisy = _pair(rows, loss, name)
            before, after = paper_pair(paper.TABLE_4, loss)
            lines.append(f"| {loss} | {_change(clean, noisy, 'top5')} | {before} -> {after} ({after - before:+.1f}) "
                         f"| {_change(clean, noisy, 'top1')} | {noisy['flipped_fit_noisy']} / "
                         f"{noisy['flipped_fit_true']} | {_crowded(clean)} -> {_crowded(noisy)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    prog = "python -m experiments.probes.label_noise_capacity"
    if (command := probe_command.parse(prog, __doc__.split("\n\n")[0], argv, configs, refusal)) is None:
        return 2
    profile, train = command
    rows = []
    for loss, variants in MEASURED:
        for variant in variants:
            rows += measure(profile, train, (variant,), loss)
            print(f"{loss}, {variant.name}: done", flush=True)
    write_csv(rows, FIELDS, path_for(profile.name))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    executors.run_as_command(main, "every finished run and every epoch's checkpoint is kept in the store; the same "
                                   "command resumes")
