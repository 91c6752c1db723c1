"""Learned relative schemes that build the logits themselves (kind ``"scores"``): ``shaw``, ``xl_relative``.

- ``shaw`` (Shaw et al. 2018, arXiv 1803.02155): clipped relative key and value embeddings a^K_r, a^V_r for
  r = clip(j - i, -k, k) (2k + 1 learned vectors of width D per layer, shared by the heads):
  logits_ij = q_i·(k_j + a^K_{r(i,j)}) / sqrt(D) and out_i = Σ_j α_ij (v_j + a^V_{r(i,j)}). No per-pair
  D-vectors are built: the key term is q @ A^K^T over the 2k + 1 distances, then gathered per pair; the value
  term scatter-adds α_ij into the 2k + 1 distance buckets, then multiplies by A^V (:meth:`value_term`).
- ``xl_relative`` (Dai et al. 2019, arXiv 1901.02860): sinusoidal embeddings R_{i-j} (width d_model) of the
  distance, a per-layer projection W_R (d_model -> H·D) and two global per-head vectors u, v (H, D) shared by
  all layers: logits_ij = ((q_i + u)·k_j + (q_i + v)·W_R R_{i-j}) / sqrt(D). The position term is evaluated
  once per distinct distance: when the query and key positions are consecutive runs with one common offset
  (training passes, KV-cache streaming) with the rel-shift trick over the Tq + Tk - 1 distances; otherwise
  (rows reset at different times, non-contiguous blocks) by a gather from the distinct distances. Both are
  exact.

Shapes: q (B, H, *, Tq, D), k (B, H, *, Tk, D), q_pos (B, *, Tq), k_pos (B, *, Tk) long; logits
(B, H, *, Tq, Tk). Positions come from q_pos / k_pos, which continue across streaming chunks, so both schemes
stream exactly and are shift-invariant. Cost: O(B·H·Tq·(Tk + 2k + 1)·D) for shaw, O(B·H·Tq·(Tq + Tk)·D) plus
O((Tq + Tk)·d_model·H·D) for xl_relative; memory O(B·H·Tq·Tk) in both.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.position.absolute import sinusoid_table
from rl_transformers.backbone.position.base import NoOptions, Position, relative
from rl_transformers.backbone.registry import register


def per_head(p: Tensor, like: Tensor) -> Tensor:
    """(H, D) per-head vector shaped (H, 1, ..., D) to broadcast against ``like`` (B, H, *, T, D)."""
    return p.view((p.shape[0],) + (1,) * (like.dim() - 3) + (p.shape[1],))


# -- Shaw ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShawOptions:
    max_distance: int = 16
    """k: relative distances j - i are clipped to [-k, k] (2k + 1 learned key and value vectors per layer)."""

    def __post_init__(self) -> None:
        if self.max_distance < 1:
            raise ValueError(f"shaw max_distance must be >= 1, got {self.max_distance!r}")


@register("position", "shaw", options=ShawOptions)
class ShawPosition(Position):
    kind = "scores"

    def __init__(self, cfg: Any, options: ShawOptions) -> None:
        super().__init__(cfg, options)
        n = 2 * options.max_distance + 1
        self.keys = nn.Parameter(torch.randn(cfg.n_layers, n, cfg.d_head) * 0.02)
        """(n_layers, 2k + 1, D) a^K per clipped distance (index r + k)."""
        self.values = nn.Parameter(torch.randn(cfg.n_layers, n, cfg.d_head) * 0.02)
        """(n_layers, 2k + 1, D) a^V per clipped distance (index r + k)."""

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, 1, *, Tq, Tk) index clip(j - i, -k, k) + k."""
        k = self.options.max_distance
        return (-relative(q_pos, k_pos)).clamp(-k, k).add(k).unsqueeze(1)

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        content = torch.matmul(q, k.transpose(-1, -2))
        per_distance = torch.matmul(q, self.keys[layer].to(q.dtype).transpose(0, 1))  # (B, H, *, Tq, 2k+1)
        index = self.buckets(q_pos, k_pos).expand(*per_distance.shape[:-1], k_pos.shape[-1])
        return (content + torch.gather(per_distance, -1, index)) * self.scale

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        index = self.buckets(q_pos, k_pos).expand_as(probs)
        mass = probs.new_zeros(*probs.shape[:-1], self.keys.shape[1]).scatter_add(-1, index, probs)
        return torch.matmul(mass, self.values[layer].to(probs.dtype))


# -- Transformer-XL ------------------------------------------------------------------------------------------
def rel_shift(x: Tensor, tk: int) -> Tensor:
    """out[..., i, j] = x[..., i, Tq - 1 - i + j] for x (..., Tq, Tq + Tk - 1) -> out (..., Tq, Tk).

    If column c of x holds distance d_max - c (d_max = the largest query-key distance), then out[i, j] holds
    the distance d_max - (Tq - 1) + i - j, i.e. the pair (i, j) of consecutive query and key positions. Done with
    one pad and reshapes (Dai et al. 2019): padding one column makes row i start Tq - 1 - i steps further.
    """
    tq, n = x.shape[-2], x.shape[-1]
    if n != tq + tk - 1:
        raise ValueError(f"rel_shift needs Tq + Tk - 1 = {tq + tk - 1} columns, got {n}")
    flat = F.pad(x, (0, 1)).flatten(-2)  # row i starts at i·(n + 1)
    return flat[..., tq - 1 : tq - 1 + tq * n].unflatten(-1, (tq, n))[..., :tk]


def contiguous_offset(q_pos: Tensor, k_pos: Tensor) -> int | None:
    """q_pos[..., 0] - k_pos[..., 0] if both are consecutive runs with one offset in every row, else None."""
    tq, tk = q_pos.shape[-1], k_pos.shape[-1]
    steps_q = torch.arange(tq, device=q_pos.device)
    steps_k = torch.arange(tk, device=k_pos.device)
    if not torch.equal(q_pos - q_pos[..., :1], steps_q.expand_as(q_pos)):
        return None
    if not torch.equal(k_pos - k_pos[..., :1], steps_k.expand_as(k_pos)):
        return None
    offset = (q_pos[..., 0] - k_pos[..., 0]).flatten()
    if offset.numel() == 0 or not bool((offset == offset[0]).all()):
        return None
    return int(offset[0])


def distinct_distances(rel: Tensor) -> tuple[Tensor, Tensor]:
    """(values (U,), index like ``rel``) with values[index] == rel, for per-distance tables.

    A dense range min..max when it is short (at most Tq + Tk values, e.g. rows reset at different times), else
    the sorted distinct values (``torch.unique``), so arbitrary positions never build a huge table.
    """
    lo, hi = int(rel.min()), int(rel.max())
    if hi - lo + 1 <= rel.shape[-2] + rel.shape[-1]:
        return torch.arange(lo, hi + 1, device=rel.device), rel - lo
    return torch.unique(rel, return_inverse=True)


@register("position", "xl_relative", options=NoOptions)
class XLRelativePosition(Position):
    kind = "scores"

    def __init__(self, cfg: Any, options: NoOptions) -> None:
        super().__init__(cfg, options)
        h, dh = cfg.n_heads, cfg.d_head
        self.u = nn.Parameter(torch.randn(h, dh) * 0.02)
        """(H, D) global content bias u (shared by all layers)."""
        self.v = nn.Parameter(torch.randn(h, dh) * 0.02)
        """(H, D) global position bias v (shared by all layers)."""
        self.r_proj = nn.ModuleList(nn.Linear(cfg.d_model, h * dh, bias=False) for _ in range(cfg.n_layers))
        """Per-layer W_R: d_model -> H·D."""
        self._tables: dict[tuple[Any, ...], Tensor] = {}
        """Sinusoid tables by distance range (pure functions of it; not saved)."""
        self._layout: tuple[Any, ...] | None = None
        """Weak references to the last (q_pos, k_pos) and their :meth:`layout` (reused across layers)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # caches are not part of the module (copies and pickles start empty)
        state["_tables"], state["_layout"] = {}, None
        return state

    def table(self, key: tuple[int, int, int], dist: Callable[[], Tensor], dtype: torch.dtype) -> Tensor:
        """Sinusoid table R of the distances ``dist()`` (N,), cached under ``key`` (it depends on them only).

        Cached tables are built outside inference mode (plain constants, usable by acting and training alike),
        so the key needs no query of the grad mode; a compiled forward builds them in its graph instead.
        """
        if torch.compiler.is_compiling():
            return sinusoid_table(dist(), self.cfg.d_model).to(dtype)
        full_key = (*key, dtype, self.u.device)
        emb = self._tables.get(full_key)
        if emb is None:
            if len(self._tables) >= 256:
                self._tables.clear()
            with torch.inference_mode(False), torch.no_grad():
                emb = sinusoid_table(dist(), self.cfg.d_model).to(dtype)
            self._tables[full_key] = emb
        return emb

    def projected(self, emb: Tensor, layer: int, like: Tensor) -> Tensor:
        """W_R R of sinusoid rows ``emb`` (N, d) as (H, 1, ..., D, N), right-multiplying ``like`` (B, H, *, T, D)."""
        proj = cast(nn.Linear, self.r_proj[layer])
        p = proj(emb).view(-1, self.n_heads, self.d_head).permute(1, 2, 0)  # (H, D, N)
        return p.reshape((self.n_heads,) + (1,) * (like.dim() - 4) + p.shape[1:]).to(like.dtype)

    def layout(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor | None]:
        """(sinusoid rows (U, d), gather index or None for the rel-shift path) of these positions.

        Every layer of a forward passes the same position tensors, so the analysis (with its host syncs) is
        done once and reused while they are the same objects.
        """
        last = self._layout
        if last is not None and last[0]() is q_pos and last[1]() is k_pos:
            return last[2], last[3]
        tq, tk = q_pos.shape[-1], k_pos.shape[-1]
        device, dtype = q_pos.device, cast(nn.Linear, self.r_proj[0]).weight.dtype
        offset = contiguous_offset(q_pos, k_pos)
        index: Tensor | None
        if offset is not None:
            # Columns: distances from the largest, offset + Tq - 1, down to the smallest, offset - (Tk - 1).
            top, n = offset + tq - 1, tq + tk - 1
            emb = self.table((-1, top, n), lambda: top - torch.arange(n, device=device), dtype)
            index = None
        else:
            rel = relative(q_pos, k_pos)
            lo, hi = int(rel.min()), int(rel.max())
            if hi - lo + 1 <= tq + tk:  # the dense range of distinct_distances
                emb = self.table((1, lo, hi - lo + 1), lambda: torch.arange(lo, hi + 1, device=device), dtype)
                index = rel - lo
            else:
                distinct, index = distinct_distances(rel)
                emb = sinusoid_table(distinct, self.cfg.d_model).to(dtype)
        self._layout = (weakref.ref(q_pos), weakref.ref(k_pos), emb, index)
        return emb, index

    def position_scores(self, qv: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """(q + v)·W_R R_{i-j} for every pair, (B, H, *, Tq, Tk) (unscaled)."""
        if torch.compiler.is_compiling():  # the layout analysis branches on data: the static pairwise form
            return self.pairwise_scores(qv, q_pos, k_pos, layer)
        tk = k_pos.shape[-1]
        emb, index = self.layout(q_pos, k_pos)
        per_distance = torch.matmul(qv, self.projected(emb, layer, qv))  # (B, H, *, Tq, U)
        if index is None:
            return rel_shift(per_distance, tk)
        return torch.gather(per_distance, -1, index.unsqueeze(1).expand(*per_distance.shape[:-1], tk))

    def aligned_scores(self, qv: Tensor, tk: int, layer: int) -> Tensor:
        """:meth:`position_scores` for column-aligned keys (see :meth:`logits_aligned`): the distance of a pair
        is its column distance Tk - Tq + i - j, so the table (Tk - 1 down to -(Tq - 1)) and the rel-shift follow
        from the shapes alone: no analysis, no host sync, the same numbers as the contiguous path."""
        tq = qv.shape[-2]
        top, n = tk - 1, tq + tk - 1
        emb = self.table((-1, top, n), lambda: top - torch.arange(n, device=qv.device), qv.dtype)
        return rel_shift(torch.matmul(qv, self.projected(emb, layer, qv)), tk)

    def pairwise_scores(self, qv: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """:meth:`position_scores` for arbitrary positions with static shapes: (q + v) W_R is taken to the
        d_model sinusoid features once per query, then dotted with R_{i-j} of every pair. The same sum in
        another order (equal to rounding); O(B·*·Tq·Tk·d) memory, used where the layout cannot be analysed
        (a compiled forward over keys that are not column-aligned, e.g. compressed memories)."""
        proj = cast(nn.Linear, self.r_proj[layer])
        w = proj.weight.to(qv.dtype).view(self.n_heads, self.d_head, -1)  # (H, D, d)
        a = torch.matmul(
            qv, w.view((self.n_heads,) + (1,) * (qv.dim() - 4) + w.shape[1:])
        )  # (B, H, *, Tq, d)
        rel = relative(q_pos, k_pos)  # (B, *, Tq, Tk)
        r = sinusoid_table(rel, self.cfg.d_model).to(qv.dtype)  # (B, *, Tq, Tk, d)
        return torch.matmul(r.unsqueeze(1), a.unsqueeze(-1)).squeeze(-1)  # (B, H, *, Tq, Tk)

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        content = torch.matmul(q + per_head(self.u.to(q.dtype), q), k.transpose(-1, -2))
        position = self.position_scores(q + per_head(self.v.to(q.dtype), q), q_pos, k_pos, layer)
        return (content + position) * self.scale

    def logits_aligned(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        content = torch.matmul(q + per_head(self.u.to(q.dtype), q), k.transpose(-1, -2))
        position = self.aligned_scores(q + per_head(self.v.to(q.dtype), q), k.shape[-2], layer)
        return (content + position) * self.scale
