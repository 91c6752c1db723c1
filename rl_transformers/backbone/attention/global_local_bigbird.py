"""``bigbird`` (Zaheer et al. 2020, arXiv 2007.14062): positions in blocks of ``block`` tokens; a query of block m
attends the blocks m - b_w .. m + b_w (causal: .. m, keys j <= i), the global tokens (symmetric, as in ``longformer``, :mod:`.global_local`) and
``n_random`` random key blocks per query block, shared by all heads and drawn with a ``torch.Generator`` seeded
from (``seed``, m) so the pattern is deterministic and does not depend on the sequence length. Causal: random
blocks are drawn from the past blocks 0 .. m - b_w - 1 only; bidirectional: from every block of the call
outside the window. Random keys reach the whole past, so streaming keeps the exact unbounded KV cache.

It runs on :class:`~rl_transformers.backbone.attention.global_local._GlobalLocal` (band + global columns + the
random-block part, merged exactly by log-sum-exp): O(T·b·(2 b_w + 1 + n_random) + T·G + G·S) per head.
Shapes: q (B, H, T, D), k, v (B, H, S, D), q_pos (B, T), k_pos, k_valid (B, S).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.attention._banded import (
    Part,
    gather_keys,
    gathered_part,
    position_index,
    query_blocks,
)
from rl_transformers.backbone.attention.global_local import _GlobalLocal
from rl_transformers.backbone.options import check_int, check_positions
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import KVCache


@dataclass(frozen=True)
class BigBirdOptions:
    block: int = 16
    """b: block length in positions; window, random keys and the compute are organised by blocks."""
    window_blocks: int = 1
    """b_w: neighbouring blocks on each side (causal: before) a query block sees (paper: 1, i.e. 3 blocks)."""
    n_random: int = 2
    """r: random key blocks per query block."""
    global_tokens: tuple[int, ...] = (0,)
    """Absolute positions of the global tokens (symmetric, as in longformer)."""
    seed: int = 0
    """Seed of the torch.Generator drawing the random blocks (the pattern is a pure function of it)."""
    max_cache: int | None = None
    """Keep at most this many past keys: the pattern restricted to the last max_cache keys (as ``full``'s); None =
    the paper's pattern, whose random blocks reach the whole past (unbounded cache). RL policies set it."""

    def __post_init__(self) -> None:
        check_int("bigbird block", self.block, 1)
        if self.max_cache is not None:
            check_int("bigbird max_cache", self.max_cache, 1)
        check_int("bigbird window_blocks", self.window_blocks, 0)
        check_int("bigbird n_random", self.n_random, 0)
        check_int("bigbird seed", self.seed, 0)
        check_positions("bigbird global_tokens", self.global_tokens)


@functools.lru_cache(maxsize=1 << 16)
def random_blocks(seed: int, m: int, window: int, r: int, causal: bool, n_total: int) -> tuple[int, ...]:
    """The r random key blocks of query block m (sorted): from 0 .. m - window - 1 (causal) or from the
    n_total blocks outside m - window .. m + window (bidirectional)."""
    if causal:
        candidates = list(range(max(0, m - window)))
    else:
        candidates = [j for j in range(n_total) if abs(j - m) > window]
    if not candidates or r == 0:
        return ()
    g = torch.Generator().manual_seed(seed * 1_000_003 + m)
    pick = torch.randperm(len(candidates), generator=g)[:r].tolist()
    return tuple(sorted(candidates[i] for i in pick))


@register(
    "attention",
    "bigbird",
    options=BigBirdOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class BigBirdAttention(_GlobalLocal):
    def global_positions(self) -> tuple[int, ...]:
        return tuple(sorted(self.options.global_tokens))

    def reach(self) -> int:
        return (self.options.window_blocks + 1) * self.options.block - 1

    @property
    def max_cache(self) -> int | None:
        return self.options.max_cache  # None: random blocks reach the whole past

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        return KVCache.empty(batch, self.n_heads, self.d_head, device, dtype)

    def window_allow(self, qp: Tensor, kp: Tensor) -> Tensor:
        b = self.options.block
        return (
            qp.div(b, rounding_mode="floor") - kp.div(b, rounding_mode="floor")
        ).abs() <= self.options.window_blocks

    def keys_per_query(self, s: int) -> int:
        return super().keys_per_query(s) + self.options.n_random * self.options.block

    def extra_allow(self, q_pos: Tensor, k_pos: Tensor) -> Any:
        o = self.options
        if o.n_random == 0:
            return None
        b = o.block
        m_min, m_max = max(0, int(q_pos.min()) // b), max(0, int(q_pos.max()) // b)
        n_total = int(k_pos.max()) // b + 1
        # picked[m - m_min, j]: key block j is a random block of query block m
        picked = torch.zeros(m_max - m_min + 1, max(n_total, m_max + 1), dtype=torch.bool)
        for m in range(m_min, m_max + 1):
            for j in random_blocks(o.seed, m, o.window_blocks, o.n_random, self.causal, n_total):
                picked[m - m_min, j] = True
        picked = picked.to(q_pos.device)
        last = picked.shape[1] - 1

        def allow(qp: Tensor, kp: Tensor) -> Tensor:
            mq = qp.div(b, rounding_mode="floor").clamp(m_min, m_max) - m_min
            mk = kp.div(b, rounding_mode="floor").clamp(0, last)
            return picked[mq, mk] & (kp >= 0) & (qp >= 0)

        return allow

    def extra_parts(
        self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, k_valid: Tensor, is_global: Any
    ) -> list[Part]:
        o = self.options
        if o.n_random == 0:
            return []
        b, s = o.block, k.shape[2]
        blocks = query_blocks(q, q_pos, s, b)
        mq = blocks.pos.div(b, rounding_mode="floor")  # (B, N, c) query block of each query
        lo, hi = mq[:, :, 0], mq[:, :, -1]  # a compute block spans at most two position blocks
        m_min, m_max = int(lo.min()), int(hi.max())
        n_total = int(k_pos.max()) // b + 1
        table = torch.full((m_max - m_min + 1, o.n_random), -1, dtype=torch.long)
        for m in range(max(m_min, 0), m_max + 1):
            picked = random_blocks(o.seed, m, o.window_blocks, o.n_random, self.causal, n_total)
            table[m - m_min, : len(picked)] = torch.tensor(picked, dtype=torch.long)
        table = table.to(q.device)
        src = torch.stack([lo, torch.where(hi != lo, hi, torch.full_like(hi, -1))], dim=-1)  # (B, N, 2)
        rb = table[(src - m_min).clamp_min(0)]  # (B, N, 2, r)
        rb = torch.where((src >= 0).unsqueeze(-1), rb, torch.full_like(rb, -1))
        want = rb.unsqueeze(-1) * b + torch.arange(b, device=q.device)  # (B, N, 2, r, b) positions
        want = torch.where(rb.unsqueeze(-1) >= 0, want, torch.full_like(want, -1))
        tag = src[:, :, :, None, None].expand_as(want).flatten(2)  # query block each key was drawn for
        want = want.flatten(2)
        keys = gather_keys(k, v, k_pos, k_valid, position_index(q_pos, s, want), expected_pos=want)
        tag5 = tag[:, None, :, None, :]
        mq5 = mq[:, None, :, :, None]
        return [
            gathered_part(
                self, blocks, keys, lambda qp, kp: (tag5 == mq5) & ~is_global(kp), include_self=False
            )
        ]
