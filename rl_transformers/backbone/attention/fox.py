"""``fox``: forgetting attention, the Forgetting Transformer's softmax attention (Lin et al. 2025, arXiv 2503.02130).

Each head has a scalar forget gate per token, f_t = σ(w_h · x_t + b_h), and the logits of softmax attention are
biased by the log-gates accumulated between key and query:

    y_i = Σ_{j ≤ i} softmax_j(q_i · k_j / √D + Σ_{l=j+1..i} log f_l) v_j,

so a key's weight decays with every forget gate after it (f ≡ 1 is causal softmax attention). The bias is D_ij =
c_i - c_j with c the running sum of log f; the attention is exact under its own bias (a dense masked softmax, or
SDPA with an additive float mask when the position scheme leaves the logits alone). Position schemes of every
kind compose with it (the paper's default uses none: the gates order the keys). Acting keeps the exact KV cache
(:class:`FoxState`), and with each cached key r_j = Σ_{l=j+1..last} log f_l, the log-gates since that key, in
float32 and kept relative to the last token so they never drift; ``max_cache`` bounds the cache (a window of
max_cache + 1 keys, in full and chunked runs alike). A padded token's gate is 1 (it forgets nothing); keys of an
earlier episode are masked (``ForwardContext.segment``) and the running sum restarts there. ``sink`` adds
learned sink slots (see ``full``), which take no forget-gate bias. An XL memory does not fold in (its tokens
have no gates): memory must be None. Cost: O(T·S·D) time, O(min(T, 512)·S) memory (blocks of queries); state
O(S·D) per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention._scan import work_dtype
from rl_transformers.backbone.attention.base import (
    Attention,
    attention_entropy,
    key_segments,
)
from rl_transformers.backbone.attention.full import SinkSlots, check_sink
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State

QUERY_BLOCK = 512
"""Queries per block of the dense computation (each block sees only the keys up to its last query)."""


@dataclass
class FoxState(State):
    """The KV cache of ``fox``: k, v (B, H, S, D); pos (B, S); valid (B, S) bool; decay (B, H, S) float32 (at
    least), the log-gates since each key (r_j, ≤ 0). Empty: S = 0; a reset row has no valid key."""

    k: Tensor
    v: Tensor
    pos: Tensor
    valid: Tensor
    decay: Tensor


@dataclass(frozen=True)
class FoxOptions:
    max_cache: int | None = None
    """Keep at most this many past keys (a window of max_cache + 1 keys incl. self); None = unbounded."""
    sink: int = 0
    """Learned sink key / value slots per head that every query may attend to (0 = none)."""

    def __post_init__(self) -> None:
        if self.max_cache is not None and (not isinstance(self.max_cache, int) or self.max_cache < 1):
            raise ValueError(f"max_cache must be a positive int or None, got {self.max_cache!r}")
        check_sink(self.sink)


@register(
    "attention",
    "fox",
    options=FoxOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact", noncausal=False),
)
class FoxAttention(Attention):
    """Softmax attention with a cumulative forget-gate bias (see the module docstring)."""

    kernel_form: ClassVar[bool] = False  # the forget gates read the layer input

    segment_masks = True

    def __init__(self, cfg: Any, options: FoxOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.f_proj = nn.Linear(cfg.d_model, cfg.n_heads)
        """Forget-gate logits, one per head."""
        self.sinks = SinkSlots(cfg.n_heads, options.sink, cfg.d_head) if options.sink else None

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if cfg.memory is not None:
            raise ValueError(
                f"attention 'fox' keeps its own KV cache with the forget gates of its keys; a memory's tokens "
                f"have no gates, got memory={cfg.memory!r}: set memory=None (--backbone.memory None) and bound "
                f"the cache with attention_options max_cache instead"
            )

    def core(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError(
            "attention 'fox' computes its forget gates from the layer input: it has no kernel on (q, k, v) "
            "alone; call the layer (forward) on its input"
        )

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> FoxState:
        h, d = self.n_heads, self.d_head
        return FoxState(
            k=torch.zeros(batch, h, 0, d, device=device, dtype=dtype),
            v=torch.zeros(batch, h, 0, d, device=device, dtype=dtype),
            pos=torch.zeros(batch, 0, dtype=torch.long, device=device),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
            decay=torch.zeros(batch, h, 0, device=device, dtype=work_dtype(dtype)),
        )

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        ctx.attention_inputs.append(x)
        pos, valid = ctx.pos, ctx.valid
        q = self.position.transform_q(self.split_heads(self.q_proj(x)), pos, self.layer)
        k = self.position.transform_k(self.split_heads(self.k_proj(x)), pos, self.layer)
        v = self.split_heads(self.v_proj(x))
        log_f = F.logsigmoid(self.f_proj(x).to(work_dtype(x.dtype))).transpose(1, 2)  # (B, H, T)
        if not ctx.all_valid:
            log_f = log_f * valid[:, None, :].to(log_f.dtype)  # a padded token forgets nothing
        cum = _running_log_gates(log_f, ctx)  # c_i: log-gates from the first new token (of i's episode) to i
        k_pos, k_valid, key_c = pos, valid, cum
        if isinstance(state, FoxState) and state.k.shape[2] > 0:
            k = torch.cat([state.k.to(k.dtype), k], dim=2)
            v = torch.cat([state.v.to(v.dtype), v], dim=2)
            k_pos, k_valid = torch.cat([state.pos, pos], 1), torch.cat([state.valid, valid], 1)
            key_c = torch.cat([-state.decay.to(cum.dtype), cum], dim=-1)  # bias r_j + c_i = c_i - (-r_j)
        t, s = q.shape[2], k.shape[2]
        window = self.options.max_cache
        outs = []
        for r0 in range(0, t, QUERY_BLOCK):  # blocks of queries: O(QUERY_BLOCK · S) memory
            r1 = min(t, r0 + QUERY_BLOCK)
            lo, hi = (0 if window is None else max(0, s - t + r0 - window)), s - t + r1  # keys a row may see
            bias = cum[..., r0:r1, None] - key_c[..., None, lo:hi]  # (B, H, T_block, S_block)
            mask = self._mask(r0, r1, t, lo, hi, k_valid, ctx)
            rows, keys = slice(r0, r1), slice(lo, hi)
            outs.append(
                self._attend(
                    q[:, :, rows], k[:, :, keys], v[:, :, keys], pos[:, rows], k_pos[:, keys], bias, mask, ctx
                )
            )
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        y = self.o_proj(self.merge_heads(out))
        if not isinstance(state, FoxState):
            return y, state
        return y, self._new_state(k, v, k_pos, k_valid, cum[..., -1:] - key_c, ctx, state)

    def _mask(
        self, r0: int, r1: int, t: int, lo: int, hi: int, k_valid: Tensor, ctx: ForwardContext
    ) -> Tensor:
        """(B, 1, r1 - r0, hi - lo) bool: query rows r0..r1 of the T new tokens may see keys lo..hi of the S
        (bottom-right aligned): valid and not later (always itself), within ``max_cache``, of the own episode."""
        s = k_valid.shape[1]
        i = torch.arange(r0, r1, device=k_valid.device)[:, None] + (s - t)
        j = torch.arange(lo, hi, device=k_valid.device)[None, :]
        allowed = k_valid[:, None, None, lo:hi] & (j <= i)
        if self.options.max_cache is not None:
            allowed = allowed & (i - j <= self.options.max_cache)
        allowed = allowed | (j == i)
        if ctx.segment is not None:
            own = ctx.segment[:, None, r0:r1, None] == key_segments(ctx, s)[:, None, None, lo:hi]
            allowed = allowed & own
        return allowed

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        bias: Tensor,
        mask: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """(B, H, T, D): softmax over the keys (a bottom-right aligned suffix of them) with the forget-gate bias
        (and the sink slots)."""
        if not (self.position.modifies_scores or ctx.collect_info or self.sinks is not None):
            float_mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))
            dropout_p = self.attn_dropout.p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, dropout_p=dropout_p)
        scores = self.position.logits_aligned if ctx.aligned else self.position.logits
        logits = (scores(q, k, q_pos, k_pos, self.layer) + bias.to(q.dtype)).masked_fill(~mask, float("-inf"))
        from_sinks = None
        if self.sinks is not None:
            probs, from_sinks = self.sinks.softmax(q, logits)
        else:
            probs = torch.softmax(logits, dim=-1)
        dropped = self.attn_dropout(probs) if self.training else probs
        out = torch.matmul(dropped, v)
        if from_sinks is not None:
            out = out + from_sinks
        extra = self.position.value_term(dropped, q_pos, k_pos, self.layer)
        if ctx.collect_info:
            ctx.add_info(f"backbone/attention_entropy/layer{self.layer}", attention_entropy(probs).detach())
        return out if extra is None else out + extra

    def _new_state(
        self,
        k: Tensor,
        v: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        decay: Tensor,
        ctx: ForwardContext,
        state: FoxState,
    ) -> FoxState:
        """All keys seen, those of a row's earlier episodes invalid, the last ``max_cache`` kept."""
        if ctx.segment is not None:
            k_valid = k_valid & (key_segments(ctx, k.shape[2]) == ctx.segment[:, -1:])
        keep = self.options.max_cache
        if keep is not None and k.shape[2] > keep:
            k, v, k_pos, k_valid, decay = (
                k[:, :, -keep:], v[:, :, -keep:], k_pos[:, -keep:], k_valid[:, -keep:], decay[..., -keep:]
            )  # fmt: skip
        return FoxState(k=k, v=v, pos=k_pos, valid=k_valid, decay=decay.to(state.decay.dtype))


def _running_log_gates(log_f: Tensor, ctx: ForwardContext) -> Tensor:
    """(B, H, T) c_i = Σ_{l ≤ i} log f_l over the new tokens, restarted at each episode start inside the chunk:
    there a sum over the own episode's tokens only (a masked product), so that no gradient, not even rounding,
    reaches an earlier episode's gates through c_i - c_j."""
    seg = ctx.segment
    if seg is None:
        return log_f.cumsum(-1)
    t = seg.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
    own = ((seg[:, :, None] == seg[:, None, :]) & causal).to(log_f.dtype)  # (B, T_i, T_l)
    return torch.einsum("bil,bhl->bhi", own, log_f)
