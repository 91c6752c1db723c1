"""The GTrXL preset of the memory actor-critic, the policy configuration and the policy factory.

GTrXL (Parisotto et al. 2019, arXiv 1910.06764) is the shared :class:`~rl_transformers.backbone.Backbone`
with gated identity-map blocks (gate bias 2.0), Transformer-XL memory and relative positions (Dai et al. 2019,
arXiv 1901.02860): :func:`gtrxl_backbone`. :class:`GTrXLPolicy` puts any backbone configuration (any
registered attention / position / memory / block / depth) into the generic
:class:`~rl_transformers.policies.actor_critic.ActorCritic`, choosing the streaming or the context-recomputing
core (:mod:`rl_transformers.policies.cores`). :class:`PolicyConfig` selects the core (transformer, LSTM, GRU or
memory-less MLP, :mod:`rl_transformers.policies.recurrent`) and :func:`make_policy` builds it, so baselines run
in the same PPO harness.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro
from gymnasium import spaces

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.model import Backbone
from rl_transformers.backbone.registry import available, capabilities
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.cores import (
    ContextCore,
    Core,
    TransformerCore,
    TwinCore,
    bounded_backbone,
    replay_exactness,
)
from rl_transformers.policies.encoders import flat_size
from rl_transformers.policies.recurrent import MLPCore, RecurrentCore

PolicyKind = Literal["transformer", "lstm", "gru", "mlp"]
CRITICS = ("shared", "detached", "separate")


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
    """Transformer backbone (kind=transformer). Its d_model is also the width of unmatched lstm/gru/mlp
    cores (--no-match-params)."""
    hidden_size: int | None = None
    """Width of the lstm / gru / mlp cores (default: sized by match_params, else backbone.d_model)."""
    match_params: bool = True
    """Size an lstm / gru / mlp core (hidden_size unset) to the parameter count of the transformer policy of
    this backbone, within ±10 %, as the encoder study does (rl_transformers/policies/sizing.py). Applied when a
    run starts; the chosen hidden_size is saved in config.json. Off: width backbone.d_model."""
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
    critic: Literal["shared", "detached", "separate"] = "shared"
    """shared: the value loss trains the core with the policy loss (one network, as cleanrl's PPO).
    detached: the critic head reads the core's features without back-propagating into them, so only the
    policy loss (and the entropy bonus) trains the core (sb3-contrib RecurrentPPO's shared_lstm=True).
    separate: the critic has its own core of the same configuration, trained by the value loss alone
    (RecurrentPPO's default, enable_critic_lstm=True); twice the core's cost. Why it matters for
    xl_relative: docs/results/xl_relative.md."""
    norm_obs: bool = False
    """Normalise Box observations by a running mean / variance kept in the policy (updated after each PPO
    update from its rollout, saved in checkpoints), as SB3's VecNormalize / CleanRL's continuous PPO do."""
    norm_obs_clip: float = 10.0
    """Clip of the normalised observations (±)."""
    head_hidden: tuple[int, ...] = ()
    """Hidden layers (Linear -> ReLU) of the actor head and of the critic head on the core's features, each
    head its own (SB3's net_arch=dict(pi=[64], vf=[64]) is (64,)); empty: linear heads."""
    obs_encoder: Literal["mlp", "none"] = "mlp"
    """Encoder of an lstm / gru / mlp core's input: mlp (Linear -> ReLU -> Linear to the core's width), or
    none: the flat Box observation itself (SB3's FlattenExtractor: the recurrent core reads the observation)."""
    init: Literal["orthogonal", "torch"] = "orthogonal"
    """Initial weights of the lstm / gru core and of the heads: orthogonal (CleanRL's: recurrent weights gain 1
    with zero biases, actor 0.01, critic 1, head hidden layers √2), or PyTorch's own initialisation (SB3's
    ortho_init=False, as rl-zoo's recurrent recipes set). The transformer backbone keeps its own."""

    def __post_init__(self) -> None:
        if self.kind not in ("transformer", "lstm", "gru", "mlp"):
            raise ValueError(f"policy kind {self.kind!r} is not one of ['gru', 'lstm', 'mlp', 'transformer']")
        for name in ("rnn_layers", "mlp_layers", "context_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.critic not in CRITICS:
            raise ValueError(f"critic {self.critic!r} is not one of {sorted(CRITICS)}")
        if not self.norm_obs_clip > 0:
            raise ValueError(f"norm_obs_clip must be > 0, got {self.norm_obs_clip!r}")
        if any(not isinstance(w, int) or w < 1 for w in self.head_hidden):
            raise ValueError(f"head_hidden must be positive widths, got {self.head_hidden!r}")
        if self.obs_encoder not in ("mlp", "none"):
            raise ValueError(f"obs_encoder {self.obs_encoder!r} is not one of ['mlp', 'none']")
        if self.obs_encoder == "none" and self.kind == "transformer":
            raise ValueError(
                "obs_encoder='none' is for lstm / gru / mlp cores; the transformer needs its encoder"
            )
        if self.init not in ("orthogonal", "torch"):
            raise ValueError(f"init {self.init!r} is not one of ['orthogonal', 'torch']")
        if self.hidden_size is not None and self.hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1 or None, got {self.hidden_size!r}")

    @property
    def width(self) -> int:
        return self.hidden_size if self.hidden_size is not None else self.backbone.d_model


# -- the preset and the factory ---------------------------------------------------------------------------
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
        critic: str = "shared",
        head_hidden: tuple[int, ...] = (),
    ) -> None:
        cfg = backbone if backbone is not None else gtrxl_backbone()
        if bound_context:
            cfg = bounded_backbone(cfg, context_len)
        exact, reason = replay_exactness(cfg)
        if not exact:
            warnings.warn(
                f"training sequences will not replay the acting context exactly: {reason}", stacklevel=2
            )

        def build() -> Core:
            if capabilities("attention", cfg.attention).streaming == "none":
                return ContextCore(cfg, context_len)
            return TransformerCore(cfg)

        core = TwinCore(build(), build()) if critic == "separate" else build()
        super().__init__(observation_space, action_space, core, log_std_init, head_hidden)
        self.backbone_config = cfg

    @property
    def backbone(self) -> Backbone:
        """The backbone (the actor's, with a separate critic)."""
        core = self.core.actor if isinstance(self.core, TwinCore) else self.core
        return core.backbone  # type: ignore[return-value]


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
            critic=config.critic,
            head_hidden=config.head_hidden,
        )
    else:
        kind = config.kind

        d_in = flat_size(observation_space) if config.obs_encoder == "none" else config.width

        def build() -> Core:
            if kind == "mlp":
                return MLPCore(d_in, config.width, config.mlp_layers)
            assert kind in ("lstm", "gru")
            return RecurrentCore(kind, d_in, config.width, config.rnn_layers, config.init)

        core = TwinCore(build(), build()) if config.critic == "separate" else build()
        policy = ActorCritic(
            observation_space, action_space, core, config.log_std_init, config.head_hidden, config.obs_encoder
        )
    if config.init == "torch":
        policy.default_init_heads()
    policy.detach_critic = config.critic == "detached"
    if config.norm_obs:
        policy.enable_obs_norm(config.norm_obs_clip)
    return policy


__all__ = ["CRITICS", "GTrXLPolicy", "PolicyConfig", "PolicyKind", "gtrxl_backbone", "make_policy"]
