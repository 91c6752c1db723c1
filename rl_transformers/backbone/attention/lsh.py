"""``lsh``: Reformer's locality-sensitive-hashing attention (Kitaev et al. 2020, arXiv 2001.04451).

Shared-QK: keys are the length-normalised queries, k_j = q_j / |q_j| (this module's ``k_proj`` *is* its
``q_proj``, so the key of every token - new, cached or from a memory - is its own query direction). Angular LSH
with random rotations R_r (D x n_buckets/2, one per head and hash round, drawn once from a generator seeded by
``seed`` and the layer index and kept as a buffer; optionally redrawn from the global RNG at every training
forward): h_r(x) = argmax([xR_r; -xR_r]). In round r the tokens are sorted by (bucket, index) and each query
attends the keys of its own bucket that lie at most ``chunk_size`` places before it in that order - causal: the
``chunk_size`` most recent keys of its bucket; bidirectional: ``chunk_size`` on each side. The kernel cuts the
sorted sequence into chunks of ``chunk_size`` and lets each chunk look at its predecessor (and successor), as in
the paper, so time and memory are O(n_hashes · L · chunk_size) per head.

Deviation from the paper, on purpose: Reformer attends "the own chunk and the previous one", so where the chunk
boundaries fall depends on how many *later* tokens hash into earlier buckets - a causal model then leaks the
future into the past. Windowing by rank inside the bucket keeps the same cost and makes the layer strictly
causal and streamable: the KV cache (raw shared keys, optionally bounded by ``max_cache``) is re-hashed and
re-sorted each call, and any chunking of a sequence gives the full run's outputs.

Self-masking (paper §2.2): a token does not attend to itself (its logit is replaced by -1e4) unless it has no
other key. Rounds are merged with the paper's log-sum-exp weighting, with logits of pairs met in N_ij rounds
lowered by log N_ij: the result is *exactly* the softmax over the union of the rounds' key sets, so adding hash
rounds can only add keys and moves the output towards full (self-masked) attention. With ``n_buckets=1`` and
``chunk_size >= L`` the layer is full shared-QK attention with the self-masking rule.

"bias" / "scores" position schemes get per-head gathered positions (see :func:`per_head_logits`).
:func:`reformer_config` builds the Reformer preset (LSH + reversible blocks + chunked FFN).

Shapes: q (B, H, T, D); k, v (B, H, S, D), the T new tokens being the last T keys; internally R = n_hashes
rounds, n chunks of m = chunk_size sorted tokens, W = 2 (causal) or 3 (bidirectional) chunks of keys per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention import _lsh_fast as fast
from rl_transformers.backbone.attention.base import Attention, assignment_input, same_segment
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register

SELF_LOGIT = -1e4
"""Logit given to a token's own key under shared-QK: weight exp(-1e4) ~ 0 unless the token has no other key."""


# -- angular LSH: the stored random rotations, the bucket of each unit key -----------------------------------
def draw_rotations(
    n_hashes: int, n_heads: int, d_head: int, n_buckets: int, generator: torch.Generator | None = None
) -> Tensor:
    """(R, H, D, n_buckets/2) Gaussian rotations; round r's draw does not depend on n_hashes (nested rounds)."""
    half = n_buckets // 2
    return torch.stack([torch.randn(n_heads, d_head, half, generator=generator) for _ in range(n_hashes)])


def hash_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH buckets (B, H, R, S) of x (B, H, S, D): argmax over [xR; -xR] (Kitaev 2020, §2).

    Half-precision keys are hashed in float32: rounding the projections to 8 bits of mantissa flips the argmax of
    keys near a bucket boundary, so a bf16 run attended other keys than the same run in float32 or float64 (the
    GPU benchmark's gate measured a 0.9 relative error)."""
    if rotations.shape[-1] == 0:
        b, h, s, _ = x.shape
        return torch.zeros(b, h, rotations.shape[0], s, dtype=torch.long, device=x.device)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    proj = torch.einsum("bhsd,rhdn->bhrsn", x, rotations.to(x.dtype))
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def _in_window(delta: Tensor, w: int, causal: bool) -> Tensor:
    """Pairs at most ``w`` sorted places apart (causal: the key at most ``w`` places before the query)."""
    return (delta >= 0) & (delta <= w) if causal else delta.abs() <= w


def _round_counts(
    met: Tensor, tok_q: Tensor, tok_k: Tensor, buckets: Tensor, rank: Tensor, w: int, causal: bool
) -> Tensor:
    """N_ij (B, H, R, n, m, W·m): in how many hash rounds key j is in query i's bucket window, for the pairs of
    every round's chunk slices (``met``: each slice's own round)."""
    b, h, r = buckets.shape[:3]
    sp = buckets.shape[3]
    count = met.to(torch.int8 if r < 127 else torch.int32)  # the pairs of each slice's own round
    small = torch.int32 if sp < 2**31 - 1 else torch.int64  # halves the memory traffic of the gathers
    buckets_s, rank_s = buckets.to(small), rank.to(small)
    for r2 in range(r):  # round r2's verdict on the pairs of the other rounds' slices
        others = torch.tensor([r0 for r0 in range(r) if r0 != r2], device=buckets.device)
        tq, tk = tok_q.index_select(2, others), tok_k.index_select(2, others).clamp_min(0)
        fq, fk = tq.reshape(b, h, -1), tk.reshape(b, h, -1)
        bq = buckets_s[:, :, r2].gather(2, fq).view_as(tq).unsqueeze(-1)
        bk = buckets_s[:, :, r2].gather(2, fk).view_as(tk).unsqueeze(-2)
        rq = rank_s[:, :, r2].gather(2, fq).view_as(tq).unsqueeze(-1)
        rk = rank_s[:, :, r2].gather(2, fk).view_as(tk).unsqueeze(-2)
        count.index_add_(2, others, ((bq == bk) & _in_window(rq - rk, w, causal)).to(count.dtype))
    return count


# -- positions that differ per head (content-based sorting is per head) -------------------------------------------
def _pick_head(x: Tensor, head: int) -> Tensor:
    return x[:, head] if x.shape[1] > 1 else x[:, 0]


def _head_pos(pos: Tensor, i: int, per_head: bool) -> Tensor:
    return pos[:, i] if per_head else pos


def per_head_logits(
    att: Attention,
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    heads: list[int] | None = None,
    aligned: bool = False,
) -> Tensor:
    """Scaled logits with the position scheme, for blocks whose positions may differ per head.

    q (B, h, *, Tq, D), k (B, h, *, Tk, D); q_pos (B, h, *, Tq) and k_pos (B, h, *, Tk) per head, or
    (B, *, Tq) / (B, *, Tk) shared by the heads. ``heads``: the model head index of each of the h heads (default
    0..h-1). Schemes that leave the logits alone cost one matmul; "bias" / "scores" schemes are called once per
    head on that head's positions (their per-head parameters broadcast to all H heads, and head ``heads[i]`` of
    the result is kept).
    """
    position = att.position
    if not position.modifies_scores:
        return torch.matmul(q, k.transpose(-1, -2)) * position.scale
    h = q.shape[1]
    heads = list(range(h)) if heads is None else heads
    per_head = q_pos.dim() == q.dim() - 1
    if not per_head and heads == list(range(att.n_heads)):
        scores = position.logits_aligned if aligned else position.logits  # aligned: the whole key set
        return scores(q, k, q_pos, k_pos, att.layer)
    out = []
    for i, head in enumerate(heads):
        logits = position.logits(
            q[:, i : i + 1],
            k[:, i : i + 1],
            _head_pos(q_pos, i, per_head),
            _head_pos(k_pos, i, per_head),
            att.layer,
        )
        out.append(_pick_head(logits, head))
    return torch.stack(out, dim=1)


def per_head_value_term(
    att: Attention,
    probs: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    heads: list[int] | None = None,
) -> Tensor | None:
    """The scheme's value term (Shaw) for probs (B, h, *, Tq, Tk) with per-head or shared positions, or None."""
    position = att.position
    if not position.modifies_scores:
        return None
    h = probs.shape[1]
    heads = list(range(h)) if heads is None else heads
    per_head = q_pos.dim() == probs.dim() - 1
    if not per_head and heads == list(range(att.n_heads)):
        return position.value_term(probs, q_pos, k_pos, att.layer)
    out = []
    for i, head in enumerate(heads):
        term = position.value_term(
            probs[:, i : i + 1], _head_pos(q_pos, i, per_head), _head_pos(k_pos, i, per_head), att.layer
        )
        if term is None:
            return None
        out.append(_pick_head(term, head))
    return torch.stack(out, dim=1)


# -- options ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LSHOptions:
    n_buckets: int = 8
    """Hash buckets per round: even (angular LSH uses n_buckets/2 random directions), or 1 = no hashing."""
    n_hashes: int = 2
    """Hash rounds; their key sets are merged exactly, so more rounds = closer to full attention."""
    chunk_size: int = 32
    """m: each query sees at most m keys of its bucket before it (and m after it when bidirectional), besides
    itself; the sorted sequence is processed in chunks of m. chunk_size >= L with n_buckets=1 = full attention."""
    redraw: bool = False
    """Redraw the random rotations (from the global torch RNG) at every forward in training mode."""
    seed: int = 0
    """Seed of the stored rotations (combined with the layer index)."""
    max_cache: int | None = None
    """Bound the KV cache to this many past keys; queries then also ignore keys more than max_cache steps back
    in full runs, so streaming stays exact. None = unbounded."""

    def __post_init__(self) -> None:
        nb = self.n_buckets
        if not isinstance(nb, int) or nb < 1 or (nb > 1 and nb % 2):
            raise ValueError(f"n_buckets must be 1 or an even int >= 2, got {nb!r}")
        if not isinstance(self.n_hashes, int) or self.n_hashes < 1:
            raise ValueError(f"n_hashes must be an int >= 1, got {self.n_hashes!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {self.chunk_size!r}")
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")


@register(
    "attention",
    "lsh",
    options=LSHOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class LSHAttention(Attention):
    """Shared-QK LSH attention; the default KV cache (raw shared keys) gives exact streaming."""

    rotations: Tensor
    """(R, H, D, n_buckets/2) stored random rotations (a buffer)."""

    def __init__(self, cfg: Any, options: LSHOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        # Shared-QK (Kitaev 2020, §2.1): the key projection is the query projection (registered under both
        # names, one set of parameters); keys are normalised in the kernel.
        self.k_proj = self.q_proj
        g = torch.Generator().manual_seed(options.seed * 100_003 + layer)
        self.register_buffer(
            "rotations", draw_rotations(options.n_hashes, cfg.n_heads, cfg.d_head, options.n_buckets, g)
        )

    def current_rotations(self) -> Tensor:
        if self.training and self.options.redraw and self.rotations.shape[-1] > 0:
            return torch.randn_like(self.rotations)
        return self.rotations

    dense_chunks: ClassVar[int] = 4
    """Take the dense path when T <= dense_chunks * chunk_size (streaming steps, short training windows)."""
    segment_masks = True
    """Rows restarting inside the chunk take the dense path, whose bucket ranks count only the keys of the
    query's own segment (what a stream reset at that token holds); the chunked path has no segments."""

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
        if ctx.segment is not None or q.shape[2] <= self.dense_chunks * self.options.chunk_size:
            return self.attend_dense(q, k, v, q_pos, k_pos, k_valid, ctx)
        return self.attend_chunked(q, k, v, q_pos, k_pos, k_valid, ctx)

    def attend_dense(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """The same operator on the (T, S) grid of the new queries only: O(R·T·S), no sorting.

        Round r's rank distance between bucket-mates i and j is the number of tokens of their bucket in (j, i]
        (a difference of cumulative counts); the union of the rounds' key sets is one softmax, which equals the
        chunked path's log-sum-exp merge.
        """
        t, s = q.shape[2], k.shape[2]
        opts = self.options
        kn = F.normalize(k, dim=-1)
        nb = opts.n_buckets
        buckets = hash_buckets(assignment_input(k, kn), self.current_rotations())  # (B, H, R, S)
        buckets = torch.where(k_valid[:, None, None, :], buckets, torch.full_like(buckets, nb))
        i = torch.arange(t, device=q.device)[:, None] + (s - t)
        j = torch.arange(s, device=q.device)[None, :]
        segment = same_segment(ctx, s)  # (B, 1, T, S) when rows restart inside the chunk, else None
        met: Tensor | None = None  # (B, H, T, S): j lies in i's bucket window in some round
        for b_r in buckets.unbind(2):  # (B, H, S) per round
            same = b_r[..., s - t :].unsqueeze(-1) == b_r.unsqueeze(-2)  # (B, H, T, S) bucket-mates
            if segment is not None:  # ranks count only the bucket-mates of the query's own segment
                same = same & segment
            upto = same.cumsum(-1, dtype=torch.int32)  # tokens of i's bucket among keys 0..j
            delta = upto[..., s - t :].diagonal(dim1=-2, dim2=-1).unsqueeze(-1) - upto  # rank_i - rank_j
            near = delta <= opts.chunk_size if self.causal else delta.abs() <= opts.chunk_size
            met = same & near if met is None else met | (same & near)
        assert met is not None
        allowed = met & k_valid[:, None, None, :]
        if self.causal:  # bucket-mates after i have delta < 0 and are excluded here
            allowed = allowed & (j <= i)
        if opts.max_cache is not None:
            allowed = allowed & (i - j <= opts.max_cache)
        own = j == i
        logits = per_head_logits(self, q, kn, q_pos, k_pos, aligned=ctx.aligned).masked_fill(own, SELF_LOGIT)
        probs = torch.softmax(logits.masked_fill(~(allowed | own), float("-inf")), dim=-1)
        dropped = self.attn_dropout(probs) if self.training else probs
        out = torch.matmul(dropped, v)
        extra = per_head_value_term(self, dropped, q_pos, k_pos)
        if ctx.collect_info:
            ctx.add_info(
                f"backbone/lsh_keys_per_query/layer{self.layer}",
                (allowed | own).sum(-1).to(q.dtype).mean().detach(),
            )
        return out if extra is None else out + extra

    def _padded_buckets(
        self, qa: Tensor, k: Tensor, v: Tensor, k_valid: Tensor, k_pos: Tensor, pad: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Queries, unit keys, values, validity and positions padded by ``pad`` tokens at the end, and each
        token's bucket (B, H, R, Sp) per hash round (padding tokens in bucket ``n_buckets``: sorted last)."""
        kn = F.normalize(k, dim=-1)
        hashed = assignment_input(k, kn)
        valid, pos = k_valid, k_pos
        if pad:
            qa, kn, v = (F.pad(x, (0, 0, 0, pad)) for x in (qa, kn, v))
            hashed = F.pad(hashed, (0, 0, 0, pad)) if hashed is not kn else kn
            valid = F.pad(valid, (0, pad), value=False)
            pos = F.pad(pos, (0, pad))
        buckets = hash_buckets(hashed, self.current_rotations())  # (B, H, R, Sp)
        nb = self.options.n_buckets
        buckets = torch.where(valid[:, None, None, :], buckets, torch.full_like(buckets, nb))  # padding last
        return qa, kn, v, valid, pos, buckets

    def _merge_rounds(self, logits: Tensor, vs: Tensor, pos_q: Tensor, pos_k: Tensor, rank: Tensor) -> Tensor:
        """Each round's attention over its sorted chunk windows (``logits`` masked), back in token order, the
        rounds merged with softmax(lse_r) weights: (B, H, Sp, D)."""
        b, h, r, sp = rank.shape
        lse = torch.logsumexp(logits, dim=-1)  # finite: the own key is always allowed
        probs = torch.softmax(logits, dim=-1)
        dropped = self.attn_dropout(probs) if self.training else probs
        out = torch.matmul(dropped, vs)
        extra = per_head_value_term(self, dropped, pos_q, pos_k)
        if extra is not None:
            out = out + extra
        out = fast.unsort_rows(out.view(b, h, r, sp, out.shape[-1]), rank)
        lse = lse.view(b, h, r, sp).gather(3, rank)
        return (torch.softmax(lse, dim=2).unsqueeze(-1) * out).sum(dim=2)

    def attend_chunked(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """Sorted chunks of every token of the sequence (Kitaev 2020): O(R·S·chunk_size)."""
        b, h, t, _ = q.shape
        s = k.shape[2]
        opts = self.options
        w = opts.chunk_size
        # Every token of the sequence is a query (cached / memory tokens' raw shared key is their query): the
        # rank windows are then plain chunk neighbourhoods. Only the last T outputs are returned.
        qa = torch.cat([k[:, :, : s - t], q], dim=2) if s > t else q
        m = w if w < s else s
        n = math.ceil(s / m)
        sp = n * m
        qa, kn, v, valid, pos, buckets = self._padded_buckets(qa, k, v, k_valid, k_pos, sp - s)
        r = buckets.shape[2]
        nb = opts.n_buckets
        idx = torch.arange(sp, device=q.device)
        order = torch.argsort(buckets * sp + idx, dim=-1)  # sort by (bucket, index)
        rank = torch.empty_like(order).scatter_(-1, order, idx.expand_as(order))  # sorted place of each token

        def sort_row(x: Tensor) -> Tensor:  # (B, Sp) -> (B, H, R, n, m)
            return x[:, None, None, :].expand(b, h, r, sp).gather(3, order).view(b, h, r, n, m)

        causal = self.causal
        offsets = [0] if n == 1 else ([-1, 0] if causal else [-1, 0, 1])
        rows_q = fast.flat_rows(order, sp).view(b, h, r, n, m)  # row of each sorted token in (B·H·Sp, D)
        qs = fast.take_rows(qa, rows_q)
        ks = fast.chunk_windows(kn, rows_q, offsets)  # overlapping views; keys outside the rows masked below
        vs = fast.chunk_windows(v, rows_q, offsets)
        pos_q = sort_row(pos)
        pos_k = fast.neighbours(pos_q, offsets, 0)
        tok_q = order.view(b, h, r, n, m)
        tok_k = fast.neighbours(tok_q, offsets, -1)
        small = torch.int16 if nb < 2**15 - 1 else torch.int64  # bucket ids: less memory traffic
        bucket_q = buckets.to(small).gather(3, order).view(b, h, r, n, m)
        bucket_k = fast.neighbours(bucket_q, offsets, -1)
        valid_k = fast.neighbours(sort_row(valid), offsets, False)
        rank_q = idx.view(1, 1, 1, n, m)  # sorted place: the same layout in every row, head and round
        rank_k = fast.neighbours(rank_q, offsets, -(10 * sp))

        iq, ik = tok_q.unsqueeze(-1), tok_k.unsqueeze(-2)
        # Causal: bucket-mates at most w places before in (bucket, index) order have index <= the query's.
        met = (bucket_q.unsqueeze(-1) == bucket_k.unsqueeze(-2)) & _in_window(
            rank_q.unsqueeze(-1) - rank_k.unsqueeze(-2), w, causal
        )
        allowed = valid_k.unsqueeze(-2) & met
        if opts.max_cache is not None:
            allowed = allowed & (iq - ik <= opts.max_cache)
        own = rank_q.unsqueeze(-1) == rank_k.unsqueeze(-2)  # each token sits once per round: its own place
        allowed = allowed | own

        logits = per_head_logits(self, qs, ks, pos_q, pos_k)  # (B, H, R, n, m, W·m)
        logits = logits.masked_fill(own, SELF_LOGIT)
        if r > 1:
            # N_ij = number of rounds in which j is in i's bucket window; logits - log N_ij make the merged result
            # the softmax over the union of the rounds' key sets (Kitaev 2020, §2.3, "multi-round LSH").
            count = _round_counts(met, tok_q, tok_k, buckets, rank, w, causal)
            logits = fast.minus_log_count(logits, count, r)
        merged = self._merge_rounds(logits.masked_fill(~allowed, float("-inf")), vs, pos_q, pos_k, rank)
        if ctx.collect_info:
            ctx.add_info(
                f"backbone/lsh_keys_per_query/layer{self.layer}",
                allowed.sum(-1).to(q.dtype).mean().detach(),
            )
        return merged[:, :, s - t : s]


def reformer_config(**overrides: Any) -> Any:
    """The Reformer preset (Kitaev 2020): LSH attention, reversible blocks, chunked FFN, rotary positions.

    Keyword arguments override :class:`BackboneConfig` fields; ``attention_options`` and ``block_options`` are
    merged into the preset's (``{"n_hashes": 4}`` keeps the preset's other LSH options).
    """
    from rl_transformers.backbone.config import BackboneConfig

    preset: dict[str, Any] = dict(
        attention="lsh",
        attention_options={"n_buckets": 8, "n_hashes": 2, "chunk_size": 32},
        block="reversible",
        block_options={"ffn_chunks": 4},
        position="rope",
    )
    for key in ("attention_options", "block_options"):
        if key in overrides:
            preset[key] = {**preset[key], **dict(overrides.pop(key))}
    if "attention" in overrides and overrides["attention"] != "lsh":
        raise ValueError(f"reformer_config is the LSH preset; got attention={overrides['attention']!r}")
    return BackboneConfig(**{**preset, **overrides})
