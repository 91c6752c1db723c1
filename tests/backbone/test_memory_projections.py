"""XL memory with cached key / value projections (``Backbone.project_memory``, acting with fixed weights).

A step then projects its new tokens only and the memory keeps their projections. Reference: the same stream
without the cache (every step projects the whole memory). Float64, with episode resets at random rows and
steps: outputs and memories agree to rounding (1e-12: each row's projection comes from a matmul of another
batch size), and the carried cache equals a fresh projection of the carried hidden states.
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import Backbone
from rl_transformers.policies import gtrxl_backbone

B, STEPS, D = 4, 12, 16
TOL = 1e-12


def backbone() -> Backbone:
    torch.manual_seed(0)
    return Backbone(gtrxl_backbone(D, 2, 2, mem_len=5).replace(attention_options={"max_cache": 5})).double()


def fresh_projections(bb: Backbone, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    atts = [bb.depth.attention_for(i) for i in range(h.shape[1])]
    k = torch.stack([a.k_proj(h[:, i]) for i, a in enumerate(atts)], dim=1)
    v = torch.stack([a.v_proj(h[:, i]) for i, a in enumerate(atts)], dim=1)
    return k, v


def streams(bb: Backbone, seed: int):  # type: ignore[no-untyped-def]
    """Step the same random stream (resets at random rows and steps) without and with the cache, checking the
    outputs agree at every step; yields the two states after each step."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(STEPS, B, 1, D, generator=g, dtype=torch.float64)
    resets = torch.rand(STEPS, B, generator=g) < 0.2
    with torch.inference_mode():
        plain = bb.init_state(B)
        cached = bb.project_memory(plain)
        for t in range(STEPS):
            a = bb(x[t], state=plain, reset=resets[t])
            b = bb(x[t], state=cached, reset=resets[t])
            assert (a.y - b.y).abs().max() < TOL
            plain, cached = a.state, b.state
            yield plain, cached


def test_cached_projections_equal_projecting_every_step() -> None:
    bb = backbone()
    for plain, cached in streams(bb, 1):
        assert plain.memory.k is None and cached.memory.k is not None  # the cache is carried, not made
        assert torch.equal(plain.memory.valid, cached.memory.valid)
        assert (plain.memory.h - cached.memory.h).abs().max() < TOL
        k, v = fresh_projections(bb, cached.memory.h)
        assert (cached.memory.k - k).abs().max() < TOL and (cached.memory.v - v).abs().max() < TOL
    assert bb.unproject_memory(cached).memory.k is None


def test_forward_with_gradients_ignores_a_stale_cache() -> None:
    bb = backbone()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        state = bb(torch.randn(B, 6, D, generator=g, dtype=torch.float64)).state
        cached = bb.project_memory(state)
        for p in bb.parameters():  # a weight update after the projections were cached
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(B, 3, D, generator=g, dtype=torch.float64)
    assert torch.equal(bb(x, state=cached).y, bb(x, state=state).y)  # grad enabled: h is projected
    with torch.no_grad():  # the stale cache is used without gradients: it bites (why rollouts refresh it)
        assert (bb(x, state=cached).y - bb(x, state=state).y).abs().max() > 1e-3


@pytest.mark.parametrize(
    "attention, options",
    [("performer", {}), ("rfa", {}), ("rfa", {"normalize": False, "gate": True}), ("linear", {})],
    ids=["performer", "rfa", "rfa_gated_unnormalized", "linear"],
)
def test_feature_map_attentions_also_cache_their_key_features(attention: str, options: dict) -> None:
    """Feature-map attentions (rope) cache φ of the memory's keys too: a step computes its new tokens'
    features only. The same stream without any cache is the reference (float64, resets at random rows and
    steps), and the carried features equal φ of a fresh projection of the carried hidden states."""
    torch.manual_seed(0)
    cfg = gtrxl_backbone(D, 2, 2, mem_len=5).replace(
        attention=attention, attention_options=options, position="rope"
    )
    bb = Backbone(cfg).double()
    atts = [bb.depth.attention_for(i) for i in range(bb.depth.n_applications)]
    for _, cached in streams(bb, 3):
        assert cached.memory.kf is not None
        k, _ = fresh_projections(bb, cached.memory.h)
        with torch.inference_mode():
            kf = torch.stack(
                [a.memory_key_features(k[:, i], cached.memory.pos) for i, a in enumerate(atts)], 1
            )
        valid = cached.memory.valid[:, None, None, :, None]  # invalid columns are never read
        assert ((cached.memory.kf - kf).abs() * valid).max() < TOL
    assert bb.unproject_memory(cached).memory.kf is None


def test_softmax_attention_caches_no_key_features() -> None:
    assert backbone().project_memory(backbone().init_state(B)).memory.kf is None
