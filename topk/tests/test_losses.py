"""The losses of Table 1: gradients (gradcheck in float64), degenerate cases that reduce to known losses,
reductions, modules, the registry Table 1 is printed from, and the cosine classifier."""

import math

import pytest
import torch
import torch.nn.functional as F

from topk import losses
from topk.layers import CosineClassifier
from topk.losses import LOSSES, build_loss, table_1

L, BATCH = 7, 5


def _data(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = (2 * torch.randn(BATCH, L, generator=g)).to(dtype).requires_grad_()
    y = torch.randint(0, L, (BATCH,), generator=g)
    return s, y


DETERMINISTIC = {
    "cross_entropy": lambda s, y: losses.cross_entropy(s, y),
    "focal_0.5": lambda s, y: losses.focal(s, y, 0.5),
    "focal_2": lambda s, y: losses.focal(s, y, 2.0),
    "ldam": lambda s, y: losses.ldam(s, y, losses.class_margins(torch.arange(1, L + 1) ** 2, 0.5).double(), scale=3.0),
    "lapin_hinge": lambda s, y: losses.lapin_hinge(s, y, 2),
    "convex_hinge": lambda s, y: losses.convex_hinge(s, y, 3),
    "calibrated_hinge": lambda s, y: losses.calibrated_hinge(s, y, 2),
    "smooth_hinge_k1": lambda s, y: losses.smooth_hinge(s, y, 1, 0.5),
    "smooth_hinge_k3": lambda s, y: losses.smooth_hinge(s, y, 3, 0.5, alpha=0.7),
    "noised_hinge_given_noise": lambda s, y: losses.noised_hinge(
        s, y, 2, 0.5, 4, margins=torch.linspace(0.1, 1.0, L, dtype=torch.float64),
        noise=torch.randn(4, BATCH, L, generator=torch.Generator().manual_seed(9), dtype=torch.float64)),
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_gradcheck_float64(name):
    """Analytic gradients against finite differences (random inputs avoid the hinges' kinks a.s.)."""
    s, y = _data()
    assert torch.autograd.gradcheck(lambda x: DETERMINISTIC[name](x, y), (s,), eps=1e-6, atol=1e-5)


def test_focal_with_gamma_zero_is_cross_entropy():
    s, y = _data()
    torch.testing.assert_close(losses.focal(s, y, 0.0), F.cross_entropy(s, y))


def test_focal_is_the_standard_formula():
    s, y = _data()
    p = torch.softmax(s, -1).gather(1, y[:, None])[:, 0]
    torch.testing.assert_close(losses.focal(s, y, 2.0, reduction="none"), (1 - p) ** 2 * -torch.log(p))


def test_focal_gradient_stays_finite_when_the_true_class_is_certain():
    s = torch.tensor([[200.0, 0.0, 0.0]], requires_grad=True)
    losses.focal(s, torch.tensor([0]), 0.5).backward()
    assert torch.isfinite(s.grad).all()


def test_ldam_with_zero_margins_and_unit_scale_is_cross_entropy():
    s, y = _data()
    torch.testing.assert_close(losses.ldam(s, y, 0.0), F.cross_entropy(s, y))
    torch.testing.assert_close(losses.ldam(s, y, torch.zeros(L, dtype=torch.float64)), F.cross_entropy(s, y))


def test_ldam_subtracts_the_true_class_margin_before_scaling():
    s, y = _data()
    margins = torch.rand(L, dtype=torch.float64)
    shifted = s - F.one_hot(y, L) * margins[y][:, None]
    torch.testing.assert_close(losses.ldam(s, y, margins, scale=30.0), F.cross_entropy(30 * shifted, y))


def test_hinge_losses_match_their_definitions():
    s, y = _data()
    s_ = s.detach()
    others = [torch.cat([row[:c], row[c + 1:]]) for row, c in zip(s_, y)]
    true = s_.gather(1, y[:, None])[:, 0]
    lapin = torch.stack([torch.sort(o, descending=True).values[1] for o in others])  # K = 2 of s without y
    torch.testing.assert_close(losses.lapin_hinge(s, y, 2, reduction="none"), F.relu(1 + lapin - true))
    calibrated = torch.sort(s_, descending=True).values[:, 2]  # K + 1 = 3
    torch.testing.assert_close(losses.calibrated_hinge(s, y, 2, reduction="none"), F.relu(1 + calibrated - true))
    shifted = torch.sort(s_ + 1 - F.one_hot(y, L), descending=True).values[:, :3].mean(1)
    torch.testing.assert_close(losses.convex_hinge(s, y, 3, reduction="none"), F.relu(shifted - true))


def test_convex_hinge_upper_bounds_lapin_hinge():
    """Lapin et al. (2015): the convexified top-K hinge is an upper bound of the top-K hinge."""
    for seed in range(20):
        s, y = _data(seed)
        for k in range(1, L):
            assert bool((losses.convex_hinge(s, y, k, reduction="none")
                         >= losses.lapin_hinge(s, y, k, reduction="none") - 1e-12).all())


def test_zero_one_loss_is_eq_3_and_counts_ties_as_correct():
    s, y = _data()
    rank = (s.detach() > s.detach().gather(1, y[:, None])).sum(1)
    torch.testing.assert_close(losses.zero_one_topk(s, y, 3, reduction="none"), (rank >= 3).double())
    assert losses.zero_one_topk(torch.zeros(2, 4), torch.tensor([0, 3]), 1).item() == 0.0


def test_noised_imbalanced_with_equal_margins_is_the_balanced_loss():
    s, y = _data()
    z = torch.randn(6, BATCH, L, dtype=torch.float64)
    torch.testing.assert_close(losses.noised_hinge(s, y, 2, 0.5, 6, margins=torch.full((L,), 0.7, dtype=torch.float64), noise=z),
                               losses.noised_hinge(s, y, 2, 0.5, 6, margins=0.7, noise=z))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_noised_hinge_scale_on_cosines_is_the_loss_on_scores_margins_and_epsilon_all_scaled(backend, request):
    """The paper's scaling constant (Sec. 4.5): ``scale * (m_y + top_{K+1,eps}(c) - c_y)_+`` on cosines ``c`` equals
    the unscaled loss on ``scale * c`` with margins ``scale * m_y`` and noise ``scale * eps``, value and gradient."""
    device = request.getfixturevalue("kernel_device") if backend == "triton" else torch.device("cpu")
    cosines, y = (t.to(device) for t in _data())
    cosines = torch.tanh(cosines).detach().requires_grad_()
    margins = torch.linspace(0.05, 0.4, L, dtype=torch.float64, device=device)
    z, scale = torch.randn(6, BATCH, L, dtype=torch.float64, device=device), 50.0
    on_cosines = losses.noised_hinge(cosines, y, 2, 0.1, 6, margins=margins, scale=scale, noise=z, backend=backend)
    scaled = (scale * cosines).detach().requires_grad_()
    on_scores = losses.noised_hinge(scaled, y, 2, scale * 0.1, 6, margins=scale * margins, noise=z, backend=backend)
    assert on_scores.item() > 1.0  # some rows violate their margin: the comparison is not between zeros
    torch.testing.assert_close(on_cosines, on_scores)
    on_cosines.backward(), on_scores.backward()
    torch.testing.assert_close(cosines.grad, scale * scaled.grad)


def test_reductions():
    s, y = _data()
    per_sample = losses.cross_entropy(s, y, reduction="none")
    assert per_sample.shape == (BATCH,)
    torch.testing.assert_close(losses.cross_entropy(s, y, reduction="sum"), per_sample.sum())
    torch.testing.assert_close(losses.cross_entropy(s, y), per_sample.mean())


def test_class_margins_are_inverse_fourth_roots_scaled_to_the_max_margin():
    counts = torch.tensor([1, 16, 81, 10000])
    margins = losses.class_margins(counts, 0.4)
    torch.testing.assert_close(margins, 0.4 * torch.tensor([1, 1 / 2, 1 / 3, 1 / 10]))
    assert margins.max().item() == pytest.approx(0.4)


def test_modules_forward_equals_their_functions_and_to_moves_the_margins(device):
    s, y = (t.to(device) for t in _data())
    counts = list(range(1, L + 1))
    module = losses.NoisedHinge.imbalanced(2, 0.5, 3, class_counts=counts, max_margin=0.3).to(device, torch.float64)
    assert module.margins.device.type == device.type and module.margins.dtype == torch.float64
    assert "margins" in dict(module.named_buffers())
    margins = losses.class_margins(counts, 0.3).to(device, torch.float64)
    torch.manual_seed(5)  # the module and the function draw the same noise from the default generator
    expected = losses.noised_hinge(s, y, 2, 0.5, 3, margins=margins)
    torch.manual_seed(5)
    assert torch.equal(module.forward(s, y), expected)
    torch.testing.assert_close(losses.Focal(2.0).to(device).forward(s, y), losses.focal(s, y, 2.0))
    ldam = losses.LDAM.from_class_counts([5] * L, 0.5, scale=2.0).to(device)
    torch.testing.assert_close(ldam.forward(s, y), losses.ldam(s, y, 0.5, scale=2.0))


def test_registry_holds_every_row_of_table_1_in_order():
    assert list(LOSSES) == ["zero_one", "cross_entropy", "ldam", "focal", "lapin_hinge", "convex_hinge",
                            "calibrated_hinge", "smooth_hinge", "noised_balanced", "noised_imbalanced"]
    rows = table_1()
    assert len(rows) == 10 and all(row["expression"].startswith("$") for row in rows)
    assert rows[8]["parameters"] == r"$K$, $\epsilon$, $B$"


@pytest.mark.parametrize("name,params", [
    ("zero_one", {"k": 2}), ("cross_entropy", {}), ("ldam", {"max_margin": 0.5, "scale": 30.0}), ("focal", {"gamma": 2.0}),
    ("lapin_hinge", {"k": 2}), ("convex_hinge", {"k": 2}), ("calibrated_hinge", {"k": 2}),
    ("smooth_hinge", {"k": 2, "tau": 1.0}), ("noised_balanced", {"k": 2, "epsilon": 0.2, "n_samples": 3}),
    ("noised_imbalanced", {"k": 2, "epsilon": 0.2, "n_samples": 3, "max_margin": 0.2}),
])
def test_build_loss_gives_every_loss_from_one_call_with_the_class_counts(name, params):
    """A training loop gives every loss the class counts; those that make margins from them use them."""
    s, y = _data(dtype=torch.float32)
    counts = torch.arange(1, L + 1)
    loss = build_loss(name, class_counts=counts, **params)
    value = loss(s, y)
    assert value.dim() == 0 and torch.isfinite(value)
    if LOSSES[name].takes_class_counts:
        torch.testing.assert_close(loss.margins, losses.class_margins(counts, params["max_margin"]))
        with pytest.raises(ValueError, match=f"loss '{name}' makes its per-class margins .* give class_counts="):
            build_loss(name, **params)


def test_build_loss_errors_name_the_choices():
    with pytest.raises(ValueError, match="registered losses are .*noised_balanced"):
        build_loss("hinge")


def test_build_loss_names_a_missing_parameter_and_the_losss_parameters():
    with pytest.raises(TypeError, match=r"build_loss\('noised_balanced', ...\): missing .*'n_samples'.* "
                                        r"parameters are k, epsilon, n_samples, margins=1.0"):
        build_loss("noised_balanced", k=5, epsilon=0.2)
    with pytest.raises(TypeError, match=r"build_loss\('ldam', ...\): missing .*'max_margin'"):
        build_loss("ldam", class_counts=[3, 2, 1])


def test_cosine_classifier_scores_are_bounded_by_the_scale_and_scale_invariant():
    head = CosineClassifier(8, 5, scale=40.0)
    x = torch.randn(16, 8)
    scores = head(x)
    assert scores.abs().max() <= 40.0 + 1e-4
    torch.testing.assert_close(head(3 * x), scores)
    assert math.isclose(head(head.weight.detach()[:1]).max().item(), 40.0, rel_tol=1e-5)
