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
- **cheaper dropout**: :func:`fast_dropout` draws the same Bernoulli masks from int32 random numbers (about 3x
  cheaper than ``bernoulli_`` on CPU) compared straight into a 0 / 1 tensor; the 1 / (1 - p) scale is folded
  into work done anyway — the embedding LayerNorm's affine parameters, the v projection (for the attention
  weights' dropout), ``addcmul``'s ``value`` (residual branches). p = 0 and the FFN's hidden dropout (GPT-2
  has none) cost nothing. Tested against the generic path with every mask forced to keep.

Equality with the generic path at every real state token is tested in tests/policies/test_decision_transformer.py
(float64, dropout 0, padded batches, several depths).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


_RANDOM_RANGE = 2**31
"""``Tensor.random_()`` on int32 draws uniformly from [0, 2**31)."""


def _keep_mask(x: Tensor, p: float) -> Tensor:
    """A no-grad 0 / 1 tensor shaped like ``x`` (its dtype): 1 with probability 1 - p (up to 2**-31).

    One int32 random number per entry compared with a threshold, the comparison written straight into a
    tensor of ``x``'s dtype (one pass; the 1 / (1 - p) scale is applied by the caller, folded into an
    operation it runs anyway).
    """
    threshold = round(p * _RANDOM_RANGE)
    draws = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    return torch.ge(draws, threshold, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))


def fast_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: each entry kept with probability 1 - p (up to 2**-31) and scaled by 1 / (1 - p).

    The same distribution as :func:`torch.nn.functional.dropout`, drawn as one int32 per entry compared with
    a threshold — about 3x cheaper on CPU than ``bernoulli_`` (a different random stream, so masks differ).
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
    blocks: list[nn.Module] = list(model.backbone.depth.blocks)
    s = model.state_token
    state_rows = slice(s, None, n)
    for i, block in enumerate(blocks):
        attn, ffn = block.attention, block.ffn
        h = block.norm1(x)
        if i < len(blocks) - 1:
            weight = torch.cat(
                [
                    _scaled(attn.q_proj.weight, q_scale),
                    attn.k_proj.weight,
                    _scaled(attn.v_proj.weight, v_scale),
                ]
            )
            bias = torch.cat(
                [_scaled(attn.q_proj.bias, q_scale), attn.k_proj.bias, _scaled(attn.v_proj.bias, v_scale)]
            )
            q, key, v = _heads(F.linear(h, weight, bias), b, t, 3, heads, d_head)
            mask = _mask_bias(t, None, x.device, x.dtype)
        else:  # the last layer needs queries (and everything after attention) at the state tokens only
            weight = torch.cat([attn.k_proj.weight, _scaled(attn.v_proj.weight, v_scale)])
            bias = torch.cat([attn.k_proj.bias, _scaled(attn.v_proj.bias, v_scale)])
            key, v = _heads(F.linear(h, weight, bias), b, t, 2, heads, d_head)
            x = x.view(b, t, d)[:, state_rows].reshape(b * k, d)
            (q,) = _heads(
                F.linear(
                    h.view(b, t, d)[:, state_rows].reshape(b * k, d),
                    _scaled(attn.q_proj.weight, q_scale),
                    _scaled(attn.q_proj.bias, q_scale),
                ),
                b,
                k,
                1,
                heads,
                d_head,
            )
            mask = _mask_bias(t, state_rows, x.device, x.dtype)
        a = _attention(q, key, v, mask, p, training).transpose(1, 2).reshape(x.shape[0], d)
        x = residual_dropout(x, attn.o_proj(a), p, training)
        pre = ffn.fc1(block.norm2(x))
        hidden = torch.relu_(pre) if cfg.activation == "relu" else ffn.act(pre)
        if ffn.dropout.p > 0:
            hidden = fast_dropout(hidden, ffn.dropout.p, training)
        x = residual_dropout(x, ffn.fc2(hidden), p, training)
    return model.backbone.final_norm(x).view(b, k, d)
