"""The attention interface every ``attention`` entry implements.

:class:`Attention` owns the multi-head projections and the plumbing shared by all variants; a variant overrides
one of two methods:

- :meth:`Attention.attend` (stateless kernel over the given keys) - the default :meth:`core` wraps it with an
  exact KV cache, so any kernel that is exact under causal masking streams exactly for free;
- :meth:`Attention.core` (stateful) - e.g. linear attention carries (S, z) instead of a KV cache.

Conventions: q (B, H, T, D) are the T new tokens; k, v (B, H, S, D) are all keys the new tokens may see, the new
tokens being the last T of them (bottom-right alignment: key j is causally visible from query i iff
j <= S - T + i). q_pos (B, T), k_pos (B, S) are positions since reset; k_valid (B, S) marks real keys. A query
always sees its own key, so no row is ever fully masked (padded queries give finite, ignored outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.context import ForwardContext, MemoryContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.state import KVCache


def visible_mask(t: int, k_valid: Tensor, causal: bool) -> Tensor:
    """(B, 1, T, S) bool: key may be attended (padding, causality, and always self)."""
    s = k_valid.shape[1]
    i = torch.arange(t, device=k_valid.device)[:, None] + (s - t)
    j = torch.arange(s, device=k_valid.device)[None, :]
    allowed = k_valid[:, None, None, :].expand(-1, 1, t, s)
    if causal:
        allowed = allowed & (j <= i)
    return allowed | (j == i)


def key_segments(ctx: ForwardContext, s: int) -> Tensor:
    """(B, S) segment of each key when the last T of S keys are the new tokens (``ForwardContext.segment``):
    carried keys (memory, KV cache) are segment 0."""
    seg = ctx.segment
    assert seg is not None
    if s == seg.shape[1]:
        return seg
    return torch.cat([seg.new_zeros(seg.shape[0], s - seg.shape[1]), seg], dim=1)


def assignment_input(raw: Tensor, unit: Tensor) -> Tensor:
    """Unit vectors for a discrete assignment (LSH buckets, routing clusters): ``unit`` (``raw`` normalised) as it
    is, or, when ``raw`` is half precision, ``raw`` normalised in float32. Rounding the similarities to 8 bits
    of mantissa flips the argmax of vectors near a boundary, so a bf16 run would assign tokens elsewhere than the
    same run in float32 (the GPU benchmark's gate measured relative errors of 0.9 / 0.7 for lsh / routing)."""
    if raw.dtype in (torch.float16, torch.bfloat16):
        return F.normalize(raw.float(), dim=-1)
    return unit


def same_segment(ctx: ForwardContext, s: int) -> Tensor | None:
    """(B, 1, T, S) bool: key j is in query i's segment (rows restarting inside the chunk), or None."""
    if ctx.segment is None:
        return None
    return ctx.segment[:, None, :, None] == key_segments(ctx, s)[:, None, None, :]


def memory_keys(ctx: ForwardContext, mem: MemoryContext) -> tuple[Tensor, Tensor]:
    """(k_pos, k_valid): ``mem``'s positions / validity followed by the new tokens' (B, M + T).

    Built once per forward and shared by the layers whose memory has the same ``pos`` / ``valid`` tensors
    (e.g. every layer of XL memory), so the layers also share the masks built from them (see
    :func:`shared_mask`).
    """
    cached = ctx.extras.get("_memory_keys")
    if cached is not None and cached[0] is mem.pos and cached[1] is mem.valid:
        return cached[2], cached[3]
    k_pos = torch.cat([mem.pos, ctx.pos], dim=1)
    k_valid = torch.cat([mem.valid, ctx.valid], dim=1)
    ctx.extras["_memory_keys"] = (mem.pos, mem.valid, k_pos, k_valid)
    return k_pos, k_valid


def shared_mask(
    ctx: ForwardContext, key: tuple[Any, ...], k_valid: Tensor, build: Callable[[], Tensor]
) -> Tensor:
    """``build()`` cached for this forward under ``key`` and the identity of ``k_valid``: the layers of one
    forward that see the same keys reuse one mask instead of rebuilding it."""
    masks = ctx.extras.setdefault("_masks", {})
    cached = masks.get(key)
    if cached is not None and cached[0] is k_valid:
        return cached[1]
    mask = build()
    masks[key] = (k_valid, mask)
    return mask


def attention_entropy(probs: Tensor) -> Tensor:
    """Mean entropy (nats) of attention rows, a cheap diagnostic."""
    p = probs.clamp_min(1e-12)
    return -(probs * p.log()).sum(-1).mean()


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    position: Position,
    q_pos: Tensor,
    k_pos: Tensor,
    layer: int,
    dropout: nn.Module | None = None,
    aligned: bool = False,
) -> tuple[Tensor, Tensor]:
    """Softmax attention with the position scheme's logits and value term; returns (out, probs).

    Shapes: q (B, H, *, Tq, D), k/v (B, H, *, Tk, D), mask broadcastable to the logits (True = attend).
    Usable on blocks (extra * dims) by banded / blocked kernels. ``aligned``: the call is the whole bottom-right
    aligned key set and ``ForwardContext.aligned`` holds (see ``Position.logits_aligned``).
    """
    scores = position.logits_aligned if aligned else position.logits
    logits = scores(q, k, q_pos, k_pos, layer)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if mask is not None:
        probs = torch.nan_to_num(probs, nan=0.0)  # blocks in which a query sees no key
    dropped = dropout(probs) if dropout is not None else probs
    out = torch.matmul(dropped, v)
    extra = position.value_term(dropped, q_pos, k_pos, layer)
    return (out if extra is None else out + extra), probs


class Attention(nn.Module):
    """Multi-head attention with pluggable kernel. Registered subclasses set ``Options`` and ``capabilities``."""

    Options: ClassVar[type]
    capabilities: ClassVar[Any]
    registry_name: ClassVar[str]
    position: Position
    position_kinds: ClassVar[frozenset[str]] = frozenset({"none", "input", "qk", "bias", "scores"})
    """Position kinds this kernel supports (kernel/linear attentions cannot take logit biases)."""
    drops_invalid_keys: ClassVar[bool] = False
    """True when keys masked for every query change nothing but rounding (a dense masked softmax: their
    weight is exactly 0), so the XL memory may leave its never-visible columns out (``read_visible``)."""
    kernel_form: ClassVar[bool] = True
    """True when :meth:`core` on q, k, v alone is the layer's computation (what the benchmark's ``kernel``
    target times); False for recurrent mixers whose gates read the layer input (time them per layer)."""
    segment_masks: ClassVar[bool] = False
    """True when the kernel masks keys of other segments (``ForwardContext.segment``, see
    :func:`same_segment`), so a chunk may restart rows inside it (``Backbone.forward(starts=...)``)."""

    @classmethod
    def masks_segments(cls, options: Any) -> bool:
        """Whether the kernel, with these options, masks keys of other segments (default: ``segment_masks``)."""
        return cls.segment_masks

    def __init__(self, cfg: Any, options: Any, position: Position, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options
        # A plain reference, not a submodule: the scheme is owned (and moved / saved) once by the Backbone.
        object.__setattr__(self, "position", position)
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.d_head = cfg.d_head
        self.causal = cfg.causal
        d = cfg.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(cfg.dropout)

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        """Raise ValueError for combinations this attention cannot run (called by BackboneConfig)."""
        from rl_transformers.backbone import registry

        kind = registry.get("position", cfg.position).cls.kind
        if kind not in cls.position_kinds:
            raise ValueError(
                f"attention {cls.registry_name!r} cannot use position {cfg.position!r} (a {kind!r} scheme); "
                f"it supports {sorted(cls.position_kinds)} schemes, e.g. position='rope' or 'none'"
            )

    # -- helpers ----------------------------------------------------------------------------------------------
    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, d) -> (B, H, T, D)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, T, D) -> (B, T, d)."""
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)

    # -- state ------------------------------------------------------------------------------------------------
    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        """Empty streaming state (default: an empty KV cache)."""
        return KVCache.empty(batch, self.n_heads, self.d_head, device, dtype)

    @property
    def cannot_stream(self) -> str | None:
        """Why this configuration cannot continue from a non-empty cache (None = it can). Checked by :meth:`core`."""
        return None

    @property
    def max_cache(self) -> int | None:
        """Bound on cached keys (None = unbounded). Variants with a window override this."""
        return getattr(self.options, "max_cache", None)

    # -- forward ----------------------------------------------------------------------------------------------
    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        """x (B, T, d) -> (y (B, T, d), new state)."""
        pos, valid = ctx.pos, ctx.valid
        q = self.position.transform_q(self.split_heads(self.q_proj(x)), pos, self.layer)
        application = len(ctx.attention_inputs)  # = layer index, or step index under universal depth
        ctx.attention_inputs.append(x)
        mem = ctx.memory_for(application)
        key_features = kf_new = None
        if mem is None:
            k_pos, k_valid = pos, valid
            k_lin, v_lin = self.k_proj(x), self.v_proj(x)
        elif mem.k is not None and mem.v is not None and not torch.is_grad_enabled():
            # Acting: the memory's projections were cached when its tokens entered (the weights are fixed
            # while acting), so only the new tokens are projected; the memory keeps theirs (XL ``write``).
            k_pos, k_valid = memory_keys(ctx, mem)
            k_new, v_new = self.k_proj(x), self.v_proj(x)
            if mem.kf is not None:  # and their key features (feature-map attentions): the new tokens' only
                kf_new = self.memory_key_features(k_new, pos)
                assert kf_new is not None
                key_features = torch.cat([mem.kf.to(kf_new.dtype), kf_new], dim=2)
                ctx.extras.setdefault("memory_key_features", {})[application] = key_features
            ctx.extras.setdefault("memory_projections", {})[application] = (k_new, v_new, kf_new)
            k_lin = torch.cat([mem.k.to(x.dtype), k_new], dim=1)
            v_lin = torch.cat([mem.v.to(x.dtype), v_new], dim=1)
        else:  # Transformer-XL style: hidden states prepended on the key/value side
            k_pos, k_valid = memory_keys(ctx, mem)
            kv_in = torch.cat([mem.h.to(x.dtype), x], dim=1)
            k_lin, v_lin = self.k_proj(kv_in), self.v_proj(kv_in)
        k = self.split_heads(k_lin)
        # with cached key features (position transform included) the kernel reads only k's shape
        if key_features is None:
            k = self.position.transform_k(k, k_pos, self.layer)
        v = self.split_heads(v_lin)
        out, state = self.core(q, k, v, pos, k_pos, k_valid, ctx, state)
        if mem is not None and mem.hook is not None:  # the memory reads this layer / mixes in retrieval (knn)
            out = mem.hook(self, x, out, ctx)
        return self.o_proj(self.merge_heads(out)), state

    def memory_key_features(self, k_lin: Tensor, k_pos: Tensor) -> Tensor | None:
        """What acting may cache per memory column beyond its key projection ``k_lin`` (B, M, d) at positions
        ``k_pos`` (B, M): a feature-map attention's key features (B, H, M, F); None (the default) caches
        nothing more. Must depend on each key alone and on weights fixed while acting."""
        return None

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
        """Default stateful wrapper: exact KV cache (bounded by ``max_cache``) around :meth:`attend`."""
        if isinstance(state, KVCache):
            if state.length > 0 and (reason := self.cannot_stream) is not None:
                raise ValueError(reason)
            full = state.append(k, v, k_pos, k_valid)  # one concatenation serves the kernel and the new state
            k, v, k_pos, k_valid = full.k, full.v, full.pos, full.valid
            if ctx.segment is not None:  # keys of segments before a row's last restart leave the cache
                last = ctx.segment[:, -1:]
                full = KVCache(k, v, k_pos, k_valid & (key_segments(ctx, k.shape[2]) == last))
            new_state = full.trimmed(self.max_cache)
        else:
            new_state = state
        return self.attend(q, k, v, q_pos, k_pos, k_valid, ctx), new_state

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """Stateless kernel: (B, H, T, D) output of the T queries over the S keys."""
        raise NotImplementedError
