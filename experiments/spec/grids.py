"""The runs behind each training figure and table: one :class:`Cell` per loss, hyperparameter and seed, with the
paper's loss hyperparameters (Section 4, Appendix E) and the profile's data, model and schedule.

Runs shared between items (Table 3's B = 10 is Table 4's p = 0 noised loss when their seeds meet) have the same
config, so the results store trains them once. Where a profile chose learning rates on validation data
(:mod:`experiments.tuning.learning_rates`), each run's learning rate is multiplied by the one chosen for its loss and
model-selection metric on its setup; the timing and first-epoch runs of Figs. 2 and 3 keep the grids' own.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.engine.config import RunConfig
from experiments.spec.paper import LABEL_NOISE, TABLE_2, TABLE_3
from experiments.spec.profiles import Profile, Setup


@dataclass(frozen=True)
class Cell:
    """One run and the labels a table or figure groups it by."""

    labels: dict
    config: RunConfig
    setup: Setup


def _cells(setup: Setup, seeds, runs, *, tuned: bool = True) -> list[Cell]:
    """``runs``: (labels, loss, keyword arguments of :meth:`Setup.config`) triples, each repeated over ``seeds``;
    ``tuned``: each at the learning rate chosen for its :func:`choice_key` on the setup, if any."""
    cells = [Cell({**labels, "seed": seed}, setup.config(loss, seed, **options), setup)
             for labels, loss, options in runs for seed in seeds]
    if tuned:
        cells = [Cell(c.labels, scaled_lr(c.config, setup.lr_scales.get(choice_key(c.config), 1.0)), setup)
                 for c in cells]
    return cells


def choice_key(config: RunConfig) -> str:
    """What a learning rate is chosen for on a setup: the loss and the metric its model is selected on (its K)."""
    return f"{config.loss} {config.selection_metric}"


def scaled_lr(config: RunConfig, multiplier: float) -> RunConfig:
    """``config`` at ``multiplier`` times its learning rate (itself at 1)."""
    return config if multiplier == 1 else config.replace(lr=config.lr * multiplier)


def _noised(k: int, epsilon: float, n_samples: int) -> dict:
    return {"k": k, "epsilon": epsilon, "n_samples": n_samples}


def _on_cosines(loss_options: dict, scale: float) -> dict:
    """A margin loss on a normalised last layer as the paper trains it (Sec. 4.5, after Cao et al., 2019): the head
    gives cosines (scale 1), so that the margins (and the noised loss's eps) are in cosine units, and the loss
    multiplies by the paper's scaling constant ``scale`` (LDAM: its softmax temperature)."""
    return {"loss_options": {**loss_options, "scale": scale}, "model_options": {"cosine_scale": 1.0}}


def table2(profile: Profile) -> list[Cell]:
    """Best validation top-5 of the noised balanced loss (K = 5, B = 10) for each eps of Table 2."""
    return _cells(profile.cifar, profile.sweep_seeds,
                  [({"loss": "noised_balanced", "epsilon": eps}, "noised_balanced", {"loss_options": _noised(5, eps, 10)})
                   for eps in TABLE_2])


def figure2(profile: Profile) -> list[Cell]:
    """The first epoch of the noised balanced loss (K = 5, B = 3) for each eps: its gradient sparsity (Fig. 2)."""
    return _cells(profile.cifar, profile.sweep_seeds[:1],
                  [({"epsilon": eps}, "noised_balanced", {"loss_options": _noised(5, eps, 3), "epochs": 1,
                                                          "milestones": ()}) for eps in TABLE_2], tuned=False)


def table3(profile: Profile) -> list[Cell]:
    """Best validation top-5 of the noised balanced loss (K = 5, eps = 0.2) for each B of Table 3."""
    return _cells(profile.cifar, profile.sweep_seeds,
                  [({"B": b}, "noised_balanced", {"loss_options": _noised(5, 0.2, b)}) for b in TABLE_3])


def figure3(profile: Profile) -> list[Cell]:
    """Epoch time against K: cross-entropy (once: it has no K), the smoothed hinge (tau = 1) and the noised loss
    (eps = 1, B in {3, 10, 50}); one seed, ``figure3_epochs`` epochs each."""
    short = {"epochs": profile.figure3_epochs, "milestones": ()}
    runs = [({"loss": "cross_entropy", "K": None}, "cross_entropy", short)]
    for k in profile.figure3_ks:
        runs.append(({"loss": "smooth_hinge", "K": k}, "smooth_hinge", {"loss_options": {"k": k, "tau": 1.0}, **short}))
        runs += [({"loss": f"noised_balanced B={b}", "K": k}, "noised_balanced",
                  {"loss_options": _noised(k, 1.0, b), **short}) for b in (3, 10, 50)]
    return _cells(profile.cifar, profile.sweep_seeds[:1], runs, tuned=False)


def label_noise(profile: Profile) -> list[Cell]:
    """Tables 4 and 7: CE, the smoothed hinge (K = 5, tau = 1) and the noised loss (K = 5, eps = 0.2, B = 10), trained
    with superclass label noise p, selected on validation top-5."""
    losses = [("cross_entropy", {}), ("smooth_hinge", {"k": 5, "tau": 1.0}), ("noised_balanced", _noised(5, 0.2, 10))]
    return _cells(profile.cifar, profile.cifar.seeds,
                  [({"loss": loss, "p": p}, loss, {"loss_options": options, "dataset_options": {"noise": p} if p else {}})
                   for p in LABEL_NOISE for loss, options in losses])  # p = 0: the clean runs, shared with Table 3


def plantnet(profile: Profile) -> list[Cell]:
    """Tables 5 and 8: six losses for K in {1, 3, 5}, selected on validation macro-average top-K (Section 4.5.1).
    LDAM and the noised imbalanced loss take a cosine head's cosines, their margins (largest 0.2) and eps in cosine
    units, scaled in the loss by 40 and 60 (:func:`_on_cosines`)."""
    runs = []
    for k in (1, 3, 5):
        chosen = {"selection_metric": f"macro_top{k}", "eval_ks": (1, 3, 5, 10)}
        runs += [
            ({"loss": "cross_entropy", "K": k}, "cross_entropy", chosen),
            ({"loss": "smooth_hinge", "K": k}, "smooth_hinge", {"loss_options": {"k": k, "tau": 0.1}, **chosen}),
            ({"loss": "noised_balanced", "K": k}, "noised_balanced", {"loss_options": _noised(k, 1.0, 5), **chosen}),
            ({"loss": "focal", "K": k}, "focal", {"loss_options": {"gamma": 2.0}, **chosen}),
            ({"loss": "ldam", "K": k}, "ldam", {**_on_cosines({"max_margin": 0.2}, 40.0), **chosen}),
            ({"loss": "noised_imbalanced", "K": k}, "noised_imbalanced",
             {**_on_cosines({**_noised(k, 0.01, 5), "max_margin": 0.2}, 60.0), **chosen}),
        ]
    return _cells(profile.plantnet, profile.plantnet.seeds, runs)


def imagenet_lt(profile: Profile) -> list[Cell]:
    """Table 6: five losses for K in {1, 3, 5}, selected on validation top-K; largest margin 0.4, scales 30 (LDAM)
    and 50 (noised imbalanced), the defaults of Appendix E, on a cosine head's cosines (:func:`_on_cosines`)."""
    runs = []
    for k in (1, 3, 5):
        chosen = {"selection_metric": f"top{k}", "eval_ks": (1, 3, 5)}
        runs += [
            ({"loss": "cross_entropy", "K": k}, "cross_entropy", chosen),
            ({"loss": "smooth_hinge", "K": k}, "smooth_hinge", {"loss_options": {"k": k, "tau": 0.1}, **chosen}),
            ({"loss": "focal", "K": k}, "focal", {"loss_options": {"gamma": 1.0}, **chosen}),
            ({"loss": "ldam", "K": k}, "ldam", {**_on_cosines({"max_margin": 0.4}, 30.0), **chosen}),
            ({"loss": "noised_imbalanced", "K": k}, "noised_imbalanced",
             {**_on_cosines({**_noised(k, 0.1, 5), "max_margin": 0.4}, 50.0), **chosen}),
        ]
    return _cells(profile.imagenet_lt, profile.imagenet_lt.seeds, runs)


def imagenet(profile: Profile) -> list[Cell]:
    """Table 9: CE, the smoothed hinge (tau = 0.1) and the noised loss (eps = 0.5, B = 10) for K in {1, 5}, each with
    the paper's learning rate and weight decay, scaled by the profile's CE learning rate (the paper's is 0.1)."""
    setup = profile.imagenet
    scale = setup.lr / 0.1
    runs = []
    for k in (1, 5):
        chosen = {"selection_metric": f"top{k}", "eval_ks": (1, 5)}
        runs += [
            ({"loss": "cross_entropy", "K": k}, "cross_entropy", {"lr": 0.1 * scale, "weight_decay": 1e-4, **chosen}),
            ({"loss": "smooth_hinge", "K": k}, "smooth_hinge",
             {"loss_options": {"k": k, "tau": 0.1}, "lr": 1.0 * scale, "weight_decay": 2.5e-5, **chosen}),
            ({"loss": "noised_balanced", "K": k}, "noised_balanced",
             {"loss_options": _noised(k, 0.5, 10), "lr": 0.1 * scale, "weight_decay": 1.5e-4, **chosen}),
        ]
    return _cells(setup, setup.seeds, runs)


#: The grids each training notebook runs (``notebooks/<name>.ipynb``), in the report's order.
NOTEBOOK_GRIDS = {
    "table2_fig2_epsilon": (table2, figure2),
    "table3_samples": (table3,),
    "fig3_epoch_time": (figure3,),
    "table4_table7_label_noise": (label_noise,),
    "table5_table8_plantnet": (plantnet,),
    "table6_imagenet_lt": (imagenet_lt,),
    "table9_imagenet": (imagenet,),
}
