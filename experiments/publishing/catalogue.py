"""Every notebook of the report, in the report's order, with the outputs it must write to ``figures/``: what the report
lists and what the CI check requires."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.spec.paper import CLAIMS


@dataclass(frozen=True)
class Item:
    notebook: str  #: notebooks/<notebook>.ipynb
    title: str
    figures: tuple[str, ...] = ()  #: each as <name>.png and <name>.pdf
    tables: tuple[str, ...] = ()  #: each as <name>.csv and <name>.md
    training: bool = False  #: trains models (runs through the results store)

    @property
    def claims(self) -> tuple[int, ...]:
        return tuple(c.number for c in CLAIMS if c.notebook == self.notebook)

    def expected_outputs(self) -> list[str]:
        return ([f"{f}.{ext}" for f in self.figures for ext in ("png", "pdf")]
                + [f"{t}.{ext}" for t in self.tables for ext in ("csv", "md")]
                + [f"claims/claim{n}.json" for n in self.claims])


ITEMS = (
    Item("table1_losses", "Table 1: the losses", tables=("table1",)),
    Item("fig1_fig6_level_sets", "Figs. 1 and 6: level sets of the losses (L = 3; K = 2 and K = 1)",
         figures=("fig1", "fig6")),
    Item("fig4_fig5_noise_parameters", "Figs. 4 and 5: the effect of B and of eps on the noised loss",
         figures=("fig4", "fig5")),
    Item("sec32_worked_example", "Section 3.2: the worked example", tables=("worked_example",)),
    Item("prop35_bound", "Prop. 3.5: the approximation bound, measured", figures=("prop35_bound",),
         tables=("prop35_bound",)),
    Item("calibration_stand_ins", "Calibration: the stand-ins fitted to the paper's cross-entropy numbers",
         tables=("calibration", "calibration_seeds", "calibration_unmatched")),
    Item("table2_fig2_epsilon", "Table 2 and Fig. 2: the effect of eps, gradient sparsity", figures=("table2", "fig2"),
         tables=("table2", "fig2"), training=True),
    Item("table3_samples", "Table 3: the effect of B", tables=("table3",), training=True),
    Item("fig3_epoch_time", "Fig. 3: epoch time against K", figures=("fig3",), tables=("fig3",), training=True),
    Item("table4_table7_label_noise", "Tables 4 and 7: CIFAR-100 with label noise, top-5 and top-1",
         figures=("table4",), tables=("table4", "table7"), training=True),
    Item("table5_table8_plantnet", "Tables 5 and 8: Pl@ntNet-300K, macro-average and plain top-K",
         tables=("table5", "table8"), training=True),
    Item("table6_imagenet_lt", "Table 6: ImageNet-LT", tables=("table6",), training=True),
    Item("table9_imagenet", "Table 9: ImageNet", tables=("table9",), training=True),
)

BY_NOTEBOOK = {item.notebook: item for item in ITEMS}
