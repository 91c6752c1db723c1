"""Supervised memory probe: can an encoder, through the policy's own acting and training path, recall the
symbol it saw k steps ago?

It separates what an encoder *can* remember from what PPO makes it learn. Data: ``n_streams``
endless streams of random symbols (uniform over ``n_symbols``), cut into episodes whose lengths are drawn
uniformly from [2k + W, 4k + 2W] (W = the training window ``seq_len``); the target at step t of an episode is
the symbol of step t - k, undefined for t < k (those steps are left out of the loss and of the accuracy). The
policy (:func:`~rl_transformers.policies.gtrxl.make_policy`, observation and action spaces ``Discrete``) is
used exactly as PPO uses it (:mod:`rl_transformers.algos.rollout`, :mod:`rl_transformers.algos.ppo_update`):

- **acting**: one token per stream per step with ``policy.act`` under ``torch.inference_mode``, the state
  carried from step to step and from one update to the next, ``episode_start`` clearing a stream's rows; at
  every W-th step ``policy.segment_start`` is called and the state stored (cloned out of inference mode), as
  the rollout stores it for each training sequence;
- **training**: each stored window of W steps is re-run in one pass from its stored state by
  ``policy.evaluate_sequence`` (episode starts inside a window cut it, as in PPO), and the loss is the
  cross-entropy of the actor head's distribution at the target, -log π(target), averaged over the defined
  targets, plus the backbone's aux losses (weight 1, PPO's default ``aux_coef``); one Adam step per update
  over all windows of the rollout (PPO's ``update_epochs = num_minibatches = 1``), gradients clipped.

So the cache bound, the XL memory, the training window and the truncation of gradients at window starts are
those of a PPO run. One **update** = one rollout of ``windows`` x W steps per stream + one gradient step. The
accuracy of a rollout is that of the greedy predictions while acting (the parameters after the updates so
far); a cell reports the accuracy after ``updates`` updates, the first update at which it reached
``success`` (0.95), and updates per second (acting + training, one thread). Rollouts before the first
defined target (k > the steps seen so far) are not counted as updates.

Shapes: B streams, T steps of a rollout, W training window; obs, targets (T, B) when stored.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rl_transformers.backbone.options import check_int, check_number, check_positive
from rl_transformers.backbone.state import State, cat_rows
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.study.encoders import policy_config


@dataclass(frozen=True)
class ProbeSettings:
    """Settings shared by every cell of a probe grid."""

    n_symbols: int = 8
    """Symbols of the stream (chance accuracy 1 / n_symbols)."""
    n_streams: int = 16
    """Parallel streams (the envs of a PPO run)."""
    seq_len: int = 16
    """Training window W (PPO's --ppo.seq-len default)."""
    windows: int = 4
    """Training windows per rollout: rollout length = windows x seq_len (PPO's default num_steps is 64)."""
    updates: int = 300
    """Gradient updates per cell; the reported accuracy is measured after the last one."""
    learning_rate: float = 1e-3
    """Adam learning rate (constant)."""
    adam_eps: float = 1e-5
    """Adam epsilon (PPO's)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (PPO's)."""
    success: float = 0.95
    """Accuracy that counts as having learned the lookup (updates to success)."""

    def __post_init__(self) -> None:
        for name in ("n_symbols", "n_streams", "seq_len", "windows", "updates"):
            check_int(f"settings.{name}", getattr(self, name), 2 if name == "n_symbols" else 1)
        for name in ("learning_rate", "adam_eps", "max_grad_norm"):
            check_positive(f"settings.{name}", getattr(self, name))
        check_number("settings.success", self.success, low=0.0, high=1.0)

    @property
    def rollout_steps(self) -> int:
        return self.windows * self.seq_len


def episode_lengths(k: int, seq_len: int) -> tuple[int, int]:
    """The inclusive range episode lengths are drawn from: [2k + W, 4k + 2W] (at least half the steps of an
    episode have a target, and several windows of every episode do)."""
    return 2 * k + seq_len, 4 * k + 2 * seq_len


class SymbolStreams:
    """``n_streams`` random symbol streams with episode resets; targets are the symbol ``k`` steps back."""

    def __init__(self, k: int, settings: ProbeSettings, rng: np.random.Generator) -> None:
        check_int("k", k, 1)
        self.k, self.settings, self.rng = k, settings, rng
        b = settings.n_streams
        self.lengths = episode_lengths(k, settings.seq_len)
        self.history = np.zeros((b, k + 1), dtype=np.int64)  # ring buffer of the last k + 1 symbols
        self.pos = np.zeros(b, dtype=np.int64)  # step within the episode of the next observation
        self.left = np.zeros(b, dtype=np.int64)  # steps left in the episode (0: the next step starts one)

    def rollout(self, n_steps: int) -> tuple[Tensor, Tensor, Tensor]:
        """obs (T, B) long, episode starts (T, B) bool, targets (T, B) long (-1 where undefined)."""
        b, k, n = self.settings.n_streams, self.k, self.settings.n_symbols
        obs = np.zeros((n_steps, b), dtype=np.int64)
        starts = np.zeros((n_steps, b), dtype=bool)
        targets = np.full((n_steps, b), -1, dtype=np.int64)
        rows = np.arange(b)
        for t in range(n_steps):
            new = self.left == 0
            if new.any():
                lo, hi = self.lengths
                self.left[new] = self.rng.integers(lo, hi + 1, size=int(new.sum()))
                self.pos[new] = 0
            symbol = self.rng.integers(0, n, size=b)
            self.history[rows, self.pos % (k + 1)] = symbol
            defined = self.pos >= k
            targets[t, defined] = self.history[rows[defined], (self.pos[defined] - k) % (k + 1)]
            obs[t], starts[t] = symbol, new
            self.pos += 1
            self.left -= 1
        return torch.from_numpy(obs), torch.from_numpy(starts), torch.from_numpy(targets)


@dataclass
class Rollout:
    """One rollout: (T, B) obs / starts / targets / greedy predictions, and the state at each window start."""

    obs: Tensor
    starts: Tensor
    targets: Tensor
    predictions: Tensor
    states: list[Any]

    @property
    def n_targets(self) -> int:
        return int((self.targets >= 0).sum())

    @property
    def accuracy(self) -> float:
        mask = self.targets >= 0
        return float((self.predictions[mask] == self.targets[mask]).float().mean()) if mask.any() else 0.0


def _clone(state: Any) -> Any:
    # Out of inference mode, so the stored copy can enter the training graph (as the PPO storage does).
    with torch.inference_mode(False):
        return state.map(lambda t: t.clone()) if isinstance(state, State) else state


def collect(
    policy: ActorCritic, streams: SymbolStreams, state: Any, seq_len: int, n_steps: int
) -> tuple[Rollout, Any]:
    """Act on ``n_steps`` steps of the streams from ``state`` (the acting path; see the module docstring)."""
    obs, starts, targets = streams.rollout(n_steps)
    predictions = torch.empty_like(obs)
    stored: list[Any] = []
    with torch.inference_mode():
        for t in range(n_steps):
            if t % seq_len == 0:
                state = policy.segment_start(state)
                stored.append(_clone(state))
            out = policy.act(obs[t], state, starts[t], deterministic=True)
            predictions[t] = out.action
            state = out.state
    return Rollout(obs, starts, targets, predictions, stored), state


def _signature(state: Any) -> tuple[Any, ...]:
    shapes: list[Any] = []
    if isinstance(state, State):
        state.map(lambda t: shapes.append((tuple(t.shape[1:]), t.dtype)) or t)  # type: ignore[func-returns-value]
    return tuple(shapes)


def window_batches(rollout: Rollout, seq_len: int) -> list[tuple[Tensor, Tensor, Tensor, Any]]:
    """The rollout's training windows as batches (obs, starts, targets (B', W), state of B' rows), one batch
    per group of windows whose stored states have equal shapes (row j·B + b = window j of stream b)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for j, state in enumerate(rollout.states):
        groups.setdefault(_signature(state), []).append(j)

    def windows(x: Tensor, js: list[int]) -> Tensor:
        return torch.cat([x[j * seq_len : (j + 1) * seq_len].T for j in js])

    out = []
    for js in groups.values():
        state = rollout.states[js[0]] if len(js) == 1 else cat_rows([rollout.states[j] for j in js])
        out.append(
            (windows(rollout.obs, js), windows(rollout.starts, js), windows(rollout.targets, js), state)
        )
    return out


def train_step(
    policy: ActorCritic, optimizer: torch.optim.Optimizer, rollout: Rollout, settings: ProbeSettings
) -> float:
    """One gradient step of cross-entropy over every window of ``rollout`` (the training path); the loss."""
    total = max(rollout.n_targets, 1)
    rows = rollout.obs.shape[1] * len(rollout.states)
    optimizer.zero_grad(set_to_none=True)
    loss_value = 0.0
    for obs, starts, targets, state in window_batches(rollout, settings.seq_len):
        mask = targets >= 0
        out = policy.evaluate_sequence(obs, targets.clamp(min=0), state, starts)
        loss = -(out.log_prob * mask).sum() / total
        for aux in out.aux_losses.values():
            loss = loss + aux * (obs.shape[0] / rows)
        loss.backward()
        loss_value += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
    optimizer.step()
    return loss_value


@dataclass(frozen=True)
class CellResult:
    """What one cell (encoder spec, k, seed) measured."""

    spec: str
    k: int
    seed: int
    updates: int
    accuracy: float
    """Greedy acting accuracy after ``updates`` updates."""
    updates_to_success: int | None
    """First update count whose accuracy reached ``success`` (None: never within the budget)."""
    updates_per_s: float
    seconds: float
    curve: list[float]
    """Accuracy after 0, 1, ..., updates updates."""
    parameters: int
    replay_exact: bool
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_policy(spec: str, settings: ProbeSettings) -> ActorCritic:
    from rl_transformers.policies.gtrxl import make_policy

    space = spaces.Discrete(settings.n_symbols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # replay exactness is recorded in the result instead
        return make_policy(policy_config(spec), space, space)


def measure(spec: str, k: int, seed: int, settings: ProbeSettings) -> CellResult:
    """Train and measure one cell (see the module docstring)."""
    from rl_transformers.policies.cores import replay_exactness
    from rl_transformers.utils.training import seed_everything

    seed_everything(seed)
    policy = build_policy(spec, settings)
    config = policy_config(spec)
    exact = config.kind != "transformer" or replay_exactness(config.backbone)[0]
    optimizer = torch.optim.Adam(policy.parameters(), lr=settings.learning_rate, eps=settings.adam_eps)
    streams = SymbolStreams(k, settings, np.random.default_rng(seed))
    state = policy.initial_state(settings.n_streams)
    curve: list[float] = []
    start = time.perf_counter()
    while True:
        rollout, state = collect(policy, streams, state, settings.seq_len, settings.rollout_steps)
        if rollout.n_targets == 0:
            continue  # every stream is still before its first target
        curve.append(rollout.accuracy)
        if len(curve) > settings.updates:
            break
        train_step(policy, optimizer, rollout, settings)
    seconds = time.perf_counter() - start
    first = next((u for u, acc in enumerate(curve) if acc >= settings.success), None)
    return CellResult(
        spec=spec,
        k=k,
        seed=seed,
        updates=settings.updates,
        accuracy=curve[-1],
        updates_to_success=first,
        updates_per_s=settings.updates / max(seconds, 1e-9),
        seconds=seconds,
        curve=[round(a, 4) for a in curve],
        parameters=sum(p.numel() for p in policy.parameters()),
        replay_exact=bool(exact),
        settings=dataclasses.asdict(settings),
    )


__all__ = [
    "CellResult",
    "ProbeSettings",
    "Rollout",
    "SymbolStreams",
    "collect",
    "episode_lengths",
    "measure",
    "train_step",
    "window_batches",
]
