"""``knn``: Memorizing Transformer (Wu et al. 2022, arXiv 2203.08913), with SPALM gating as an option.

Every layer keeps a Transformer-XL local memory of the last ``mem_len`` hidden states (the ``xl`` logic, reused);
one layer (``layer``, default the second-to-last) is kNN-augmented: it also owns a non-differentiable external
store of the (key, value) pairs of past tokens, N = ``store_size`` per batch row. Each new query q_t of that
layer retrieves, per head, the k = ``top_k`` stored keys with the highest q̂·k̂ (keys and queries L2-normalised
as in the paper, retrieval is content-only: no positions) and attends over them,
A_mem = softmax(τ_h q̂·k̂_i) v_i with a learned per-head temperature τ_h (initialised at sqrt(D), the size of
q·k/sqrt(D) for unit-variance entries). It is mixed with the layer's own (local) attention output per head:
out = g·A_mem + (1 - g)·A_local, with g = σ(b_g) a learned scalar per head (``gate="per_head"``, the paper's) or
g_t = σ(w_h·x_t + b_h) from the layer input (``gate="spalm"``, the context-dependent gate of SPALM, Yogatama et
al. 2021, arXiv 2102.02557). Before anything was stored (fresh row, after reset) a query retrieves nothing and g
is taken as 0. The queries and the stored keys/values use the layer's own q/k/v projections without the
positional transform (the local attention keeps its positional scheme).

What is stored: after each forward, the tokens that fall out of the local memory (the oldest columns of the XL
window) are written, key k̂ = normalise(W_k h), value W_v h, computed from that layer's stored hidden state h with
the current weights; padding is skipped. So a token is either in the local memory or in the store, never both
(it is never retrieved twice), and the store only holds tokens older than everything in the local context:
nothing from the future can be retrieved. The store is a per-row ring buffer (write pointer ``ptr``): when full,
the oldest entry is overwritten first. ``reset`` empties the row. Streaming is "window": like ``xl``, which
tokens are local depends on the chunking; top-k < N also makes retrieval an approximation of attention over the
whole store (exact when top_k >= store_size).

``index="exact"`` (default) scores every stored key in torch and takes an exact top-k (O(T·N·D) per head);
``index="faiss"`` searches a faiss-cpu inner-product index built from the store (optional dependency, CPU round
trip); both gather the selected keys back in torch so gradients reach the queries, τ and the gate.

Shapes: B batch, T new tokens, N store slots, H heads, D head dim; store keys/values (B, H, N, D).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.context import ForwardContext, MemoryContext
from rl_transformers.backbone.memory.base import Memory
from rl_transformers.backbone.memory.xl import XLMemory, XLMemoryState, XLOptions
from rl_transformers.backbone.options import check_choice, check_int
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State, zero_rows

Gate = Literal["per_head", "spalm"]
Index = Literal["exact", "faiss"]
GATES: tuple[str, ...] = get_args(Gate)
INDEXES: tuple[str, ...] = get_args(Index)
_ATTENTION = "knn/attention"  # ctx.extras slot: the kNN layer's attention module (for write)


@dataclass
class KNNMemoryState(State):
    """local: the XL memory of every layer; keys (B, H, N, D) normalised, values (B, H, N, D) (head-major, so
    that retrieval's matrix products read them in place); valid (B, N); pos (B, N) position of the stored token;
    ptr (B,) next slot to write (the oldest entry once full)."""

    local: XLMemoryState
    keys: Tensor
    values: Tensor
    valid: Tensor
    pos: Tensor
    ptr: Tensor
    owned: bool = False
    """True for the private copy a rollout acts with (:meth:`KNNMemory.with_projections`): an acting step
    (no gradients) writes its one entry into this store in place instead of copying the whole store, so the
    state it was given, and every state sharing its buffers, is spent after that step. False (every other
    state, including what :meth:`KNNMemory.without_projections` returns for storing): writes return a new
    store and the given state stays valid, as for every other state."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "head_major": True}

    def __setstate__(self, data: dict[str, Any]) -> None:
        """Unpickle (a resumed run's loop state); a state saved before the store became head-major (its keys
        and values (B, N, H, D)) is transposed, so old checkpoints resume."""
        if not data.pop("head_major", False):
            data = {**data, "keys": data["keys"].transpose(1, 2), "values": data["values"].transpose(1, 2)}
        self.__dict__.update(data)

    def reset(self, mask: Tensor | None) -> KNNMemoryState:
        """Rows where ``mask`` is True empty their store and local memory: validity, positions and the write
        pointer are cleared; the stored keys and values are kept, since an invalid slot is masked out of the top-k
        scores and of the softmax (weight exactly 0 on a finite value). Saves rewriting the whole store at every
        acting step (resets are masked arithmetic applied at every step); the outputs are the same bit for bit."""
        if mask is None:
            return self
        return dataclasses.replace(
            self,
            local=self.local.reset(mask),
            valid=zero_rows(self.valid, mask),
            pos=zero_rows(self.pos, mask),
            ptr=zero_rows(self.ptr, mask),
        )


@dataclass(frozen=True)
class KNNOptions:
    mem_len: int = 64
    """Local (Transformer-XL) memory per layer: hidden states kept and attended exactly."""
    store_size: int = 512
    """N: (key, value) pairs kept per batch row in the external store (FIFO)."""
    top_k: int = 32
    """k: entries retrieved per query and head (k >= store_size: attention over the whole store)."""
    layer: int | None = None
    """Index of the kNN-augmented layer (negative counts from the end); None = second-to-last (or the only)."""
    gate: Gate = "per_head"
    """per_head: g = σ(b_g) per head (Wu 2022); spalm: g_t = σ(w·x_t + b) per head (Yogatama 2021)."""
    index: Index = "exact"
    """exact: top-k in torch; faiss: faiss-cpu inner-product search (pip install faiss-cpu)."""

    def __post_init__(self) -> None:
        for name in ("mem_len", "store_size", "top_k"):
            check_int(f"knn {name}", getattr(self, name), 1)
        check_choice("knn gate", self.gate, Gate)
        check_choice("knn index", self.index, Index)


def resolve_layer(layer: int | None, n_layers: int) -> int:
    """The kNN layer's index in [0, n_layers) (ValueError naming the valid range otherwise)."""
    if layer is None:
        return max(0, n_layers - 2)
    if not -n_layers <= layer < n_layers:
        raise ValueError(
            f"knn layer={layer} is out of range for n_layers={n_layers}: use -{n_layers}..{n_layers - 1}"
        )
    return layer % n_layers


def faiss_top_k(q: Tensor, keys: Tensor, valid: Tensor, k: int) -> Tensor:
    """Indices (B, H, T, k) of the k largest q·key per query with faiss (-1 pads missing entries).

    q (B, H, T, D), keys (B, H, N, D), valid (B, N). One exact inner-product index per row and head.
    """
    import faiss  # optional dependency

    b, h, t, _ = q.shape
    out = torch.full((b, h, t, k), -1, dtype=torch.long)
    q_np = q.detach().float().cpu().numpy()
    keys_np = keys.detach().float().cpu().numpy()
    valid_cpu = valid.cpu()
    for row in range(b):
        slots = valid_cpu[row].nonzero().squeeze(1)
        if slots.numel() == 0:
            continue
        for head in range(h):
            index = faiss.IndexFlatIP(q.shape[-1])
            index.add(keys_np[row, head, slots.numpy()].copy())
            _, found = index.search(q_np[row, head].copy(), min(k, slots.numel()))
            found_t = torch.from_numpy(found)
            out[row, head, :, : found_t.shape[1]] = torch.where(found_t >= 0, slots[found_t.clamp_min(0)], -1)
    return out.to(q.device)


@register(
    "memory",
    "knn",
    options=KNNOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="window", noncausal=False),
)
class KNNMemory(Memory):
    aligned_positions = True  # the local memory is XL's; retrieval uses no positions
    segment_aware = True  # a query after a restart retrieves nothing; the store keeps the last segment

    def __init__(self, cfg: Any, options: KNNOptions) -> None:
        super().__init__(cfg, options)
        self.local = XLMemory(cfg, XLOptions(mem_len=options.mem_len))
        self.layer = resolve_layer(options.layer, cfg.n_layers)
        h, dh = cfg.n_heads, cfg.d_head
        self.log_temperature = nn.Parameter(torch.full((h,), 0.5 * math.log(dh)))  # τ_h = sqrt(D) at start
        if options.gate == "per_head":
            self.gate_logit = nn.Parameter(torch.zeros(h))
        else:
            self.gate_proj = nn.Linear(cfg.d_model, h)
            nn.init.zeros_(self.gate_proj.weight)
            nn.init.zeros_(self.gate_proj.bias)

    @property
    def window(self) -> int:
        """Local context of every layer (the kNN layer also reaches the store)."""
        return self.options.mem_len

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> KNNMemoryState:
        n, h, dh = self.options.store_size, self.cfg.n_heads, self.cfg.d_head
        return KNNMemoryState(
            local=self.local.init_state(batch, device, dtype),
            keys=torch.zeros(batch, h, n, dh, device=device, dtype=dtype),
            values=torch.zeros(batch, h, n, dh, device=device, dtype=dtype),
            valid=torch.zeros(batch, n, dtype=torch.bool, device=device),
            pos=torch.zeros(batch, n, dtype=torch.long, device=device),
            ptr=torch.zeros(batch, dtype=torch.long, device=device),
        )

    # -- read: XL memory everywhere, retrieval at the kNN layer ----------------------------------------------
    def read(self, state: KNNMemoryState) -> list[MemoryContext | None]:
        contexts = self.local.read(state.local)
        mem = contexts[self.layer]
        assert mem is not None
        contexts[self.layer] = dataclasses.replace(mem, hook=partial(self._augment, state))
        return contexts

    def retrieve(
        self, state: KNNMemoryState, q: Tensor, may_retrieve: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """kNN attention of raw queries q (B, H, T, D) over the store: (A_mem (B, H, T, D), found (B, H, T)).
        ``may_retrieve`` (B, T) bool: False for queries that see an empty store (restarted inside the chunk).

        One matrix product gives every q̂·k̂ (the store is head-major: read in place); the top-k indices are
        taken from it without gradient; the softmax runs over the k picked scores; the weights are spread back
        over the N slots (0 elsewhere) and a second product with the values gives A_mem. The same sum as
        gathering the k selected keys and values (tested against it in float64), without copying k keys and
        values per query. faiss pads missing entries with -1: they point at slot 0 with weight 0."""
        qn = F.normalize(q, dim=-1)
        keys = state.keys.to(q.dtype)
        values = state.values.to(q.dtype)
        n = keys.shape[2]
        k = min(self.options.top_k, n)
        cosine = torch.matmul(qn, keys.transpose(-1, -2))  # (B, H, T, N)
        valid = state.valid[:, None, None, :]
        if may_retrieve is not None:
            valid = valid & may_retrieve[:, None, :, None]
        valid = valid.expand_as(cosine)
        if self.options.index == "faiss":
            idx = faiss_top_k(qn, keys, state.valid, k)
        else:
            with torch.no_grad():
                idx = cosine.detach().masked_fill(~valid, float("-inf")).topk(k, dim=-1).indices
        picked = valid.gather(-1, idx.clamp_min(0)) & (idx >= 0)  # (B, H, T, k): a valid slot was retrieved
        idx = idx.clamp_min(0)
        tau = self.log_temperature.exp().to(q.dtype)[None, :, None, None]
        weights = torch.softmax((tau * cosine.gather(-1, idx)).masked_fill(~picked, float("-inf")), dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)  # nothing retrieved
        spread = torch.zeros_like(cosine).scatter_add(-1, idx, weights)  # (B, H, T, N), 0 off the top k
        return torch.matmul(spread, values), picked.any(-1)

    def gate(self, x: Tensor) -> Tensor:
        """g (B or 1, H, T or 1) in (0, 1): weight of the retrieved memories."""
        if self.options.gate == "per_head":
            return torch.sigmoid(self.gate_logit).to(x.dtype)[None, :, None]
        return torch.sigmoid(self.gate_proj(x)).transpose(1, 2)

    def _augment(
        self, state: KNNMemoryState, attention: Any, x: Tensor, out: Tensor, ctx: ForwardContext
    ) -> Tensor:
        """The hook at the kNN layer: out = g·A_mem + (1 - g)·A_local (g = 0 where nothing was retrieved)."""
        ctx.extras[_ATTENTION] = attention
        q = attention.split_heads(attention.q_proj(x))
        # a query restarted inside the chunk (segment > 0) belongs to an episode that has stored nothing yet
        a_mem, found = self.retrieve(state, q, None if ctx.segment is None else ctx.segment == 0)
        g = self.gate(x) * found.to(x.dtype)
        if ctx.collect_info:
            ctx.add_info(f"backbone/knn_gate/layer{self.layer}", g.mean().detach())
            ctx.add_info("backbone/knn_store_fill", state.valid.float().mean().detach())
        return g[..., None] * a_mem + (1 - g[..., None]) * out

    # -- write: XL memories, then the tokens leaving the kNN layer's local window go to the store ------------------
    def write(self, state: KNNMemoryState, ctx: ForwardContext) -> KNNMemoryState:
        local = state.local
        h_all = torch.cat(
            [local.h[:, self.layer], ctx.attention_inputs[self.layer].detach().to(local.h.dtype)], 1
        )
        n_out = max(0, h_all.shape[1] - self.options.mem_len)  # oldest columns leave the local window
        old_valid, new_valid = local.valid, ctx.valid
        # rows restarted inside the chunk: an empty store, their last segment only
        if ctx.segment is not None:
            last = ctx.segment[:, -1:]
            state = state.reset(last[:, 0] > 0)
            old_valid, new_valid = old_valid & (last == 0), new_valid & (ctx.segment == last)
        store = (state.keys, state.values, state.valid, state.pos, state.ptr)
        if n_out:
            attention = ctx.extras.get(_ATTENTION)
            if attention is None:
                raise RuntimeError(
                    "the knn memory needs its layer's attention projections, but the attention did not call the "
                    "memory hook (an attention that overrides Attention.forward must call it)"
                )
            pos_all = torch.cat([local.pos, ctx.pos], dim=1)
            valid_all = torch.cat([old_valid, new_valid], dim=1)
            in_place = state.owned and not torch.is_grad_enabled()  # an owned store, written while acting
            with torch.no_grad():
                h_out = h_all[:, :n_out]
                w_k, w_v = attention.k_proj, attention.v_proj
                keys = F.normalize(attention.split_heads(w_k(h_out.to(w_k.weight.dtype))), dim=-1)
                values = attention.split_heads(w_v(h_out.to(w_v.weight.dtype)))
                store = self.store_append(
                    state,
                    keys.to(state.keys.dtype),
                    values.to(state.values.dtype),
                    pos_all[:, :n_out],
                    valid_all[:, :n_out],
                    in_place=in_place,
                )
        keys, values, valid, pos, ptr = store
        return KNNMemoryState(self.local.write(local, ctx), keys, values, valid, pos, ptr, state.owned)

    # -- acting: the local memory's projections cached, the store owned ----------------------------------------
    def with_projections(self, state: KNNMemoryState, attentions: list[Any]) -> KNNMemoryState:
        """For a rollout (fixed weights): the local memory's key / value projections cached (``xl``'s), and a
        private copy of the store that the acting steps then write in place (``owned``): one copy of the store
        per rollout instead of one per step. The given state is not changed."""
        return dataclasses.replace(
            state,
            local=self.local.with_projections(state.local, attentions),
            keys=state.keys.clone(),
            values=state.values.clone(),
            owned=True,
        )

    def without_projections(self, state: KNNMemoryState) -> KNNMemoryState:
        """What a rollout stores: no cached projections, and a store of its own (a copy when ``owned``, since
        the next acting step writes the owned one in place)."""
        local = self.local.without_projections(state.local)
        if not state.owned:
            return dataclasses.replace(state, local=local)
        return dataclasses.replace(
            state, local=local, keys=state.keys.clone(), values=state.values.clone(), owned=False
        )

    def store_append(
        self,
        state: KNNMemoryState,
        keys: Tensor,
        values: Tensor,
        pos: Tensor,
        valid: Tensor,
        *,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Write the valid entries (keys/values (B, H, n, D), pos/valid (B, n), oldest first) into the ring
        buffers, overwriting the oldest entries; returns (keys, values, valid, pos, ptr).

        One entry per row (every acting step) is a scatter into the slot under the pointer (of the entry, or of
        the slot's own content when the entry is not kept); several (a chunk) are a scatter into the buffers
        padded with one dump slot for the entries that are not kept. Both write the same values (tested against
        each other); the first copies each buffer once, without the padding or a pass of elementwise selects,
        and not at all with ``in_place`` (an ``owned`` store while acting: ``state``'s buffers are written)."""
        size = state.valid.shape[1]
        written = valid.long().cumsum(1)  # 1-based order of each valid entry
        count = written[:, -1:]
        keep = valid & (count - written < size)  # if more than N arrive, only the newest N survive
        ptr = (state.ptr + count.squeeze(1)) % size
        if valid.shape[1] == 1:  # the slot under the pointer takes the entry, or keeps its own
            index = state.ptr.view(-1, 1, 1, 1).expand_as(keys)
            kept = keep.view(-1, 1, 1, 1)

            def put_one(buffer: Tensor, new: Tensor) -> Tensor:
                entry = torch.where(kept, new, buffer.gather(2, index))
                return buffer.scatter_(2, index, entry) if in_place else buffer.scatter(2, index, entry)

            hit = keep & (torch.arange(size, device=valid.device) == state.ptr[:, None])  # (B, N)
            return (
                put_one(state.keys, keys),
                put_one(state.values, values),
                state.valid | hit,
                torch.where(hit, pos, state.pos),
                ptr,
            )
        slot = torch.where(keep, (state.ptr[:, None] + written - 1) % size, size)  # slot ``size`` is dropped

        def put(buffer: Tensor, new: Tensor, dim: int) -> Tensor:
            padded = torch.cat([buffer, buffer.narrow(dim, 0, 1)], dim=dim)  # one dump slot
            index = slot.view(
                slot.shape[:1] + (1,) * (dim - 1) + slot.shape[1:] + (1,) * (new.dim() - dim - 1)
            )
            return padded.scatter(dim, index.expand_as(new), new).narrow(dim, 0, size)

        return (
            put(state.keys, keys, 2),
            put(state.values, values, 2),
            put(state.valid, keep, 1),
            put(state.pos, pos, 1),
            ptr,
        )

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        resolve_layer(options.layer, cfg.n_layers)
        if options.index == "faiss":
            try:
                import faiss  # noqa: F401
            except ImportError as err:
                raise ValueError(
                    "knn index='faiss' needs faiss-cpu (pip install faiss-cpu); or use index='exact'"
                ) from err
