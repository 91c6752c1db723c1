"""Compressed key/value sets: ``linformer`` and ``memory_compressed``.

``linformer`` (Wang et al. 2020, arXiv 2006.04768): learned projections E, F in R^{k x max_len} map the S keys
and values along the sequence to k rows, head_i = softmax(Q_i (E K_i)^T / sqrt(D)) (F V_i); a sequence of
S <= max_len keys uses the first S columns of E and F, padded keys are zeroed before the projection. Sharing
(paper §4): ``none`` (E_i, F_i per head), ``headwise`` (one E, one F for all heads), ``key_value`` (E = F),
``layerwise`` (one E = F for all heads and layers; the parameter is owned - registered, saved and moved - by
the first layer built, the other layers hold a plain reference to it). Every output mixes all positions, so
the entry is bidirectional only, and there is no streaming form. Time O(T·k·D), memory O(T·k).

``memory_compressed`` (Liu et al. 2018, arXiv 1801.10198): keys and values are cut into blocks of c tokens
(c = ``rate``) and each block is compressed by a strided convolution (kernel = stride = c; weights per head or
shared by the heads, initialised as mean pooling), dividing the key count by c. Causal: a query attends the
compressed blocks entirely in its past; with ``local=True`` (default) it attends its own, still incomplete
block exactly (keys of its block up to itself) and the earlier blocks compressed; with ``local=False`` it
attends the compressed blocks that end at or before it, plus its own key. Blocks are cut at positions since
reset (block = position // c), so streaming is exact: the state holds the compressed blocks completed so far
and the raw keys of the current block (O(L/c + c) per head). Bidirectional: all other blocks compressed (+ the
own block exact with ``local``). Time and memory O(T·(T/c + c)).

Both compute logits from content only (compressed keys have no single position), so they accept positional
schemes of kind none / input / qk (e.g. rope applied before the compression). Shapes: q (B, H, T, D); k, v
(B, H, S, D); E, F (H|1, k, max_len); compressed blocks (B, H, n, D).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _dense
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_choice, check_int
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State

CONTENT_POSITIONS = frozenset({"none", "input", "qk"})

# ----------------------------------------------------------------------------------------------------- linformer
Share = Literal["none", "headwise", "key_value", "layerwise"]
SHARES: tuple[str, ...] = get_args(Share)

_LAYERWISE: weakref.WeakKeyDictionary[nn.Module, nn.Parameter] = weakref.WeakKeyDictionary()
"""The layer-shared projection of each backbone, keyed by the backbone's (single) position module."""


@dataclass(frozen=True)
class LinformerOptions:
    k: int = 32
    """Projected length: keys and values are mapped to k rows."""
    max_len: int = 256
    """Longest key sequence (E, F have max_len columns; shorter sequences use the first S)."""
    share: Share = "headwise"
    """Projection sharing: none | headwise | key_value | layerwise (Wang 2020, §4)."""

    def __post_init__(self) -> None:
        for name in ("k", "max_len"):
            check_int(f"linformer {name}", getattr(self, name), 1)
        check_choice("linformer share", self.share, Share)


@register(
    "attention",
    "linformer",
    options=LinformerOptions,
    capabilities=Capabilities(causal=False, exact=False, streaming="none", noncausal=True),
)
class LinformerAttention(Attention):
    position_kinds = CONTENT_POSITIONS

    def __init__(self, cfg: Any, options: LinformerOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        shape = (cfg.n_heads if options.share == "none" else 1, options.k, options.max_len)

        def init() -> nn.Parameter:
            # Johnson-Lindenstrauss style init: entries N(0, 1/k) (Wang 2020, Theorem 2).
            return nn.Parameter(torch.randn(shape) / math.sqrt(options.k))

        self.e: nn.Parameter | None = None
        self.f: nn.Parameter | None = None
        if options.share == "layerwise":
            shared = _LAYERWISE.get(position)
            if shared is None:
                self.e = init()
                _LAYERWISE[position] = self.e
            else:
                object.__setattr__(self, "_shared", shared)  # a reference, not a registered parameter
        else:
            self.e = init()
            if options.share != "key_value":
                self.f = init()

    @property
    def projections(self) -> tuple[Tensor, Tensor]:
        """(E, F), each (H|1, k, max_len)."""
        e = self.e if self.e is not None else self.__dict__["_shared"]
        return e, (self.f if self.f is not None else e)

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> None:
        return None

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
        s = k.shape[2]
        if s > self.options.max_len:
            raise ValueError(
                f"linformer got {s} keys but max_len={self.options.max_len}; raise attention_options max_len"
            )
        e, f = self.projections
        keep = k_valid[:, None, :, None].to(k.dtype)
        kp = torch.einsum("hns,bhsd->bhnd", e[..., :s].to(k.dtype), k * keep)
        vp = torch.einsum("hns,bhsd->bhnd", f[..., :s].to(v.dtype), v * keep)
        dropout_p = self.attn_dropout.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, kp, vp, dropout_p=dropout_p)


# --------------------------------------------------------------------------------------------- memory_compressed
@dataclass(frozen=True)
class MemoryCompressedOptions:
    rate: int = 3
    """c: compression factor = kernel = stride of the convolution (Liu 2018 use 3)."""
    per_head: bool = True
    """Separate convolution weights per head (False: one convolution shared by the heads)."""
    local: bool = True
    """Attend the own block's keys exactly (and only earlier blocks compressed)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rate, int) or self.rate < 1:
            raise ValueError(f"memory_compressed rate must be an int >= 1, got {self.rate!r}")


@dataclass
class CompressedState(State):
    """Streaming state of ``memory_compressed``.

    ck, cv: (B, H, N, D) compressed blocks, slot b = block b since reset; cvalid: (B, N) (block holds a valid
    key); pk, pv: (B, H, c, D) raw keys / values of the current block, slot = position mod c; pvalid: (B, c).
    """

    ck: Tensor
    cv: Tensor
    cvalid: Tensor
    pk: Tensor
    pv: Tensor
    pvalid: Tensor


class BlockOperands(NamedTuple):
    """One call's block-aligned operands of the block attention (:meth:`MemoryCompressedAttention.fused_blocks`,
    ``eager_blocks``)."""

    qa: Tensor
    """(B, H, n, c, D) queries, aligned to blocks of c."""
    keys_c: Tensor
    """(B, H, n_old + n, D) compressed keys: the state's blocks, then this call's."""
    vals_c: Tensor
    """(B, H, n_old + n, D) compressed values."""
    kb: Tensor
    """(B, H, n, c, D) exact keys, aligned."""
    vb: Tensor
    """(B, H, n, c, D) exact values, aligned."""
    see: Tensor
    """(n, c, n) which compressed blocks each query block sees."""
    comp_valid: Tensor
    """(B, n) this call's compressed blocks that hold a real key."""
    old_valid: Tensor
    """(B, n_old) the state's compressed blocks that hold a real key."""
    allow_l: Tensor
    """(B, n, c, c) the exact keys of its own block each query sees."""


@register(
    "attention",
    "memory_compressed",
    options=MemoryCompressedOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class MemoryCompressedAttention(Attention):
    position_kinds = CONTENT_POSITIONS

    def __init__(self, cfg: Any, options: MemoryCompressedOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        c, d = options.rate, cfg.d_head
        lead = (cfg.n_heads,) if options.per_head else ()
        pool = torch.eye(d).expand(*lead, c, d, d) / c  # mean pooling over the block
        self.conv_k = nn.Parameter(pool.clone())
        """(H|-, c, D, D) key convolution: block (c, D) -> D, out_e = sum_{s,d} x[s, d] W[s, d, e] + b_e."""
        self.conv_v = nn.Parameter(pool.clone())
        """(H|-, c, D, D) value convolution."""
        self.bias_k = nn.Parameter(torch.zeros(*lead, d))
        self.bias_v = nn.Parameter(torch.zeros(*lead, d))

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if cfg.memory is not None:
            raise ValueError(
                f"attention 'memory_compressed' keeps its own compressed streaming state; use memory=None "
                f"(got memory={cfg.memory!r})"
            )

    def compress(self, blocks: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """(B, H, n, c, D) -> (B, H, n, D): the strided convolution applied to each block."""
        w, bias = weight.to(blocks.dtype), bias.to(blocks.dtype)
        if self.options.per_head:
            return torch.einsum("bhncd,hcde->bhne", blocks, w) + bias[:, None, :]
        return torch.einsum("bhncd,cde->bhne", blocks, w) + bias

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> CompressedState:
        h, d, c = self.n_heads, self.d_head, self.options.rate
        return CompressedState(
            ck=torch.zeros(batch, h, 0, d, device=device, dtype=dtype),
            cv=torch.zeros(batch, h, 0, d, device=device, dtype=dtype),
            cvalid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
            pk=torch.zeros(batch, h, c, d, device=device, dtype=dtype),
            pv=torch.zeros(batch, h, c, d, device=device, dtype=dtype),
            pvalid=torch.zeros(batch, c, dtype=torch.bool, device=device),
        )

    def fused_blocks(self, blocks: BlockOperands) -> Tensor:
        """Causal long calls: (B, H, La, D) by chunks of query blocks, each one SDPA call over the compressed
        keys so far and the chunk's exact keys with an additive mask (the same key sets as the dense form)."""
        qa, keys_c, vals_c, kb, vb, see, comp_valid, old_valid, allow_l = blocks
        b, h, n, c, d = qa.shape
        n_old = old_valid.shape[1]
        per = max(1, _dense.FUSED_CHUNK // c)  # query blocks per chunk
        zero = torch.zeros((), dtype=qa.dtype, device=qa.device)
        neg = torch.full((), float("-inf"), dtype=qa.dtype, device=qa.device)
        p = self.attn_dropout.p if self.training else 0.0
        outs = []
        for s0 in range(0, n, per):
            s1 = min(n, s0 + per)
            m, width = s1 - s0, (s1 - s0) * c
            keys = torch.cat([keys_c[:, :, : n_old + s1], kb[:, :, s0:s1].reshape(b, h, width, d)], dim=2)
            vals = torch.cat([vals_c[:, :, : n_old + s1], vb[:, :, s0:s1].reshape(b, h, width, d)], dim=2)
            ok_c = see[s0:s1, :, :s1].reshape(1, width, s1) & comp_valid[:, None, :s1]
            diag = torch.eye(m, dtype=torch.bool, device=qa.device)[None, :, None, :, None]
            ok_l = (diag & allow_l[:, s0:s1, :, None, :]).reshape(b, width, width)  # block-diagonal
            ok = torch.cat([old_valid[:, None, :].expand(b, width, n_old), ok_c, ok_l], dim=-1)
            q_chunk = qa[:, :, s0:s1].reshape(b, h, width, d)
            mask = torch.where(ok, zero, neg)[:, None]
            outs.append(
                F.scaled_dot_product_attention(
                    q_chunk, keys, vals, attn_mask=mask, dropout_p=p, scale=self.position.scale
                )
            )
        return torch.cat(outs, dim=2)

    def eager_blocks(self, blocks: BlockOperands) -> Tensor:
        """:meth:`fused_blocks`'s result in one masked softmax over every query block."""
        qa, keys_c, vals_c, kb, vb, see, comp_valid, old_valid, allow_l = blocks
        b, h, n, c, d = qa.shape
        n_old = old_valid.shape[1]
        allow_c = torch.cat(
            [
                old_valid[:, None, None, :].expand(b, n, c, n_old),
                see[None] & comp_valid[:, None, None, :],
            ],
            dim=-1,
        )
        scale = self.position.scale
        logits = torch.cat(
            [
                # one (La, D) x (D, N) product per head: broadcasting keys over the query blocks would copy them
                torch.matmul(qa.view(b, h, n * c, d), keys_c.transpose(-1, -2)).view(b, h, n, c, -1) * scale,
                torch.matmul(qa, kb.transpose(-1, -2)) * scale,  # (B, H, n, c, c)
            ],
            dim=-1,
        )
        allowed = torch.cat([allow_c, allow_l], dim=-1)[:, None]
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        probs = self.attn_dropout(probs) if self.training else probs
        n_c = keys_c.shape[2]
        return torch.matmul(probs[..., :n_c].reshape(b, h, n * c, n_c), vals_c) + torch.matmul(
            probs[..., n_c:], vb
        ).view(b, h, n * c, d)

    def _visibility(self, n: int, vblk: Tensor) -> tuple[Tensor, Tensor]:
        """Which compressed blocks each query slot sees, (n, c, n), and which exact keys of its own block,
        (B, n, c, c).

        Causal: the earlier blocks, and with ``local`` off also the own block from its last slot (once it is
        complete). Non-causal: every other block, or every block with ``local`` off. Exact keys of the own block:
        with ``local``, the valid ones up to the query's slot (causal) or all of them; always the query's own."""
        c, causal, dev = self.options.rate, self.causal, vblk.device
        beta = torch.arange(n, device=dev)
        qb = beta[:, None]  # query block (n, 1)
        slot = torch.arange(c, device=dev)
        last = (slot == c - 1)[None, :, None]  # (1, c, 1) query is the last of its block
        if causal:
            earlier = beta[None, None, :] < qb[:, :, None]  # (n, 1, n)
            see = (
                earlier if self.options.local else earlier | ((beta[None, None, :] == qb[:, :, None]) & last)
            )
        else:
            others = beta[None, None, :] != qb[:, :, None]
            see = others if self.options.local else torch.ones_like(others)
        if self.options.local:
            own = slot[None, :] <= slot[:, None] if causal else torch.ones(c, c, dtype=torch.bool, device=dev)
        else:
            own = torch.zeros(c, c, dtype=torch.bool, device=dev)
        allow_l = (own[None, None] & vblk[:, :, None, :]) | torch.eye(c, dtype=torch.bool, device=dev)
        return see.expand(n, c, n), allow_l

    def _next_state(
        self,
        state: CompressedState,
        ck: Tensor,
        cv: Tensor,
        comp_valid: Tensor,
        kb: Tensor,
        vb: Tensor,
        vblk: Tensor,
        p0: Tensor,
        t: int,
    ) -> CompressedState:
        """Write this call's complete blocks (ck, cv at block β, valid where comp_valid) at slot p0 // c + β of
        the state and keep the last, incomplete block of the aligned keys kb, vb (B, h, n, c, d) as pending."""
        b, h, n, c, d = kb.shape
        r, first, n_old = p0 % c, p0 // c, state.ck.shape[2]
        beta = torch.arange(n, device=kb.device)
        complete = (beta[None, :] + 1) * c <= (r[:, None] + t)
        n_new = max(n_old, int((first + complete.sum(-1)).max()))
        target = torch.where(
            complete, first[:, None] + beta[None, :], torch.full_like(complete, n_new, dtype=torch.long)
        )
        idx = target[:, None, :, None].expand(b, h, n, d)

        def store(old: Tensor, new: Tensor) -> Tensor:
            base = F.pad(old, (0, 0, 0, n_new + 1 - n_old))
            return base.scatter(2, idx, new)[:, :, :n_new]

        cvalid = F.pad(state.cvalid, (0, n_new + 1 - n_old), value=False).scatter(1, target, comp_valid)
        end = r + t  # aligned slots filled so far
        cur = end // c  # (B,) the incomplete block
        fill = torch.arange(c, device=kb.device)[None, :] < (end - cur * c)[:, None]
        pick = cur[:, None, None, None, None].expand(b, h, 1, c, d)
        return CompressedState(
            ck=store(state.ck, ck),
            cv=store(state.cv, cv),
            cvalid=cvalid[:, :n_new],
            pk=kb.gather(2, pick).squeeze(2),
            pv=vb.gather(2, pick).squeeze(2),
            pvalid=vblk.gather(1, cur[:, None, None].expand(b, 1, c)).squeeze(1) & fill,
        )

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
        if k.shape[2] != t:
            raise ValueError("memory_compressed takes no key prefix (memory); keys must be the new tokens")
        c, dev = self.options.rate, q.device
        causal = self.causal
        if causal and isinstance(state, CompressedState):
            pk, pv, pvalid = state.pk, state.pv, state.pvalid
            old_k, old_v, old_valid = state.ck, state.cv, state.cvalid
        else:
            pk = pv = q.new_zeros(b, h, c, d)
            pvalid = torch.zeros(b, c, dtype=torch.bool, device=dev)
            old_k = old_v = q.new_zeros(b, h, 0, d)
            old_valid = torch.zeros(b, 0, dtype=torch.bool, device=dev)
        # Block-aligned sequence: aligned slot u holds position (p0 // c)·c + u of the row; the first r = p0 mod c
        # slots come from the pending block of the state, then the T new tokens, then empty slots.
        p0 = q_pos[:, 0] if causal else torch.zeros(b, dtype=torch.long, device=dev)
        r = p0 % c
        n = math.ceil((c + t) / c) if causal else math.ceil(t / c)
        la = n * c
        u = torch.arange(la, device=dev)
        new_slot = u[None, :] - r[:, None]  # (B, La) index of the new token in slot u
        is_new = (new_slot >= 0) & (new_slot < t)
        src = torch.where(u[None, :] < r[:, None], u[None, :], torch.where(is_new, c + new_slot, c + t))

        def align(pending: Tensor, x: Tensor) -> Tensor:
            seq = torch.cat([pending, x, x.new_zeros(b, h, 1, d)], dim=2)
            return seq.gather(2, src[:, None, :, None].expand(b, h, la, d))

        none = torch.zeros(b, 1, dtype=torch.bool, device=dev)
        valid = torch.cat([pvalid, k_valid, none], dim=1).gather(1, src)
        keep = valid[:, None, :, None].to(k.dtype)
        ka, va = align(pk, k) * keep, align(pv, v) * keep
        qa = align(pk.new_zeros(b, h, c, d), q).view(b, h, n, c, d)
        kb, vb, vblk = ka.view(b, h, n, c, d), va.view(b, h, n, c, d), valid.view(b, n, c)
        beta = torch.arange(n, device=dev)
        complete = (
            (beta[None, :] + 1) * c <= (r[:, None] + t)
            if causal
            else torch.ones(b, n, dtype=torch.bool, device=dev)
        )
        comp_valid = complete & vblk.any(-1)  # (B, n)
        ck = self.compress(kb, self.conv_k, self.bias_k)
        cv = self.compress(vb, self.conv_v, self.bias_v)
        # Compressed keys: the state's blocks (all earlier than any new query) and this call's blocks.
        keys_c = torch.cat([old_k, ck], dim=2)
        vals_c = torch.cat([old_v, cv], dim=2)
        see, allow_l = self._visibility(n, vblk)
        attend = self.fused_blocks if causal and _dense.prefer_fused(la) else self.eager_blocks
        out = attend(BlockOperands(qa, keys_c, vals_c, kb, vb, see, comp_valid, old_valid, allow_l))
        out = out.gather(2, (r[:, None] + torch.arange(t, device=dev))[:, None, :, None].expand(b, h, t, d))
        if not (causal and isinstance(state, CompressedState)):
            return out, state
        return out, self._next_state(state, ck, cv, comp_valid, kb, vb, vblk, p0, t)
