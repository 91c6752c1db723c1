"""The training forward without cutting (``Core.segments``) equals the cut-and-packed one, values and gradients.

Both run the same attention sums: the packed pieces of a row over right-padded, reset copies of its state, the
uncut row over its own state with each token masked to its episode. In float64 they agree to rounding (the sums
run over longer masked key rows and larger batches, so BLAS may add in another order): outputs and every
parameter gradient to 1e-10 relative to the gradient's scale.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from rl_transformers.policies import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.policies import actor_critic as actor_critic_module

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(3)
B, W = 5, 9


def run(policy, state, obs, actions, starts, segments: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(actor_critic_module, "SEGMENT_PATH", segments)
    policy.zero_grad(set_to_none=True)
    out = policy.evaluate_sequence(obs, actions, state, starts)
    (out.log_prob.sum() + (out.value**2).sum() + out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize(
    ("mem_len", "attention", "position", "memory"),
    [
        (4, "full", "xl_relative", "xl"),
        (32, "full", "xl_relative", "xl"),
        (4, "gaussian_prior", "xl_relative", "xl"),
        (32, "gaussian_prior", "xl_relative", "xl"),
        (4, "linear", "rope", "xl"),  # feature-map attentions: running sums restarted by segment
        (32, "linear", "rope", "xl"),
        (4, "performer", "rope", "xl"),
        (4, "lsh", "xl_relative", "xl"),
        (32, "lsh", "xl_relative", "xl"),
        (2, "full", "xl_relative", "knn"),  # the store: a query after a restart retrieves nothing
        (1, "full", "xl_relative", "knn"),
    ],
)
def test_uncut_training_forward_equals_packed(
    mem_len: int, attention: str, position: str, memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    backbone = gtrxl_backbone(16, 2, 2, mem_len=mem_len).replace(
        attention=attention, attention_options={}, position=position
    )
    if memory == "knn":  # a small store that a few acting steps fill, top-k below its size
        backbone = backbone.replace(
            memory="knn", memory_options={"mem_len": mem_len, "store_size": 6, "top_k": 3}
        )
    policy = make_policy(PolicyConfig(backbone=backbone), OBS, ACT).double()
    assert policy.core.segments  # the default GTrXL takes the uncut path
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a stored state with a partly filled memory, as a rollout leaves it
        state = policy.initial_state(B)
        for t in range(6):
            step = policy.act(
                torch.randn(B, 3, generator=g, dtype=torch.float64), state, torch.tensor([t == 2] * B)
            )
            state = step.state
    obs = torch.randn(B, W, 3, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (B, W), generator=g)
    starts = torch.rand(B, W, generator=g) < 0.3
    starts[0, 0] = starts[1, 4] = starts[1, 5] = True
    starts[2] = False
    assert starts[:, 1:].any()
    packed, packed_grads = run(policy, state, obs, actions, starts, False, monkeypatch)
    uncut, uncut_grads = run(policy, state, obs, actions, starts, True, monkeypatch)
    for name in ("log_prob", "value", "entropy"):
        assert (getattr(uncut, name) - getattr(packed, name)).abs().max() < 1e-12, name
    assert packed_grads.keys() == uncut_grads.keys() and len(packed_grads) > 10
    for name, want in packed_grads.items():
        scale = max(float(want.abs().max()), 1e-3)
        assert float((uncut_grads[name] - want).abs().max()) < 1e-10 * scale, name


def _filled_state(policy, g: torch.Generator, steps: int):  # type: ignore[no-untyped-def]
    """A stored state as a rollout leaves it (a reset at step 2, then ``steps`` steps)."""
    with torch.no_grad():
        state = policy.initial_state(B)
        for t in range(steps):
            obs = torch.randn(B, 3, generator=g, dtype=torch.float64)
            state = policy.act(obs, state, torch.tensor([t == 2] * B)).state
    return state


@pytest.mark.filterwarnings("ignore:training sequences will not replay")  # compressive replays by window
@pytest.mark.parametrize("compression, rate", [("conv", 2), ("max_pool", 3), ("dilated_conv", 2)])
@pytest.mark.parametrize("full_row", [True, False], ids=["a_row_without_restart", "every_row_restarts"])
def test_compressive_uncut_equals_packed_with_its_losses(
    compression: str, rate: int, full_row: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compressive`` on the uncut path: outputs, both compressor losses and every gradient equal cutting and
    packing, also when no row is one whole piece (packing then pads to a shorter width, which pushes fewer
    memories out of the FIFO: the uncut write follows it)."""
    torch.manual_seed(0)
    options = {"mem_len": W + 1, "cmem_len": 3, "rate": rate, "compression": compression}
    backbone = gtrxl_backbone(16, 2, 2).replace(memory="compressive", memory_options=options)
    policy = make_policy(PolicyConfig(backbone=backbone), OBS, ACT).double()
    assert policy.core.segments and policy.core.segment_chunk_limit == W + 1
    g = torch.Generator().manual_seed(3)
    state = _filled_state(policy, g, 3 * W)
    obs = torch.randn(B, W, 3, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (B, W), generator=g)
    starts = torch.zeros(B, W, dtype=torch.bool)
    starts[0, [0, 5]] = starts[1, 4] = starts[3, 2] = starts[4, [3, 7]] = True
    if not full_row:
        starts[2, 6] = True
    assert bool(starts[2, 1:].any()) != full_row

    def losses(segments: bool):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(actor_critic_module, "SEGMENT_PATH", segments)
        policy.zero_grad(set_to_none=True)
        out = policy.evaluate_sequence(obs, actions, state, starts)
        aux = out.aux_losses
        (out.log_prob.sum() + (out.value**2).sum() + out.entropy.sum() + sum(aux.values())).backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        return out, {k: float(v) for k, v in aux.items()}, grads

    packed, packed_aux, packed_grads = losses(False)
    uncut, uncut_aux, uncut_grads = losses(True)
    for name in ("log_prob", "value", "entropy"):
        assert (getattr(uncut, name) - getattr(packed, name)).abs().max() < 1e-12, name
    assert set(packed_aux) == {"compressive_autoencoding", "compressive_attention_reconstruction"}
    assert all(v > 0 for v in packed_aux.values())  # memories were compressed: the losses are tested
    for name, value in packed_aux.items():
        assert abs(uncut_aux[name] - value) < 1e-12 * max(1.0, abs(value)), name
    assert packed_grads.keys() == uncut_grads.keys()
    assert any("compressors" in n for n in packed_grads)  # the losses reach the compressor
    for name, want in packed_grads.items():
        scale = max(float(want.abs().max()), 1e-3)
        assert float((uncut_grads[name] - want).abs().max()) < 1e-10 * scale, name


def test_compressive_longer_chunks_are_cut_and_most_used_is_refused() -> None:
    """Chunks longer than mem_len are refused with starts (the policy cuts them instead); most_used compression
    never takes the uncut path."""
    from rl_transformers.backbone import Backbone

    cfg = gtrxl_backbone(16, 1, 2).replace(memory="compressive", memory_options={"mem_len": 4})
    bb = Backbone(cfg)
    with pytest.raises(ValueError, match="at most 4 tokens, got 5"):
        bb(torch.randn(2, 5, 16), starts=torch.zeros(2, 5, dtype=torch.bool))
    used = Backbone(cfg.replace(memory_options={"mem_len": 4, "compression": "most_used"}))
    assert "most_used" in str(used.segments_unsupported)
