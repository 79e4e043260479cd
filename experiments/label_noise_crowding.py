"""Why the noised loss loses its top-1 under label noise on the CIFAR-100 stand-in: classes crowding every top 5.

At the quick profile, the noised loss (K = 5, eps = 0.2, B = 10) of Tables 4 and 7 keeps its top-1 at p <= 0.1 and
falls towards chance at larger p, with its top-5 below CE's. Its selected models hold the same few classes in the top 5
of most test images (:meth:`topk.metrics.TopKCoverage.crowded_classes`), and the true class gets the places left. The
loss allows this: its gradient (Prop. 3.7) pushes down only the class at the (K+1)-th place of each perturbed score
vector, so nothing pulls down a class that sits above that place by more than the noise ``eps Z`` reaches.

:data:`EPSILONS` trains the tables' noised-loss runs (every p and seed, the learning rate chosen for the loss, nothing
else changed) with other values of eps beside the paper's, with the tables' CE runs for reference. Nothing is fitted,
and the tables and verdicts keep the paper's eps.

``python -m experiments.label_noise_crowding PROFILE`` trains what the results store lacks and writes
``benchmarks/results/label_noise_crowding_<profile>.csv``, each row stamped with its run's device, commit and
versions; the README's ``label-noise-crowding`` block is generated from it (:mod:`experiments.readme`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments import grids, profile_steps
from experiments.config import RunConfig
from experiments.paths import BENCHMARK_RESULTS
from experiments.profiles import Profile
from experiments.store import write_csv
from experiments.summary import mean_interval
from experiments.train import run

#: The paper's eps for Tables 4 and 7 first, then the other values trained.
EPSILONS = (0.2, 0.5, 1.0)

FIELDS = ["loss", "epsilon", "p", "seed", "selected_epoch", "top1", "top5", "crowded_top1", "crowded_top5",
          "device", "commit", "torch"]


def configs(profile: Profile) -> list[tuple[float | None, RunConfig]]:
    """(eps, config) for the tables' CE runs (eps None) and their noised-loss runs at every eps of :data:`EPSILONS`,
    in the tables' order of p and seed."""
    cells = grids.label_noise(profile)
    pairs = [(None, cell.config) for cell in cells if cell.labels["loss"] == "cross_entropy"]
    noised = [cell.config for cell in cells if cell.labels["loss"] == "noised_balanced"]
    for epsilon in EPSILONS:
        pairs += [(epsilon, config.replace(loss_options={**config.loss_options, "epsilon": epsilon}))
                  for config in noised]
    return pairs


def row(epsilon: float | None, record: dict) -> dict:
    """One CSV row from a run's ``record`` (percentages; the crowded classes of its test evaluation, empty for a run
    stored before they were recorded)."""
    config, provenance, test = record["config"], record["provenance"], record["test"]
    crowded = test.get("crowded_classes", {})
    return {"loss": config["loss"], "epsilon": "" if epsilon is None else epsilon,
            "p": config["dataset_options"].get("noise", 0.0), "seed": config["seed"],
            "selected_epoch": record["selected_epoch"], "top1": f"{100 * test['top']['1']:.1f}",
            "top5": f"{100 * test['top']['5']:.1f}", "crowded_top1": crowded.get("1", ""),
            "crowded_top5": crowded.get("5", ""), "device": provenance["device"],
            "commit": provenance["git_commit"], "torch": provenance["torch"]}


def measure(profile: Profile, train) -> list[dict]:
    """A :func:`row` for every run of :func:`configs`; ``train(config)`` gives a run's record."""
    return [row(epsilon, train(config)) for epsilon, config in configs(profile)]


def path_for(profile_name: str, results: Path = BENCHMARK_RESULTS) -> Path:
    return results / f"label_noise_crowding_{profile_name}.csv"


def _cell(rows: list[dict]) -> str:
    """Mean test top-1 / top-5 over the seeds, then each seed's classes crowding the top 5."""
    top1, top5 = (mean_interval([float(r[metric]) for r in rows])[0] for metric in ("top1", "top5"))
    crowded = ", ".join(str(r["crowded_top5"]) or "-" for r in sorted(rows, key=lambda r: int(r["seed"])))
    return f"{top1:.1f} / {top5:.1f} ({crowded})"


def markdown(rows: list[dict]) -> str:
    """CE, then the noised loss at each eps (rows) by label noise p (columns): mean test top-1 / top-5, and in
    parentheses each seed's number of classes in the top 5 of more than half the test images."""
    noise_levels = sorted({float(r["p"]) for r in rows})
    groups = dict.fromkeys((r["loss"], r["epsilon"]) for r in rows)
    lines = ["| loss | " + " | ".join(f"p = {p:g}" for p in noise_levels) + " |",
             "|---|" + "---|" * len(noise_levels)]
    for loss, epsilon in groups:
        name = "CE" if loss == "cross_entropy" else f"noised, eps = {float(epsilon):g}" + (
            " (the paper's)" if float(epsilon) == EPSILONS[0] else "")
        cells = [_cell([r for r in rows if (r["loss"], r["epsilon"]) == (loss, epsilon) and float(r["p"]) == p])
                 for p in noise_levels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    command = profile_steps.parse_command("python -m experiments.label_noise_crowding", __doc__.split("\n\n")[0], argv)
    if command is None:
        return 2
    profile, store, device = command
    rows = measure(profile, lambda config: run(config, store, device=device))
    write_csv(rows, FIELDS, path_for(profile.name))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
