"""``linear``: linear attention with φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, arXiv 2006.16236).

Softmax similarity exp(q·k/√D) is replaced by a kernel φ(q)·φ(k), so attention factorises:
y_i = φ(q_i)^T S_i / φ(q_i)^T z_i with S_i = Σ_{j≤i} φ(k_j) v_j^T (F × D) and z_i = Σ_{j≤i} φ(k_j) (F).
Causal runs use the chunked operator of ``_linear_ops`` (masked quadratic inside a chunk, carried (S, z) between
chunks, memory-efficient cumulative-sum gradient of the paper's eqs. 8-10); a single new token is one RNN step.
Streaming state is the constant-size :class:`LinearState` (S (B, H, F, D), z (B, H, F)), so chunked == full run
exactly. Non-causal: y_i = φ(q_i)^T (Σ_j φ(k_j) v_j^T) / φ(q_i)^T Σ_j φ(k_j).

This module also holds :class:`FeatureMapAttention`, the machinery shared with the random-feature entries of
``kernel.py`` (``rfa``, ``performer``): features -> fold any key prefix (Transformer-XL memory: the S - T keys
before the new tokens, bottom-right aligned) into (S, z) -> causal / non-causal product -> normalise. Padded keys
get zero features (they add nothing to S or z); a padded query still sees its own key, as in ``visible_mask``, so
its output stays finite. Only position schemes of kind none / input / qk (e.g. rope) apply: there are no logits to
bias. Attention dropout is not applied (the attention matrix is never formed).
Cost: O(T·F·D) time and O(F·D) state per head; O(T·C) extra memory for chunks of C tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention import _linear_ops as ops
from rl_transformers.backbone.attention.base import Attention, same_segment
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State


@dataclass
class LinearState(State):
    """Running sums of a kernel attention: s = S (B, H, F, D) = Σ φ(k_j) v_j^T, z (B, H, F) = Σ φ(k_j).

    The empty state is all zeros, so the base ``reset`` applies. Gated ``rfa`` keeps the decayed sums.
    """

    s: Tensor
    z: Tensor


def check_chunk_size(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are accumulated in float32 (long prefix sums lose too much in 16 bits)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class FeatureMapAttention(Attention):
    """Attention of the form φ(q)^T S / φ(q)^T z. Subclasses define the feature maps (and optionally gates)."""

    position_kinds = frozenset({"none", "input", "qk"})
    segment_masks = True

    @classmethod
    def masks_segments(cls, options: Any) -> bool:
        """Plain sums restart by segment (``_linear_ops.segmented_linear``); a decaying (gated) state does not."""
        return not getattr(options, "gate", False)

    # -- what subclasses define -------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        """F: size of φ(x)."""
        raise NotImplementedError

    def query_features(self, q: Tensor) -> Tensor:
        """φ(q): (B, H, T, D) -> (B, H, T, F)."""
        raise NotImplementedError

    def key_features(self, k: Tensor) -> Tensor:
        """φ(k): (B, H, S, D) -> (B, H, S, F)."""
        raise NotImplementedError

    def gates(self, ctx: ForwardContext, k_valid: Tensor) -> tuple[Tensor, Tensor] | None:
        """(log g, key weight), each (B, H, S), for a decaying state; None = plain sums."""
        return None

    count_feature: bool = False
    """True when the last key feature is the constant 1 and the last query feature is 0: z then also holds the
    (gate-weighted) number of keys seen, and :meth:`safe_denominator` receives that count for every query."""

    def safe_denominator(self, den: Tensor, count: Tensor | None) -> Tensor:
        """Guard against a zero normaliser (positive features: only on underflow). den, count: (B, H, T, 1)."""
        return den.clamp_min(torch.finfo(den.dtype).tiny)

    # -- state and forward ------------------------------------------------------------------------------------
    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> LinearState:
        h, f, d = self.n_heads, self.n_features, self.d_head
        dtype = work_dtype(dtype)  # sums kept in at least float32
        return LinearState(
            s=torch.zeros(batch, h, f, d, device=device, dtype=dtype),
            z=torch.zeros(batch, h, f, device=device, dtype=dtype),
        )

    def memory_key_features(self, k_lin: Tensor, k_pos: Tensor) -> Tensor:
        """φ of the memory's keys (position transform, then the feature map), cached while acting: each key's
        features depend on that key and on fixed weights / random features only (redraws happen in training)."""
        k = self.position.transform_k(self.split_heads(k_lin), k_pos, self.layer)
        return self.key_features(k.to(work_dtype(k.dtype)))

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
        b, h, t, d = q.shape
        n_prefix = k.shape[2] - t
        in_dtype, wd = q.dtype, work_dtype(q.dtype)
        q, k, v = q.to(wd), k.to(wd), v.to(wd)
        fq = self.query_features(q)
        cached = ctx.extras.get("memory_key_features", {}).get(len(ctx.attention_inputs) - 1)
        fk_raw = self.key_features(k) if cached is None else cached.to(wd)  # acting: the memory's were cached
        # The masked form is exact without padding too (x·1, + 0): a compiled forward takes it rather than
        # branch on the data (``k_valid.all()`` is a host sync and a graph break).
        no_padding = (ctx.all_valid and n_prefix == 0) or (
            not torch.compiler.is_compiling() and bool(k_valid.all())
        )
        ones = torch.ones_like(v[..., :1])
        v1 = torch.cat([v, ones], dim=-1)  # the ones column turns S into [S, z]
        fk = fk_raw
        if not no_padding:
            keep = k_valid[:, None, :, None].to(wd)
            fk, v1 = fk_raw * keep, v1 * keep  # padded keys contribute nothing
        if isinstance(state, LinearState):
            s0 = torch.cat([state.s, state.z[..., None]], dim=-1).to(wd)
        else:
            s0 = q.new_zeros(b, h, self.n_features, d + 1)
        gated = self.gates(ctx, k_valid)
        log_g = None
        chunk = self.options.chunk_size
        seen = carried = None
        if ctx.segment is not None:  # rows restart inside the chunk (Backbone.forward(starts=...))
            seen, carried = self._segment_masks(ctx, t)
        if seen is not None and carried is not None:
            if n_prefix:  # carried keys (XL memory) are segment 0: folded into the state that segment sees
                s0 = ops.fold(fk[..., :n_prefix, :], v1[..., :n_prefix, :], s0, None)
            out, s_end = ops.segmented_linear(
                fq, fk[..., n_prefix:, :], v1[..., n_prefix:, :], s0, seen, carried
            )
        elif self.causal:
            if gated is not None:
                log_g, weight = gated
                fk = fk * weight[..., None]
            if n_prefix:  # keys before the new tokens (XL memory) are visible to all of them: fold them first
                pre = log_g[..., :n_prefix] if log_g is not None else None
                s0 = ops.fold(fk[..., :n_prefix, :], v1[..., :n_prefix, :], s0, pre)
                log_g = log_g[..., n_prefix:] if log_g is not None else None
            fk_new, v_new = fk[..., n_prefix:, :], v1[..., n_prefix:, :]
            if log_g is None:
                out, s_end = ops.causal_linear(fq, fk_new, v_new, s0, chunk)
            else:
                out, s_end = ops.gated_causal_chunked(fq, fk_new, v_new, log_g, s0, chunk)
        else:
            out, s_end = ops.noncausal_linear(fq, fk, v1, s0)
        padded = None
        if not no_padding:
            # A padded query still sees its own key (visible_mask semantics), which keeps its output finite.
            own = (fq * fk_raw[..., n_prefix:, :]).sum(-1, keepdim=True)
            padded = ~k_valid[:, None, n_prefix:, None]
            out = out + torch.where(padded, own * torch.cat([v, ones], dim=-1)[..., n_prefix:, :], 0.0)
        count = None
        if self.count_feature and seen is not None and carried is not None:
            new_count = seen.to(wd) @ fk[..., n_prefix:, -1, None]  # keys of the own segment seen so far
            count = torch.where(carried, s0[..., -1, d, None, None], 0.0) + new_count
            count = count if padded is None else count + padded.to(wd)
        elif self.count_feature:
            count = self._key_count(fk[..., n_prefix:, -1], s0[..., -1, d], s_end[..., -1, d], log_g, chunk)
            count = count if padded is None else count + padded.to(wd)
        y = (out[..., :d] / self.safe_denominator(out[..., d:], count)).to(in_dtype)
        if not isinstance(state, LinearState):  # no streaming state (e.g. a memory module supplies context)
            return y, state
        return y, LinearState(s=s_end[..., :d].to(state.s.dtype), z=s_end[..., d].to(state.z.dtype))

    def _segment_masks(self, ctx: ForwardContext, t: int) -> tuple[Tensor, Tensor]:
        """(seen (B, 1, T, T), carried (B, 1, T, 1)) for rows restarting inside the chunk: a query sees the new
        keys of its own segment (and only earlier ones when causal), and the carried state only in segment 0."""
        seen = same_segment(ctx, t)
        assert seen is not None and ctx.segment is not None
        if self.causal:
            seen = seen & torch.ones(t, t, dtype=torch.bool, device=seen.device).tril()
        return seen, (ctx.segment == 0)[:, None, :, None]

    def _key_count(
        self, new: Tensor, before: Tensor, after: Tensor, log_g: Tensor | None, chunk: int
    ) -> Tensor:
        """(B, H, T, 1) (gate-weighted) number of keys each query sees: new (B, H, T) per-token weights,
        before / after (B, H) the counts held by the state before and after this call."""
        if not self.causal:
            return after[..., None, None].expand(*new.shape, 1)
        if log_g is None:
            return (before[..., None] + torch.cumsum(new, dim=-1))[..., None]
        ones = torch.ones_like(new)[..., None]
        count, _ = ops.gated_causal_chunked(ones, new[..., None], ones, log_g, before[..., None, None], chunk)
        return count


@dataclass(frozen=True)
class LinearOptions:
    chunk_size: int = 64
    """C: tokens per chunk of the causal computation (memory O(T·C) for in-chunk scores)."""

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)


@register(
    "attention",
    "linear",
    options=LinearOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class LinearAttention(FeatureMapAttention):
    """φ(x) = elu(x) + 1 on queries and keys (no 1/√D scale), F = D."""

    @property
    def n_features(self) -> int:
        return self.d_head

    def query_features(self, q: Tensor) -> Tensor:
        return F.elu(q) + 1.0

    def key_features(self, k: Tensor) -> Tensor:
        return F.elu(k) + 1.0
