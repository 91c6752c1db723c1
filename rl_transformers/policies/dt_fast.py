"""A fused training forward for the Decision Transformer's plain GPT-2 backbone (same maths, less work).

:class:`~rl_transformers.policies.decision_transformer.DecisionTransformer` uses it when its backbone is the
paper's shape — ``full`` attention without a cache bound, ``pre_ln`` blocks, ``fixed`` depth, position
``none``, no memory, causal, no diagnostics — with right padding and no incoming state. It reads the weights
of the generic :class:`~rl_transformers.backbone.Backbone` (no parameters of its own, so checkpoints and the
generic path are unchanged) and differs from it only in how the same function is computed:

- **no padding mask**: with right padding every padded token sits after all real tokens of its row, so the
  causal mask alone already hides them from real queries; one (T, T) additive causal mask serves the whole
  batch instead of a (B, 1, T, T) boolean mask. Outputs at padded tokens differ from the
  generic path (which lets a padded query see only itself); they are ignored by the loss and by every caller.
- **one QKV matmul**: the q, k, v projections run as one ``linear`` over the concatenated weights.
- **one embedding matmul**: :func:`fused_embed` embeds return, state and action (Box spaces) with one
  block-diagonal ``addmm`` whose output is already in token order (no stack).
- **last layer at the state tokens only**: the action is read at the state tokens, so the last block computes
  its queries, output projection, residual, FFN and the final LayerNorm for those K tokens only (keys and
  values still cover the other tokens): about a fifth of the matmul work of a 3-layer model. The window's last
  token (the action a_{K-1}) is seen by no state token and is dropped in every layer.
- **2-D position-wise work**: LayerNorms, projections and the FFN run on (B·T, d) matrices (no views under
  in-place ops), the ReLU in place on the FFN hidden activation (one allocation fewer per layer).
- **cheaper dropout**: :func:`fast_dropout` draws the same Bernoulli masks from 32-bit random integers (the
  halves of 64-bit draws; several times cheaper than ``bernoulli_`` on CPU) compared straight into a 0 / 1
  tensor; the 1 / (1 - p) scale is folded into work done anyway — the embedding LayerNorm's affine parameters,
  the v projection (for the attention weights' dropout), ``addcmul``'s ``value`` (residual branches). p = 0 and
  the FFN's hidden dropout (GPT-2 has none) cost nothing. Tested against the generic path with every mask
  forced to keep.
- **hand-written backward on the dropout path** (training, 0 < p < 1): the attention, the attention's output
  projection + residual dropout and GPT-2's ReLU FFN + residual dropout are autograd Functions computing the
  same gradients with the same matmuls but fewer memory passes (q / k / v grads written contiguously and
  joined once instead of autograd's strided stack, dropout scales folded into the small weight operands, the
  ReLU backward in place). Tested against the generic path (every mask forced to keep: predictions and all
  gradients) and against autograd of the same forward with random masks (``MANUAL_BACKWARD = False``).

Equality with the generic path at every real state token is tested in tests/policies/test_decision_transformer.py
(float64, dropout 0, padded batches, several depths).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from rl_transformers.backbone.blocks import PreLNBlock


def fast_path_reason(model: Any) -> str | None:
    """Why ``model`` (a DecisionTransformer) cannot use :func:`fused_forward` (None = it can)."""
    cfg = model.backbone_config
    checks = {
        "attention": (cfg.attention, "full"),
        "block": (cfg.block, "pre_ln"),
        "depth": (cfg.depth, "fixed"),
        "position": (cfg.position, "none"),
        "padding": (model.padding, "right"),
    }
    for name, (value, wanted) in checks.items():
        if value != wanted:
            return f"{name}={value!r} (the fused path needs {wanted!r})"
    if cfg.memory is not None:
        return f"memory={cfg.memory!r}"
    if cfg.options("attention").max_cache is not None or cfg.options("attention").force_dense:
        return "attention options max_cache / force_dense"
    if cfg.options("block").ffn_chunks != 1:
        return "ffn_chunks != 1"
    if model.backbone.collect_info:
        return "backbone.collect_info"
    return None


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _keep_mask(x: Tensor, p: float) -> Tensor:
    """A no-grad 0 / 1 tensor shaped like ``x`` (its dtype): 1 with probability 1 - p (up to 2**-32).

    One uniform 32-bit random integer per entry compared with a threshold, the comparison written straight
    into a tensor of ``x``'s dtype (one pass; the 1 / (1 - p) scale is applied by the caller, folded into an
    operation it runs anyway). The 32-bit integers are the two halves of full-range 64-bit draws (two
    Mersenne-Twister outputs each, so independent and uniform over all 2**32 values): one ``random_`` entry per
    two mask entries, a quarter cheaper on CPU than an int32 ``random_()`` per entry.
    """
    n = x.numel()
    threshold = min(_INT32_MIN + round(p * 2**32), _INT32_MAX)
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), None)
    draws = words.view(torch.int32)[:n].view(x.shape)
    return torch.ge(draws, threshold, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))


def fast_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: each entry kept with probability 1 - p (up to 2**-32) and scaled by 1 / (1 - p).

    The same distribution as :func:`torch.nn.functional.dropout`, drawn as one 32-bit integer per entry
    compared with a threshold (:func:`_keep_mask`) — several times cheaper on CPU than ``bernoulli_`` (a
    different random stream, so masks differ).
    """
    if not training or p <= 0:
        return x
    if p >= 1:
        return x * 0.0
    return torch.mul(x, _keep_mask(x, p)).mul_(1.0 / (1.0 - p))


def residual_dropout(x: Tensor, branch: Tensor, p: float, training: bool) -> Tensor:
    """``x + fast_dropout(branch)`` in one pass (``addcmul`` with the 1 / (1 - p) scale as its ``value``)."""
    if not training or p <= 0:
        return x + branch
    if p >= 1:
        return x + branch * 0.0
    return torch.addcmul(x, branch, _keep_mask(branch, p), value=1.0 / (1.0 - p))


def _attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, p: float, training: bool) -> Tensor:
    """Softmax attention with an additive (Tq, Tk) mask ``bias`` (0 / -inf); dropout on the weights.

    With dropout, ``q`` must come already multiplied by D**-0.5 and ``v`` by 1 / (1 - p) (both folded into
    their projections by :func:`fused_forward`, so the backward has no scaling passes): the weights are only
    masked, ``(P ⊙ M) (v / (1 - p)) = (P ⊙ M / (1 - p)) v``.
    """
    if not training or p <= 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    b, h, t, d = q.shape
    scores = torch.baddbmm(bias, q.reshape(b * h, t, d), k.reshape(b * h, -1, d).transpose(1, 2))
    probs = torch.softmax(scores, dim=-1)
    weights = torch.mul(probs, _keep_mask(probs, p))
    return torch.bmm(weights, v.reshape(b * h, -1, d)).view(b, h, t, d)


# --- hand-written backward passes of the dropout (training) path ------------------------------------------------
#
# Autograd of the ops above builds the attention gradient of the packed q / k / v projection by stacking three
# grads, one of them a transposed view (a strided gather over the whole (B·T, 3d) tensor), multiplies a residual
# branch's gradient by its mask and then by the 1 / (1 - p) scale (two passes), and allocates a fresh tensor for
# the ReLU backward on the (B·T, 4d) FFN hidden activation. The functions below compute the same gradients with
# the same matmuls: the attention's q / k / v grads written contiguously and joined once, the scale folded into
# the (d, d) / (d, 4d) weights of the backward matmuls, the ReLU backward in place. ``MANUAL_BACKWARD = False``
# runs the plain autograd of the same forward (the reference of the tests).

MANUAL_BACKWARD = True
"""Use the hand-written backward passes on the dropout path (False: autograd of the same ops)."""


def _split(x: Tensor, b: int, t: int, parts: int, heads: int, d_head: int) -> list[Tensor]:
    """(B·T, parts·d) projections -> ``parts`` tensors (B·H, T, D) (views when H = 1)."""
    return [
        u.transpose(1, 2).reshape(b * heads, t, d_head) for u in x.view(b, t, parts, heads, d_head).unbind(2)
    ]


def _join(parts: list[Tensor], b: int, t: int, heads: int, d_head: int) -> Tensor:
    """Inverse of :func:`_split`: ``parts`` tensors (B·H, T, D) -> one (B·T, parts·d) tensor."""
    views = [u.view(b, heads, t, d_head).transpose(1, 2) for u in parts]
    if len(views) == 1:
        return views[0].reshape(b * t, heads * d_head)
    return torch.stack(views, dim=2).view(b * t, len(parts) * heads * d_head)


class _DropoutAttention(torch.autograd.Function):
    """:func:`_attention` with dropout from packed projections: (B·Tq, d) outputs, backward by hand.

    ``qsrc`` is the (B·T, 3d) [q | k | v] projection when ``kvsrc`` is None, else the (B·Tq, d) q projection
    with ``kvsrc`` the (B·T, 2d) [k | v] one. q and v come scaled as :func:`_attention` needs them.
    """

    @staticmethod
    def forward(
        ctx: Any, qsrc: Tensor, kvsrc: Tensor | None, bias: Tensor, p: float, b: int, heads: int
    ) -> Tensor:
        d = qsrc.shape[1] // (3 if kvsrc is None else 1)
        d_head = d // heads
        q, k, v = _DropoutAttention._qkv(qsrc, kvsrc, b, heads, d_head)
        probs = torch.softmax(torch.baddbmm(bias, q, k.transpose(1, 2)), dim=-1)
        keep = _keep_mask(probs, p)
        weights = torch.mul(probs, keep)
        ctx.save_for_backward(qsrc, kvsrc, probs, keep, weights)
        ctx.b, ctx.heads, ctx.d_head = b, heads, d_head
        return _join([torch.bmm(weights, v)], b, q.shape[1], heads, d_head)

    @staticmethod
    def _qkv(qsrc: Tensor, kvsrc: Tensor | None, b: int, heads: int, d_head: int) -> list[Tensor]:
        if kvsrc is None:
            return _split(qsrc, b, qsrc.shape[0] // b, 3, heads, d_head)
        return _split(qsrc, b, qsrc.shape[0] // b, 1, heads, d_head) + _split(
            kvsrc, b, kvsrc.shape[0] // b, 2, heads, d_head
        )

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        qsrc, kvsrc, probs, keep, weights = ctx.saved_tensors
        b, heads, d_head = ctx.b, ctx.heads, ctx.d_head
        q, k, v = _DropoutAttention._qkv(qsrc, kvsrc, b, heads, d_head)
        (g_out,) = _split(grad, b, q.shape[1], 1, heads, d_head)
        g_weights = torch.bmm(g_out, v.transpose(1, 2)).mul_(keep)  # d probs
        g_v = torch.bmm(weights.transpose(1, 2), g_out)
        g_scores = torch._softmax_backward_data(g_weights, probs, -1, probs.dtype)
        g_q = torch.bmm(g_scores, k)
        g_k = torch.bmm(g_scores.transpose(1, 2), q)
        t, tq = k.shape[1], q.shape[1]
        if kvsrc is None:
            return _join([g_q, g_k, g_v], b, t, heads, d_head), None, None, None, None, None
        return (
            _join([g_q], b, tq, heads, d_head),
            _join([g_k, g_v], b, t, heads, d_head),
            None,
            None,
            None,
            None,
        )


class _LinearResidualDropout(torch.autograd.Function):
    """``x + keep ⊙ (inp Wᵀ + bias) / (1 - p)`` (a residual branch ending in a linear), backward by hand."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, inp: Tensor, weight: Tensor, bias: Tensor, p: float) -> Tensor:
        y = torch.addmm(bias, inp, weight.t())
        keep = _keep_mask(y, p)
        ctx.save_for_backward(inp, weight, keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.addcmul(x, y, keep, value=ctx.scale)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        inp, weight, keep = ctx.saved_tensors
        s = ctx.scale
        g_y = torch.mul(grad, keep)  # the branch's gradient / s: s is folded into the small matmul operands
        g_inp = torch.mm(g_y, weight * s) if ctx.needs_input_grad[1] else None
        return grad, g_inp, torch.mm(g_y.t(), inp).mul_(s), g_y.sum(0).mul_(s), None


class _ReluFFNResidualDropout(torch.autograd.Function):
    """``x + keep ⊙ fc2(relu(fc1(u))) / (1 - p)`` (GPT-2's FFN branch), backward by hand (ReLU in place)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, u: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, p: float
    ) -> Tensor:
        hidden = torch.addmm(b1, u, w1.t()).relu_()
        y = torch.addmm(b2, hidden, w2.t())
        keep = _keep_mask(y, p)
        ctx.save_for_backward(u, w1, hidden, w2, keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.addcmul(x, y, keep, value=ctx.scale)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        u, w1, hidden, w2, keep = ctx.saved_tensors
        s = ctx.scale
        g_y = torch.mul(grad, keep)
        g_hidden = torch.mm(g_y, w2 * s)
        g_w2 = torch.mm(g_y.t(), hidden).mul_(s)
        g_b2 = g_y.sum(0).mul_(s)
        g_pre = torch.ops.aten.threshold_backward.grad_input(g_hidden, hidden, 0, grad_input=g_hidden)
        g_u = torch.mm(g_pre, w1) if ctx.needs_input_grad[1] else None
        return grad, g_u, torch.mm(g_pre.t(), u), g_pre.sum(0), g_w2, g_b2, None


def _mask_bias(t: int, rows: slice | None, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(Tq, T) additive causal mask over T tokens; ``rows`` picks the query tokens (e.g. the state tokens)."""
    pos = torch.arange(t, device=device)
    q = pos if rows is None else pos[rows]
    bias = torch.zeros(q.shape[0], t, device=device, dtype=dtype)
    return bias.masked_fill_(pos[None, :] > q[:, None], float("-inf"))


def _scaled(w: Tensor, scale: float) -> Tensor:
    return w if scale == 1.0 else w * scale


def _embed_norm_dropout(norm: nn.LayerNorm, x: Tensor, p: float, training: bool) -> Tensor:
    """``fast_dropout(norm(x), p)``, the 1 / (1 - p) scale folded into the LayerNorm's affine parameters."""
    if not training or p <= 0 or p >= 1 or norm.weight is None:
        return fast_dropout(norm(x), p, training)
    s = 1.0 / (1.0 - p)
    bias = None if norm.bias is None else norm.bias * s
    y = F.layer_norm(x, norm.normalized_shape, norm.weight * s, bias, norm.eps)
    return torch.mul(y, _keep_mask(y, p))


def _heads(x: Tensor, b: int, t: int, parts: int, heads: int, d_head: int) -> tuple[Tensor, ...]:
    """(B·T, parts·d) projections -> ``parts`` tensors (B, H, T, D) (views)."""
    return tuple(u.transpose(1, 2) for u in x.view(b, t, parts, heads, d_head).unbind(2))


def fused_embed(
    model: Any, returns_to_go: Tensor, observations: Tensor, actions: Tensor, timesteps: Tensor
) -> Tensor:
    """``model.embed_steps`` (B, K, n, d) with the n linear token embeddings as one matmul.

    The return, state and action embeddings of a step are one linear map of the concatenated inputs
    ``[R̂ · scale, normalised s, a]`` with a block-diagonal weight (``torch.block_diag`` of the three weights,
    so gradients reach them unchanged), whose (B·K, n·d) output is already the token order. Box observations
    and actions only (an ``nn.Embedding`` table is a lookup): otherwise ``model.embed_steps``.
    """
    if model.discrete_observations or model.discrete_actions:
        return model.embed_steps(returns_to_go, observations, actions, timesteps)
    b, k = timesteps.shape
    d = model.embed_timestep.embedding_dim
    dtype = model.state_mean.dtype
    t = model.embed_timestep(timesteps.long().clamp(0, model.max_ep_len - 1))
    obs = (observations.reshape(b, k, model.obs_dim).to(dtype) - model.state_mean) / model.state_std
    parts = [obs, actions.reshape(b, k, model.action_dim).to(dtype)]
    linears = [model.embed_state, model.embed_action]
    if model.embed_return is not None:
        parts.insert(0, returns_to_go.reshape(b, k, 1).to(dtype) * model.return_scale)
        linears.insert(0, model.embed_return)
    inputs = torch.cat(parts, dim=-1).reshape(b * k, -1)
    weight = torch.block_diag(*(lin.weight for lin in linears))
    bias = torch.cat([lin.bias for lin in linears])
    tokens = torch.addmm(bias, inputs, weight.t()).view(b, k, len(linears), d)
    return tokens + t.unsqueeze(2)


def fused_forward(model: Any, tokens: Tensor) -> Tensor:
    """Backbone outputs at the state tokens, (B, K, d), of the (B, K, n, d) step embeddings (before LN).

    The last token of the window (the action a_{K-1}, read by no state token) is dropped from the start.
    """
    b, k, n, d = tokens.shape
    t = k * n - 1
    training = model.training
    cfg = model.backbone_config
    p = float(cfg.dropout)
    heads, d_head = cfg.n_heads, cfg.d_head
    x = tokens.reshape(b, k * n, d)[:, :t].reshape(b * t, d)
    x = _embed_norm_dropout(model.embed_norm, x, model.embed_dropout.p, training)
    drop = training and p > 0
    v_scale = 1.0 / (1.0 - p) if drop and p < 1 else 1.0  # attention dropout's scale, folded into v
    q_scale = d_head**-0.5 if drop else 1.0  # the dropout path's scores scale, folded into q
    blocks: list[PreLNBlock] = list(model.backbone.depth.blocks)
    s = model.state_token
    state_rows = slice(s, None, n)
    # Hand-written backward passes (autocast would hand them mixed dtypes: autograd of the same ops then).
    manual = drop and p < 1 and MANUAL_BACKWARD and not torch.is_autocast_enabled(x.device.type)
    for i, block in enumerate(blocks):
        attn, ffn = block.attention, block.ffn
        h = block.norm1(x)
        w_q, b_q = _scaled(attn.q_proj.weight, q_scale), _scaled(attn.q_proj.bias, q_scale)
        w_kv = torch.cat([attn.k_proj.weight, _scaled(attn.v_proj.weight, v_scale)])
        b_kv = torch.cat([attn.k_proj.bias, _scaled(attn.v_proj.bias, v_scale)])
        if i < len(blocks) - 1:
            qkv = F.linear(h, torch.cat([w_q, w_kv]), torch.cat([b_q, b_kv]))
            mask = _mask_bias(t, None, x.device, x.dtype)
            if manual:
                a = _DropoutAttention.apply(qkv, None, mask, p, b, heads)
            else:
                q, key, v = _heads(qkv, b, t, 3, heads, d_head)
                a = _attention(q, key, v, mask, p, training).transpose(1, 2).reshape(x.shape[0], d)
        else:  # the last layer needs queries (and everything after attention) at the state tokens only
            kv = F.linear(h, w_kv, b_kv)
            x = x.view(b, t, d)[:, state_rows].reshape(b * k, d)
            q_proj = F.linear(h.view(b, t, d)[:, state_rows].reshape(b * k, d), w_q, b_q)
            mask = _mask_bias(t, state_rows, x.device, x.dtype)
            if manual:
                a = _DropoutAttention.apply(q_proj, kv, mask, p, b, heads)
            else:
                (q,) = _heads(q_proj, b, k, 1, heads, d_head)
                key, v = _heads(kv, b, t, 2, heads, d_head)
                a = _attention(q, key, v, mask, p, training).transpose(1, 2).reshape(x.shape[0], d)
        o = attn.o_proj
        if manual and o.bias is not None:
            x = _LinearResidualDropout.apply(x, a, o.weight, o.bias, p)
        else:
            x = residual_dropout(x, o(a), p, training)
        u = block.norm2(x)
        fc1, fc2 = ffn.fc1, ffn.fc2
        if (
            manual
            and cfg.activation == "relu"
            and ffn.dropout.p == 0
            and fc1.bias is not None
            and fc2.bias is not None
        ):
            x = _ReluFFNResidualDropout.apply(x, u, fc1.weight, fc1.bias, fc2.weight, fc2.bias, p)
            continue
        pre = fc1(u)
        hidden = torch.relu_(pre) if cfg.activation == "relu" else ffn.act(pre)
        if ffn.dropout.p > 0:
            hidden = fast_dropout(hidden, ffn.dropout.p, training)
        x = residual_dropout(x, fc2(hidden), p, training)
    return model.backbone.final_norm(x).view(b, k, d)
