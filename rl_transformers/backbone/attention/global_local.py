"""Window + global patterns: ``longformer`` and ``etc`` here, ``bigbird`` (:mod:`.global_local_bigbird`) on the same base.

``longformer`` (Beltagy et al. 2020, arXiv 2004.05150): a (dilated) sliding window plus global tokens. Head h
with dilation d_h sees keys j with |i - j| <= w·d_h and (i - j) mod d_h == 0 (causal: 0 <= i - j; so w + 1 keys
incl. itself causal, 2w + 1 bidirectional). ``global_tokens`` are absolute positions (since reset) that are
symmetric: a global query attends every key, and every query attends the global keys; causal: only keys j <= i
in both directions. Streaming keeps a bounded state: a window of the last max(w·max d, max global position)
keys plus the keys of the global positions seen so far (exact).

``etc`` (Ainslie et al. 2020, arXiv 2004.08483, global-local attention): the first ``n_global`` positions are the
global input (g2g, g2l: they attend every key) and all later positions the long input; long tokens attend all
global tokens (l2g) and the long tokens within radius r (l2l, |i - j| <= r); causal: keys j <= i everywhere.
We chose existing tokens (the first n_global positions, e.g. a task / return-to-go prefix) rather than separate
learned global tokens, which would need hidden states of their own flowing through every layer of the stack.
Same bounded streaming state as ``longformer``.

All three (``bigbird`` too) run on :class:`_GlobalLocal`: a band (window) part, a global-column part and a
random-block part merged exactly by log-sum-exp, plus dense rows for the global queries (see ``_banded``):
O(T·(w·d + G) + G·S) per head for longformer / etc; never T x S.
Shapes: q (B, H, T, D), k, v (B, H, S, D), q_pos (B, T), k_pos, k_valid (B, S).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from rl_transformers.backbone.attention._banded import (
    Keys,
    Part,
    band_part,
    columns_part,
    explicit_keys,
    gather_keys,
    global_rows,
    merge_parts,
    position_index,
)
from rl_transformers.backbone.attention._dense import dense_pattern, prefer_dense, windowed_pattern
from rl_transformers.backbone.attention._flex import flex_pattern, use_flex
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_int, check_positions
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import KVCache, State


@dataclass
class GlobalWindowCache(State):
    """Streaming state of window + global attention.

    window: the last keys (bounded KV cache); k, v (B, H, G, D) and valid (B, G): keys of the global positions
    already seen (slot g holds global position g of the options).
    """

    window: KVCache
    k: Tensor
    v: Tensor
    valid: Tensor


class _GlobalLocal(Attention):
    """Window (optionally dilated per head) + symmetric global tokens, with a bounded streaming state."""

    def global_positions(self) -> tuple[int, ...]:
        raise NotImplementedError

    def reach(self) -> int:
        """Largest |i - j| the window part may reach."""
        raise NotImplementedError

    def window_allow(self, qp: Tensor, kp: Tensor) -> Tensor:
        raise NotImplementedError

    window_per_head: ClassVar[bool] = False
    """Whether the window differs between heads (longformer's dilations)."""

    def head_window_allow(self, h: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
        """:meth:`window_allow` of head h for one query / key (the flex form); default: the same for all heads."""
        return self.window_allow(qp, kp)

    @property
    def max_cache(self) -> int | None:
        return max([self.reach(), *self.global_positions()])

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        window = KVCache.empty(batch, self.n_heads, self.d_head, device, dtype)
        g = len(self.global_positions())
        if g == 0:
            return window
        return GlobalWindowCache(
            window=window,
            k=torch.zeros(batch, self.n_heads, g, self.d_head, device=device, dtype=dtype),
            v=torch.zeros(batch, self.n_heads, g, self.d_head, device=device, dtype=dtype),
            valid=torch.zeros(batch, g, dtype=torch.bool, device=device),
        )

    def _gpos(self, device: torch.device) -> Tensor:
        return torch.tensor(self.global_positions(), dtype=torch.long, device=device)

    def _sequence_globals(
        self, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, k_valid: Tensor, gpos: Tensor
    ) -> Keys:
        want = gpos.expand(q_pos.shape[0], 1, -1)
        return gather_keys(k, v, k_pos, k_valid, position_index(q_pos, k.shape[2], want), expected_pos=want)

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
        if not isinstance(state, GlobalWindowCache):
            return super().core(q, k, v, q_pos, k_pos, k_valid, ctx, state)
        cache = state.window
        window = cache.append(k, v, k_pos, k_valid, self.max_cache)
        k = torch.cat([cache.k, k], dim=2)
        v = torch.cat([cache.v, v], dim=2)
        k_pos = torch.cat([cache.pos, k_pos], dim=1)
        k_valid = torch.cat([cache.valid, k_valid], dim=1)
        seen = self._sequence_globals(k, v, q_pos, k_pos, k_valid, self._gpos(q.device))
        keep = state.valid[:, None, :, None]
        gk = torch.where(keep, state.k, seen.k[:, :, 0])
        gv = torch.where(keep, state.v, seen.v[:, :, 0])
        gvalid = state.valid | seen.valid[:, 0]
        out = self.kernel(q, k, v, q_pos, k_pos, k_valid, (gk, gv, gvalid))
        return out, GlobalWindowCache(window, gk, gv, gvalid)

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
        return self.kernel(q, k, v, q_pos, k_pos, k_valid, None, ctx)

    def extra_parts(
        self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, k_valid: Tensor, is_global: Any
    ) -> list[Part]:
        """Further disjoint parts (bigbird's random blocks)."""
        return []

    def extra_allow(self, q_pos: Tensor, k_pos: Tensor) -> Any:
        """The pairs of :meth:`extra_parts` as an ``allow`` function for the dense form (None: no pairs)."""
        return None

    def keys_per_query(self, s: int) -> int:
        """Keys a query of the blocked form gathers (decides the dense form, see ``prefer_dense``)."""
        return 2 * self.reach() + 1 + len(self.global_positions())

    def kernel(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        stored: tuple[Tensor, Tensor, Tensor] | None,
        ctx: ForwardContext | None = None,
    ) -> Tensor:
        gpos = self._gpos(q.device)
        s = k.shape[2]

        def is_global(p: Tensor) -> Tensor:
            if gpos.numel() == 0:
                return torch.zeros_like(p, dtype=torch.bool)
            return (p.unsqueeze(-1) == gpos).any(dim=-1)

        reach = self.reach()

        def union(qp: Tensor, kp: Tensor) -> Tensor:  # called only when the mask is not cached
            extra = self.extra_allow(q_pos, k_pos)
            allowed = self.window_allow(qp, kp) | is_global(kp) | is_global(qp)
            return allowed if extra is None else allowed | extra(qp, kp)

        key = (type(self).__name__, self.options, self.n_heads, self.causal)  # same pattern in every layer
        bound = getattr(self.options, "max_cache", None)  # bigbird's option (the others keep their globals)
        if stored is None and use_flex(self, q):
            extra = self.extra_allow(q_pos, k_pos)  # built once, not per call of the predicate

            def keep(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
                allowed = self.head_window_allow(h, qp, kp) | is_global(kp) | is_global(qp)
                return allowed if extra is None else allowed | extra(qp, kp)

            heads = self.window_per_head
            return flex_pattern(
                self, q, k, v, q_pos, k_pos, k_valid, None, keep=keep, per_head=heads, window=bound
            )
        if stored is None and bound is not None:
            return windowed_pattern(self, q, k, v, q_pos, k_pos, k_valid, union, bound, ctx, key)
        if stored is None and prefer_dense(s, self.keys_per_query(s)):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, union, ctx, key)
        windows = [(-reach, 0 if self.causal else reach)]
        parts = [
            band_part(
                self, q, k, v, q_pos, k_pos, k_valid, windows,
                lambda qp, kp: self.window_allow(qp, kp) & ~is_global(kp),
            )
        ]  # fmt: skip
        if gpos.numel():
            if stored is None:
                keys = self._sequence_globals(k, v, q_pos, k_pos, k_valid, gpos)
            else:
                gk, gv, gvalid = stored
                keys = explicit_keys(gk, gv, gpos.expand(q.shape[0], -1), gvalid)
            parts.append(columns_part(self, q, q_pos, s, keys, lambda qp, kp: kp != qp))
        parts += self.extra_parts(q, k, v, q_pos, k_pos, k_valid, is_global)
        out = merge_parts(parts)
        if gpos.numel():
            out = global_rows(self, q, k, v, q_pos, k_pos, k_valid, gpos, out)
        return out


# ------------------------------------------------------------------------------------------------ longformer
@dataclass(frozen=True)
class LongformerOptions:
    window: int = 32
    """w: keys on each side of the query (causal: before it) within the (dilated) window."""
    dilation: tuple[int, ...] = (1,)
    """d: gap between window keys, one value for all heads or one per head (n_heads values)."""
    global_tokens: tuple[int, ...] = (0,)
    """Absolute positions (since reset) of the global tokens: they attend everything and all attend them."""

    def __post_init__(self) -> None:
        check_int("longformer window", self.window, 0)
        if not isinstance(self.dilation, tuple) or not self.dilation:
            raise ValueError(
                f"longformer dilation must be a non-empty tuple of ints >= 1, got {self.dilation!r}"
            )
        for d in self.dilation:
            check_int("longformer dilation", d, 1)
        check_positions("longformer global_tokens", self.global_tokens)


@register(
    "attention",
    "longformer",
    options=LongformerOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class LongformerAttention(_GlobalLocal):
    dil: Tensor
    """(1, H, 1, 1, 1) dilation of each head."""

    def __init__(self, cfg: Any, options: LongformerOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        dil = options.dilation * cfg.n_heads if len(options.dilation) == 1 else options.dilation
        self.register_buffer(
            "dil", torch.tensor(dil, dtype=torch.long).view(1, -1, 1, 1, 1), persistent=False
        )

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if len(options.dilation) not in (1, cfg.n_heads):
            raise ValueError(
                f"longformer dilation needs 1 or n_heads={cfg.n_heads} values, got {options.dilation!r}"
            )

    def global_positions(self) -> tuple[int, ...]:
        return tuple(sorted(self.options.global_tokens))

    def reach(self) -> int:
        return self.options.window * max(self.options.dilation)

    def window_allow(self, qp: Tensor, kp: Tensor) -> Tensor:
        d = self.dil.to(qp.device)
        delta = qp - kp
        return (delta.abs() <= self.options.window * d) & (delta.remainder(d) == 0)

    window_per_head = True

    def head_window_allow(self, h: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
        d = self.dil.flatten()[h]
        delta = qp - kp
        return (delta.abs() <= self.options.window * d) & (delta.remainder(d) == 0)


# ------------------------------------------------------------------------------------------------------- etc
@dataclass(frozen=True)
class EtcOptions:
    window: int = 32
    """r: local radius of the long-to-long part (|i - j| <= r; causal: 0 <= i - j <= r)."""
    n_global: int = 2
    """The first n_global positions (since reset) are the global input."""

    def __post_init__(self) -> None:
        check_int("etc window", self.window, 0)
        check_int("etc n_global", self.n_global, 0)


@register(
    "attention",
    "etc",
    options=EtcOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class EtcAttention(_GlobalLocal):
    def global_positions(self) -> tuple[int, ...]:
        return tuple(range(self.options.n_global))

    def reach(self) -> int:
        return self.options.window

    def window_allow(self, qp: Tensor, kp: Tensor) -> Tensor:
        return (qp - kp).abs() <= self.options.window
