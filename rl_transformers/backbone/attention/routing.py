"""``routing``: Routing Transformer attention with online k-means (Roy et al. 2021, arXiv 2003.05997).

Each routing head keeps n_clusters unit centroids μ (a buffer, never streaming state). Queries and keys are
length-normalised (x̂ = x / |x|) and assigned to their nearest centroid, c(x) = argmax_c x̂·μ_c (the paper's
Algorithm 1; we use this per-token argmax rather than the balanced top-k of the reference implementation
because it depends on each token alone, which keeps causal routing strictly causal and streamable). A query
attends the keys of its own cluster (causal: the past ones), always plus its own key; logits use the raw q, k.
With one cluster this is full attention.

Training: the commitment loss mean ‖x̂ - μ_c(x)‖² over the new queries and keys, times ``commitment_weight``
(default 1e-4, lucidrains/routing-transformer's ``commitment_factor``), is returned as the aux loss
``routing_commitment`` (gradient into the projections only; the raw loss is ``info["backbone/routing_commitment"]``),
and, in training mode only, the centroids move by
an exponential moving average towards the mean of their assigned vectors, μ_c <- normalise(λ μ_c + (1 - λ)
mean_c), as a no-grad buffer update after the layer has used the old centroids. ``local_heads`` of the H heads
(the first ones) use a sliding window of ``local_window`` past keys instead of routing (the paper combines
routing and local heads).

Cost: the routing heads gather each cluster's queries and keys into padded blocks, O(L²/k) time and memory for
balanced clusters (which k-means pushes towards); when padding would make the blocks larger than the dense
T x S matrix the kernel falls back to dense masked attention, so it is never worse than dense. Long calls on CPU
(plain scores, no dropout, no max_cache) take the flash form instead (``_routing_flash``): every cluster's
queries and keys as one time-ordered slot sequence, all clusters in one causal flash call, the own key merged by
log-sum-exp, same key sets. Local heads are banded, O(L·w). Streaming: a KV cache that also stores each key's cluster id (:class:`RoutingCache`), exact.

Shapes: q (B, H, T, D); k, v (B, H, S, D) with the new tokens last; cluster ids (B, Hr, T|S), Hr routing heads;
blocks (B, Hr, k, M, D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention._routing_kernels import band_attention, cluster_attention
from rl_transformers.backbone.attention.base import Attention, assignment_input
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_number
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State


@dataclass(frozen=True)
class RoutingOptions:
    n_clusters: int = 4
    """k: centroids per routing head."""
    local_heads: int = 0
    """How many heads (the first ones) use a sliding window instead of routing; must be < n_heads."""
    local_window: int = 16
    """Keys before the query a local head sees besides itself (bidirectional: on each side)."""
    decay: float = 0.999
    """λ of the EMA centroid update (training mode only)."""
    max_cache: int | None = None
    """Bound the KV cache to this many past keys (queries then ignore older keys in full runs too)."""
    seed: int = 0
    """Seed of the initial centroids (combined with the layer index)."""
    commitment_weight: float = 1e-4
    """Weight of the commitment loss in ``aux_losses["routing_commitment"]``. At 1 it starts ~1,000x an RL loss and
    its gradient (clipped together with the RL one) leaves the policy almost none; 1e-4 is the reference
    implementation's, whose loss is a per-coordinate mean (ours sums the head's coordinates)."""

    def __post_init__(self) -> None:
        check_number("commitment_weight", self.commitment_weight, low=0.0)
        for name in ("n_clusters", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.local_heads, int) or self.local_heads < 0:
            raise ValueError(f"local_heads must be an int >= 0, got {self.local_heads!r}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay!r}")
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")


@dataclass
class RoutingCache(State):
    """KV cache plus the cluster id of every cached key of the routing heads.

    k, v: (B, H, S, D); pos, valid: (B, S); clusters: (B, Hr, S) long. Columns are time-aligned across rows.
    """

    k: Tensor
    v: Tensor
    pos: Tensor
    valid: Tensor
    clusters: Tensor

    @classmethod
    def empty(
        cls, batch: int, n_heads: int, n_routing: int, d_head: int, device: Any, dtype: torch.dtype
    ) -> RoutingCache:
        return cls(
            k=torch.zeros(batch, n_heads, 0, d_head, device=device, dtype=dtype),
            v=torch.zeros(batch, n_heads, 0, d_head, device=device, dtype=dtype),
            pos=torch.zeros(batch, 0, dtype=torch.long, device=device),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
            clusters=torch.zeros(batch, n_routing, 0, dtype=torch.long, device=device),
        )

    @property
    def length(self) -> int:
        return self.k.shape[2]


# -- module -----------------------------------------------------------------------------------------------------
@register(
    "attention",
    "routing",
    options=RoutingOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class RoutingAttention(Attention):
    aux_losses = ("routing_commitment",)  # names this entry adds to BackboneOutput.aux_losses
    centroids: Tensor
    """(Hr, k, D) unit centroids of the routing heads (a buffer, updated in training only)."""

    def __init__(self, cfg: Any, options: RoutingOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.n_local = options.local_heads
        self.n_routing = cfg.n_heads - options.local_heads
        g = torch.Generator().manual_seed(options.seed * 100_003 + layer)
        centroids = F.normalize(
            torch.randn(self.n_routing, options.n_clusters, cfg.d_head, generator=g), dim=-1
        )
        self.register_buffer("centroids", centroids)

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if options.local_heads >= cfg.n_heads:
            raise ValueError(
                f"routing local_heads={options.local_heads} must be < n_heads={cfg.n_heads} (at least one "
                "routing head); for local heads only use attention='local'"
            )
        if cfg.block == "reversible" and getattr(cfg.options("block"), "recompute", False):
            raise ValueError(
                "attention 'routing' returns the aux loss 'routing_commitment' and updates its centroids in "
                "training, which a recomputing reversible block cannot do; use block_options="
                "{'recompute': False} or another block"
            )

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> RoutingCache:
        return RoutingCache.empty(batch, self.n_heads, self.n_routing, self.d_head, device, dtype)

    def assign(self, x: Tensor, centroids: Tensor) -> Tensor:
        """Nearest-centroid ids (B, Hr, N) of normalised x (B, Hr, N, D) (float32 from half-precision inputs:
        :func:`~rl_transformers.backbone.attention.base.assignment_input`)."""
        return torch.einsum("bhnd,hkd->bhnk", x, centroids.to(x.dtype)).argmax(-1)

    def assigned(self, mu: Tensor, cluster: Tensor, dtype: torch.dtype) -> Tensor:
        """Centroid (B, Hr, N, D) of each id in ``cluster`` (B, Hr, N)."""
        heads = torch.arange(self.n_routing, device=mu.device)[:, None]
        return mu.to(dtype)[heads, cluster]

    def core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
        state: Any,
    ) -> tuple[Tensor, Any]:
        t = q.shape[2]
        nl, opts = self.n_local, self.options
        mu = self.centroids.clone()  # the update below must not touch what autograd saved
        qn, kn = F.normalize(q[:, nl:], dim=-1), F.normalize(k[:, nl:], dim=-1)
        cq, ck = (
            self.assign(assignment_input(q[:, nl:], qn), mu),
            self.assign(assignment_input(k[:, nl:], kn), mu),
        )
        new_k, new_valid = kn, k_valid
        if isinstance(state, RoutingCache):
            if state.length:  # (an empty cache: no copies of k, v)
                k = torch.cat([state.k, k], dim=2)
                v = torch.cat([state.v, v], dim=2)
                k_pos = torch.cat([state.pos, k_pos], dim=1)
                k_valid = torch.cat([state.valid, k_valid], dim=1)
                ck = torch.cat([state.clusters, ck], dim=2)
            keep = k.shape[2] if opts.max_cache is None else min(k.shape[2], opts.max_cache)
            state = RoutingCache(
                k[:, :, -keep:], v[:, :, -keep:], k_pos[:, -keep:], k_valid[:, -keep:], ck[:, :, -keep:]
            )
        heads = list(range(nl, self.n_heads))
        out = cluster_attention(
            self,
            q[:, nl:],
            k[:, nl:],
            v[:, nl:],
            q_pos,
            k_pos,
            k_valid,
            cq,
            ck,
            opts.n_clusters,
            heads,
            opts.max_cache,
        )
        if nl:
            local = band_attention(
                self,
                q[:, :nl],
                k[:, :nl],
                v[:, :nl],
                q_pos,
                k_pos,
                k_valid,
                opts.local_window,
                list(range(nl)),
                opts.max_cache,
            )
            out = torch.cat([local, out], dim=1)
        # Commitment loss (Roy 2021, §4.1) on the new queries and keys; gradient flows into the projections.
        q_valid = k_valid[:, -t:]
        new_ck = ck[:, :, -new_k.shape[2] :]
        dq = (qn - self.assigned(mu, cq, qn.dtype)).pow(2).sum(-1)
        dk = (new_k - self.assigned(mu, new_ck, qn.dtype)).pow(2).sum(-1)
        wq, wk = q_valid[:, None].to(dq.dtype), new_valid[:, None].to(dk.dtype)
        total = (wq.sum() + wk.sum()) * self.n_routing
        loss = ((dq * wq).sum() + (dk * wk).sum()) / total.clamp_min(1.0)
        ctx.add_aux("routing_commitment", opts.commitment_weight * loss)
        if ctx.collect_info:
            ctx.add_info("backbone/routing_commitment", loss.detach())
        if self.training:
            self.update_centroids(mu, [(qn, cq, q_valid), (new_k, new_ck, new_valid)])
        if ctx.collect_info:
            usage = F.one_hot(cq, opts.n_clusters).to(q.dtype).mean(dim=(0, 2))
            ctx.add_info(
                f"backbone/routing_max_cluster_share/layer{self.layer}", usage.amax(-1).mean().detach()
            )
        return out, state

    @torch.no_grad()
    def update_centroids(self, mu: Tensor, groups: list[tuple[Tensor, Tensor, Tensor]]) -> None:
        """EMA k-means step: μ_c <- normalise(λ μ_c + (1 - λ) mean of the valid vectors assigned to c)."""
        n_k = self.options.n_clusters
        sums = torch.zeros_like(mu)
        counts = mu.new_zeros(mu.shape[:2])
        for x, cluster, valid in groups:
            onehot = F.one_hot(cluster, n_k).to(mu.dtype) * valid[:, None, :, None].to(mu.dtype)
            sums += torch.einsum("bhnk,bhnd->hkd", onehot, x.to(mu.dtype))
            counts += onehot.sum(dim=(0, 2))
        decay = self.options.decay
        mean = sums / counts.clamp_min(1.0).unsqueeze(-1)
        moved = F.normalize(decay * mu + (1.0 - decay) * mean, dim=-1)
        self.centroids.copy_(torch.where(counts.unsqueeze(-1) > 0, moved, mu))
