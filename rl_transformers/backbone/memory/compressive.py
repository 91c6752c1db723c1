"""``compressive``: Compressive Transformer (Rae et al. 2019, arXiv 1911.05507).

Transformer-XL keeps, per layer, the last m_m attention inputs as memory; the Compressive Transformer compresses
what falls out of that FIFO instead of discarding it. Each layer keeps a FIFO memory of m_m = ``mem_len`` hidden
states and a FIFO compressed memory of m_cm = ``cmem_len`` slots; evicted memories are compressed in groups of
c = ``rate`` by the layer's f_c: R^{n×d} -> R^{(n/c)×d} and appended to the compressed memory. Attention keys and
values come from [SG(cmem) ; SG(mem) ; h] (oldest to newest), so the layer sees (m_m + c·m_cm) past tokens at the
cost of m_m + m_cm. Compression functions (``compression``): ``max_pool`` / ``mean_pool`` (kernel = stride = c),
``conv`` (1D convolution, kernel = stride = c, initialised to mean pooling), ``dilated_conv`` (a stack of
⌈log2 c⌉ kernel-2 convolutions with dilations 1, 2, 4, ... run inside each group, WaveNet style, read at the
group's last element: its receptive field covers the group; initialised to mean pooling when c is a power of two)
and ``most_used`` (keep, from each group, the memory that received the most attention while it sat in memory:
in every forward the memory hook recomputes the layer's softmax weights as a dense softmax with the layer's own
projections, positional scheme and causal / padding mask, and adds them up over heads and queries).

Training the compressor: the memories are stop-gradient, so the task loss never reaches f_c. Two local losses do
(both in ``aux_losses``, summed over layers, zero when nothing is compressed; with stop-gradient on everything but
the compressor and the decoder, as in the paper):
``compressive_autoencoding`` = mean ||old_mem - g(f_c(old_mem))||² with a decoder g (transposed convolution,
kernel = stride = c) and ``compressive_attention_reconstruction`` = mean ||attn(h, old_mem) -
attn(h, f_c(old_mem))||², content-based attention with the layer's own (detached) q/k/v projections, h being
the current chunk's attention inputs of that layer.

Streaming bookkeeping. A token belongs to group ⌊p/c⌋ of its row (p = position since reset), so groups never
straddle a reset and chunked / reset / fresh runs group alike. A memory leaving the FIFO waits, still attended as
ordinary memory, until its whole group has left (at most c - 1 such memories), then the group is compressed. A
compressed memory takes the position of the last memory of its group, for every f_c (so rate 1 equals ``xl``
with memory m_m + m_cm exactly). Groups made only of padding keep their slot but are never attended. Streaming is "window":
the carried state is bounded (m_m + c - 1 + m_cm slots per layer) and memories are stop-gradient; the training
window (how far gradients flow) is the chunk length the trainer uses, a separate knob from the memory length.
Chunks with restarts (``Backbone.forward(starts=...)``, PPO's uncut training rows) of at most m_m tokens: only a
row's first segment compresses, exactly as cutting the chunk into per-episode pieces and packing them would (see
:meth:`CompressiveMemory.write`), and a restarted row returns the state of its last segment.

Shapes: B batch, L layers, T new tokens, W <= m_m + c - 1 uncompressed slots, C <= m_cm compressed slots, d width.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import visible_mask
from rl_transformers.backbone.context import ForwardContext, MemoryContext
from rl_transformers.backbone.memory._compressive_ops import (
    content_attention,
    gather_columns,
    keep_last_filled,
    longest_piece,
    scatter_columns,
)
from rl_transformers.backbone.memory.base import Memory
from rl_transformers.backbone.options import check_choice, check_int
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State

Compression = Literal["max_pool", "mean_pool", "conv", "dilated_conv", "most_used"]
COMPRESSIONS: tuple[str, ...] = get_args(Compression)
_ATTENTION = "compressive/attention"  # ctx.extras slot: {application: attention module}
_USAGE = "compressive/usage"  # ctx.extras slot: {application: (B, S) attention received by each key}


@dataclass
class CompressiveMemoryState(State):
    """Per-layer FIFO memory and compressed memory of every row.

    h: (B, L, W, d) uncompressed memories, time-aligned columns like ``xl``; pos, valid: (B, W); live: (B, W) not yet
    compressed (False once compressed and after a reset); ch: (B, L, C, d) compressed memories, right-aligned per
    row; cpos, cvalid: (B, C) their positions and whether they may be attended; cfill: (B, C) slot in use;
    usage: (B, L, W) attention received so far (``most_used`` only, else None).
    """

    h: Tensor
    pos: Tensor
    valid: Tensor
    live: Tensor
    ch: Tensor
    cpos: Tensor
    cvalid: Tensor
    cfill: Tensor
    usage: Tensor | None = None


@dataclass(frozen=True)
class CompressiveOptions:
    mem_len: int = 32
    """m_m: uncompressed memories per layer (the Transformer-XL FIFO)."""
    cmem_len: int = 32
    """m_cm: compressed memories per layer."""
    rate: int = 2
    """c: compression rate (c evicted memories -> 1 compressed memory)."""
    compression: Compression = "conv"
    """f_c: max_pool, mean_pool, conv (best in the paper), dilated_conv or most_used."""

    def __post_init__(self) -> None:
        for name in ("mem_len", "cmem_len", "rate"):
            check_int(f"compressive {name}", getattr(self, name), 1)
        check_choice("compression", self.compression, Compression)


def _set(conv: nn.Conv1d | nn.ConvTranspose1d, weight: Tensor) -> None:
    """Initialise a convolution to ``weight`` and a zero bias."""
    with torch.no_grad():
        conv.weight.copy_(weight)
        if conv.bias is not None:
            conv.bias.zero_()


class Compressor(nn.Module):
    """One layer's compression f_c: (B, n, d) -> (B, n/c, d), and the decoder g: (B, n/c, d) -> (B, n, d)."""

    def __init__(self, kind: str, d: int, rate: int) -> None:
        super().__init__()
        self.kind = kind
        self.rate = rate
        eye = torch.eye(d)
        if kind == "conv":
            self.conv = nn.Conv1d(d, d, rate, stride=rate)
            _set(self.conv, eye[:, :, None].expand(d, d, rate) / rate)  # start as mean pooling
        elif kind == "dilated_conv":
            depth = (rate - 1).bit_length()  # ⌈log2 c⌉ layers: receptive field 2^depth >= c
            self.dilations = tuple(2**i for i in range(depth))
            self.convs = nn.ModuleList()
            for dilation in self.dilations:
                conv = nn.Conv1d(d, d, 2, dilation=dilation)
                _set(conv, eye[:, :, None].expand(d, d, 2) / 2)  # each layer averages x[t] and x[t - δ]
                self.convs.append(conv)
        self.decoder = nn.ConvTranspose1d(d, d, rate, stride=rate)
        _set(self.decoder, eye[:, :, None].expand(d, d, rate))  # start by repeating each slot c times

    def forward(
        self, x: Tensor, valid: Tensor | None = None, usage: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (B, n, d), valid (B, n) bool, usage (B, n) (most_used) -> compressed (B, n/c, d), group valid (B, n/c).

        Invalid memories (padding, empty slots) are left out of pools and zeroed before convolutions; a group
        without a valid memory gives zeros and is marked invalid.
        """
        b, n, d = x.shape
        c = self.rate
        if n % c:
            raise ValueError(f"compressing {n} memories at rate {c}: n must be a multiple of c")
        g = n // c
        if valid is None:
            valid = torch.ones(b, n, dtype=torch.bool, device=x.device)
        groups, member = x.view(b, g, c, d), valid.view(b, g, c)
        group_valid = member.any(-1)
        if self.kind == "mean_pool":
            out = (groups * member[..., None]).sum(2) / member.sum(2, keepdim=True).clamp_min(1)
        elif self.kind == "max_pool":
            out = groups.masked_fill(~member[..., None], float("-inf")).amax(2)
            out = torch.where(group_valid[..., None], out, torch.zeros_like(out))
        elif self.kind == "conv":
            seq = (x * valid[..., None]).transpose(1, 2)  # (B, d, n)
            out = self.conv(seq).transpose(1, 2)
        elif self.kind == "dilated_conv":
            h = (groups * member[..., None]).reshape(b * g, c, d).transpose(1, 2)  # one group per row
            for conv, dilation in zip(self.convs, self.dilations):
                h = conv(F.pad(h, (dilation, 0)))  # causal padding keeps the group length c
            out = h[..., -1].reshape(b, g, d)
        else:  # most_used
            if usage is None:
                raise ValueError("most_used compression needs the attention usage of each memory")
            score = usage.view(b, g, c).masked_fill(~member, float("-inf"))
            pick = score.argmax(-1)  # (B, g)
            out = groups.gather(2, pick[..., None, None].expand(b, g, 1, d)).squeeze(2)
            out = torch.where(group_valid[..., None], out, torch.zeros_like(out))
        return out, group_valid

    def decode(self, z: Tensor) -> Tensor:
        """g: (B, n/c, d) -> (B, n, d)."""
        return self.decoder(z.transpose(1, 2)).transpose(1, 2)


@register(
    "memory",
    "compressive",
    options=CompressiveOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="window", noncausal=False),
)
class CompressiveMemory(Memory):
    aux_losses = ("compressive_autoencoding", "compressive_attention_reconstruction")  # to aux_losses
    segment_aware = True

    @classmethod
    def segments_unsupported(cls, options: CompressiveOptions) -> str | None:
        if options.compression == "most_used":
            return "most_used compression credits attention weights without segment masks"
        return None

    @classmethod
    def segment_chunk_limit(cls, options: CompressiveOptions) -> int | None:
        """A chunk with restarts of at most m_m tokens: no token of a later segment leaves the FIFO, so only the
        first segment (continuing the state) compresses (see :meth:`write`)."""
        return options.mem_len

    def __init__(self, cfg: Any, options: CompressiveOptions) -> None:
        super().__init__(cfg, options)
        self.compressors = nn.ModuleList(
            Compressor(options.compression, cfg.d_model, options.rate) for _ in range(cfg.n_layers)
        )

    @property
    def window(self) -> int:
        """Past tokens a layer can reach: m_m + c·m_cm."""
        return self.options.mem_len + self.options.rate * self.options.cmem_len

    def init_state(
        self, batch: int, device: torch.device | None, dtype: torch.dtype
    ) -> CompressiveMemoryState:
        n, d = self.cfg.n_layers, self.cfg.d_model

        def cols(*shape: int, kind: torch.dtype = dtype) -> Tensor:
            return torch.zeros(*shape, dtype=kind, device=device)

        # Full-size from the start (W = m_m + c - 1 uncompressed, C = m_cm compressed slots, all empty): one
        # shape for the whole stream, so a compiled step never recompiles; empty slots are never attended.
        most_used = self.options.compression == "most_used"
        w, c = self.options.mem_len + self.options.rate - 1, self.options.cmem_len
        return CompressiveMemoryState(
            h=cols(batch, n, w, d),
            pos=cols(batch, w, kind=torch.long),
            valid=cols(batch, w, kind=torch.bool),
            live=cols(batch, w, kind=torch.bool),
            ch=cols(batch, n, c, d),
            cpos=cols(batch, c, kind=torch.long),
            cvalid=cols(batch, c, kind=torch.bool),
            cfill=cols(batch, c, kind=torch.bool),
            usage=cols(batch, n, w) if most_used else None,
        )

    # -- read: [cmem ; mem] per layer, plus a hook that sees the layer's attention -------------------------------
    def read(self, state: CompressiveMemoryState) -> list[MemoryContext | None]:
        pos = torch.cat([state.cpos, state.pos], dim=1)
        valid = torch.cat([state.cvalid, state.valid & state.live], dim=1)
        return [
            MemoryContext(
                torch.cat([state.ch[:, i], state.h[:, i]], dim=1), pos, valid, hook=partial(self._observe, i)
            )
            for i in range(state.h.shape[1])
        ]

    def _observe(
        self, application: int, attention: Any, x: Tensor, out: Tensor, ctx: ForwardContext
    ) -> Tensor:
        """Remember the layer's attention module (for the attention-reconstruction loss) and, for ``most_used``,
        recompute its softmax weights to credit each key with the attention it received."""
        ctx.extras.setdefault(_ATTENTION, {})[application] = attention
        if self.options.compression == "most_used":
            mem = ctx.memory_for(application)
            assert mem is not None
            with torch.no_grad():
                layer, position = attention.layer, attention.position
                q = position.transform_q(attention.split_heads(attention.q_proj(x)), ctx.pos, layer)
                kv_in = torch.cat([mem.h.to(x.dtype), x], dim=1)
                k_pos = torch.cat([mem.pos, ctx.pos], dim=1)
                k_valid = torch.cat([mem.valid, ctx.valid], dim=1)
                k = position.transform_k(attention.split_heads(attention.k_proj(kv_in)), k_pos, layer)
                logits = position.logits(q, k, ctx.pos, k_pos, layer)
                mask = visible_mask(x.shape[1], k_valid, attention.causal)
                probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
                # (B, S): attention each key received, summed over heads and real (non-padding) queries
                received = (probs * ctx.valid[:, None, :, None]).sum((1, 2))
            ctx.extras.setdefault(_USAGE, {})[application] = received
        return out

    # -- write: append, compress complete groups that left the FIFO, trim -----------------------------------------
    def write(self, state: CompressiveMemoryState, ctx: ForwardContext) -> CompressiveMemoryState:
        o = self.options
        m, c = o.mem_len, o.rate
        n_layers = state.h.shape[1]
        b, t = ctx.pos.shape
        new_h = torch.stack([h.detach() for h in ctx.attention_inputs[:n_layers]], dim=1).to(state.h.dtype)
        h = torch.cat([state.h, new_h], dim=2)
        pos = torch.cat([state.pos, ctx.pos], dim=1)
        valid = torch.cat([state.valid, ctx.valid], dim=1)
        seg = ctx.segment  # rows restarted inside the chunk (t <= m_m: ``segment_chunk_limit``)
        first = torch.ones_like(ctx.valid) if seg is None else seg == 0  # tokens that continue the state
        live = torch.cat([state.live, first], dim=1)
        usage = self._usage(state, ctx, t) if state.usage is not None else None
        total = h.shape[2]

        # A live column is compressed once the last member of its group (position ≡ c-1 mod c, which sits
        # c-1-p%c columns later: positions are contiguous since reset) has left the FIFO (last m columns).
        # With restarts, each row's first segment is pushed through the FIFO as cutting and packing would push
        # it: by the longest piece of the chunk (packing's padded width); later segments start from an empty
        # memory and, with t <= m_m, compress nothing (their tokens are not live for compression).
        col = torch.arange(total, device=pos.device)
        last_member = col + (c - 1 - pos % c)
        pushed = total if seg is None else state.h.shape[2] + longest_piece(seg)
        compress = live & (last_member < pushed - m)
        n_cols = (max(0, total - m) // c) * c  # static bound on compressed columns per row (no host sync)
        n_rows = compress.sum(1)
        start = compress.int().argmax(1)  # first compressed column (complete groups, contiguous)
        offs = torch.arange(n_cols, device=pos.device)
        index = (start[:, None] + offs).clamp_max(total - 1)
        present = offs[None, :] < n_rows[:, None]  # (B, n_cols)
        old = gather_columns(h, index, 2)  # (B, L, n_cols, d)
        old_valid = gather_columns(valid, index, 1) & present
        old_pos = gather_columns(pos, index, 1)
        old_usage = gather_columns(usage, index, 2) if usage is not None else None

        groups_present = present[:, ::c]
        groups_pos = old_pos[:, c - 1 :: c]  # position of the last memory of each group
        new_ch = h.new_zeros(b, n_layers, n_cols // c, h.shape[3])
        groups_valid = torch.zeros_like(groups_present)
        ae_loss = attn_loss = h.new_zeros(())
        for i in range(n_layers if n_cols else 0):
            z, groups_valid = self.compressors[i](
                old[:, i], old_valid, old_usage[:, i] if old_usage is not None else None
            )
            new_ch[:, i] = z.detach()
            ae, ar = self._losses(i, old[:, i], old_valid, z, groups_valid, ctx, first)
            ae_loss, attn_loss = ae_loss + ae, attn_loss + ar
        ctx.add_aux("compressive_autoencoding", ae_loss)
        ctx.add_aux("compressive_attention_reconstruction", attn_loss)

        ch, cpos, cvalid, cfill = self._push_compressed(
            state, new_ch, groups_pos, groups_valid, groups_present
        )

        # Uncompressed: the FIFO plus the (< c) evicted memories whose group is not complete yet.
        keep = min(total, m + c - 1)
        live = live & ~compress
        if seg is not None:  # a restarted row keeps its last segment only, as if run alone from a reset
            last = seg[:, -1:]
            restarted = last > 0  # (B, 1)
            mine = torch.cat([~restarted.expand(-1, state.h.shape[2]), seg == last], dim=1)
            live = torch.where(restarted, mine, live)
            valid = valid & mine
            cvalid, cfill = cvalid & ~restarted, cfill & ~restarted
            cpos = cpos.masked_fill(restarted, 0)
        out = CompressiveMemoryState(
            h=h[:, :, total - keep :],
            pos=pos[:, total - keep :],
            valid=valid[:, total - keep :],
            live=live[:, total - keep :],
            ch=ch,
            cpos=cpos,
            cvalid=cvalid,
            cfill=cfill,
            usage=usage[:, :, total - keep :] if usage is not None else None,
        )
        if ctx.collect_info:
            ctx.add_info("backbone/memory_fill", (out.valid & out.live).float().mean(1).mean().detach())
            ctx.add_info("backbone/cmem_fill", (cvalid.float().sum(1) / o.cmem_len).mean().detach())
        return out

    def _push_compressed(
        self, state: CompressiveMemoryState, new_ch: Tensor, pos: Tensor, valid: Tensor, present: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(ch, cpos, cvalid, cfill): the new groups appended to the compressed FIFO, each row's last m_cm kept."""
        ch_all = torch.cat([state.ch, new_ch], dim=2)
        fill_all = torch.cat([state.cfill, present], dim=1)
        width = min(self.options.cmem_len, ch_all.shape[2])
        target = keep_last_filled(fill_all, width)
        ch = scatter_columns(ch_all, target, width, 2)
        cpos = scatter_columns(torch.cat([state.cpos, pos], dim=1), target, width, 1)
        cvalid = scatter_columns(torch.cat([state.cvalid, valid & present], 1), target, width, 1)
        return ch, cpos, cvalid, scatter_columns(fill_all, target, width, 1)

    def _usage(self, state: CompressiveMemoryState, ctx: ForwardContext, t: int) -> Tensor:
        """(B, L, W + T) attention received so far by every uncompressed column (old columns accumulate)."""
        assert state.usage is not None
        received = ctx.extras.get(_USAGE, {})
        n_layers, n_c = state.h.shape[1], state.ch.shape[2]
        if len(received) < n_layers:
            raise RuntimeError(
                "most_used compression needs the attention weights of every layer, but the attention did not call "
                "the memory hook (an attention that overrides Attention.forward must call it)"
            )
        # received[i]: (B, C + W + T) over [cmem ; mem ; new tokens]; the uncompressed columns are the last W + T.
        inc = torch.stack([received[i][:, n_c:] for i in range(n_layers)], dim=1).to(state.usage.dtype)
        return torch.cat([state.usage, inc.new_zeros(inc.shape[0], n_layers, t)], dim=2) + inc

    def _losses(
        self,
        layer: int,
        old: Tensor,
        old_valid: Tensor,
        z: Tensor,
        z_valid: Tensor,
        ctx: ForwardContext,
        queries: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Auto-encoding and attention-reconstruction losses of one layer (gradients reach f_c and g only);
        ``queries`` (B, T): the tokens whose attention is reconstructed (a row's first segment: the piece that
        compressed)."""
        compressor: Compressor = self.compressors[layer]  # type: ignore[assignment]
        rec = compressor.decode(z)
        weight = old_valid.to(rec.dtype)
        ae = ((rec - old).pow(2).mean(-1) * weight).sum() / weight.sum().clamp_min(1)

        attention = ctx.extras.get(_ATTENTION, {}).get(layer)
        if attention is None:  # the attention did not call the hook: no projections to compare with
            return ae, ae.new_zeros(())

        def project(linear: nn.Linear, inp: Tensor) -> Tensor:
            w, bias = linear.weight.detach(), linear.bias.detach() if linear.bias is not None else None
            return attention.split_heads(F.linear(inp.to(w.dtype), w, bias))

        hq = ctx.attention_inputs[layer].detach()
        q = project(attention.q_proj, hq)
        a_old = content_attention(
            q, project(attention.k_proj, old), project(attention.v_proj, old), old_valid
        )
        a_new = content_attention(q, project(attention.k_proj, z), project(attention.v_proj, z), z_valid)
        rows = ctx.valid & queries & z_valid.any(1, keepdim=True)  # real queries of rows that compressed
        err = (a_old - a_new).pow(2).mean(-1).mean(1)  # (B, T)
        weight = rows.to(err.dtype)
        return ae, (err * weight).sum() / weight.sum().clamp_min(1)
