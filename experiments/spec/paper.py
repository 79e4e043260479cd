"""The paper's published numbers and claims, as data (Garcin et al., ICML 2022; Table 2 from the thesis, Table 4.2).

Accuracies are in percent, as printed; ``(mean, half-width of the 95% interval)`` where the paper gives one, and the
few / medium / many-shot means as a triple where it gives them. The notebooks put these beside the reproduced numbers,
and :mod:`experiments.analysis.claims` judges each claim of :data:`CLAIMS` from the reproduced results.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Table 2 (thesis Table 4.2): best validation top-5, CIFAR-100, DenseNet 40-40, noised balanced, K = 5, B = 10.
TABLE_2 = {0.0: 19.38, 1e-4: 14.84, 1e-3: 11.4, 1e-2: 93.36, 1e-1: 94.46, 1.0: 94.24, 10.0: 93.78, 100.0: 93.12}

#: Table 3: best validation top-5, noised balanced, K = 5, eps = 0.2, by B.
TABLE_3 = {1: 94.28, 2: 94.2, 3: 94.46, 5: 94.52, 10: 94.24, 50: 94.64, 100: 94.52}

#: Fig. 3 (text of Section 4.3): average epoch time in seconds on their GPU, by loss, at K = 5 (B = 3) and K = 10.
FIGURE_3 = {"K=5": {"cross_entropy": 65, "noised_balanced B=3": 68, "smooth_hinge": 81},
            "K=10": {"noised_balanced B=3": 60, "smooth_hinge": 90}}

#: Fig. 2 (text of Section 4.1): about 4 of the 100 gradient coordinates are non-zero in the first epoch, even for
#: large eps (noised balanced, K = 5, B = 3).
FIGURE_2_LARGE_EPSILON_NONZERO = 4.0

LABEL_NOISE = (0.0, 0.1, 0.2, 0.3, 0.4)

#: Table 4: test top-5 on CIFAR-100 with superclass label noise p (4 seeds), by loss, one entry per p.
TABLE_4 = {
    "cross_entropy": [(94.2, 0.1), (90.3, 0.2), (87.6, 0.1), (85.7, 0.4), (83.6, 0.2)],
    "smooth_hinge": [(93.3, 0.0), (92.2, 0.3), (90.4, 0.2), (88.8, 0.1), (87.4, 0.1)],
    "noised_balanced": [(94.4, 0.1), (91.9, 0.1), (90.7, 0.5), (89.7, 0.1), (87.8, 0.6)],
}

#: Table 7: test top-1 of the same models.
TABLE_7 = {
    "cross_entropy": [(76.6, 0.1), (71.0, 0.2), (68.1, 0.1), (65.5, 0.3), (61.8, 0.4)],
    "smooth_hinge": [(69.2, 0.1), (71.2, 0.4), (71.3, 0.3), (70.8, 0.6), (70.6, 0.2)],
    "noised_balanced": [(68.7, 0.3), (68.3, 0.5), (69.4, 0.5), (69.3, 0.3), (69.1, 0.4)],
}

#: Table 5: test macro-average top-K on Pl@ntNet-300K (3 seeds): {K: {loss: (mean, half-width, (few, medium, many))}}.
TABLE_5 = {
    1: {"cross_entropy": (36.3, 0.3, (12.6, 42.9, 71.7)), "smooth_hinge": (35.7, 0.2, (13.1, 41.5, 71.1)),
        "noised_balanced": (35.8, 0.3, (12.4, 42.1, 72.1)), "focal": (37.6, 0.3, (15.5, 43.4, 71.4)),
        "ldam": (40.6, 0.1, (20.9, 45.8, 71.2)), "noised_imbalanced": (42.4, 0.3, (23.9, 46.3, 72.1))},
    3: {"cross_entropy": (58.8, 0.4, (32.4, 75.3, 92.0)), "smooth_hinge": (50.3, 0.2, (16.7, 69.8, 92.7)),
        "noised_balanced": (58.7, 0.4, (32.2, 73.8, 88.8)), "focal": (60.4, 0.3, (35.9, 74.8, 92.0)),
        "ldam": (63.3, 0.3, (43.0, 74.1, 90.0)), "noised_imbalanced": (64.9, 0.4, (44.8, 74.5, 92.1))},
    5: {"cross_entropy": (68.7, 0.2, (45.1, 86.3, 95.4)), "smooth_hinge": (50.9, 0.3, (12.1, 78.1, 95.7)),
        "noised_balanced": (66.4, 0.5, (42.0, 82.5, 95.5)), "focal": (69.7, 0.2, (47.5, 84.8, 95.8)),
        "ldam": (71.9, 0.3, (54.0, 83.0, 94.0)), "noised_imbalanced": (73.2, 0.5, (55.3, 84.2, 95.3))},
}

#: Table 8: test top-K of the models of Table 5: {K: {loss: (mean, half-width)}}.
TABLE_8 = {
    1: {"cross_entropy": (80.1, 0.1), "smooth_hinge": (79.8, 0.0), "noised_balanced": (80.8, 0.1),
        "focal": (79.8, 0.1), "ldam": (79.6, 0.1), "noised_imbalanced": (81.0, 0.1)},
    3: {"cross_entropy": (93.1, 0.0), "smooth_hinge": (93.2, 0.0), "noised_balanced": (93.5, 0.1),
        "focal": (93.5, 0.0), "ldam": (92.3, 0.1), "noised_imbalanced": (93.5, 0.1)},
    5: {"cross_entropy": (95.7, 0.0), "smooth_hinge": (95.0, 0.1), "noised_balanced": (95.8, 0.0),
        "focal": (96.0, 0.0), "ldam": (95.2, 0.2), "noised_imbalanced": (95.8, 0.1)},
    10: {"cross_entropy": (97.5, 0.0), "smooth_hinge": (95.5, 0.0), "noised_balanced": (97.5, 0.0),
         "focal": (97.7, 0.0), "ldam": (97.2, 0.1), "noised_imbalanced": (97.5, 0.0)},
}

#: Table 6: test top-K on ImageNet-LT (4 seeds), with few / medium / many-shot means (thesis Table 4.6).
TABLE_6 = {
    1: {"cross_entropy": (37.0, 0.1, (1.5, 28.2, 60.6)), "smooth_hinge": (37.3, 0.1, (1.3, 28.6, 60.7)),
        "focal": (37.7, 0.0, (2.4, 29.8, 59.9)), "ldam": (39.3, 0.2, (10.5, 33.1, 57.1)),
        "noised_imbalanced": (38.7, 0.0, (7.6, 32.3, 57.6))},
    3: {"cross_entropy": (55.5, 0.1, (8.2, 53.0, 75.3)), "smooth_hinge": (42.0, 0.1, (0.0, 29.1, 72.9)),
        "focal": (56.2, 0.0, (10.2, 54.0, 75.1)), "ldam": (56.0, 0.2, (24.1, 52.0, 72.3)),
        "noised_imbalanced": (56.5, 0.1, (27.0, 52.6, 71.7))},
    5: {"cross_entropy": (63.2, 0.1, (15.8, 63.1, 80.1)), "smooth_hinge": (39.0, 0.1, (0.0, 20.7, 75.5)),
        "focal": (63.8, 0.1, (17.8, 63.6, 80.3)), "ldam": (63.1, 0.2, (32.9, 60.1, 77.7)),
        "noised_imbalanced": (63.5, 0.1, (37.0, 60.2, 77.0))},
}

#: Table 9: test top-K on ImageNet, ResNet-18 (3 seeds).
TABLE_9 = {
    1: {"cross_entropy": (72.24, 0.15), "smooth_hinge": (71.43, 0.14), "noised_balanced": (72.46, 0.15)},
    5: {"cross_entropy": (90.60, 0.05), "smooth_hinge": (90.71, 0.06), "noised_balanced": (90.52, 0.07)},
}

#: Section 3.2's worked example: L = 4, K = 2, B = 3, eps = 1.
WORKED_EXAMPLE = {
    "s": (2.4, 2.6, 2.3, 0.5),
    "noise": ((0.2, -0.1, 0.1, 0.3), (0.1, 0.1, -0.1, 0.1), (-0.1, -0.1, 0.1, -0.1)),
    "k": 2, "epsilon": 1.0,
    "smoothed_top_k": 7.4 / 3,  # printed as 2.47
    "gradient": (1 / 3, 1 / 3, 1 / 3, 0.0),
}

#: How each loss is named in the tables.
LOSS_LABELS = {
    "cross_entropy": "CE", "smooth_hinge": "Smoothed hinge", "noised_balanced": "Noised bal.", "focal": "Focal",
    "ldam": "LDAM", "noised_imbalanced": "Noised imbal.",
}


@dataclass(frozen=True)
class Claim:
    number: int
    text: str
    source: str  #: the paper's item that supports it
    notebook: str  #: the notebook that judges it


CLAIMS = (
    Claim(1, "eps = 0 (the calibrated hinge) fails to learn, so do eps = 1e-4 and 1e-3; eps >= 1e-2 learns, "
             "and large eps stays good", "Table 2", "table2_fig2_epsilon"),
    Claim(2, "The noised loss's gradient stays sparse (about B + 1 non-zero coordinates of 100) yet learning "
             "succeeds", "Fig. 2", "table2_fig2_epsilon"),
    Claim(3, "B has little impact on accuracy; a small B (3 to 10) is enough", "Table 3", "table3_samples"),
    Claim(4, "The noised loss's epoch time barely depends on K, the smoothed hinge's grows with K", "Fig. 3",
          "fig3_epoch_time"),
    Claim(5, "Under label noise, the top-5 losses beat cross-entropy on top-5 accuracy, and the noised loss is at "
             "least as good as the smoothed hinge except at p = 0.1", "Table 4", "table4_table7_label_noise"),
    Claim(6, "On a heavy-tailed dataset the smoothed hinge fails on tail classes for K = 3, 5, and the noised "
             "imbalanced loss beats LDAM, focal and CE on macro-average top-K for every K", "Table 5",
          "table5_table8_plantnet"),
    Claim(7, "|top_K,eps(s) - top_K(s)| <= eps K sqrt(2 log L) (Prop. 3.5)", "Prop. 3.5", "prop35_bound"),
)
