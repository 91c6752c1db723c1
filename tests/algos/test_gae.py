"""GAE(λ): a hand-computed case (termination vs truncation bootstrapping) and an independent reference."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.algos.storage import compute_gae


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_hand_computed_termination_vs_truncation() -> None:
    # gamma = lambda = 0.5, two envs, four steps; columns are envs.
    # env 0: terminated at t=1 (no bootstrap), truncated at t=3 with V(final obs) = 4 (bootstrap from it, not
    #        from last_value = 10); env 1: no episode end, bootstrap from last_value = 2.
    rewards = _t([[1, 0], [0, 0], [2, 0], [1, 1]])
    values = _t([[0.5, 1], [1, 1], [0, 1], [2, 1]])
    terminated = torch.tensor([[False, False], [True, False], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, False], [False, False], [True, False]])
    final_values = _t([[99, 99], [99, 99], [99, 99], [4, 99]])  # only [3, 0] may be read
    last_value = torch.tensor([10.0, 2.0], dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, terminated, truncated, final_values, last_value, 0.5, 0.5)
    # env 0 by hand: d3 = 1 + .5*4 - 2 = 1 -> A3 = 1 (episode ends); d2 = 2 + .5*2 - 0 = 3 -> A2 = 3 + .25*1;
    # d1 = 0 + 0 - 1 = -1 -> A1 = -1 (terminated); d0 = 1 + .5*1 - .5 = 1 -> A0 = 1 + .25*(-1).
    # env 1: d3 = 1 + .5*2 - 1 = 1; d2 = d1 = d0 = 0 + .5*1 - 1 = -.5; A_t = d_t + .25 A_{t+1}.
    a1_3 = 1.0
    a1_2 = -0.5 + 0.25 * a1_3
    a1_1 = -0.5 + 0.25 * a1_2
    a1_0 = -0.5 + 0.25 * a1_1
    expected = _t([[0.75, a1_0], [-1.0, a1_1], [3.25, a1_2], [1.0, a1_3]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, expected + values, rtol=0, atol=1e-12)


def test_termination_wins_over_truncation() -> None:
    ones = torch.ones(1, 1, dtype=torch.float64)
    both = torch.ones(1, 1, dtype=torch.bool)
    adv, _ = compute_gae(ones, 0 * ones, both, both, 5 * ones, 7 * ones[0], 0.9, 0.95)
    assert adv.item() == pytest.approx(1.0)  # no bootstrap at all
    adv, _ = compute_gae(ones, 0 * ones, ~both, both, 5 * ones, 7 * ones[0], 0.9, 0.95)
    assert adv.item() == pytest.approx(1.0 + 0.9 * 5)  # truncation: V(final obs), not last_value


def reference_gae(rewards, values, terminated, truncated, final_values, last_value, gamma, lam):
    """A_t = sum_k (γλ)^k δ_{t+k} over the rest of the episode, written as an explicit double loop."""
    t_len, n = rewards.shape
    adv = torch.zeros_like(rewards)
    for e in range(n):
        deltas = []
        for t in range(t_len):
            if terminated[t, e]:
                nxt = 0.0
            elif truncated[t, e]:
                nxt = final_values[t, e]
            else:
                nxt = last_value[e] if t == t_len - 1 else values[t + 1, e]
            deltas.append(rewards[t, e] + gamma * nxt - values[t, e])
        for t in range(t_len):
            total, k = 0.0, 0
            while t + k < t_len:
                total += (gamma * lam) ** k * deltas[t + k]
                if terminated[t + k, e] or truncated[t + k, e]:
                    break
                k += 1
            adv[t, e] = total
    return adv


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)], ids=["default", "mc", "td0"])
def test_matches_explicit_sum(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(3)
    t_len, n = 17, 4
    rewards = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    values = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    final_values = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    terminated = torch.rand(t_len, n, generator=g) < 0.15
    truncated = torch.rand(t_len, n, generator=g) < 0.15
    last_value = torch.randn(n, generator=g, dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, terminated, truncated, final_values, last_value, gamma, lam)
    expected = reference_gae(rewards, values, terminated, truncated, final_values, last_value, gamma, lam)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(ret, adv + values)


def test_monte_carlo_returns() -> None:
    # γ = λ = 1 with a terminal end: returns are the plain sums of the remaining rewards.
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.3], [-1.0], [2.0]])
    terminated = torch.tensor([[False], [False], [True]])
    _, ret = compute_gae(
        rewards,
        values,
        terminated,
        torch.zeros_like(terminated),
        torch.zeros_like(rewards),
        torch.zeros(1),
        1.0,
        1.0,
    )
    torch.testing.assert_close(ret, torch.tensor([[6.0], [5.0], [3.0]]))
