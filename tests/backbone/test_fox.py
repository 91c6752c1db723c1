"""``fox``: the forgetting attention == its definition written out (float64): chunked, token by token, with
episode starts, the cache window and the sink slots."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig
from rl_transformers.backbone.attention import fox as fox_module
from tests.backbone import invariants as inv
from tests.backbone import recurrent_checks as rc


def naive(m, x: Tensor, starts: Tensor) -> Tensor:
    """Lin et al. 2025, eq. 5: o_i = Σ_j exp(q_i·k_j/√D + Σ_{l=j+1..i} log f_l) v_j / Σ_j exp(...), over the
    keys j ≤ i of the same episode (and, with ``max_cache``, i - j ≤ max_cache), plus the sink slots."""
    b, t, _ = x.shape
    h, d = m.n_heads, m.d_head
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(b, t, h, d)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(b, t, h, d)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(b, t, h, d)
    f = 1 / (1 + torch.exp(-(x @ m.f_proj.weight.T + m.f_proj.bias)))  # (B, T, H)
    window = m.options.max_cache
    rows = []
    for bi in range(b):
        episode = starts[bi].long().cumsum(0)
        for i in range(t):
            heads = []
            for hi in range(h):
                logits, values = [], []
                if m.sinks is not None:
                    for n in range(m.sinks.k.shape[1]):
                        logits.append(q[bi, i, hi] @ m.sinks.k[hi, n] / math.sqrt(d))
                        values.append(m.sinks.v[hi, n])
                for j in range(i + 1):
                    if episode[j] != episode[i] or (window is not None and i - j > window):
                        continue
                    gate = sum(
                        (torch.log(f[bi, s, hi]) for s in range(j + 1, i + 1)), torch.zeros((), dtype=x.dtype)
                    )
                    logits.append(q[bi, i, hi] @ k[bi, j, hi] / math.sqrt(d) + gate)
                    values.append(v[bi, j, hi])
                p = torch.softmax(torch.stack(logits), 0)
                heads.append(p @ torch.stack(values))
            rows.append(m.o_proj(torch.cat(heads)))
    return torch.stack(rows).view(b, t, -1)


@pytest.mark.parametrize(
    "options",
    [{}, {"max_cache": 3}, {"sink": 2}, {"sink": 1, "max_cache": 2}],
    ids=["plain", "window", "sink", "both"],
)
def test_fox_matches_its_definition(options: dict) -> None:
    m = rc.make_mixer("fox", **options)
    with torch.no_grad():
        m.f_proj.bias.fill_(-1.0)  # gates well below 1: the bias matters
    rc.check_reference(m, naive)
    rc.check_carried_state(m, same_tensors=False)
    rc.check_reset_rows(m)
    rc.check_reset_cuts(m)
    if "max_cache" not in options:  # the window counts columns, padded ones included (as full's max_cache)
        rc.check_padding(m)


@pytest.mark.parametrize("options", [{}, {"max_cache": 2, "sink": 1}], ids=["plain", "window-sink"])
def test_query_blocks_change_nothing(monkeypatch: pytest.MonkeyPatch, options: dict) -> None:
    """Blocks of 3 queries (each over the keys it may see) == the definition, values and gradients."""
    monkeypatch.setattr(fox_module, "QUERY_BLOCK", 3)
    m = rc.make_mixer("fox", **options)
    with torch.no_grad():
        m.f_proj.bias.fill_(-1.0)
    rc.check_reference(m, naive)
    rc.check_carried_state(m, same_tensors=False)


def test_gates_of_one_give_causal_softmax_attention() -> None:
    """f ≡ 1 (bias → +∞): the plain causal attention of ``full``."""
    fox = inv.tiny_backbone(attention="fox", position="rope")
    full = inv.tiny_backbone(attention="full", position="rope")
    full.load_state_dict(fox.state_dict(), strict=False)
    for block in fox.depth.blocks:
        with torch.no_grad():
            block.attention.f_proj.weight.zero_()
            block.attention.f_proj.bias.fill_(1e4)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(fox(x).y, full(x).y, rtol=1e-10, atol=1e-10)


def test_dense_path_equals_sdpa_path() -> None:
    m = rc.make_mixer("fox")
    x = torch.randn(2, 7, rc.D_MODEL, dtype=torch.float64)
    starts = rc.random_starts(2, 7)
    with torch.no_grad():
        fast, _ = rc.parallel(m, x, starts)
        ctx = rc.context(starts, 7, 2)
        ctx.info = {}  # collecting diagnostics takes the dense path
        dense, _ = m(x, ctx, m.init_state(2, None, torch.float64).reset(starts[:, 0]))
    torch.testing.assert_close(dense, fast, rtol=1e-12, atol=1e-12)
    assert "backbone/attention_entropy/layer0" in ctx.info


def test_memory_and_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"memory=None \(--backbone.memory None\)"):
        BackboneConfig(attention="fox", position="rope", memory="xl")
    with pytest.raises(ValueError, match="sink"):
        BackboneConfig(attention="fox", attention_options={"sink": -1})
    with pytest.raises(ValueError, match="max_cache"):
        BackboneConfig(attention="fox", attention_options={"max_cache": 0})


def test_inside_a_backbone() -> None:
    rc.check_backbone("fox")
