"""FlexAttention form of the mask-defined attentions: one fused kernel per call on CUDA.

The sparse patterns (``local``, ``block_local``, ``block_local_2d``, ``strided``, ``fixed``, ``blockwise``,
``longformer``, ``bigbird``, ``etc``), the Gaussian prior and adaptive span's soft window are each
softmax(q·kᵀ·scale + b(i, j)) over a key set M(i, j); FlexAttention (Dong et al. 2024, arXiv 2412.05496;
``torch.nn.attention.flex_attention``) computes exactly that with a ``mask_mod`` M and a ``score_mod`` b,
skipping the key blocks the mask leaves empty (``create_block_mask``), in one fused, compiled kernel on CUDA.

- **mask**: the entry's own ``allow(q_pos, k_pos)`` predicate (the one its dense and blocked forms use) applied
  to one query / key at a time, with the padding, causality, window, segment and always-attended own key of
  ``_dense.pattern_mask`` (or of ``base.visible_mask``: causality by index, see :func:`flex_pattern`);
  patterns that differ per head or row (strided / fixed under ``split_heads``, longformer's dilations,
  blockwise's permutations) pass ``keep(b, h, q_index, q_pos, k_pos)``, which reads 1-D per-head tables at h.
- **score**: a distance bias of the position scheme (``t5``, ``alibi``, ``kerple_*``, ``sandwich``: any
  :class:`~rl_transformers.backbone.position.bias.DistanceBias`) as a per-head table over the 2S - 1 distances of
  the call, gathered at q_pos - k_pos (learned tables and slopes keep their gradients), plus the entry's own term
  (the Gaussian prior, the log of adaptive span's ramp).

Dispatch (:func:`use_flex`): the flex form is chosen when :func:`flex_available` says the device runs it (CUDA,
compute capability >= 8.0, FlexAttention importable) and the call has at least :data:`FLEX_MIN_LEN` queries, no
attention dropout, a head dim and dtype (16 / 32 bit) the kernel takes, and a position scheme of kind none /
input / qk / a distance bias. Everything else, the CPU included, keeps the dense / blocked / fused forms of ``_dense`` and ``_banded``.
On CPU FlexAttention runs eager (an unfused reference implementation, forward only: no backward on CPU) and
compiled (forward, slow to compile); tests force the eager form with ``FLEX_PATH = "always"``.
Shapes: q (B, H, T, D), k, v (B, H, S, D), q_pos (B, T), k_pos, k_valid (B, S).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.attention.base import key_segments
from rl_transformers.backbone.position.bias import DistanceBias

Allow = Callable[[Tensor, Tensor], Tensor]
"""(q_pos, k_pos) -> bool, broadcastable to (B, H, N, c, K); here called on one query and one key."""
ScoreTerm = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""(b, h, q_index, q_pos, k_pos) -> additive logit term of one (query, key) pair (``keep``: bool, whether the
pair may be attended)."""

FLEX_PATH = "auto"
""""auto" (by :func:`flex_available` and the call), "always" (tests: the flex form wherever the call allows it,
CPU included) or "never"."""
FLEX_MIN_LEN = 512
"""Calls with fewer queries keep the dense / blocked forms (streaming steps, RL windows): short calls gain
nothing from the fused kernel and every new shape costs a compilation."""
FLEX_COMPILE = "auto"
""""auto" (compiled on CUDA, eager elsewhere), True or False: whether flex_attention runs compiled."""
RECOMPILE_LIMIT = 256
"""Compilations of the flex kernel allowed (Dynamo's default, 8, is below the sizes x patterns of one run)."""
BLOCK = 128
"""Block size of the block mask (FlexAttention's default tile)."""
WORK: list[float] | None = None
"""When a list (the benchmark's kernel census sets one, ``bench/kernels.py``): every flex call appends the
FLOPs its kernel really does, 4·D per computed (query, key) pair of the non-empty tiles of its block mask,
x 3.5 when gradients will flow (forward + backward, the FlashAttention convention). None: nothing recorded."""


def flex_available(device: torch.device) -> bool:
    """Whether the flex form runs on ``device``: CUDA with compute capability >= 8.0 (Ampere and later, where
    the Triton kernel takes bf16) and ``torch.nn.attention.flex_attention`` importable. Tests mock this."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def scores_supported(position: Any) -> bool:
    """Position schemes the score modifier expresses: no logit term (none / input / qk), or a distance bias."""
    if not position.modifies_scores:
        return True
    return isinstance(position, DistanceBias) and position.shift_invariant


def use_flex(att: Any, q: Tensor) -> bool:
    """Whether ``att``'s call on queries q (B, H, T, D) takes the flex form (see the module docstring)."""
    if FLEX_PATH == "never" or not scores_supported(att.position):
        return False
    if att.training and att.attn_dropout.p > 0:
        return False
    if FLEX_PATH == "always":
        return True
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):  # float64 (references) keeps today's
        return False
    d = q.shape[-1]
    head_dim_ok = d >= 16 and d & (d - 1) == 0
    return q.shape[2] >= FLEX_MIN_LEN and head_dim_ok and flex_available(q.device)


def _allow_recompiles() -> None:
    import torch._dynamo.config

    # Every (length, pattern, score term) is its own compilation; past the default limit of 8 Dynamo would run
    # the rest eagerly (the unfused form, T x S scores).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


@functools.cache
def _compiled() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    _allow_recompiles()
    return torch.compile(flex_attention, dynamic=False)  # type: ignore[no-any-return]


@functools.cache
def _compiled_block_mask() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import create_block_mask

    _allow_recompiles()
    # static shapes: a second length must recompile, not turn the sizes into symbols (the predicates' index
    # arithmetic on captured lengths does not trace under vmap with symbolic sizes)
    return torch.compile(create_block_mask, dynamic=False)  # type: ignore[no-any-return]


def build_block_mask(
    mask_mod: Callable[..., Tensor], b: int, h: int | None, t: int, s: int, device: Any
) -> Any:
    """``create_block_mask`` of (B, H|None, T, S) with :data:`BLOCK` tiles, compiled where the kernel is."""
    from torch.nn.attention.flex_attention import create_block_mask

    build = _compiled_block_mask() if compiled_on(device) else create_block_mask
    return build(mask_mod, b, h, t, s, device=device, BLOCK_SIZE=BLOCK)


def compiled_on(device: torch.device) -> bool:
    """Whether flex_attention and the block mask are compiled on ``device`` (see :data:`FLEX_COMPILE`)."""
    return device.type == "cuda" if FLEX_COMPILE == "auto" else bool(FLEX_COMPILE)


def _kernel(device: torch.device) -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled() if compiled_on(device) else flex_attention  # type: ignore[return-value]


def check_scalar(allow: Allow | None, q_pos: Tensor, k_pos: Tensor) -> None:
    """``allow`` must give one value per (query, key): a per-head or per-row predicate would compute a
    (B|1, H|1, ...) intermediate inside the kernel's mask, which the compiled kernel does not lower as the
    eager form computes it (per-head patterns pass ``keep``, which reads the head index)."""
    if allow is None:
        return
    r = allow(q_pos[0, 0], k_pos[0, 0])
    if r.dim() != 0:
        raise ValueError(f"a flex mask predicate must return one value per pair, got shape {tuple(r.shape)}")


def distance_table(
    position: Any, s: int, layer: int, dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """(H, 2S - 1) bias of every distance -(S - 1) .. S - 1 (index = distance + S - 1), or None (no bias)."""
    if not position.modifies_scores:
        return None
    rel = torch.arange(-(s - 1), s, device=device)
    bias = position.bias(torch.zeros(1, 1, dtype=torch.long, device=device), -rel[None], layer, dtype)
    return bias[0, :, 0, :]


def flex_pattern(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    allow: Allow | None,
    *,
    window: int | None = None,
    past_window: bool = False,
    causal_by_index: bool = False,
    ctx: Any = None,
    keep: ScoreTerm | None = None,
    per_head: bool = True,
    score: ScoreTerm | None = None,
) -> Tensor:
    """The pattern as one FlexAttention call: (B, H, T, D).

    Mask = k_valid & ``allow`` & causality (by position, as ``_dense.pattern_mask``; ``causal_by_index``: by
    column, as ``base.visible_mask``) & ``window`` (keys at most ``window`` columns away, both sides, or only
    before the query with ``past_window``, as ``full.window_limit``) & the query's own segment (when ``ctx``
    is given and rows restart inside it) & ``keep``, or the query's own key. ``per_head=False``: ``keep`` is
    the same for every head (one block mask for all heads). Score = q·k·scale + the position scheme's
    distance bias + ``score``.
    """
    b, h, t, _ = q.shape
    s = k.shape[2]
    off = s - t
    causal = att.causal
    check_scalar(allow, q_pos, k_pos)
    heads = keep is not None and per_head
    seg_q = seg_k = None
    if ctx is not None and ctx.segment is not None:
        seg_q, seg_k = ctx.segment, key_segments(ctx, s)

    def mask_mod(bi: Tensor, hi: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
        qi, kj = qi.clamp(max=t - 1), kj.clamp(max=s - 1)  # a padded tile may ask beyond the ends
        qp, kp = q_pos[bi, qi], k_pos[bi, kj]
        m = k_valid[bi, kj]
        if allow is not None:
            m = m & allow(qp, kp)
        if causal:
            m = m & ((kj <= qi + off) if causal_by_index else (kp <= qp))
        if window is not None:
            dist = qi + off - kj
            m = m & ((dist <= window) if past_window else (dist.abs() <= window))
        if seg_q is not None and seg_k is not None:
            m = m & (seg_q[bi, qi] == seg_k[bi, kj])
        if keep is not None:
            m = m & keep(bi, hi, qi, qp, kp)
        return m | (kj == qi + off)

    block_mask = build_block_mask(mask_mod, b, h if heads else None, t, s, q.device)
    table = distance_table(att.position, s, att.layer, torch.promote_types(q.dtype, torch.float32), q.device)
    score_mod = None
    if table is not None or score is not None:

        def score_mod(x: Tensor, bi: Tensor, hi: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            qi, kj = qi.clamp(max=t - 1), kj.clamp(max=s - 1)
            qp, kp = q_pos[bi, qi], k_pos[bi, kj]
            if table is not None:
                x = x + table[hi, (qp - kp + s - 1).clamp(0, 2 * s - 2)].to(x.dtype)
            if score is not None:
                x = x + score(bi, hi, qi, qp, kp).to(x.dtype)
            return x

    out = _kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=att.position.scale)
    if WORK is not None:
        WORK.append(tile_flops(block_mask, b, h, q.shape[-1], q.requires_grad or k.requires_grad))
    return out  # type: ignore[no-any-return]


def tile_flops(block_mask: Any, b: int, h: int, d: int, backward: bool) -> float:
    """FLOPs of the tiles a block mask makes the kernel compute: 4·D per (query, key) pair of every partial
    or full tile, for all B rows and H heads (a mask shared by the heads counts once per head)."""
    tiles = float(block_mask.kv_num_blocks.sum())
    if block_mask.full_kv_num_blocks is not None:
        tiles += float(block_mask.full_kv_num_blocks.sum())
    q_block, kv_block = block_mask.BLOCK_SIZE
    rows, heads = block_mask.kv_num_blocks.shape[:2]
    tiles *= (b // rows) * (h // heads)
    return 4.0 * d * tiles * q_block * kv_block * (3.5 if backward else 1.0)
