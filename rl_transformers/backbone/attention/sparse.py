"""Factorised sparse patterns: ``strided``, ``fixed`` (Sparse Transformer) and ``blockwise`` (BlockBERT).

``strided`` (Child et al. 2019, arXiv 1904.10509) with stride l: A(1) = local, query i sees keys j with
0 <= i - j <= l (bidirectional |i - j| <= l); A(2) = strided, keys with (i - j) mod l == 0 (causal: j <= i).
``fixed`` with stride l and c summary positions: A(1) = same block, floor(j / l) == floor(i / l); A(2) = summary
columns, j mod l in {l - c, ..., l - 1} (causal: j <= i). The paper's three ways to use the two patterns are the
option ``combine``: ``"alternate"`` (even layers A(1), odd layers A(2), by ``self.layer``), ``"union"`` (every head
sees A(1) ∪ A(2)) and ``"split_heads"`` (the first ceil(H/2) heads A(1), the others A(2)). A query always sees
itself. A(1) runs as a band, strided A(2) by reshaping the sequence into its l residue classes, fixed A(2) as a
set of gathered summary columns; the parts are merged exactly by log-sum-exp. Cost per head: O(T·l) for A(1),
O(T·S/l) for strided A(2), O(T·c·S/l) for fixed A(2) (the paper takes l ~ sqrt(L)). A(2) looks back without
bound, so streaming keeps the exact unbounded KV cache (an A(1)-only layer under ``"alternate"`` keeps l keys).
Short key sets (RL steps) run the same pattern as one dense masked SDPA call, long causal calls a chunked
fused-kernel form (``_dense``); all forms are tested against the same explicit masks.

``blockwise`` (Qiu et al. 2019, arXiv 1911.02972, BlockBERT): positions are cut into blocks of ``block_size``
tokens, grouped n at a time (``n_blocks``) into super-blocks (the pattern repeats every n·block_size positions,
so streaming is exact with a bounded cache). Head h has a permutation π_h of the n blocks; a query in block i of
a super-block attends the keys of block π_h(i) of the same super-block. Causal: a block may only attend a block
that is not in the future - π_h(i) <= i, causal inside the diagonal block π_h(i) == i; a head whose π_h maps
block i to a later block attends its own block i causally instead. Default permutations: head h shifts by
h mod n (π_h(i) = (i - h) mod n: head 0 block-diagonal, head 1 the previous block, ...), BlockBERT's choice for
n = 2. ``block_size=None`` is the paper's whole-sequence form: each call's keys are cut into n equal blocks by
index (no streaming). Runs as a band of n·block_size keys each side: O(T·n·block_size) per head.

Shapes: q (B, H, T, D), k, v (B, H, S, D), q_pos (B, T), k_pos, k_valid (B, S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from rl_transformers.backbone.attention._banded import (
    Part,
    band_part,
    columns_part,
    gather_keys,
    merge_parts,
    position_index,
    residue_part,
)
from rl_transformers.backbone.attention._dense import (
    dense_pattern,
    prefer_dense,
    prefer_fused,
    prefix_columns_attention,
    residue_classes_attention,
    shared_positions,
    windowed_pattern,
)
from rl_transformers.backbone.attention._flex import flex_pattern, use_flex
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_choice, check_int
from rl_transformers.backbone.registry import Capabilities, register

Combine = Literal["alternate", "union", "split_heads"]
COMBINES = ("alternate", "union", "split_heads")


class _Factorised(Attention):
    """Shared plumbing of ``strided`` / ``fixed``: which heads use A(1) and A(2) under ``combine``."""

    def heads(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """(uses A(1), uses A(2)) as (1, H, 1, 1, 1) bool tensors."""
        h = torch.arange(self.n_heads, device=device).view(1, -1, 1, 1, 1)
        combine = self.options.combine
        if combine == "union":
            one = torch.ones_like(h, dtype=torch.bool)
            return one, one
        if combine == "alternate":
            local = torch.full_like(h, self.layer % 2 == 0, dtype=torch.bool)
            return local, ~local
        local = h < math.ceil(self.n_heads / 2)
        return local, ~local

    def mask_key(self) -> tuple[Any, ...]:
        """What the pattern depends on besides positions (layers with equal keys share one dense mask)."""
        return (
            type(self).__name__,
            self.options,
            self.uses_local,
            self.uses_global,
            self.n_heads,
            self.causal,
        )

    @property
    def uses_local(self) -> bool:
        return self.options.combine != "alternate" or self.layer % 2 == 0

    @property
    def uses_global(self) -> bool:
        return self.options.combine != "alternate" or self.layer % 2 == 1

    @property
    def local_reach(self) -> int:
        raise NotImplementedError

    @property
    def max_cache(self) -> int | None:
        bound = self.options.max_cache  # None: A(2) looks back without bound (the exact, unbounded cache)
        if self.uses_global:
            return bound
        return self.local_reach if bound is None else min(bound, self.local_reach)

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if options.combine == "split_heads" and cfg.n_heads < 2:
            raise ValueError(
                f"combine='split_heads' needs n_heads >= 2, got n_heads={cfg.n_heads}; use 'union' or 'alternate'"
            )


# --------------------------------------------------------------------------------------------------- strided
@dataclass(frozen=True)
class StridedOptions:
    stride: int = 8
    """l: local reach of A(1) (0 <= i - j <= l) and period of A(2) ((i - j) mod l == 0); the paper uses ~sqrt(L)."""
    combine: Combine = "union"
    """How A(1) and A(2) are combined: "alternate" (per layer), "union" (every head) or "split_heads"."""
    max_cache: int | None = None
    """Keep at most this many past keys: the pattern restricted to the last max_cache keys (as ``full``'s); None =
    the paper's pattern over the whole past (unbounded cache). RL policies set it (``bound_context``)."""

    def __post_init__(self) -> None:
        check_int("strided stride", self.stride, 1)
        check_choice("combine", self.combine, Combine)
        if self.max_cache is not None:
            check_int("strided max_cache", self.max_cache, 1)


@register(
    "attention",
    "strided",
    options=StridedOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class StridedAttention(_Factorised):
    @property
    def local_reach(self) -> int:
        return self.options.stride

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
        l = self.options.stride  # noqa: E741 - the paper's symbol
        local, strided = self.heads(q.device)

        def in_band(qp: Tensor, kp: Tensor) -> Tensor:
            return local & ((qp - kp).abs() <= l)

        reach = l if self.uses_local else 0

        def union(qp: Tensor, kp: Tensor) -> Tensor:
            return in_band(qp, kp) | (strided & ((qp - kp).remainder(l) == 0))

        if use_flex(self, q):  # the union read at one head (per-head tables: a scalar per pair)
            loc, far = local.flatten().contiguous(), strided.flatten().contiguous()

            def keep(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
                return (loc[h] & ((qp - kp).abs() <= l)) | (far[h] & ((qp - kp).remainder(l) == 0))

            window, split = self.options.max_cache, self.options.combine == "split_heads"
            return flex_pattern(
                self, q, k, v, q_pos, k_pos, k_valid, None, keep=keep, per_head=split, window=window
            )
        if self.options.max_cache is not None:
            return windowed_pattern(
                self, q, k, v, q_pos, k_pos, k_valid, union, self.options.max_cache, ctx, self.mask_key()
            )
        if prefer_dense(k.shape[2], 2 * reach + 1 + (k.shape[2] // l if self.uses_global else 0)):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, union, ctx, self.mask_key())
        s = k.shape[2]
        fusable = self.causal and self.uses_global and not self.position.modifies_scores and q.shape[2] == s
        if fusable and prefer_fused(s) and shared_positions(k_pos):  # long: residue classes + band, fused
            return residue_classes_attention(
                self, q, k, v, q_pos, k_pos, k_valid, l, strided[..., 0], union, local[..., 0]
            )
        parts = [
            band_part(self, q, k, v, q_pos, k_pos, k_valid, [(-reach, 0 if self.causal else reach)], in_band)
        ]
        if self.uses_global:
            parts.append(
                residue_part(
                    self, q, k, v, q_pos, k_pos, k_valid, l, lambda qp, kp: strided & ~in_band(qp, kp)
                )
            )
        return merge_parts(parts)


# ----------------------------------------------------------------------------------------------------- fixed
@dataclass(frozen=True)
class FixedOptions:
    stride: int = 8
    """l: block length; A(1) = keys of the query's block."""
    summary: int = 2
    """c: the last c positions of every block are summary columns every query attends (A(2)); 1 <= c <= l."""
    combine: Combine = "union"
    """How A(1) and A(2) are combined: "alternate" (per layer), "union" (every head) or "split_heads"."""
    max_cache: int | None = None
    """Keep at most this many past keys: the pattern restricted to the last max_cache keys (as ``full``'s); None =
    the paper's pattern over the whole past (unbounded cache). RL policies set it (``bound_context``)."""

    def __post_init__(self) -> None:
        check_int("fixed stride", self.stride, 1)
        check_int("fixed summary", self.summary, 1)
        if self.summary > self.stride:
            raise ValueError(
                f"fixed summary={self.summary} must be <= stride={self.stride} (valid: 1..{self.stride})"
            )
        check_choice("combine", self.combine, Combine)
        if self.max_cache is not None:
            check_int("fixed max_cache", self.max_cache, 1)


@register(
    "attention",
    "fixed",
    options=FixedOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class FixedAttention(_Factorised):
    @property
    def local_reach(self) -> int:
        return self.options.stride - 1

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
        l, c = self.options.stride, self.options.summary  # noqa: E741 - the paper's symbols
        local, summary = self.heads(q.device)

        def same_block(qp: Tensor, kp: Tensor) -> Tensor:
            return local & (qp.div(l, rounding_mode="floor") == kp.div(l, rounding_mode="floor"))

        reach = l - 1 if self.uses_local else 0

        def union(qp: Tensor, kp: Tensor) -> Tensor:
            return same_block(qp, kp) | (summary & (kp.remainder(l) >= l - c))

        if use_flex(self, q):  # the union read at one head (per-head tables: a scalar per pair)
            loc, summ = local.flatten().contiguous(), summary.flatten().contiguous()

            def keep(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
                block = qp.div(l, rounding_mode="floor") == kp.div(l, rounding_mode="floor")
                return (loc[h] & block) | (summ[h] & (kp.remainder(l) >= l - c))

            window, split = self.options.max_cache, self.options.combine == "split_heads"
            return flex_pattern(
                self, q, k, v, q_pos, k_pos, k_valid, None, keep=keep, per_head=split, window=window
            )
        if self.options.max_cache is not None:
            return windowed_pattern(
                self, q, k, v, q_pos, k_pos, k_valid, union, self.options.max_cache, ctx, self.mask_key()
            )
        if prefer_dense(k.shape[2], 2 * reach + 1 + (c * (k.shape[2] // l + 1) if self.uses_global else 0)):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, union, ctx, self.mask_key())
        s = k.shape[2]
        fusable = self.causal and self.uses_global and not self.position.modifies_scores and q.shape[2] == s
        if fusable and prefer_fused(s) and shared_positions(k_pos):  # long: summary columns + blocks, fused
            idx = torch.arange(s, device=q.device)
            columns = idx[(idx + k_pos[0, 0]).remainder(l) >= l - c]
            return prefix_columns_attention(
                self, q, k, v, q_pos, k_pos, k_valid, columns, summary[..., 0], l, union
            )
        parts: list[Part] = [
            band_part(
                self, q, k, v, q_pos, k_pos, k_valid, [(-reach, 0 if self.causal else reach)], same_block
            )
        ]
        if self.uses_global:
            s = k.shape[2]
            # Summary positions m·l + l - c + t of every block m overlapping the keys, per row.
            first = (q_pos[:, -1] - (s - 1)).div(l, rounding_mode="floor")  # block of key index 0
            m = first[:, None] + torch.arange(math.ceil(s / l) + 1, device=q.device)
            want = (m[:, :, None] * l + (l - c) + torch.arange(c, device=q.device)).reshape(q.shape[0], 1, -1)
            keys = gather_keys(k, v, k_pos, k_valid, position_index(q_pos, s, want), expected_pos=want)
            parts.append(columns_part(self, q, q_pos, s, keys, lambda qp, kp: summary & ~same_block(qp, kp)))
        return merge_parts(parts)


# ------------------------------------------------------------------------------------------------- blockwise
@dataclass(frozen=True)
class BlockwiseOptions:
    n_blocks: int = 2
    """n: blocks per super-block (the permutations act on these)."""
    block_size: int | None = 32
    """Tokens per block (positions); None = the paper's form, each call's keys split into n equal blocks."""
    permutations: tuple[tuple[int, ...], ...] | None = None
    """π_h per head, each a permutation of range(n) (one entry for all heads, or n_heads entries);
    None = head h shifts by h mod n."""

    def __post_init__(self) -> None:
        check_int("blockwise n_blocks", self.n_blocks, 1)
        check_int("blockwise block_size", self.block_size, 1, optional=True)
        if self.permutations is not None:
            if (
                not isinstance(self.permutations, tuple)
                or not self.permutations
                or not all(isinstance(p, (tuple, list)) for p in self.permutations)
            ):
                raise ValueError(
                    f"blockwise permutations must be a non-empty tuple of tuples, got {self.permutations!r}"
                )
            # JSON / CLI give lists: store tuples so the options stay hashable
            object.__setattr__(self, "permutations", tuple(tuple(p) for p in self.permutations))
            for perm in self.permutations:
                if sorted(perm) != list(range(self.n_blocks)):
                    raise ValueError(
                        f"blockwise permutation {perm!r} is not a permutation of range({self.n_blocks}) "
                        f"(n_blocks={self.n_blocks})"
                    )


@register(
    "attention",
    "blockwise",
    options=BlockwiseOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class BlockwiseAttention(Attention):
    target: Tensor
    """(H, n) block attended by block i of head h (causal: future targets replaced by i)."""

    def __init__(self, cfg: Any, options: BlockwiseOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        n = options.n_blocks
        if options.permutations is None:
            perms = [[(i - h) % n for i in range(n)] for h in range(cfg.n_heads)]
        elif len(options.permutations) == 1:
            perms = [list(options.permutations[0])] * cfg.n_heads
        else:
            perms = [list(p) for p in options.permutations]
        table = torch.tensor(perms, dtype=torch.long)  # (H, n): block attended by block i of head h
        if cfg.causal:  # a future target block falls back to the (causal) diagonal block
            own = torch.arange(n).expand_as(table)
            table = torch.where(table <= own, table, own)
        self.register_buffer("target", table, persistent=False)

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        perms = options.permutations
        if perms is not None and len(perms) not in (1, cfg.n_heads):
            raise ValueError(f"blockwise needs 1 or n_heads={cfg.n_heads} permutations, got {len(perms)}")

    @property
    def max_cache(self) -> int | None:
        bs = self.options.block_size
        return None if bs is None else self.options.n_blocks * bs - 1

    @property
    def cannot_stream(self) -> str | None:
        if self.options.block_size is None:
            return (
                "blockwise with block_size=None splits each call's keys into n blocks and cannot stream; "
                "set block_size"
            )
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
        n, s = self.options.n_blocks, k.shape[2]
        if self.options.block_size is None:  # whole call: blocks by key index (position - offset)
            bs = max(1, math.ceil(s / n))
            origin = (q_pos[:, -1] - (s - 1)).view(-1, 1, 1, 1, 1)
        else:
            bs = self.options.block_size
            origin = torch.zeros((), dtype=torch.long, device=q.device)
        heads = torch.arange(self.n_heads, device=q.device).view(1, -1, 1, 1, 1)
        target = self.target.to(q.device)

        def allow(qp: Tensor, kp: Tensor) -> Tensor:
            qb = (qp - origin).div(bs, rounding_mode="floor")
            kb = (kp - origin).div(bs, rounding_mode="floor")
            same_super = qb.div(n, rounding_mode="floor") == kb.div(n, rounding_mode="floor")
            return same_super & (kb.remainder(n) == target[heads, qb.remainder(n)])

        if use_flex(self, q):  # the same predicate read at one (row, head, query, key)
            rows = origin.reshape(-1).expand(q.shape[0]).contiguous()

            def keep(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
                qb = (qp - rows[b]).div(bs, rounding_mode="floor")
                kb = (kp - rows[b]).div(bs, rounding_mode="floor")
                same_super = qb.div(n, rounding_mode="floor") == kb.div(n, rounding_mode="floor")
                return same_super & (kb.remainder(n) == target[h, qb.remainder(n)])

            return flex_pattern(self, q, k, v, q_pos, k_pos, k_valid, None, keep=keep)
        reach = n * bs - 1
        if prefer_dense(s, 2 * reach + 1):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, allow)
        windows = [(-reach, 0 if self.causal else reach)]
        return band_part(self, q, k, v, q_pos, k_pos, k_valid, windows, allow, bs).out
