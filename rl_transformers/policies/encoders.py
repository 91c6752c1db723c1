"""Observation encoders: any Gymnasium observation space -> one d_out-dim feature vector per observation.

``make_encoder(observation_space, d_out)`` picks the encoder by the space:

- ``Box`` (vectors, or any non-image shape) and ``MultiBinary``: flatten, then an MLP
  (Linear -> ReLU -> Linear);
- image ``Box`` (uint8, 3 dims, channels first or last, detected by :func:`image_layout`): a CNN on
  ``x / 255`` (Nature-CNN strides for images of side >= 36, 3x3 stride-1 convolutions for small grids such as
  MiniGrid's 7x7 views), then a Linear layer;
- ``Discrete`` / ``MultiDiscrete``: one one-hot vector per entry (``start`` offsets handled), concatenated,
  then a Linear layer (an embedding per value, summed over entries);
- ``Dict`` / ``Tuple``: one sub-encoder per child (keys in the space's order), concatenated, ReLU, Linear.

Every encoder takes observations with any number of leading batch dimensions: a tensor of shape
``(*batch, *space.shape)`` (or a dict / tuple of such tensors) gives ``(*batch, d_out)``. The encoders are
shared by the actor-critic policies and the Decision Transformer. :func:`obs_to_tensor` converts what a
(vector) env returns to tensors with the dtypes the encoders expect; :func:`tree_map` maps over dict/tuple
observations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

Obs = Tensor | dict[str, Any] | tuple[Any, ...]
SUPPORTED = ("Box", "MultiBinary", "Discrete", "MultiDiscrete", "Dict", "Tuple")


def tree_map(fn: Callable[[Any], Any], obs: Any) -> Any:
    """Apply ``fn`` to every leaf of a (nested) dict / tuple observation."""
    if isinstance(obs, dict):
        return {k: tree_map(fn, v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(tree_map(fn, v) for v in obs)
    return fn(obs)


def _leaf_dtype(space: spaces.Space) -> torch.dtype:
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return torch.long
    if isinstance(space, spaces.Box) and space.dtype == np.uint8:
        return torch.uint8
    return torch.float32


def obs_to_tensor(obs: Any, space: spaces.Space, device: torch.device | str = "cpu") -> Obs:
    """NumPy observations (a batch or a single one) -> tensors: long for discrete, uint8 images, else float32."""
    if isinstance(space, spaces.Dict):
        return {k: obs_to_tensor(obs[k], s, device) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(obs_to_tensor(o, s, device) for o, s in zip(obs, space.spaces))
    return torch.as_tensor(np.asarray(obs), device=device).to(_leaf_dtype(space))


def image_layout(space: spaces.Space) -> Literal["HWC", "CHW"] | None:
    """``"HWC"`` / ``"CHW"`` for a uint8 image Box (1, 3 or 4 channels), else None.

    Channels last is Gymnasium's convention and wins when both ends could be channels (e.g. (3, 8, 3)).
    """
    if not isinstance(space, spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return None
    first, last = space.shape[0], space.shape[-1]
    if last in (1, 3, 4):
        return "HWC"
    if first in (1, 3, 4):
        return "CHW"
    return None


class MLPEncoder(nn.Module):
    """Flatten the trailing ``shape`` dims, then Linear -> ReLU -> Linear."""

    def __init__(self, shape: tuple[int, ...], d_out: int, hidden: int | None = None) -> None:
        super().__init__()
        self.shape = tuple(shape)
        n_in = int(np.prod(self.shape)) if self.shape else 1
        hidden = hidden or d_out
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[: x.dim() - len(self.shape)]
        return self.net(x.reshape(*lead, -1).to(cast(nn.Linear, self.net[0]).weight.dtype))


class FlattenEncoder(nn.Module):
    """No learned encoder: the trailing ``shape`` dims flattened, as SB3's ``FlattenExtractor`` (the policy's
    core reads the observation itself)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.d_out = int(np.prod(self.shape)) if self.shape else 1

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[: x.dim() - len(self.shape)]
        return x.reshape(*lead, self.d_out).float()


def flat_size(observation_space: spaces.Space) -> int:
    """Width of :class:`FlattenEncoder`'s output (Box / MultiBinary observations; ValueError otherwise)."""
    if not isinstance(observation_space, (spaces.Box, spaces.MultiBinary)) or image_layout(observation_space):
        raise ValueError(
            f"obs_encoder='none' needs a flat Box or MultiBinary observation space, got {observation_space!r}; "
            "use obs_encoder='mlp' (the default)"
        )
    return int(np.prod(observation_space.shape)) if observation_space.shape else 1


class RunningNorm(nn.Module):
    """Observation normalisation by a running mean / variance: ``clip((x - mean) / sqrt(var + eps))``.

    The statistics are buffers (saved in checkpoints) and change only through :meth:`update`, which merges a
    batch's moments with Chan et al.'s parallel rule (1979), so the normalisation is a fixed function between
    updates. PPO updates it once per rollout, *after* the epochs, so acting and training see the same
    statistics (like SB3's ``VecNormalize`` / Gymnasium's ``NormalizeObservation``, which update every step).
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        if not clip > 0:
            raise ValueError(f"observation clip must be > 0, got {clip!r}")
        self.shape, self.clip, self.eps = tuple(shape), float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def start_like_vecnormalize(self) -> None:
        """Empty statistics with SB3's prior (``RunningMeanStd(epsilon=1e-4)``: mean 0, variance 1, count 1e-4),
        which weighs in while the first observations have a small spread."""
        self.mean.zero_()
        self.var.fill_(1.0)
        self.count.fill_(1e-4)

    def moments(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(n, sum, sum of squares) of a batch (*lead, *shape), float64: what ranks all-reduce."""
        flat = x.detach().to(torch.float64).reshape(-1, *self.shape)
        return flat.new_tensor(float(flat.shape[0])), flat.sum(0), flat.pow(2).sum(0)

    @torch.no_grad()
    def update_from_moments(self, n: Tensor, total: Tensor, total_sq: Tensor) -> None:
        if float(n) <= 0:
            return
        b_mean = total / n
        b_var = (total_sq / n - b_mean.pow(2)).clamp_min(0.0)
        delta = b_mean - self.mean
        new_count = self.count + n
        m2 = self.var * self.count + b_var * n + delta.pow(2) * self.count * n / new_count
        self.mean.add_(delta * n / new_count)
        self.var.copy_(m2 / new_count)
        self.count.copy_(new_count)

    def update(self, x: Tensor) -> None:
        """Merge the batch ``x`` (*lead, *shape) into the statistics."""
        self.update_from_moments(*self.moments(x))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype if x.is_floating_point() else torch.float32
        z = (x.to(torch.float64) - self.mean) / (self.var + self.eps).sqrt()
        return z.clamp(-self.clip, self.clip).to(dtype)


class OneHotEncoder(nn.Module):
    """One-hot of each discrete entry (``nvec`` values each, offset by ``start``), concatenated, then Linear."""

    offsets: Tensor
    start: Tensor

    def __init__(self, nvec: np.ndarray, start: np.ndarray, d_out: int) -> None:
        super().__init__()
        nvec = np.asarray(nvec, dtype=np.int64)
        self.shape = tuple(nvec.shape)
        flat_n = nvec.reshape(-1)
        # offset of each entry's block inside the concatenated one-hot vector
        self.register_buffer("offsets", torch.as_tensor(np.concatenate([[0], np.cumsum(flat_n)[:-1]])))
        self.register_buffer("start", torch.as_tensor(np.asarray(start, dtype=np.int64).reshape(-1)))
        self.n_total = int(flat_n.sum())
        # Linear on a one-hot == an embedding table; Embedding + sum is the cheap form of it.
        self.embed = nn.EmbeddingBag(self.n_total, d_out, mode="sum")
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[: x.dim() - len(self.shape)]
        idx = x.reshape(-1, len(self.offsets)).long() - self.start + self.offsets
        return (self.embed(idx) + self.bias).reshape(*lead, -1)


class CNNEncoder(nn.Module):
    """Convolutions on ``uint8 / 255`` images (HWC or CHW), flattened, then Linear -> ReLU."""

    def __init__(self, shape: tuple[int, ...], layout: Literal["HWC", "CHW"], d_out: int) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.layout = layout
        c, h, w = (shape[2], shape[0], shape[1]) if layout == "HWC" else shape
        if min(h, w) >= 36:  # Nature CNN (Mnih et al. 2015)
            convs = [nn.Conv2d(c, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU()]
            convs += [nn.Conv2d(64, 64, 3, 1), nn.ReLU()]
        else:  # small grids: keep the resolution, two 3x3 convolutions ("same" padding for tiny sides)
            pad = 1 if min(h, w) < 5 else 0
            convs = [nn.Conv2d(c, 16, 3, 1, pad), nn.ReLU(), nn.Conv2d(16, 32, 3, 1, pad), nn.ReLU()]
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.out = nn.Sequential(nn.Linear(n_flat, d_out), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[: x.dim() - 3]
        img = x.reshape(-1, *self.shape).to(cast(nn.Linear, self.out[0]).weight.dtype) / 255.0
        if self.layout == "HWC":
            img = img.permute(0, 3, 1, 2)
        return self.out(self.convs(img)).reshape(*lead, -1)


class CompositeEncoder(nn.Module):
    """One encoder per child of a Dict / Tuple space, concatenated, ReLU, Linear."""

    def __init__(self, children: dict[str, nn.Module], d_out: int, d_child: int, is_tuple: bool) -> None:
        super().__init__()
        self.keys = list(children)
        self.is_tuple = is_tuple
        self.children_enc = nn.ModuleDict(children)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(d_child * len(children), d_out))

    def forward(self, obs: dict[str, Any] | tuple[Any, ...]) -> Tensor:
        if self.is_tuple:
            parts = [self.children_enc[k](obs[int(k)]) for k in self.keys]  # type: ignore[index]
        else:
            parts = [self.children_enc[k](obs[k]) for k in self.keys]  # type: ignore[call-overload]
        return self.out(torch.cat(parts, dim=-1))


def make_encoder(observation_space: spaces.Space, d_out: int, kind: str = "mlp") -> nn.Module:
    """The encoder for ``observation_space`` mapping observations to ``(*batch, d_out)`` features (``kind``
    "none": :class:`FlattenEncoder`, whose width ``d_out`` must be :func:`flat_size`)."""
    space = observation_space
    if kind == "none":
        if d_out != flat_size(space):
            raise ValueError(f"a flattening encoder of {space!r} has width {flat_size(space)}, not {d_out}")
        return FlattenEncoder(tuple(cast(spaces.Box, space).shape))
    if d_out < 1:
        raise ValueError(f"d_out must be >= 1, got {d_out}")
    layout = image_layout(space)
    if layout is not None:
        return CNNEncoder(tuple(cast(spaces.Box, space).shape), layout, d_out)
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return MLPEncoder(tuple(space.shape), d_out)
    if isinstance(space, spaces.Discrete):
        return OneHotEncoder(np.array(int(space.n)), np.array(int(space.start)), d_out)
    if isinstance(space, spaces.MultiDiscrete):
        return OneHotEncoder(space.nvec, space.start, d_out)
    if isinstance(space, spaces.Dict):
        subs = {k: make_encoder(s, d_out) for k, s in space.spaces.items()}
        return CompositeEncoder(subs, d_out, d_out, is_tuple=False)
    if isinstance(space, spaces.Tuple):
        subs = {str(i): make_encoder(s, d_out) for i, s in enumerate(space.spaces)}
        return CompositeEncoder(subs, d_out, d_out, is_tuple=True)
    raise TypeError(
        f"no encoder for observation space {space!r}; supported: {', '.join(SUPPORTED)} "
        "(wrap other spaces, e.g. with envs.FloatFlattenObservation)"
    )
