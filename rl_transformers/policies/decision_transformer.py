"""Decision Transformer network on the shared backbone.

Method (Chen et al. 2021, arXiv 2106.01345): an episode is the sequence (R̂_0, s_0, a_0, R̂_1, s_1, a_1, ...)
with the return-to-go R̂_t = Σ_{t'≥t} r_t'. Each of the K steps of a window gives three tokens: a linear
embedding of the scaled return-to-go, of the (dataset-normalised) state and of the action (a table for
Discrete actions), each plus a learned embedding of the *episode timestep* t. The 3K tokens go through an
embedding LayerNorm and dropout, then the causal :class:`~rl_transformers.backbone.Backbone` (any registered
attention / position / memory / block / depth). The action a_t is predicted from the output at the state
token s_t, so it sees R̂_≤t, s_≤t, a_<t: Box actions by Linear → Tanh rescaled to the action bounds (masked
MSE), Discrete actions by logits (masked cross-entropy). Behaviour cloning is the same network without the
return token (``condition_on_return=False``: 2 tokens per step).

The default backbone (:func:`dt_backbone_config`) is the paper's GPT-2: 3 pre-LN layers, d = 128, 1 head,
ReLU, dropout 0.1 on attention weights, residual branches and embeddings (none on the FFN hidden layer, as in
GPT-2), causal, position ``none`` (the timestep embedding carries the position); all overridable.

Padding: a window shorter than K (an episode's first steps, or a window cut by the episode's end) is padded
on the ``padding`` side (default ``"right"``: real steps at [0, L)); padded steps have zeros everywhere and
``mask`` False, and their tokens reach the backbone as ``key_padding_mask`` False. With right padding the
real tokens sit at backbone positions 0 .. 3L - 1 whatever K is, so every position scheme (even absolute
ones) sees the same positions in training, in a recomputed rollout context and in a streamed rollout.
Training batches and :class:`~rl_transformers.policies.dt_rollout.DTAgent` contexts are built by the same
:func:`~rl_transformers.policies.dt_padding.pad_steps`.

Shapes (B batch, K steps, d model width, A action dim, n = tokens per step, 3 or 2):
returns_to_go (B, K) raw returns (scaled inside by ``return_scale``); observations (B, K, *obs_shape) raw
(normalised inside by the ``state_mean`` / ``state_std`` buffers); actions (B, K, A) float or (B, K) long
(raw Discrete values, ``start`` included); timesteps (B, K) long; mask (B, K) bool; tokens (B, n·K, d);
predictions (B, K, A) actions or (B, K, n_actions) logits.

Layout (one concern per module, imports one way):

- ``decision_transformer`` (this module): the network — :func:`dt_backbone_config`, :class:`DTOutput`,
  :class:`DecisionTransformer` (embeddings, forward, head, loss).
- ``dt_spaces``: the accepted observation / action spaces and their JSON form (checkpoints).
- ``dt_padding``: ``Padding`` and :func:`~rl_transformers.policies.dt_padding.pad_steps`, shared by training
  batches and rollout contexts.
- ``dt_fast``: the fused training forward of the plain GPT-2 configuration.
- ``dt_rollout``: :class:`~rl_transformers.policies.dt_rollout.DTAgent`, the stateful rollout agent over this
  network, kept apart from it as d3rlpy keeps its stateful wrapper apart from its model. (The user-facing
  d3rlpy-style wrapper, ``StatefulDTWrapper``, lives in ``rl_transformers/agents/dt_agent.py`` on top of
  ``DTAgent``.)

Imports: ``dt_spaces``, ``dt_padding``, ``dt_fast`` -> nothing of the package; ``decision_transformer`` ->
those three; ``dt_rollout`` -> ``dt_padding`` and ``decision_transformer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.model import Backbone
from rl_transformers.backbone.registry import capabilities
from rl_transformers.backbone.state import BackboneState
from rl_transformers.policies.dt_fast import fast_path_reason, fused_embed, fused_forward
from rl_transformers.policies.dt_padding import PADDINGS, Padding
from rl_transformers.policies.dt_spaces import check_space, space_from_dict, space_to_dict


def dt_backbone_config(**overrides: Any) -> BackboneConfig:
    """The Decision Transformer paper's GPT-2 shape as a :class:`BackboneConfig` (fields overridable)."""
    base: dict[str, Any] = dict(
        d_model=128,
        n_layers=3,
        n_heads=1,
        dropout=0.1,
        ffn_dropout=0.0,  # GPT-2 drops the residual branches and attention weights, not the FFN hidden layer
        activation="relu",
        causal=True,
        attention="full",
        position="none",
        block="pre_ln",
    )
    base.update(overrides)
    return BackboneConfig(**base)


# --- the model -----------------------------------------------------------------------------------------------


@dataclass
class DTOutput:
    """What :meth:`DecisionTransformer.forward` returns."""

    predictions: Tensor
    """(B, K, A) predicted actions (Box) or (B, K, n_actions) logits (Discrete), one per step."""
    hidden: Tensor
    """(B, K, d) backbone outputs at the state tokens."""
    state: BackboneState | None
    """Backbone state after these tokens (streaming); None when the fused forward ran (no state asked)."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    """Backbone auxiliary losses (unweighted)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Backbone diagnostics (when ``model.backbone.collect_info``)."""


def _check_arguments(
    backbone: BackboneConfig,
    context_len: int,
    max_ep_len: int,
    return_scale: float,
    padding: Padding,
    segments: int,
) -> None:
    """ValueError naming the first bad constructor argument of :class:`DecisionTransformer`."""
    if not backbone.causal:
        raise ValueError("the Decision Transformer needs a causal backbone (BackboneConfig.causal=True)")
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len!r}")
    if max_ep_len < 1:
        raise ValueError(f"max_ep_len must be >= 1, got {max_ep_len!r}")
    if not (math.isfinite(return_scale) and return_scale > 0):
        raise ValueError(f"return_scale must be a positive finite number, got {return_scale!r}")
    if padding not in PADDINGS:
        raise ValueError(f"padding={padding!r} is not one of {list(PADDINGS)}")
    if not (isinstance(segments, int) and segments >= 1):
        raise ValueError(f"segments must be an integer >= 1, got {segments!r}")
    if segments > 1 and (backbone.memory is None or padding != "right"):
        raise ValueError(
            f"segments={segments} needs a backbone memory and right padding, got memory="
            f"{backbone.memory!r}, padding={padding!r}"
        )


class DecisionTransformer(nn.Module):
    """(R̂, s, a) sequence model predicting a_t from the token of s_t. See the module docstring.

    Args:
        observation_space: Box (any shape, flattened) or Discrete.
        action_space: Box (continuous, Tanh head + MSE) or Discrete (logits + cross-entropy).
        backbone: the backbone; default :func:`dt_backbone_config` (must be causal).
        context_len: K, steps per window (3K tokens).
        max_ep_len: rows of the timestep embedding; timesteps >= max_ep_len use the last row.
        return_scale: returns-to-go are multiplied by this before their embedding (1/1000 for MuJoCo).
        condition_on_return: False drops the return token (behaviour cloning with the same network).
        embed_dropout: dropout after the embedding LayerNorm (default: the backbone's dropout).
        padding: side on which short windows are padded, in training and in
            :class:`~rl_transformers.policies.dt_rollout.DTAgent`.
        segments: > 1 when the model was trained on consecutive K-step segments with the backbone memory
            carried across them (RATE, Cherepanov et al. 2023, arXiv 2306.09459); the rollout agent then
            carries the memory across the episode, segment by segment. Needs a backbone memory and right
            padding.
    """

    state_mean: Tensor
    state_std: Tensor
    action_low: Tensor
    action_high: Tensor

    def __init__(
        self,
        observation_space: gym.spaces.Space,
        action_space: gym.spaces.Space,
        backbone: BackboneConfig | None = None,
        context_len: int = 20,
        max_ep_len: int = 1000,
        *,
        return_scale: float = 1e-3,
        condition_on_return: bool = True,
        embed_dropout: float | None = None,
        padding: Padding = "right",
        segments: int = 1,
    ) -> None:
        super().__init__()
        check_space(observation_space, "observation")
        check_space(action_space, "action")
        backbone = dt_backbone_config() if backbone is None else backbone
        _check_arguments(backbone, context_len, max_ep_len, return_scale, padding, segments)
        self.observation_space = observation_space
        self.action_space = action_space
        self.backbone_config = backbone
        self.context_len = int(context_len)
        self.max_ep_len = int(max_ep_len)
        self.return_scale = float(return_scale)
        self.condition_on_return = bool(condition_on_return)
        self.padding: Padding = padding
        self.segments = segments
        self.tokens_per_step = 3 if condition_on_return else 2
        self.state_token = 1 if condition_on_return else 0
        d = backbone.d_model

        self.discrete_observations = isinstance(observation_space, gym.spaces.Discrete)
        if isinstance(observation_space, gym.spaces.Discrete):
            self.obs_shape: tuple[int, ...] = ()
            self.embed_state: nn.Module = nn.Embedding(int(observation_space.n), d)
            obs_dim = 1
        else:
            self.obs_shape = tuple(cast("tuple[int, ...]", observation_space.shape))
            obs_dim = int(np.prod(self.obs_shape)) if self.obs_shape else 1
            self.embed_state = nn.Linear(obs_dim, d)
        self.obs_dim = obs_dim
        # Dataset statistics (set by the trainer, saved with the weights); identity by default.
        self.register_buffer("state_mean", torch.zeros(obs_dim))
        self.register_buffer("state_std", torch.ones(obs_dim))

        self.discrete_actions = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            self.n_actions = int(action_space.n)
            self.action_start = int(action_space.start)
            self.action_dim = 1
            self.embed_action: nn.Module = nn.Embedding(self.n_actions, d)
            self.action_head: nn.Module = nn.Linear(d, self.n_actions)
            self.squash = False
        else:
            self.n_actions = 0
            self.action_start = 0
            self.action_dim = int(np.prod(cast("tuple[int, ...]", action_space.shape)))
            self.embed_action = nn.Linear(self.action_dim, d)
            self.action_head = nn.Linear(d, self.action_dim)
            low = np.asarray(cast(gym.spaces.Box, action_space).low, dtype=np.float64).reshape(-1)
            high = np.asarray(cast(gym.spaces.Box, action_space).high, dtype=np.float64).reshape(-1)
            # Tanh rescaled to [low, high] when the bounds are finite (the paper's Linear -> Tanh).
            self.squash = bool(np.isfinite(low).all() and np.isfinite(high).all())
            self.register_buffer("action_low", torch.as_tensor(np.where(self.squash, low, -1.0)).float())
            self.register_buffer("action_high", torch.as_tensor(np.where(self.squash, high, 1.0)).float())
        self.embed_return: nn.Module | None = nn.Linear(1, d) if condition_on_return else None
        self.embed_timestep = nn.Embedding(self.max_ep_len, d)
        self.embed_norm = nn.LayerNorm(d)
        self.embed_dropout = nn.Dropout(backbone.dropout if embed_dropout is None else embed_dropout)
        self.backbone = Backbone(backbone)
        self.fused = True
        """Use the fused training forward when the configuration allows it (:func:`fast_path_reason`)."""
        self._init_embeddings()

    def _init_embeddings(self) -> None:
        """GPT-2 initialisation N(0, 0.02) for the embeddings and the head (the backbone keeps its own)."""
        for module in (
            self.embed_state,
            self.embed_action,
            self.embed_return,
            self.embed_timestep,
            self.action_head,
        ):
            if module is None:
                continue
            nn.init.normal_(cast(Tensor, module.weight), std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(cast(Tensor, module.bias))

    # -- configuration --------------------------------------------------------------------------------------
    def set_state_normalization(self, mean: np.ndarray | Tensor, std: np.ndarray | Tensor) -> None:
        """Store the dataset's state mean / std (flattened obs_dim); states are normalised inside forward."""
        if self.discrete_observations:
            raise ValueError("Discrete observations are embedded by index and take no normalisation")
        mean_t = torch.as_tensor(np.asarray(mean, dtype=np.float32)).reshape(-1)
        std_t = torch.as_tensor(np.asarray(std, dtype=np.float32)).reshape(-1)
        if mean_t.numel() != self.obs_dim or std_t.numel() != self.obs_dim:
            raise ValueError(
                f"state mean/std must have {self.obs_dim} entries, got {mean_t.numel()}, {std_t.numel()}"
            )
        if not bool((std_t > 0).all()):
            raise ValueError("state std must be positive (add a small epsilon)")
        self.state_mean.copy_(mean_t)
        self.state_std.copy_(std_t)

    def init_kwargs(self) -> dict[str, Any]:
        """JSON-able constructor arguments (with :func:`space_to_dict` spaces) to rebuild this model."""
        return {
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "backbone": self.backbone_config.to_dict(),
            "context_len": self.context_len,
            "max_ep_len": self.max_ep_len,
            "return_scale": self.return_scale,
            "condition_on_return": self.condition_on_return,
            "embed_dropout": self.embed_dropout.p,
            "padding": self.padding,
            **(
                {"segments": self.segments} if self.segments > 1 else {}
            ),  # older checkpoints keep their kwargs
        }

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> DecisionTransformer:
        """Rebuild from :meth:`init_kwargs` (weights not included)."""
        args = dict(kwargs)
        args["observation_space"] = space_from_dict(args["observation_space"])
        args["action_space"] = space_from_dict(args["action_space"])
        args["backbone"] = BackboneConfig.from_dict(args["backbone"])
        obs_space, act_space = args.pop("observation_space"), args.pop("action_space")
        return cls(obs_space, act_space, **args)

    @property
    def carries_memory(self) -> bool:
        """Whether rollouts carry the backbone memory across K-step segments (trained with ``segments`` > 1)."""
        return self.segments > 1

    @property
    def streams_exactly(self) -> bool:
        """Whether a chunked backbone run with carried state equals the full run.

        Used by the rollout agent :class:`~rl_transformers.policies.dt_rollout.DTAgent` to stream.

        Needs every variant to declare ``streaming="exact"`` and no memory module (a memory sees, in
        streaming, tokens a training window never shows it), and right padding (so positions agree).
        """
        cfg = self.backbone_config
        if cfg.memory is not None or self.padding != "right":
            return False
        kinds = ("attention", "position", "block", "depth")
        return all(capabilities(kind, getattr(cfg, kind)).streaming == "exact" for kind in kinds)

    # -- embeddings -----------------------------------------------------------------------------------------
    def embed_steps(
        self, returns_to_go: Tensor, observations: Tensor, actions: Tensor, timesteps: Tensor
    ) -> Tensor:
        """(B, K, n, d) token embeddings per step (before the LayerNorm), in order [R̂,] s, a."""
        t = self.embed_timestep(timesteps.long().clamp(0, self.max_ep_len - 1))
        b, k = timesteps.shape
        if self.discrete_observations:
            s = self.embed_state(observations.long().reshape(b, k))
        else:
            obs = observations.reshape(b, k, self.obs_dim).to(self.state_mean.dtype)
            s = self.embed_state((obs - self.state_mean) / self.state_std)
        if self.discrete_actions:
            a = self.embed_action(
                (actions.long().reshape(b, k) - self.action_start).clamp(0, self.n_actions - 1)
            )
        else:
            a = self.embed_action(actions.reshape(b, k, self.action_dim).to(self.state_mean.dtype))
        tokens = [s + t, a + t]
        if self.embed_return is not None:
            r = returns_to_go.reshape(b, k, 1).to(self.state_mean.dtype) * self.return_scale
            tokens.insert(0, self.embed_return(r) + t)
        return torch.stack(tokens, dim=2)

    def run_tokens(
        self,
        tokens: Tensor,
        key_padding_mask: Tensor | None = None,
        state: BackboneState | None = None,
        reset: Tensor | None = None,
    ) -> Any:
        """Embedding LayerNorm + dropout + backbone on (B, T, d) tokens; returns the BackboneOutput."""
        x = self.embed_dropout(self.embed_norm(tokens))
        return self.backbone(x, state=state, reset=reset, key_padding_mask=key_padding_mask)

    # -- forward / prediction / loss ------------------------------------------------------------------------
    def forward(
        self,
        returns_to_go: Tensor,
        observations: Tensor,
        actions: Tensor,
        timesteps: Tensor,
        mask: Tensor | None = None,
        state: BackboneState | None = None,
        return_state: bool = False,
    ) -> DTOutput:
        """Action predictions for every step of (B, K) windows (shapes in the module docstring).

        Without an incoming ``state`` and with ``return_state`` False, the plain GPT-2 configuration runs the
        fused forward of :mod:`~rl_transformers.policies.dt_fast` (equal at every real step; ``state`` of the
        output is then None). ``return_state=True`` or ``model.fused = False`` forces the generic path.
        """
        if state is None and not return_state and self.fused and fast_path_reason(self) is None:
            steps = fused_embed(self, returns_to_go, observations, actions, timesteps)
            hidden = fused_forward(self, steps)  # same function at the real steps (see dt_fast.py)
            return DTOutput(self.head(hidden), hidden, None)
        steps = self.embed_steps(returns_to_go, observations, actions, timesteps)
        b, k, n, d = steps.shape
        kpm = None if mask is None else mask.to(torch.bool).repeat_interleave(n, dim=1)
        out = self.run_tokens(steps.reshape(b, k * n, d), key_padding_mask=kpm, state=state)
        hidden = out.y.reshape(b, k, n, d)[:, :, self.state_token]
        return DTOutput(self.head(hidden), hidden, out.state, out.aux_losses, out.info)

    def head(self, hidden: Tensor) -> Tensor:
        """Predictions from state-token outputs (..., d): actions in the bounds (Box) or logits (Discrete)."""
        raw = self.action_head(hidden)
        if self.discrete_actions or not self.squash:
            return raw
        return self.action_low + (torch.tanh(raw) + 1.0) * 0.5 * (self.action_high - self.action_low)

    def to_action(
        self, predictions: Tensor, sample: bool = False, generator: torch.Generator | None = None
    ) -> Tensor:
        """Env actions from predictions (..., A or n_actions): the Box prediction, or argmax / a sample."""
        if not self.discrete_actions:
            return predictions
        if sample:
            probs = torch.softmax(predictions.float(), dim=-1).reshape(-1, self.n_actions)
            index = torch.multinomial(probs, 1, generator=generator).reshape(predictions.shape[:-1])
        else:
            index = predictions.argmax(dim=-1)
        return index + self.action_start

    def action_loss(self, predictions: Tensor, actions: Tensor, mask: Tensor) -> Tensor:
        """Masked MSE (Box, mean over real steps and action dims) or cross-entropy (Discrete, mean over steps)."""
        valid = mask.to(torch.bool)
        n_valid = valid.sum().clamp_min(1)
        if self.discrete_actions:
            target = (actions.long().reshape(valid.shape) - self.action_start).clamp(0, self.n_actions - 1)
            ce = F.cross_entropy(
                predictions.reshape(-1, self.n_actions), target.reshape(-1), reduction="none"
            )
            return (ce * valid.reshape(-1)).sum() / n_valid
        target = actions.reshape(*valid.shape, self.action_dim).to(predictions.dtype)
        err = (predictions - target).pow(2).sum(-1)
        return (err * valid).sum() / (n_valid * self.action_dim)


__all__ = ["DTOutput", "DecisionTransformer", "dt_backbone_config"]
