"""The illustration of Section 3.2 of Garcin et al. (ICML 2022): L = 4, K = 2, B = 3, eps = 1."""

import torch

import topk

SCORES = [2.4, 2.6, 2.3, 0.5]
NOISE = [[0.2, -0.1, 0.1, 0.3], [0.1, 0.1, -0.1, 0.1], [-0.1, -0.1, 0.1, -0.1]]


def test_section_3_2_worked_example_value_and_gradient():
    """With the paper's three noise vectors, the smoothed top-2 is (2.5 + 2.5 + 2.4) / 3 = 7.4 / 3 and its
    gradient (1/3, 1/3, 1/3, 0): the noise moves weight to the coordinates close to the top-2 score."""
    s = torch.tensor(SCORES, dtype=torch.float64, requires_grad=True)
    value = topk.smooth_top_k(s, 2, 1.0, 3, noise=torch.tensor(NOISE, dtype=torch.float64))
    value.backward()
    assert abs(value.item() - 7.4 / 3) < 1e-12
    torch.testing.assert_close(s.grad, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=torch.float64), rtol=0, atol=1e-15)


def test_section_3_2_hard_top_2_and_small_epsilon_keep_the_hard_gradient():
    """top_2(s) = 2.4 at coordinate 1; with eps = 0.1 the same noise no longer changes the arg top-2."""
    s = torch.tensor(SCORES, dtype=torch.float64, requires_grad=True)
    assert topk.top_k(s, 2).item() == 2.4
    value = topk.smooth_top_k(s, 2, 0.1, 3, noise=torch.tensor(NOISE, dtype=torch.float64))
    value.backward()
    torch.testing.assert_close(s.grad, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-15)
