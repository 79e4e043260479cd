"""Every loss of Table 1 of Garcin et al. (ICML 2022): functions, ``nn.Module`` forms and the registry."""

from topk.losses.functional import (
    calibrated_hinge,
    class_margins,
    convex_hinge,
    cross_entropy,
    focal,
    lapin_hinge,
    ldam,
    noised_hinge,
    smooth_hinge,
    zero_one_topk,
)
from topk.losses.modules import (
    LDAM,
    CalibratedHinge,
    ConvexHinge,
    CrossEntropy,
    Focal,
    LapinHinge,
    NoisedHinge,
    SmoothHinge,
    ZeroOneTopK,
)
from topk.losses.registry import LOSSES, LossSpec, build_loss, table_1

__all__ = [
    "zero_one_topk", "cross_entropy", "focal", "ldam", "lapin_hinge", "convex_hinge", "calibrated_hinge",
    "smooth_hinge", "noised_hinge", "class_margins",
    "ZeroOneTopK", "CrossEntropy", "Focal", "LDAM", "LapinHinge", "ConvexHinge", "CalibratedHinge", "SmoothHinge",
    "NoisedHinge",
    "LOSSES", "LossSpec", "build_loss", "table_1",
]
