"""Bad input raises a ValueError / TypeError naming the argument and the bad value, before any computation."""

import pytest
import torch

import topk
from topk import losses
from topk.elementary_symmetric import log_elementary_symmetric_pair

s = torch.randn(4, 6)
y = torch.tensor([0, 1, 2, 5])

CASES = [
    (lambda: topk.top_k([1.0, 2.0], 1), TypeError, "'s' should be a torch.Tensor"),
    (lambda: topk.top_k(torch.arange(6), 1), TypeError, "floating-point tensor, got dtype torch.int64"),
    (lambda: topk.top_k(torch.zeros(()), 1), ValueError, r"shape \(..., L\)"),
    (lambda: topk.top_k(s, 7), ValueError, r"'k' should be in \[1, 6\].*got 7"),
    (lambda: topk.top_sum_k(s, 0), ValueError, r"'k' should be in \[1, 6\].*got 0"),
    (lambda: topk.smooth_top_k(s, 2.0, 1.0, 3), TypeError, "'k' should be an integer, got 2.0"),
    (lambda: topk.smooth_top_k(s, 2, -0.1, 3), ValueError, "'epsilon' should be >= 0.0, got -0.1"),
    (lambda: topk.smooth_top_k(s, 2, float("nan"), 3), ValueError, "'epsilon' should be finite, got nan"),
    (lambda: topk.smooth_top_k(s, 2, 1.0, 0), ValueError, "'n_samples' should be >= 1, got 0"),
    (lambda: topk.smooth_top_k(s, 2, 1.0, 3, noise=torch.randn(3, 4, 5)), ValueError,
     r"'noise' should have shape \(n_samples, \*s.shape\) = \(3, 4, 6\), got \(3, 4, 5\)"),
    (lambda: topk.smooth_top_k(s, 2, 1.0, 3, noise=torch.randn(3, 4, 6, dtype=torch.float64)), TypeError,
     "'noise' should have the scores' dtype torch.float32, got torch.float64"),
    (lambda: topk.smooth_top_k(s, 2, 1.0, 3, generator=1), TypeError, "'generator' should be a torch.Generator"),
    (lambda: topk.smooth_top_k(s, 2, 1.0, 3, samples_per_chunk=0), ValueError, "'samples_per_chunk' should be >= 1"),
    (lambda: losses.noised_hinge(s, y, 6, 1.0, 3), ValueError, r"'k' should be in \[1, 5\] \(k \+ 1 must not exceed"),
    (lambda: losses.calibrated_hinge(s, y, 6), ValueError, r"'k' should be in \[1, 5\]"),
    (lambda: losses.lapin_hinge(s, y, 6), ValueError, r"'k' should be in \[1, 5\]"),
    (lambda: losses.noised_hinge(s, y.float(), 2, 1.0, 3), TypeError, "'y' should be an integer tensor"),
    (lambda: losses.noised_hinge(s, torch.tensor([0, 1, 2, 6]), 2, 1.0, 3), ValueError,
     r"'y' should hold class indices in \[0, 5\], got 6"),
    (lambda: losses.cross_entropy(s, torch.tensor([0, -1, 2, 3])), ValueError, "got -1"),
    (lambda: losses.cross_entropy(s, y[:3]), ValueError, r"'y' should have shape \(4,\).*got \(3,\)"),
    (lambda: losses.cross_entropy(s, y, reduction="avg"), ValueError, "'reduction' should be one of"),
    (lambda: losses.focal(s, y, -1.0), ValueError, "'gamma' should be >= 0.0, got -1.0"),
    (lambda: losses.ldam(s, y, torch.zeros(5)), ValueError, r"'margins' should be a real number or a tensor of shape \(6,\)"),
    (lambda: losses.ldam(s, y, 0.1, scale=0.0), ValueError, "'scale' should be > 0.0"),
    (lambda: losses.noised_hinge(s, y, 2, 1.0, 3, scale=-60.0), ValueError, "'scale' should be > 0.0, got -60.0"),
    (lambda: losses.NoisedHinge(2, 1.0, 3, margins=torch.tensor([0.1, float("inf"), 0, 0, 0, 0])), ValueError,
     "'margins' should be finite"),
    (lambda: losses.LDAM(torch.tensor([0.1, float("nan")])), ValueError, "'margins' should be finite"),
    (lambda: losses.ldam(s, y, torch.tensor(0.5)), ValueError, r"tensor of shape \(6,\).*got a tensor of shape \(\)"),
    (lambda: losses.class_margins([10, 0, 3], 0.5), ValueError, "positive and finite.*got 0.0 for class 1"),
    (lambda: losses.class_margins([10, -2], 0.5), ValueError, "got -2.0 for class 1"),
    (lambda: losses.class_margins([], 0.5), ValueError, "non-empty"),
    (lambda: losses.class_margins(["a"], 0.5), TypeError, r"'class_counts' should be a 1-d sequence.*got \['a'\]"),
    (lambda: losses.class_margins(None, 0.5), TypeError, "'class_counts' should be a 1-d sequence.*got None"),
    (lambda: losses.ldam(s, y, torch.tensor([0.1, float("nan"), 0, 0, 0, 0])), ValueError,
     "'margins' should be finite and >= 0, got nan"),
    (lambda: losses.noised_hinge(s, y, 2, 1.0, 3, margins=torch.tensor([0.1, 0, -0.5, 0, 0, 0])), ValueError,
     "'margins' should be finite and >= 0, got -0.5"),
    (lambda: losses.smooth_hinge(s, y, 6, 1.0), ValueError, r"'k' should be in \[1, 5\] \(k \+ 1 must not exceed"),
    (lambda: losses.smooth_hinge(s, y, 2, 0.0), ValueError, "'tau' should be > 0.0, got 0.0"),
    (lambda: losses.smooth_hinge(s, y, 2, float("inf")), ValueError, "'tau' should be finite, got inf"),
    (lambda: losses.smooth_hinge(s, y, 2, 1.0, alpha=-0.5), ValueError, "'alpha' should be >= 0.0, got -0.5"),
    (lambda: losses.smooth_hinge(s, torch.tensor([0, 1, 2, 7]), 2, 1.0), ValueError,
     r"'y' should hold class indices in \[0, 5\], got 7"),
    (lambda: losses.SmoothHinge(k=2, tau=-1.0), ValueError, "'tau' should be > 0.0, got -1.0"),
    (lambda: losses.smooth_hinge(s, y, 2, 1.0, hard_switch="False"), TypeError,
     "'hard_switch' should be True or False, got 'False'"),
    (lambda: losses.SmoothHinge(k=2, tau=1.0, hard_switch=0), TypeError, "'hard_switch' should be True or False, got 0"),
    (lambda: log_elementary_symmetric_pair(s, 0), ValueError, r"'k' should be in \[1, 6\].*got 0"),
    (lambda: log_elementary_symmetric_pair(s, 7), ValueError, r"'k' should be in \[1, 6\].*got 7"),
    (lambda: log_elementary_symmetric_pair(s, 2, backend="cuda"), ValueError,
     r"'backend' should be one of \('torch', 'triton'\), got 'cuda'"),
    (lambda: log_elementary_symmetric_pair(torch.arange(6), 2), TypeError, "'x' should be a floating-point tensor"),
    (lambda: log_elementary_symmetric_pair(s.half(), 2), TypeError, "'x' should be float32 or float64"),
    (lambda: losses.NoisedHinge(k=0, epsilon=0.1, n_samples=3), ValueError, "'k' should be >= 1, got 0"),
    (lambda: losses.NoisedHinge(k=5, epsilon=-1, n_samples=3), ValueError, "'epsilon' should be >= 0.0"),
    # margins and counts that make no sense where they are made or given
    (lambda: losses.noised_hinge(s, y, 2, 1.0, 3, margins=-0.2), ValueError, "'margins' should be >= 0.0, got -0.2"),
    (lambda: losses.NoisedHinge(2, 1.0, 3, margins=-1.0), ValueError, "'margins' should be >= 0.0, got -1.0"),
    (lambda: losses.LDAM(torch.tensor([0.1, -0.3])), ValueError, r"'margins' should be finite and >= 0, got \[0.1"),
    (lambda: losses.class_margins([10, 2.5, 3], 0.5), ValueError, "whole numbers of samples, got 2.5 for class 1"),
    (lambda: losses.class_margins([10, 2], -0.5), ValueError, "'max_margin' should be >= 0.0, got -0.5"),
    (lambda: topk.metrics.shot_groups([10, 2.5]), ValueError, "whole numbers of examples, got 2.5"),
    (lambda: topk.metrics.TopKAccuracy(ks="5"), TypeError, "'ks' should be an integer"),
    (lambda: topk.metrics.TopKAccuracy(ks=None), TypeError, "'ks' should be a positive integer or a sequence"),
    (lambda: topk.metrics.TopKAccuracy(ks=0), ValueError, "'ks' should be >= 1, got 0"),
    (lambda: topk.metrics.MacroTopKAccuracy(5, num_classes=2.0), TypeError, "'num_classes' should be an integer"),
    (lambda: losses.build_loss("noised_imbalanced", class_counts=[3, 2], k=1, epsilon=0.1, n_samples=3,
                               max_margin=0.2, sclae=30.0), TypeError,
     r"unknown parameter \['sclae'\]; its parameters are k, epsilon, n_samples, max_margin, scale=1.0"),
]


@pytest.mark.parametrize("call,error,message", CASES, ids=[c[2][:40] for c in CASES])
def test_bad_input_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mismatched_devices_are_refused():
    with pytest.raises(ValueError, match="'y' is on cpu but the scores are on cuda"):
        losses.cross_entropy(s.cuda(), y)
    with pytest.raises(ValueError, match="'noise' is on cpu"):
        topk.smooth_top_k(s.cuda(), 2, 1.0, 3, noise=torch.randn(3, 4, 6))
    with pytest.raises(ValueError, match="'generator' is on cpu"):
        topk.smooth_top_k(s.cuda(), 2, 1.0, 3, generator=torch.Generator())


def test_a_checkpoint_s_bad_margins_fail_at_load_and_good_ones_load():
    module = losses.NoisedHinge(2, 1.0, 3, margins=losses.class_margins([50, 5, 1], 0.3))
    margins = module.state_dict()["margins"].clone()
    module.load_state_dict({"margins": margins.flip(0)})
    assert module.margins[0] == margins[-1]
    with pytest.raises(ValueError, match=r"'margins' should be finite and >= 0, got \[.*nan"):
        module.load_state_dict({"margins": torch.tensor([0.1, float("nan"), 0.2])})
    with pytest.raises(ValueError, match=r"'margins' should be finite and >= 0, got \[-0.1"):
        torch.nn.Sequential(losses.LDAM(torch.full((3,), 0.2))).load_state_dict({"0.margins": torch.full((3,), -0.1)})
    assert module.margins[0] == margins[-1]  # the failed load changed nothing


def test_margins_are_checked_without_a_host_read_where_the_loss_compiles():
    """The functional form's margins are an asynchronous assertion, as the labels' range: compiled, an in-graph one."""
    compiled = torch.compile(lambda m: losses.ldam(s, y, m), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(torch.full((6,), 0.2)), losses.ldam(s, y, torch.full((6,), 0.2)))
    with pytest.raises(RuntimeError, match="'margins' should be finite and >= 0"):
        compiled(torch.full((6,), -0.2))


def test_nan_scores_give_nan_losses_never_finite_ones():
    bad = s.clone()
    bad[2, 3] = float("nan")
    for loss in (losses.cross_entropy(bad, y, reduction="none"), losses.focal(bad, y, 2.0, reduction="none"),
                 losses.ldam(bad, y, 0.3, reduction="none"), losses.lapin_hinge(bad, y, 2, reduction="none"),
                 losses.convex_hinge(bad, y, 2, reduction="none"), losses.calibrated_hinge(bad, y, 2, reduction="none"),
                 losses.zero_one_topk(bad, y, 2, reduction="none"), losses.noised_hinge(bad, y, 2, 0.5, 3, reduction="none"),
                 losses.smooth_hinge(bad, y, 1, 0.5, reduction="none"), losses.smooth_hinge(bad, y, 3, 0.5, reduction="none")):
        assert torch.isnan(loss[2]) and torch.isfinite(loss[[0, 1, 3]]).all()


def test_one_k_is_taken_where_several_are():
    assert topk.metrics.TopKAccuracy(ks=5).ks == (5,) and topk.metrics.MacroTopKAccuracy(3, num_classes=4).ks == (3,)


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_empty_batch_gives_what_cross_entropy_gives(name, reduction):
    """PyTorch's convention, as ``F.cross_entropy``: no sample, no loss per sample; their sum is 0 and their mean 0/0,
    NaN; the gradient is empty. Every loss and reduction, the noised losses' pruned CPU kernel included."""
    options = {"k": 2, "epsilon": 0.2, "n_samples": 3, "tau": 1.0, "gamma": 2.0, "max_margin": 0.3}
    keywords = losses.LOSSES[name].keywords
    loss = losses.build_loss(name, class_counts=[5, 4, 3, 2, 1], reduction=reduction,
                             **{key: value for key, value in options.items() if key in keywords})
    scores = torch.empty(0, 5, requires_grad=True)
    labels = torch.empty(0, dtype=torch.long)
    value = loss(scores, labels)
    expected = torch.nn.functional.cross_entropy(scores, labels, reduction=reduction)
    torch.testing.assert_close(value, expected, equal_nan=True)
    if value.requires_grad:
        value.sum().backward()
        assert scores.grad.shape == (0, 5)
