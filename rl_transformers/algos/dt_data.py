"""Decision Transformer batching: returns-to-go, K-step windows sampled ∝ episode length, padding masks.

Method (Chen et al. 2021, arXiv 2106.01345, §4 and their released code): the episodes are concatenated once;
each step stores its undiscounted return-to-go R̂_t = Σ_{t'≥t} r_t' (within its episode, γ = 1) and its
episode timestep t (from 0). A batch draws B episodes with probability ∝ length and, in each, a start step
uniformly in [0, T − 1]; the window is the steps [start, start + K) that exist (L = min(K, T − start)),
padded to K on the model's padding side (:func:`~rl_transformers.policies.dt_padding.pad_steps`)
with zeros and ``mask`` False. Rollouts build their contexts the same way, so R̂ alignment is the same in
training and acting: the token of step t carries R̂_t, which includes r_t, and the agent's R̂_{t+1} = R̂_t − r_t.

%BC (the paper's "Percentile Behavior Cloning"): :func:`top_fraction_episodes` keeps the best episodes by
return whose steps make up the top ``fraction`` of the dataset's steps (at least one episode).

Segment recurrence (RATE, Cherepanov et al. 2023, arXiv 2306.09459; ``--segments N``):
:meth:`TrajectoryDataset.sample_segments` draws windows of N consecutive K-step segments and
:func:`segment_backward` runs them in order with the backbone memory carried and detached.

Shapes: B batch, K context, A action dim. Batch fields: returns_to_go (B, K) float32, observations
(B, K, *obs_shape) float32 (int64 for Discrete observations), actions (B, K, A) float32 or (B, K) int64,
timesteps (B, K) int64, mask (B, K) bool.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.policies.dt_padding import Padding, pad_steps


class EpisodeLike(Protocol):
    """What the batcher needs from an episode (``offline_data.Episode`` satisfies it)."""

    # Read-only members, so that frozen dataclasses such as ``Episode`` satisfy the protocol.
    @property
    def observations(self) -> np.ndarray: ...
    @property
    def actions(self) -> np.ndarray: ...
    @property
    def rewards(self) -> np.ndarray: ...


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """R̂_t = Σ_{t'≥t} r_t' (float64), the undiscounted reverse cumulative sum of one episode's rewards."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    return np.cumsum(r[::-1])[::-1].copy()


def top_fraction_episodes(lengths: np.ndarray, returns: np.ndarray, fraction: float) -> np.ndarray:
    """Indices (ascending) of the best episodes by return holding the top ``fraction`` of all steps.

    Episodes are taken in decreasing order of return (ties: dataset order) while their cumulated length
    stays within ``ceil(fraction · total steps)``; at least one episode is kept. ``fraction = 1`` keeps all.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"top fraction must be in (0, 1], got {fraction!r}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if fraction == 1.0:
        return np.arange(len(lengths))
    budget = math.ceil(fraction * int(lengths.sum()))
    order = np.argsort(-np.asarray(returns, dtype=np.float64), kind="stable")
    kept: list[int]
    kept, used = [], 0
    for i in order:
        if kept and used + lengths[i] > budget:
            break
        kept.append(int(i))
        used += int(lengths[i])
    return np.sort(np.asarray(kept, dtype=np.int64))


def _check_integral_actions(episodes: Sequence[EpisodeLike], indices: np.ndarray) -> None:
    """Refuse float actions that are not whole numbers (casting them to int64 would silently truncate)."""
    for index, ep in zip(indices, episodes):
        actions = np.asarray(ep.actions)
        if np.issubdtype(actions.dtype, np.floating):
            bad = np.flatnonzero((actions != np.round(actions)).reshape(len(actions), -1).any(axis=1))
            if len(bad):
                values = [(int(s), actions[s].tolist()) for s in bad[:5]]
                raise ValueError(
                    f"discrete actions must be whole numbers; episode {int(index)} holds (step, value) {values}"
                )


@dataclass
class DTBatch:
    """A batch of padded K-step windows (shapes in the module docstring)."""

    returns_to_go: Tensor
    observations: Tensor
    actions: Tensor
    timesteps: Tensor
    mask: Tensor

    def to(self, device: torch.device | str) -> DTBatch:
        return DTBatch(*(getattr(self, f).to(device, non_blocking=True) for f in self.fields()))

    @staticmethod
    def fields() -> tuple[str, ...]:
        return ("returns_to_go", "observations", "actions", "timesteps", "mask")

    def model_inputs(self) -> dict[str, Tensor]:
        return {f: getattr(self, f) for f in self.fields()}


class TrajectoryDataset:
    """Concatenated episodes with per-step returns-to-go and timesteps, and the window sampler.

    Args:
        episodes: sequences of aligned observations (T, *obs_shape), actions (T, A) or (T,), rewards (T,).
        discrete_actions: actions are integer indices (kept as int64) instead of float vectors.
        discrete_observations: observations are integer indices.
        top_fraction: keep only the top episodes by return (%BC, :func:`top_fraction_episodes`).
    """

    def __init__(
        self,
        episodes: Sequence[EpisodeLike],
        *,
        discrete_actions: bool,
        discrete_observations: bool = False,
        top_fraction: float = 1.0,
    ) -> None:
        if not episodes:
            raise ValueError("no episodes given")
        all_lengths = np.array([len(np.asarray(ep.rewards).reshape(-1)) for ep in episodes], dtype=np.int64)
        if (all_lengths < 1).any():
            raise ValueError(f"episode {int(np.argmin(all_lengths))} is empty")
        all_returns = np.array([float(np.sum(ep.rewards, dtype=np.float64)) for ep in episodes])
        keep = top_fraction_episodes(all_lengths, all_returns, top_fraction)
        self.episode_indices = keep
        """Indices of the kept episodes in the input sequence."""
        kept = [episodes[i] for i in keep]
        self.discrete_actions = discrete_actions
        self.discrete_observations = discrete_observations
        obs_dtype = np.int64 if discrete_observations else np.float32
        act_dtype = np.int64 if discrete_actions else np.float32
        self.observations = np.concatenate([np.asarray(ep.observations, dtype=obs_dtype) for ep in kept])
        if discrete_actions:
            _check_integral_actions(kept, keep)
        actions = [np.asarray(ep.actions, dtype=act_dtype) for ep in kept]
        if not discrete_actions:
            actions = [a.reshape(len(a), -1) for a in actions]
        self.actions = np.concatenate([a.reshape(len(a)) if discrete_actions else a for a in actions])
        self.rewards = np.concatenate([np.asarray(ep.rewards, dtype=np.float64).reshape(-1) for ep in kept])
        self.returns_to_go = np.concatenate([returns_to_go(ep.rewards) for ep in kept])
        self._rtg32 = self.returns_to_go.astype(np.float32)
        self.lengths = all_lengths[keep]
        self.returns = all_returns[keep]
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.timesteps = np.concatenate([np.arange(n, dtype=np.int64) for n in self.lengths])
        if len(self.observations) != len(self.rewards) or len(self.actions) != len(self.rewards):
            raise ValueError(
                f"episodes are not aligned: {len(self.observations)} observations, {len(self.actions)} "
                f"actions, {len(self.rewards)} rewards in total"
            )
        self.probabilities = self.lengths / self.lengths.sum()

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    @property
    def num_steps(self) -> int:
        return int(self.lengths.sum())

    def state_stats(self, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std (+ ``eps``) of the flattened observations, float32 (obs_dim,)."""
        flat = self.observations.reshape(len(self.observations), -1).astype(np.float64)
        return flat.mean(0).astype(np.float32), (flat.std(0) + eps).astype(np.float32)

    def windows(
        self,
        episodes: np.ndarray,
        starts: np.ndarray,
        context_len: int,
        padding: Padding,
        lengths: np.ndarray | None = None,
    ) -> DTBatch:
        """Windows of ``episodes`` (B,) (indices into the kept episodes) from step ``starts`` (B,).

        Each window holds L = min(K, T − start, ``lengths``) real steps, padded to K on ``padding``'s side.
        """
        episodes = np.asarray(episodes, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        k = int(context_len)
        if (starts < 0).any() or (starts >= self.lengths[episodes]).any():
            raise ValueError("window starts must lie inside their episodes")
        n_real = np.minimum(self.lengths[episodes] - starts, k)
        if lengths is not None:
            n_real = np.minimum(n_real, np.asarray(lengths, dtype=np.int64))
        offsets = np.arange(k, dtype=np.int64)[None, :]
        valid = offsets < n_real[:, None]  # (B, K), real steps first
        index = np.where(valid, self.starts[episodes, None] + starts[:, None] + offsets, 0)

        def gather(values: np.ndarray) -> Tensor:
            picked = values[index]
            keep = valid.reshape(*valid.shape, *([1] * (picked.ndim - 2)))
            return torch.from_numpy(np.where(keep, picked, np.zeros((), dtype=picked.dtype)))

        n = torch.from_numpy(n_real)
        return DTBatch(
            returns_to_go=pad_steps(gather(self._rtg32), n, padding),
            observations=pad_steps(gather(self.observations), n, padding),
            actions=pad_steps(gather(self.actions), n, padding),
            timesteps=pad_steps(gather(self.timesteps), n, padding),
            mask=pad_steps(torch.from_numpy(valid), n, padding),
        )

    def sample(
        self, batch_size: int, context_len: int, rng: np.random.Generator, padding: Padding
    ) -> DTBatch:
        """B windows: episodes drawn ∝ length, start uniform over each episode's steps."""
        episodes = rng.choice(self.num_episodes, size=batch_size, p=self.probabilities)
        starts = rng.integers(0, self.lengths[episodes])
        return self.windows(episodes, starts, context_len, padding)

    def sample_segments(
        self, batch_size: int, context_len: int, segments: int, rng: np.random.Generator
    ) -> list[DTBatch]:
        """B windows of N = ``segments`` consecutive K-step segments, returned as N right-padded (B, K) batches.

        Episodes are drawn ∝ length; each window starts at a multiple of K, j·K with j uniform in
        [0, max(0, ⌈T/K⌉ − N)], so a window holds N whole segments where the episode allows it and its
        segments fall where the rollout's do (the agent starts a segment at t = 0, K, 2K, ...). Segment i is
        steps [start + iK, start + (i+1)K) of the N·K window: its real steps first, then padding (segments
        past the episode's end are all padding, mask False).
        """
        k, n = int(context_len), int(segments)
        episodes = rng.choice(self.num_episodes, size=batch_size, p=self.probabilities)
        n_segments = -(-self.lengths[episodes] // k)  # ⌈T/K⌉
        starts = rng.integers(0, np.maximum(n_segments - n, 0) + 1) * k
        window = self.windows(episodes, starts, n * k, "right")
        return [
            DTBatch(*(getattr(window, f)[:, i * k : (i + 1) * k].contiguous() for f in DTBatch.fields()))
            for i in range(n)
        ]

    def describe(self) -> dict[str, Any]:
        """Summary numbers for logs: episodes, steps, return statistics."""
        return {
            "episodes": self.num_episodes,
            "steps": self.num_steps,
            "return_max": float(self.returns.max()),
            "return_mean": float(self.returns.mean()),
            "return_median": float(np.median(self.returns)),
            "return_min": float(self.returns.min()),
            "length_max": int(self.lengths.max()),
        }


def segment_backward(
    net: nn.Module,
    model: DecisionTransformer,
    segments: list[DTBatch],
    aux_weight: Callable[[str], float],
    collect_info: bool = False,
) -> dict[str, Any]:
    """Forward and backward N consecutive segments of the same windows, the backbone state carried from one
    to the next and detached (Transformer-XL's stop-gradient, Dai et al. 2019, arXiv 1901.02860; RATE,
    Cherepanov et al. 2023, arXiv 2306.09459). Accumulates gradients; returns the detached loss terms.

    The action loss is the one a single pass over the N·K steps would give: Σ_i n_i ℓ_i / Σ_i n_i, with n_i
    the real steps of segment i and ℓ_i its mean action loss; aux losses are averaged over the segments.
    Since the state is detached, segment i's term depends on its own forward only, so it is backpropagated
    at once and one segment's activations live at a time. Under DDP gradients are all-reduced at the last
    backward only (``no_sync`` before). Diagnostics come from the last segment."""
    counts = [batch.mask.sum() for batch in segments]
    total = torch.stack(counts).sum().clamp_min(1)
    n = len(segments)
    state = None
    loss_sum = action_sum = torch.zeros((), dtype=torch.float64, device=total.device)
    aux_sum: dict[str, Tensor] = {}
    info: dict[str, Any] = {}
    for i, batch in enumerate(segments):
        last = i == n - 1
        sync: AbstractContextManager[Any] = (
            net.no_sync() if isinstance(net, DistributedDataParallel) and not last else nullcontext()
        )
        model.backbone.collect_info = collect_info and last
        try:
            with sync:
                out = net(**batch.model_inputs(), state=state, return_state=True)
                mean = model.action_loss(out.predictions, batch.actions, batch.mask)
                action_loss = mean * counts[i] / total  # in the loss's dtype
                loss = action_loss
                for name, value in out.aux_losses.items():
                    loss = loss + aux_weight(name) * value / n
                loss.backward()
        finally:
            model.backbone.collect_info = False
        state = out.state.detach()
        loss_sum = loss_sum + loss.detach()
        action_sum = action_sum + action_loss.detach()
        for name, value in out.aux_losses.items():
            term = value.detach() / n
            aux_sum[name] = aux_sum[name] + term if name in aux_sum else term
        info = out.info
    dtype = out.predictions.dtype
    return {"loss": loss_sum.to(dtype), "action_loss": action_sum.to(dtype), "aux": aux_sum, "info": info}
