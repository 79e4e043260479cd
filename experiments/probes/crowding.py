"""Classes crowding every top K under the noised losses, and how far the noise reaches: a probe of eps.

A noised loss's gradient (Prop. 3.7) pushes down only the class at the (K+1)-th place of each perturbed score vector,
so nothing pulls down a class that sits above that place by more than the noise ``eps Z`` reaches: a run can end with
a few classes in the top K of most test images, whatever the image (:meth:`topk.metrics.TopKCoverage.crowded_classes`),
the true class getting the places that remain. Larger eps reaches further.

:data:`PROBES` trains the noised-loss runs of Tables 4 and 7 (label noise), 6 (ImageNet-LT) and 5 (Pl@ntNet-300K),
every seed and level at the learning rate chosen for the loss, nothing else changed, at other eps beside the paper's,
with the tables' CE runs for reference: larger eps on the CIFAR-100 stand-in; smaller on the ImageNet-LT one, down to
0.002, the paper's 0.1 divided by the cosine head's scale 50 (eps on the scaled scores rather than the cosines); on
the Pl@ntNet-300K one, the paper's own grid for the imbalanced loss (0.01, its choice, 0.05 and 0.1; Appendix E).
Nothing is fitted; the tables and verdicts keep the paper's eps.

``python -m experiments.probes.crowding PROFILE`` trains what the results store lacks and writes
``benchmarks/results/crowding_<profile>.csv``, each row stamped with its run's device, commit and versions; the
``crowding`` block of ``docs/stand-ins.md`` is generated from it (:mod:`experiments.publishing.readme`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.analysis.summary import mean_interval
from experiments.engine.config import RunConfig
from experiments.engine.store import write_csv
from experiments.paths import BENCHMARK_RESULTS
from experiments.probes import command as probe_command
from experiments.provenance import RECORD_STAMP_FIELDS, record_stamp
from experiments.scale import executors
from experiments.spec import grids
from experiments.spec.profiles import Profile


@dataclass(frozen=True)
class Probe:
    """A table's noised-loss runs at each of ``epsilons`` (the paper's first), beside its CE runs: ``grid`` gives the
    table's cells, ``level`` names the label by which its columns go (label noise p, or the K a loss was trained for),
    and ``levels`` keeps some of them; ``k(level)`` is the K whose top-K accuracy and crowding are shown, ``metric``
    the table's accuracy (``"top"``, or ``"macro_top"``: macro-average top-K, which the runs are selected on too)."""

    name: str
    grid: str
    loss: str
    epsilons: tuple[float, ...]
    level: str
    levels: tuple[float, ...]
    fixed_k: int | None = None  #: the K shown at every level; None: the level itself is K
    metric: str = "top"

    def k(self, level: float) -> int:
        return self.fixed_k or int(level)

    def configs(self, profile: Profile) -> list[tuple[float | None, float, RunConfig]]:
        """(eps, level, config) for the table's CE runs (eps None) and its noised-loss runs at every eps, in the
        table's order of level and seed; one selection metric per run (the table's top-K)."""
        cells = [c for c in getattr(grids, self.grid)(profile) if c.labels[self.level] in self.levels
                 and c.config.selection_metric == f"{self.metric}{self.k(c.labels[self.level])}"]
        found = [(None, c.labels[self.level], c.config) for c in cells if c.labels["loss"] == "cross_entropy"]
        noised = [(c.labels[self.level], c.config) for c in cells if c.labels["loss"] == self.loss]
        for epsilon in self.epsilons:
            found += [(epsilon, level, config.replace(loss_options={**config.loss_options, "epsilon": epsilon}))
                      for level, config in noised]
        return found


PROBES = (
    Probe("CIFAR-100 stand-in under label noise (Tables 4 and 7)", "label_noise", "noised_balanced", (0.2, 0.5, 1.0),
          "p", (0.0, 0.1, 0.2, 0.3, 0.4), fixed_k=5),
    Probe("ImageNet-LT stand-in (Table 6)", "imagenet_lt", "noised_imbalanced", (0.1, 0.01, 0.002), "K", (3, 5)),
    Probe("Pl@ntNet-300K stand-in (Table 5), macro-average", "plantnet", "noised_imbalanced", (0.01, 0.05, 0.1), "K",
          (1, 3, 5), metric="macro_top"),
)

FIELDS = ["probe", "loss", "epsilon", "level", "k", "metric", "seed", "selected_epoch", "top1", "topk", "crowded_top1",
          "crowded_topk", *RECORD_STAMP_FIELDS]


def row(probe: Probe, epsilon: float | None, level: float, record: dict) -> dict:
    """One CSV row from a run's ``record`` (percentages to 3 decimals, so that their means round as the tables'; the
    crowded classes of its test evaluation, empty for a run stored before they were recorded)."""
    config, test = record["config"], record["test"]
    crowded, k = test.get("crowded_classes", {}), probe.k(level)
    return {"probe": probe.name, "loss": config["loss"], "epsilon": "" if epsilon is None else epsilon,
            "level": level, "k": k, "seed": config["seed"], "selected_epoch": record["selected_epoch"],
            "metric": probe.metric, "top1": f"{100 * test[probe.metric]['1']:.3f}",
            "topk": f"{100 * test[probe.metric][str(k)]:.3f}",
            "crowded_top1": crowded.get("1", ""), "crowded_topk": crowded.get(str(k), ""), **record_stamp(record)}


def configs(profile: Profile, probes=PROBES) -> list[RunConfig]:
    """Every run the probe measures at ``profile``: what its CSV's rows must be made of to be current."""
    return [config for probe in probes for _, _, config in probe.configs(profile)]


def measure(profile: Profile, train, probes=PROBES) -> list[dict]:
    """A :func:`row` for every run of every probe; ``train(config)`` gives a run's record."""
    return [row(probe, epsilon, level, train(config))
            for probe in probes for epsilon, level, config in probe.configs(profile)]


def path_for(profile_name: str, results: Path = BENCHMARK_RESULTS) -> Path:
    return results / f"crowding_{profile_name}.csv"


def _cell(rows: list[dict]) -> str:
    """Mean test top-1 / top-K over the seeds, then each seed's classes crowding the top K."""
    top1, topk = (mean_interval([float(r[metric]) for r in rows])[0] for metric in ("top1", "topk"))
    crowded = ", ".join(str(r["crowded_topk"]) or "-" for r in sorted(rows, key=lambda r: int(r["seed"])))
    return f"{top1:.1f} / {topk:.1f} ({crowded})"


def _table(probe: Probe, rows: list[dict]) -> list[str]:
    levels = sorted({float(r["level"]) for r in rows})
    accuracy = probe.metric.replace("_", " ")
    header = [f"{probe.level} = {level:g}" + ("" if probe.fixed_k else f" ({accuracy}-1 / {accuracy}-{int(level)})")
              for level in levels]
    papers = probe.epsilons[0]
    lines = [f"| {probe.name}: loss | " + " | ".join(header) + " |", "|---|" + "---|" * len(levels)]
    for loss, epsilon in dict.fromkeys((r["loss"], r["epsilon"]) for r in rows):
        name = "CE" if loss == "cross_entropy" else f"{loss}, eps = {float(epsilon):g}" + (
            " (the paper's)" if float(epsilon) == papers else "")
        cells = [_cell([r for r in rows if (r["loss"], r["epsilon"]) == (loss, epsilon) and float(r["level"]) == level])
                 for level in levels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(rows: list[dict], probes=PROBES) -> str:
    """One table per probe: CE, then the noised loss at each eps (rows) by level (columns); each cell the mean test
    top-1 / top-K over the seeds and, in parentheses, each seed's number of classes in the top K of more than half the
    test images."""
    tables = [_table(probe, [r for r in rows if r["probe"] == probe.name]) for probe in probes
              if any(r["probe"] == probe.name for r in rows)]
    return "\n\n".join("\n".join(table) for table in tables)


def main(argv: list[str] | None = None) -> int:
    if (command := probe_command.parse("python -m experiments.probes.crowding", __doc__.split("\n\n")[0], argv,
                                       configs)) is None:
        return 2
    profile, train = command
    rows = measure(profile, train)
    write_csv(rows, FIELDS, path_for(profile.name))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    executors.run_as_command(main, "every finished run and every epoch's checkpoint is kept in the store; the same "
                                   "command resumes")
