"""Memory actor-critic policies: observation encoder -> sequence core -> actor head + critic head.

The core maps a chunk of tokens x (B, T, d) with a carried per-env state to y (B, T, d). The default core is the
shared :class:`~rl_transformers.backbone.Backbone` configured as GTrXL (Parisotto et al. 2019, arXiv
1910.06764): gated identity-map blocks (gate bias 2.0), Transformer-XL memory and relative positions (Dai et al.
2019, arXiv 1901.02860). Any registered attention / position / memory / block / depth can be selected; LSTM,
GRU and memory-less MLP cores (:mod:`rl_transformers.policies.recurrent`) sit behind the same interface, so
baselines run in the same PPO harness.

Two ways to run a policy, which give the same numbers (tested):

- :meth:`ActorCritic.act` - one token per env per step, state carried (rollouts; ``episode_start`` (B,) clears
  the rows of envs whose episode just began, via the backbone's ``reset``);
- :meth:`ActorCritic.evaluate_sequence` - a stored sequence (B, T) in one pass from the state stored at its
  first step (PPO updates). Episode starts inside the sequence are applied as in the rollout: each row is cut
  at its episode starts, the pieces are packed into one right-padded batch (a piece after a cut starts from
  the row's state, reset), run in a single forward, and scattered back.

One-pass == step-by-step holds when a query of the training pass sees exactly the keys it saw when acting.
That is true of streaming attentions (exact KV cache / linear state / windowed caches). Transformer-XL memory
alone is not: a one-pass query at offset i of a sequence sees mem_len + i keys, an acting step mem_len. With
``bound_context`` (default) full attention is therefore limited to ``mem_len`` past keys under XL memory, and
to ``context_len`` past keys without memory (a KV cache keeps its columns across episodes, so an unbounded
cache would grow for the whole run). Non-streaming attentions (capability ``streaming="none"``) run through
:class:`ContextCore`: the policy keeps the last ``context_len`` tokens plus the tokens of the current training
segment, and recomputes the backbone over them at every step.

Shapes: B envs (or sequences), T time steps, d = backbone.d_model; obs (B, *obs_shape) when acting,
(B, T, *obs_shape) in ``evaluate_sequence``; values, log-probs, entropies (B,) / (B, T).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import torch
import tyro
from gymnasium import spaces
from torch import Tensor, nn

from rl_transformers.backbone import Backbone, BackboneConfig, available, capabilities
from rl_transformers.backbone.state import State
from rl_transformers.policies.encoders import Obs, RunningNorm, make_encoder
from rl_transformers.policies.heads import ActionHead, make_action_head

PolicyKind = Literal["transformer", "lstm", "gru", "mlp"]


# -- configuration ------------------------------------------------------------------------------------------
def gtrxl_backbone(
    d_model: int = 64, n_layers: int = 2, n_heads: int = 4, mem_len: int = 32, gate_bias: float = 2.0
) -> BackboneConfig:
    """GTrXL: gated blocks, XL memory of ``mem_len`` steps, ``xl_relative`` positions (``rope`` if missing)."""
    position = "xl_relative" if "xl_relative" in available()["position"] else "rope"
    return BackboneConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        attention="full",
        position=position,
        memory="xl",
        memory_options={"mem_len": mem_len},
        block="gtrxl",
        block_options={"gate_bias": gate_bias},
    )


@dataclass(frozen=True)
class PolicyConfig:
    """Which core the actor-critic uses and how it is sized."""

    kind: Annotated[PolicyKind, tyro.conf.arg(name="policy")] = "transformer"
    """Core: transformer (the backbone below), lstm, gru, or mlp (memory-less)."""
    backbone: BackboneConfig = field(default_factory=gtrxl_backbone)
    """Transformer backbone (kind=transformer). Its d_model is also the width of the lstm/gru/mlp cores."""
    hidden_size: int | None = None
    """Width of the lstm / gru / mlp cores (default: backbone.d_model)."""
    rnn_layers: int = 1
    """Stacked LSTM / GRU layers."""
    mlp_layers: int = 2
    """Hidden layers of the memory-less MLP core."""
    context_len: int = 64
    """Past tokens kept as context by non-streaming attentions; also the KV window set by bound_context."""
    bound_context: bool = True
    """Give unbounded attention caches a window: mem_len under XL memory, context_len without memory."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian (Box) actions."""
    norm_obs: bool = False
    """Normalise Box observations by a running mean / variance kept in the policy (updated after each PPO
    update from its rollout, saved in checkpoints), as SB3's VecNormalize / CleanRL's continuous PPO do."""
    norm_obs_clip: float = 10.0
    """Clip of the normalised observations (±)."""

    def __post_init__(self) -> None:
        if self.kind not in ("transformer", "lstm", "gru", "mlp"):
            raise ValueError(f"policy kind {self.kind!r} is not one of ['gru', 'lstm', 'mlp', 'transformer']")
        for name in ("rnn_layers", "mlp_layers", "context_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.norm_obs_clip > 0:
            raise ValueError(f"norm_obs_clip must be > 0, got {self.norm_obs_clip!r}")
        if self.hidden_size is not None and self.hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1 or None, got {self.hidden_size!r}")

    @property
    def width(self) -> int:
        return self.hidden_size if self.hidden_size is not None else self.backbone.d_model


# -- cores --------------------------------------------------------------------------------------------------
@dataclass
class CoreOutput:
    y: Tensor
    """(B, T, d_out) features for the heads."""
    state: Any
    """State after the chunk."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class Core(nn.Module):
    """Sequence core interface. ``forward`` resets rows only at the chunk start (``reset`` (B,) bool)."""

    d_in: int
    d_out: int
    stateful: bool = True
    """False for memory-less cores: sequences need no cutting at episode starts."""

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> State:
        raise NotImplementedError

    def forward(
        self, x: Tensor, state: Any, reset: Tensor | None = None, valid: Tensor | None = None
    ) -> CoreOutput:
        raise NotImplementedError

    def segment_start(self, state: Any) -> Any:
        """Called by trainers at the first step of every training sequence (before the state is stored)."""
        return state

    @property
    def collect_info(self) -> bool:
        return False

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        pass


def replay_exactness(cfg: BackboneConfig) -> tuple[bool, str]:
    """Whether a one-pass training sequence sees exactly the keys each acting step saw (and why not)."""
    streaming = capabilities("attention", cfg.attention).streaming
    if streaming == "none":
        return True, "non-streaming attention: recomputed over the policy's context segment"
    if cfg.memory is None:
        return True, f"attention {cfg.attention!r} streams ({streaming})"
    if cfg.memory != "xl":
        return False, f"memory {cfg.memory!r} depends on how the stream is chunked"
    mem_len = cfg.options("memory").mem_len
    window = getattr(cfg.options("attention"), "max_cache", None)
    if window is not None and window <= mem_len:
        return True, f"attention window {window} <= mem_len {mem_len}"
    return False, (
        f"attention {cfg.attention!r} under XL memory sees mem_len + i keys at offset i of a training sequence "
        f"but mem_len={mem_len} keys when acting (set its max_cache <= mem_len, or bound_context=True)"
    )


def bounded_backbone(cfg: BackboneConfig, context_len: int) -> BackboneConfig:
    """``cfg`` with a window on attentions that would otherwise see more when training than when acting."""
    opts = cfg.options("attention")
    if not any(f.name == "max_cache" for f in dataclasses.fields(opts)) or opts.max_cache is not None:
        return cfg
    if cfg.memory == "xl":
        window = cfg.options("memory").mem_len
    elif cfg.memory is None:
        window = context_len
    else:
        return cfg
    return dataclasses.replace(cfg, attention_options={**cfg.attention_options, "max_cache": window})


class TransformerCore(Core):
    """The shared :class:`Backbone`, streaming one chunk at a time with its own state."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.backbone = Backbone(cfg)
        self.d_in = self.d_out = cfg.d_model

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> State:
        return self.backbone.init_state(batch, device, dtype)

    def forward(
        self, x: Tensor, state: Any, reset: Tensor | None = None, valid: Tensor | None = None
    ) -> CoreOutput:
        out = self.backbone(x, state=state, reset=reset, key_padding_mask=valid)
        return CoreOutput(out.y, out.state, out.aux_losses, out.info)

    @property
    def collect_info(self) -> bool:
        return self.backbone.collect_info

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        self.backbone.collect_info = value


@dataclass
class ContextState(State):
    """Recent input tokens x (B, S, d) and their validity (B, S) for non-streaming attentions."""

    x: Tensor
    valid: Tensor


class ContextCore(TransformerCore):
    """A backbone re-run over a context window of past tokens at every step (non-streaming attentions).

    The window holds the last ``context_len`` tokens before the current training segment plus the segment's
    tokens (at most ``2 * context_len``); :meth:`segment_start` trims it to ``context_len``. A training pass
    over the segment from the stored window then sees exactly what each acting step saw (for position schemes
    that depend on distances only). Tokens in the window are detached (like XL memory).
    """

    def __init__(self, cfg: BackboneConfig, context_len: int) -> None:
        super().__init__(cfg)
        self.context_len = context_len

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> ContextState:
        return ContextState(
            x=torch.zeros(batch, 0, self.d_in, device=device, dtype=dtype),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        )

    def forward(
        self, x: Tensor, state: Any, reset: Tensor | None = None, valid: Tensor | None = None
    ) -> CoreOutput:
        if reset is not None:
            state = state.reset(reset.to(torch.bool))
        t = x.shape[1]
        if valid is None:
            valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        seq = torch.cat([state.x.to(x.dtype), x], dim=1)
        mask = torch.cat([state.valid, valid.to(torch.bool)], dim=1)
        out = self.backbone(seq, key_padding_mask=mask)
        keep = seq.shape[1] if seq.shape[1] <= 2 * self.context_len else self.context_len
        new_state = ContextState(seq[:, -keep:].detach(), mask[:, -keep:])
        return CoreOutput(out.y[:, -t:], new_state, out.aux_losses, out.info)

    def segment_start(self, state: Any) -> Any:
        k = self.context_len
        return ContextState(state.x[:, -k:], state.valid[:, -k:])


# -- packing sequences at episode starts ---------------------------------------------------------------------
@dataclass
class Packing:
    """Index maps between (B, T) sequences and P right-padded pieces (P, L) cut at episode starts."""

    piece: Tensor
    """(B*T,) piece of each step."""
    offset: Tensor
    """(B*T,) position of each step inside its piece."""
    row: Tensor
    """(P,) sequence (row) each piece comes from."""
    reset: Tensor
    """(P,) bool: the piece starts an episode (its state is the row's state, reset)."""
    n_pieces: int
    length: int

    @classmethod
    def from_starts(cls, starts: Tensor) -> Packing:
        b, t = starts.shape
        cut = starts.clone().to(torch.bool)
        cut[:, 0] = True
        flat_cut = cut.reshape(-1)
        piece = torch.cumsum(flat_cut.long(), 0) - 1
        time = torch.arange(t, device=starts.device).repeat(b)
        offset = time - time[flat_cut][piece]
        row = torch.arange(b, device=starts.device).repeat_interleave(t)[flat_cut]
        n_pieces = int(flat_cut.sum())
        length = int(offset.max()) + 1
        return cls(piece, offset, row, starts.reshape(-1).to(torch.bool)[flat_cut], n_pieces, length)

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, *f) -> (P, L, *f), zero padding."""
        flat = x.reshape(-1, *x.shape[2:])
        out = flat.new_zeros(self.n_pieces, self.length, *x.shape[2:])
        out[self.piece, self.offset] = flat
        return out

    def unpack(self, y: Tensor, b: int, t: int) -> Tensor:
        """(P, L, *f) -> (B, T, *f)."""
        return y[self.piece, self.offset].reshape(b, t, *y.shape[2:])

    def valid(self) -> Tensor:
        mask = torch.zeros(self.n_pieces, self.length, dtype=torch.bool, device=self.piece.device)
        mask[self.piece, self.offset] = True
        return mask


# -- the actor-critic ---------------------------------------------------------------------------------------
class ActOutput(NamedTuple):
    """What :meth:`ActorCritic.act` returns (unpacks as ``action, value, log_prob, state``)."""

    action: Tensor
    """(B, *action_shape) sampled (or modal) action, unclipped."""
    value: Tensor
    """(B,) critic value."""
    log_prob: Tensor
    """(B,) log-probability of ``action``."""
    state: Any
    """State after this step."""


@dataclass
class SequenceOutput:
    log_prob: Tensor
    """(B, T) log-probabilities of the given actions."""
    entropy: Tensor
    """(B, T) policy entropy."""
    value: Tensor
    """(B, T) critic values."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Encoder -> core -> (actor head, critic head), with a per-env state carried by the caller."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        core: Core,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.encoder = make_encoder(observation_space, core.d_in)
        self.core = core
        self.actor: ActionHead = make_action_head(action_space, core.d_out, log_std_init)
        self.critic = _init_linear(nn.Linear(core.d_out, 1), 1.0)
        self.obs_norm: RunningNorm | None = None
        """Observation normaliser (``enable_obs_norm``); None: observations go to the encoder as they are."""

    def enable_obs_norm(self, clip: float = 10.0) -> None:
        """Normalise observations with running statistics (Box observation spaces only)."""
        space = self.observation_space
        if not isinstance(space, spaces.Box):
            raise ValueError(
                f"norm_obs needs a Box observation space, got {space}; valid: Box (flatten Dict / Tuple "
                "observations first, e.g. with envs.FloatFlattenObservation)"
            )
        self.obs_norm = RunningNorm(tuple(space.shape), clip).to(next(self.parameters()).device)

    def encode(self, obs: Obs) -> Tensor:
        """Encoder features of observations (normalised first when ``obs_norm`` is set)."""
        return self.encoder(obs if self.obs_norm is None else self.obs_norm(obs))

    # -- state --------------------------------------------------------------------------------------------
    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        p = next(self.parameters())
        return self.core.initial_state(batch_size, p.device if device is None else device, p.dtype)

    def segment_start(self, state: Any) -> Any:
        """Call at the first step of each training sequence, before storing the state (trims context cores)."""
        return self.core.segment_start(state)

    # -- acting -------------------------------------------------------------------------------------------
    def _step(self, obs: Obs, state: Any, episode_start: Tensor | None) -> tuple[Tensor, Any]:
        x = self.encode(obs).unsqueeze(1)
        reset = None if episode_start is None else episode_start.to(device=x.device, dtype=torch.bool)
        out = self.core(x, state, reset=reset)
        return out.y[:, 0], out.state

    def act(
        self, obs: Obs, state: Any, episode_start: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        """One step for B envs: obs (B, ...), episode_start (B,) bool (True: the episode begins with obs)."""
        h, new_state = self._step(obs, state, episode_start)
        dist = self.actor(h)
        action = dist.mode() if deterministic else dist.sample()
        return ActOutput(action, self.critic(h).squeeze(-1), dist.log_prob(action), new_state)

    def value(self, obs: Obs, state: Any, episode_start: Tensor | None = None) -> Tensor:
        """(B,) critic values of ``obs`` given the state (used to bootstrap truncated episodes)."""
        h, _ = self._step(obs, state, episode_start)
        return self.critic(h).squeeze(-1)

    def to_env(self, action: Tensor) -> np.ndarray:
        """Actions for ``env.step`` (NumPy, Box actions clipped to the bounds)."""
        return self.actor.to_env(action)

    # -- training -----------------------------------------------------------------------------------------
    def features(self, obs: Obs, state: Any, episode_starts: Tensor) -> CoreOutput:
        """Core features (B, T, d) of stored sequences, cutting rows at episode starts (see module docstring)."""
        x = self.encode(obs)
        b, t = x.shape[:2]
        starts = episode_starts.to(device=x.device, dtype=torch.bool)
        if not self.core.stateful or t == 1 or not bool(starts[:, 1:].any()):
            return self.core(x, state, reset=starts[:, 0])
        packing = Packing.from_starts(starts)
        piece_state = state.index_select(packing.row)
        out = self.core(packing.pack(x), piece_state, reset=packing.reset, valid=packing.valid())
        return CoreOutput(packing.unpack(out.y, b, t), None, out.aux_losses, out.info)

    def evaluate_sequence(
        self, obs: Obs, actions: Tensor, state: Any, episode_starts: Tensor
    ) -> SequenceOutput:
        """Log-probs, entropies and values of stored sequences in one pass.

        obs (B, T, ...), actions (B, T, *action_shape), state: the state before step 0 of each row (B rows),
        episode_starts (B, T) bool as recorded while acting.
        """
        out = self.features(obs, state, episode_starts)
        dist = self.actor(out.y)
        value = self.critic(out.y).squeeze(-1)
        return SequenceOutput(dist.log_prob(actions), dist.entropy(), value, out.aux_losses, out.info)

    @property
    def collect_info(self) -> bool:
        return self.core.collect_info

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        self.core.collect_info = value


class GTrXLPolicy(ActorCritic):
    """Actor-critic on the shared backbone (default: GTrXL, see :func:`gtrxl_backbone`)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        backbone: BackboneConfig | None = None,
        context_len: int = 64,
        bound_context: bool = True,
        log_std_init: float = 0.0,
    ) -> None:
        cfg = backbone if backbone is not None else gtrxl_backbone()
        if bound_context:
            cfg = bounded_backbone(cfg, context_len)
        exact, reason = replay_exactness(cfg)
        if not exact:
            warnings.warn(
                f"training sequences will not replay the acting context exactly: {reason}", stacklevel=2
            )
        if capabilities("attention", cfg.attention).streaming == "none":
            core: Core = ContextCore(cfg, context_len)
        else:
            core = TransformerCore(cfg)
        super().__init__(observation_space, action_space, core, log_std_init)
        self.backbone_config = cfg

    @property
    def backbone(self) -> Backbone:
        return self.core.backbone  # type: ignore[return-value]


def make_policy(
    config: PolicyConfig, observation_space: spaces.Space, action_space: spaces.Space
) -> ActorCritic:
    """The actor-critic described by ``config`` for these spaces."""
    policy: ActorCritic
    if config.kind == "transformer":
        policy = GTrXLPolicy(
            observation_space,
            action_space,
            config.backbone,
            context_len=config.context_len,
            bound_context=config.bound_context,
            log_std_init=config.log_std_init,
        )
    else:
        from rl_transformers.policies.recurrent import MLPCore, RecurrentCore

        core: Core
        if config.kind == "mlp":
            core = MLPCore(config.width, config.width, config.mlp_layers)
        else:
            core = RecurrentCore(config.kind, config.width, config.width, config.rnn_layers)
        policy = ActorCritic(observation_space, action_space, core, config.log_std_init)
    if config.norm_obs:
        policy.enable_obs_norm(config.norm_obs_clip)
    return policy


__all__ = [
    "ActOutput",
    "ActorCritic",
    "ContextCore",
    "ContextState",
    "Core",
    "CoreOutput",
    "GTrXLPolicy",
    "Packing",
    "PolicyConfig",
    "PolicyKind",
    "SequenceOutput",
    "TransformerCore",
    "bounded_backbone",
    "gtrxl_backbone",
    "make_policy",
    "replay_exactness",
]
