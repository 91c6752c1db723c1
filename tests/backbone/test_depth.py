"""Depth control: Universal Transformer + ACT and early exit (degenerate equalities, hand-computed ponder cost)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_transformers.backbone import BackboneConfig
from tests.backbone import invariants as inv

X = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _shared_fixed_stack(universal, n: int):
    """A fixed-depth backbone of n layers, each a copy of the universal backbone's shared block."""
    fixed = inv.tiny_backbone(n_layers=n, position="rope")
    for blk in fixed.depth.blocks:
        blk.load_state_dict(universal.depth.block.state_dict())
    fixed.final_norm.load_state_dict(universal.final_norm.state_dict())
    return fixed


@pytest.mark.parametrize("n", [1, 3])
def test_universal_forced_to_run_n_steps_equals_n_shared_layers(n: int) -> None:
    opts = {"halting_bias_init": -1e4, "timestep_signal": False}  # h ≈ 0: halts only at the last step, R = 1
    uni = inv.tiny_backbone(n_layers=n, position="rope", depth="universal", depth_options=opts)
    fixed = _shared_fixed_stack(uni, n)
    with torch.no_grad():
        torch.testing.assert_close(uni(X).y, fixed(X).y, atol=1e-10, rtol=0)
    plain = inv.tiny_backbone(
        n_layers=n, position="rope", depth="universal", depth_options={"act": False, "timestep_signal": False}
    )
    plain.load_state_dict(uni.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(plain(X).y, fixed(X).y, atol=1e-10, rtol=0)


def test_universal_ponder_cost_matches_hand_computation() -> None:
    # h = σ(b) = 0.4 everywhere: cumulative 0.4, 0.8, then 1.2 >= 0.99 -> halt at step 3 with R = 1 - 0.8 = 0.2.
    b = math.log(0.4 / 0.6)
    uni = inv.tiny_backbone(
        n_layers=5,
        position="rope",
        depth="universal",
        depth_options={"halting_bias_init": b, "timestep_signal": False, "ponder_weight": 0.5},
    )
    uni.collect_info = True
    uni.final_norm = torch.nn.Identity()
    out = uni(X)
    h = torch.sigmoid(uni.depth.halting.bias.detach())[0]  # 0.4 up to float32 rounding of b
    torch.testing.assert_close(out.info["backbone/ponder_cost"], 3 + (1 - 2 * h))  # ρ = N + R
    assert out.info["backbone/ponder_cost"].item() == pytest.approx(3.2, abs=1e-6)
    torch.testing.assert_close(out.aux_losses["act_ponder"], 0.5 * (3 + (1 - 2 * h)))  # τ·ρ
    assert out.info["backbone/ponder_steps"].item() == pytest.approx(3.0)
    # output = h s1 + h s2 + (1 - 2h) s3, where s_k = k steps of the plain shared-weight recurrence
    states = []
    with torch.no_grad():
        for k in (1, 2, 3):
            plain = inv.tiny_backbone(
                n_layers=k,
                position="rope",
                depth="universal",
                depth_options={"act": False, "timestep_signal": False},
            )
            plain.load_state_dict(uni.state_dict(), strict=False)
            plain.final_norm = torch.nn.Identity()
            states.append(plain(X).y)
    expected = h * states[0] + h * states[1] + (1 - 2 * h) * states[2]
    torch.testing.assert_close(out.y, expected, atol=1e-10, rtol=0)


def test_universal_halting_unit_gets_gradient_from_ponder_cost() -> None:
    uni = inv.tiny_backbone(n_layers=3, position="rope", depth="universal")
    uni.train()
    out = uni(X)
    (out.y.pow(2).mean() + out.aux_losses["act_ponder"]).backward()
    assert uni.depth.halting.weight.grad.abs().sum() > 0


def test_universal_ponder_weight_defaults_to_the_reference_and_is_checked() -> None:
    """τ defaults to tensor2tensor's act_loss_weight 0.01 (at 1 the ponder cost, >= 2, swamps an RL loss)."""
    default = inv.tiny_backbone(n_layers=3, position="rope", depth="universal")
    off = inv.tiny_backbone(
        n_layers=3, position="rope", depth="universal", depth_options={"ponder_weight": 0.0}
    )
    off.load_state_dict(default.state_dict())
    default.collect_info = True
    out = default(X)
    torch.testing.assert_close(out.aux_losses["act_ponder"], 0.01 * out.info["backbone/ponder_cost"])
    assert out.info["backbone/ponder_cost"].item() >= 2.0
    assert off(X).aux_losses["act_ponder"].item() == 0.0
    torch.testing.assert_close(off(X).y, out.y)  # τ weights the loss only, never the output
    with pytest.raises(ValueError, match="ponder_weight must be a number >= 0, got -1"):
        inv.tiny_backbone(depth="universal", position="rope", depth_options={"ponder_weight": -1})


def test_early_exit_threshold_inf_is_full_depth_and_zero_exits_at_layer_one() -> None:
    full = inv.tiny_backbone(n_layers=3, position="rope")
    never = inv.tiny_backbone(
        n_layers=3, position="rope", depth="early_exit", depth_options={"threshold": math.inf}
    )
    never.load_state_dict(full.state_dict(), strict=False)
    never.collect_info = True
    with torch.no_grad():
        out = never(X)
        torch.testing.assert_close(out.y, full(X).y, atol=1e-12, rtol=0)
        assert (out.info["backbone/exit_layer_per_token"] == 3).all()
    always = inv.tiny_backbone(
        n_layers=3, position="rope", depth="early_exit", depth_options={"threshold": 0.0}
    )
    always.load_state_dict(full.state_dict(), strict=False)
    always.collect_info = True
    one = inv.tiny_backbone(n_layers=1, position="rope")
    one.depth.blocks[0].load_state_dict(full.depth.blocks[0].state_dict())
    one.final_norm.load_state_dict(full.final_norm.state_dict())
    with torch.no_grad():
        out = always(X)
        assert (out.info["backbone/exit_layer_per_token"] == 1).all()
        torch.testing.assert_close(out.y, one(X).y, atol=1e-12, rtol=0)


@pytest.mark.parametrize("measure", ["saturation", "softmax", "classifier"])
def test_early_exit_measures_stream_exactly(measure: str) -> None:
    bb = inv.tiny_backbone(
        n_layers=3, position="rope", depth="early_exit", depth_options={"measure": measure, "threshold": 0.5}
    )
    if measure == "softmax":
        bb.depth.confidence_head = torch.nn.Linear(16, 4).double()
    bb.collect_info = True
    with torch.no_grad():
        depths = bb(X).info["backbone/exit_layer_per_token"]
    assert depths.min() >= 1 and depths.max() <= 3
    inv.check_streaming(bb, length=9)
    inv.check_causal(bb)


def test_early_exit_classifier_trains_on_oracle() -> None:
    bb = inv.tiny_backbone(
        n_layers=3, position="rope", depth="early_exit", depth_options={"measure": "classifier"}
    )
    bb.train()
    loss = bb(X).aux_losses["early_exit_classifier"]
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert bb.depth.exit_classifier.weight.grad.abs().sum() > 0


def test_softmax_measure_without_head_explains() -> None:
    bb = inv.tiny_backbone(
        n_layers=2, position="rope", depth="early_exit", depth_options={"measure": "softmax"}
    )
    with pytest.raises(RuntimeError, match="confidence_head"):
        bb(X)


def test_bad_depth_options() -> None:
    with pytest.raises(ValueError, match="measure='entropy' is not one of"):
        BackboneConfig(depth="early_exit", depth_options={"measure": "entropy"})


@pytest.mark.parametrize("scale", ["input_rms", "unit"])
def test_universal_timestep_signal_is_scaled_by_each_tokens_input_rms(scale: str) -> None:
    """One step, no ACT: block(x + c·signal(0)) with c = RMS of the token's x (input_rms) or 1 (unit), checked
    against the same block without the signal fed the shifted input. A unit signal would drown features of a
    policy's scale (0.2 per coordinate), as it did in the encoder study."""
    from rl_transformers.backbone.position.absolute import sinusoid_table

    opts = {"act": False, "timestep_scale": scale}
    signalled = inv.tiny_backbone(n_layers=1, position="rope", depth="universal", depth_options=opts)
    plain = inv.tiny_backbone(
        n_layers=1, position="rope", depth="universal", depth_options={"act": False, "timestep_signal": False}
    )
    plain.load_state_dict(signalled.state_dict())
    x = 0.2 * X
    c = x.pow(2).mean(-1, keepdim=True).sqrt() if scale == "input_rms" else 1.0
    shifted = x + c * sinusoid_table(torch.zeros(1, 1, dtype=torch.long), x.shape[-1]).to(x.dtype)
    with torch.no_grad():
        torch.testing.assert_close(signalled(x).y, plain(shifted).y, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match=r"timestep_scale='rms' is not one of"):
        inv.tiny_backbone(depth="universal", position="rope", depth_options={"timestep_scale": "rms"})
