"""Action heads: features (*batch, d) -> an action distribution for a Gymnasium action space.

- ``Discrete(n)``: Categorical over n logits (``start`` offset added back in :meth:`ActionHead.to_env`);
- ``MultiDiscrete(nvec)``: independent Categoricals, one per entry; log-probs and entropies are summed;
- ``MultiBinary(n)``: independent Bernoullis;
- ``Box``: diagonal Gaussian, mean from the features, a state-independent learned log-std (Schulman et al.
  2017, arXiv 1707.06347). The sampled (unclipped) action is what is stored and scored; only the copy sent to
  the env is clipped to the bounds (:meth:`ActionHead.to_env`), so log-probs stay those of the sample.

The distributions are small hand-written classes (no ``torch.distributions`` argument validation on the
per-step hot path). Sampling draws from torch's global generator: Gumbel-max for categoricals, ``randn`` for
Gaussians. Shapes: actions (*batch) long for Discrete, (*batch, k) long for MultiDiscrete, (*batch, *shape)
float for Box / MultiBinary; ``log_prob`` and ``entropy`` are (*batch).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

SUPPORTED = ("Discrete", "MultiDiscrete", "MultiBinary", "Box")


class Categorical:
    """Categorical over the last dim of ``logits``."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits - logits.logsumexp(-1, keepdim=True)

    def sample(self) -> Tensor:
        u = torch.rand_like(self.logits).clamp_(1e-20, 1.0)
        return (self.logits - (-u.log()).log()).argmax(-1)  # Gumbel-max

    def mode(self) -> Tensor:
        return self.logits.argmax(-1)

    def log_prob(self, action: Tensor) -> Tensor:
        return self.logits.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> Tensor:
        return -(self.logits.exp() * self.logits).sum(-1)


class MultiCategorical:
    """Independent Categoricals, one per entry; ``logits`` (*batch, sum(nvec)) split by ``nvec``."""

    def __init__(self, logits: Tensor, nvec: list[int]) -> None:
        self.parts = [Categorical(x) for x in logits.split(nvec, dim=-1)]

    def sample(self) -> Tensor:
        return torch.stack([p.sample() for p in self.parts], dim=-1)

    def mode(self) -> Tensor:
        return torch.stack([p.mode() for p in self.parts], dim=-1)

    def log_prob(self, action: Tensor) -> Tensor:
        return sum(p.log_prob(action[..., i]) for i, p in enumerate(self.parts))  # type: ignore[return-value]

    def entropy(self) -> Tensor:
        return sum(p.entropy() for p in self.parts)  # type: ignore[return-value]


class Bernoulli:
    """Independent Bernoullis over the trailing ``event_dims`` dims of ``logits``."""

    def __init__(self, logits: Tensor, event_dims: int) -> None:
        self.logits = logits
        self.dims = tuple(range(-event_dims, 0))

    def sample(self) -> Tensor:
        return torch.bernoulli(torch.sigmoid(self.logits))

    def mode(self) -> Tensor:
        return (self.logits > 0).to(self.logits.dtype)

    def log_prob(self, action: Tensor) -> Tensor:
        lp = -nn.functional.binary_cross_entropy_with_logits(self.logits, action, reduction="none")
        return lp.sum(self.dims)

    def entropy(self) -> Tensor:
        p = torch.sigmoid(self.logits)
        return nn.functional.binary_cross_entropy_with_logits(self.logits, p, reduction="none").sum(self.dims)


class DiagGaussian:
    """Diagonal Gaussian; ``mean`` (*batch, *shape), ``log_std`` broadcastable to it."""

    def __init__(self, mean: Tensor, log_std: Tensor, event_dims: int) -> None:
        self.mean = mean
        self.log_std = log_std.expand_as(mean)
        self.dims = tuple(range(-event_dims, 0))

    def sample(self) -> Tensor:
        return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def mode(self) -> Tensor:
        return self.mean

    def log_prob(self, action: Tensor) -> Tensor:
        z = (action - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(self.dims)

    def entropy(self) -> Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(self.dims)


Distribution = Categorical | MultiCategorical | Bernoulli | DiagGaussian


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActionHead(nn.Module):
    """Linear map from features to the parameters of the action distribution of ``action_space``."""

    action_shape: tuple[int, ...]

    def __init__(self, action_space: spaces.Space, d_in: int, log_std_init: float = 0.0) -> None:
        super().__init__()
        self.space = action_space
        self.log_std: nn.Parameter | None = None
        if isinstance(action_space, spaces.Discrete):
            self.kind = "discrete"
            n_out, self.action_shape, self.action_dtype = int(action_space.n), (), torch.long
        elif isinstance(action_space, spaces.MultiDiscrete):
            if action_space.nvec.ndim != 1:
                raise ValueError(f"only 1-D MultiDiscrete action spaces are supported, got {action_space!r}")
            self.kind = "multi_discrete"
            self.nvec = [int(n) for n in action_space.nvec]
            n_out, self.action_shape, self.action_dtype = sum(self.nvec), (len(self.nvec),), torch.long
        elif isinstance(action_space, spaces.MultiBinary):
            self.kind = "multi_binary"
            self.action_shape, self.action_dtype = tuple(action_space.shape), torch.float32
            n_out = int(np.prod(self.action_shape))
        elif isinstance(action_space, spaces.Box):
            self.kind = "box"
            self.action_shape, self.action_dtype = tuple(action_space.shape), torch.float32
            n_out = int(np.prod(self.action_shape))
            self.log_std = nn.Parameter(torch.full(self.action_shape, float(log_std_init)))
            self.low = np.asarray(action_space.low, dtype=np.float32)
            self.high = np.asarray(action_space.high, dtype=np.float32)
        else:
            raise TypeError(
                f"no action head for action space {action_space!r}; supported: {', '.join(SUPPORTED)}"
            )
        # Small initial logits / means: a near-uniform (or near-zero-mean) starting policy (Andrychowicz 2020).
        self.linear = _init_linear(nn.Linear(d_in, n_out), 0.01)

    def forward(self, h: Tensor) -> Distribution:
        out = self.linear(h)
        if self.kind == "discrete":
            return Categorical(out)
        if self.kind == "multi_discrete":
            return MultiCategorical(out, self.nvec)
        shaped = out.reshape(*out.shape[:-1], *self.action_shape)
        if self.kind == "multi_binary":
            return Bernoulli(shaped, len(self.action_shape))
        assert self.log_std is not None
        return DiagGaussian(shaped, self.log_std.to(shaped.dtype), len(self.action_shape))

    def to_env(self, action: Tensor) -> np.ndarray:
        """Actions as the env takes them: NumPy, ``start`` offsets added, Box actions clipped to the bounds."""
        a = action.detach().cpu().numpy()
        if self.kind == "discrete":
            return a.astype(np.int64) + int(cast(spaces.Discrete, self.space).start)
        if self.kind == "multi_discrete":
            return a.astype(np.int64) + np.asarray(
                cast(spaces.MultiDiscrete, self.space).start, dtype=np.int64
            )
        if self.kind == "multi_binary":
            return a.astype(self.space.dtype)
        return np.clip(a, self.low, self.high).astype(self.space.dtype)


def make_action_head(action_space: spaces.Space, d_in: int, log_std_init: float = 0.0) -> ActionHead:
    """The :class:`ActionHead` for ``action_space`` reading ``d_in``-dim features."""
    return ActionHead(action_space, d_in, log_std_init)
