"""Blocks: GTrXL gate near identity at init, ReZero identity at init, reversible gradients and memory, ffn_chunks."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from tests.backbone import invariants as inv


def test_gtrxl_large_gate_bias_is_close_to_identity_at_init() -> None:
    x = torch.randn(2, 6, 16, dtype=torch.float64)

    def stack_change(bias: float) -> float:
        bb = inv.tiny_backbone(block="gtrxl", block_options={"gate_bias": bias}, position="none")
        bb.final_norm = torch.nn.Identity()  # look at the residual stream itself
        with torch.no_grad():
            return (bb(x).y - x).abs().max().item()

    assert stack_change(20.0) < 1e-6  # z = σ(· − 20) ≈ 2e-9: the stream passes through untouched
    assert stack_change(20.0) < stack_change(2.0) < stack_change(-2.0)


def test_gtrxl_gate_formula() -> None:
    from rl_transformers.backbone.blocks import GRUGate

    torch.manual_seed(0)
    gate = GRUGate(4, gate_bias=1.5).double()
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    w_r, w_z, w_g = gate.w.weight.chunk(3, dim=0)
    u_r, u_z = gate.u_rz.weight.chunk(2, dim=0)
    r = torch.sigmoid(y @ w_r.T + x @ u_r.T)
    z = torch.sigmoid(y @ w_z.T + x @ u_z.T - 1.5)
    h = torch.tanh(y @ w_g.T + (r * x) @ gate.u_g.weight.T)
    out, z_got = gate(x, y)
    torch.testing.assert_close(out, (1 - z) * x + z * h)
    torch.testing.assert_close(z_got, z)


def test_rezero_is_identity_at_init_and_learns() -> None:
    bb = inv.tiny_backbone(block="rezero", position="rope")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(bb(x).y, x)
    bb(x).y.sum().backward()
    alphas = [p.grad for n, p in bb.named_parameters() if "alpha" in n]
    assert len(alphas) == 2 * bb.cfg.n_layers and all(g is not None and g.abs() > 0 for g in alphas)


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_reversible_gradients_equal_plain_autograd(dropout: float) -> None:
    """Same weights, same dropout masks: recomputing backward == storing activations."""
    kw = dict(block="reversible", position="rope", dropout=dropout, n_layers=3)
    a = inv.tiny_backbone(**kw, block_options={"recompute": True})
    b = inv.tiny_backbone(**kw, block_options={"recompute": False})
    b.load_state_dict(a.state_dict())
    a.train(), b.train()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    grads = []
    for bb in (a, b):
        torch.manual_seed(123)
        xi = x.clone().requires_grad_(True)
        out = bb(xi).y
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append((out.detach(), xi.grad, {n: p.grad.clone() for n, p in bb.named_parameters()}))
    (ya, gxa, gpa), (yb, gxb, gpb) = grads
    torch.testing.assert_close(ya, yb, atol=1e-10, rtol=0)
    torch.testing.assert_close(gxa, gxb, atol=1e-8, rtol=0)
    assert gpa.keys() == gpb.keys()
    for name in gpa:
        torch.testing.assert_close(gpa[name], gpb[name], atol=1e-8, rtol=0, msg=name)


def _saved_bytes(bb: Backbone, x: torch.Tensor) -> int:
    """Bytes of tensors autograd saves for backward during one forward (a memory counter, not a timer)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        bb(x).y.sum()
    return total


def test_reversible_activation_memory_does_not_grow_with_depth() -> None:
    x = torch.randn(2, 32, 16, requires_grad=True)

    def saved(block: str, depth: int) -> int:
        torch.manual_seed(0)
        bb = Backbone(BackboneConfig(d_model=16, n_heads=2, n_layers=depth, block=block, position="none"))
        return _saved_bytes(bb, x)

    rev2, rev8 = saved("reversible", 2), saved("reversible", 8)
    pre2, pre8 = saved("pre_ln", 2), saved("pre_ln", 8)
    assert rev8 == rev2  # only the last (y1, y2) and the final norm's inputs are kept
    assert pre8 > 3 * pre2  # plain blocks store activations per layer
    assert rev8 < pre8 / 4


def test_reversible_refuses_universal_depth() -> None:
    with pytest.raises(ValueError, match=r"reversible.*depth='fixed'"):
        BackboneConfig(block="reversible", depth="universal")


@pytest.mark.parametrize("block", ["post_ln", "pre_ln", "gtrxl", "rezero", "reversible"])
def test_ffn_chunks_equal_unchunked(block: str) -> None:
    a = inv.tiny_backbone(block=block, position="rope")
    b = inv.tiny_backbone(block=block, position="rope", block_options={"ffn_chunks": 3})
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    if block == "rezero":  # alphas start at 0: move them so the FFN matters
        for bb in (a, b):
            for n, p in bb.named_parameters():
                if "alpha" in n:
                    p.data.fill_(0.5)
    with torch.no_grad():
        torch.testing.assert_close(a(x).y, b(x).y, atol=1e-12, rtol=0)


def test_post_ln_matches_formula() -> None:
    bb = inv.tiny_backbone(block="post_ln", position="none", n_layers=1)
    blk = bb.depth.blocks[0]
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    with torch.no_grad():
        from rl_transformers.backbone.context import ForwardContext

        ctx = ForwardContext(pos=torch.arange(4)[None], valid=torch.ones(1, 4, dtype=torch.bool), causal=True)
        a, _ = blk.attention(x, ctx, None)
        h = blk.norm1(x + a)
        expected = blk.norm2(h + blk.ffn.fc2(torch.relu(blk.ffn.fc1(h))))
        torch.testing.assert_close(bb(x).y, expected)


def test_reversible_custom_backward_passes_gradcheck() -> None:
    bb = inv.tiny_backbone(block="reversible", position="rope", d_model=8, n_heads=2, n_layers=2)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp: bb(inp).y, (x,), eps=1e-6, atol=1e-5)


def test_ffn_dropout_separate_from_residual_dropout() -> None:
    """ffn_dropout=0 leaves the FFN hidden layer undropped in training; None inherits `dropout`."""
    from rl_transformers.backbone.blocks import FeedForward

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    plain = FeedForward(BackboneConfig(d_model=16, n_heads=2, dropout=0.5, ffn_dropout=0.0)).train()
    expected = plain.fc2(torch.relu(plain.fc1(x)))
    torch.testing.assert_close(plain(x), expected, rtol=0, atol=0)
    inherited = FeedForward(BackboneConfig(d_model=16, n_heads=2, dropout=0.5)).train()
    inherited.load_state_dict(plain.state_dict())
    assert inherited.dropout.p == 0.5
    assert not torch.equal(inherited(x), expected)
    assert torch.equal(inherited.eval()(x), expected)
    with pytest.raises(ValueError, match="ffn_dropout must be in"):
        BackboneConfig(ffn_dropout=1.0)
