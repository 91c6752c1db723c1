"""The DT's fused training forward (policies/dt_fast.py) against the generic backbone path: same predictions and
gradients in float64, the cases it refuses, and its dropout masks (keep rate, scaling, unbiasedness, the manual
backward against autograd)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.policies.test_decision_transformer import make_model, tiny


def _padded_batch(k: int, b: int = 5, seed: int = 3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([k, 1, k - 1, 2, k])[:b]
    mask = torch.arange(k)[None] < lengths[:, None]
    batch = {
        "returns_to_go": torch.rand(b, k, generator=g, dtype=dtype) * 30,
        "observations": torch.randn(b, k, 3, generator=g, dtype=dtype),
        "actions": torch.rand(b, k, 2, generator=g, dtype=dtype) * 2 - 1,
        "timesteps": torch.randint(0, 50, (b, k), generator=g),
        "mask": mask,
    }
    return {
        n: v * mask.view(*mask.shape, *([1] * (v.dim() - 2))) if n != "mask" else v for n, v in batch.items()
    }


@pytest.mark.parametrize(
    "overrides, kwargs",
    [
        ({}, {}),
        ({"n_layers": 1}, {}),
        ({"n_layers": 3, "n_heads": 4, "activation": "gelu"}, {}),
        ({"n_layers": 2, "ffn_dropout": 0.2}, {"condition_on_return": False}),
    ],
)
@pytest.mark.parametrize("train", [False, True])
def test_fused_forward_equals_generic_path(overrides: dict, kwargs: dict, train: bool) -> None:
    """Same weights, float64, dropout 0: predictions at real steps and all parameter gradients agree."""
    from rl_transformers.policies.dt_fast import fast_path_reason

    backbone = tiny(dropout=0.0, **overrides)
    if "ffn_dropout" in overrides:  # dropout layers present but compared in eval mode only
        backbone = tiny(**overrides)
    model = make_model(k=4, backbone=backbone, **kwargs).double()
    assert fast_path_reason(model) is None
    model.train(train and "ffn_dropout" not in overrides)
    batch = _padded_batch(4)
    fused = model(**batch)
    assert fused.state is None  # the fused path ran
    model.zero_grad()
    model.action_loss(fused.predictions, batch["actions"], batch["mask"]).backward()
    grads_fused = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.fused = False
    generic = model(**batch)
    assert generic.state is not None
    model.action_loss(generic.predictions, batch["actions"], batch["mask"]).backward()
    real = batch["mask"]
    torch.testing.assert_close(fused.predictions[real], generic.predictions[real], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fused.hidden[real], generic.hidden[real], rtol=1e-10, atol=1e-12)
    grads_generic = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads_fused.keys() == grads_generic.keys()
    for name, g in grads_generic.items():
        torch.testing.assert_close(grads_fused[name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_fused_path_is_refused_where_it_would_change_the_maths() -> None:
    from rl_transformers.policies.dt_fast import fast_path_reason

    assert "padding" in fast_path_reason(make_model(padding="left"))
    assert "position" in fast_path_reason(make_model(backbone=tiny(position="rope")))
    assert "block" in fast_path_reason(make_model(backbone=tiny(block="gtrxl")))
    assert "max_cache" in fast_path_reason(make_model(backbone=tiny(attention_options={"max_cache": 2})))
    model = make_model(backbone=tiny(dropout=0.0)).eval()
    batch = _padded_batch(4, dtype=torch.float32)
    assert model(**batch, return_state=True).state is not None  # asking for the state forces the generic path


def test_fast_dropout_keeps_with_probability_one_minus_p_and_rescales() -> None:
    from rl_transformers.policies.dt_fast import fast_dropout, residual_dropout

    torch.manual_seed(0)
    x = torch.full((400_000,), 2.0)
    for p in (0.1, 0.5):
        y = fast_dropout(x, p, training=True)
        kept = y != 0
        assert torch.all(y[kept] == 2.0 / (1 - p))
        n = x.numel()
        assert abs(kept.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
        base = torch.randn(n)
        z = residual_dropout(base, x, p, training=True) - base
        zk = z.abs() > 1e-3
        torch.testing.assert_close(z[zk], torch.full_like(z[zk], 2.0 / (1 - p)))
        assert abs(zk.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    assert torch.equal(fast_dropout(x, 0.3, training=False), x)
    assert torch.equal(fast_dropout(x, 1.0, training=True), torch.zeros_like(x))


@pytest.mark.parametrize("n_layers", [1, 3])
def test_fused_dropout_scales_equal_scaled_weights_when_every_mask_keeps(monkeypatch, n_layers: int) -> None:
    """Dropout p > 0 with every mask forced to keep: each dropout multiplies by 1 / (1 - p). The fused path
    folds that scale into other operations (embedding LayerNorm, v projection, addcmul); it must equal the
    generic path at dropout 0 with the same scale put by hand on the embedding LayerNorm, the v and output
    projections and fc2 (float64)."""
    from rl_transformers.policies import dt_fast

    p = 0.25
    s = 1.0 / (1.0 - p)
    monkeypatch.setattr(dt_fast, "_keep_mask", lambda x, p: torch.ones_like(x))
    fused_model = make_model(k=4, backbone=tiny(dropout=p, n_layers=n_layers)).double().train()
    reference = make_model(k=4, backbone=tiny(dropout=0.0, n_layers=n_layers)).double().eval()
    reference.load_state_dict(fused_model.state_dict())
    with torch.no_grad():
        for param in (reference.embed_norm.weight, reference.embed_norm.bias):
            param.mul_(s)
        for block in reference.backbone.depth.blocks:
            for lin in (block.attention.v_proj, block.attention.o_proj, block.ffn.fc2):
                lin.weight.mul_(s)
                lin.bias.mul_(s)
    batch = _padded_batch(4)
    fused = fused_model(**batch)
    assert fused.state is None
    reference.fused = False
    expected = reference(**batch)
    real = batch["mask"]
    torch.testing.assert_close(fused.hidden[real], expected.hidden[real], rtol=1e-10, atol=1e-12)


def _scaled_reference(model, p: float, n_layers: int, **kwargs):
    """The generic model at dropout 0 with every dropout's 1 / (1 - p) put by hand on the weights after it."""
    s = 1.0 / (1.0 - p)
    reference = make_model(k=4, backbone=tiny(dropout=0.0, n_layers=n_layers), **kwargs).double().eval()
    reference.load_state_dict(model.state_dict())
    scaled = [reference.embed_norm.weight, reference.embed_norm.bias]
    for block in reference.backbone.depth.blocks:
        for lin in (block.attention.v_proj, block.attention.o_proj, block.ffn.fc2):
            scaled += [lin.weight, lin.bias]
    with torch.no_grad():
        for param in scaled:
            param.mul_(s)
    names = {id(param): name for name, param in reference.named_parameters()}
    return reference, {names[id(param)] for param in scaled}


@pytest.mark.parametrize("n_layers", [1, 3])
@pytest.mark.parametrize("condition_on_return", [True, False])
def test_fused_dropout_gradients_equal_generic_path_when_every_mask_keeps(
    monkeypatch, n_layers: int, condition_on_return: bool
) -> None:
    """The dropout path's hand-written backward passes (dt_fast.MANUAL_BACKWARD) with every mask forced to keep:
    predictions equal the generic path with the scales put on the weights, and every gradient equals the generic
    one (times 1 / (1 - p) for the weights that carry the scale in the reference), float64."""
    from rl_transformers.policies import dt_fast

    assert dt_fast.MANUAL_BACKWARD
    p = 0.25
    monkeypatch.setattr(dt_fast, "_keep_mask", lambda x, p: torch.ones_like(x))
    kwargs = {"condition_on_return": condition_on_return}
    model = make_model(k=4, backbone=tiny(dropout=p, n_layers=n_layers), **kwargs).double().train()
    reference, scaled = _scaled_reference(model, p, n_layers, **kwargs)
    batch = _padded_batch(4)
    fused = model(**batch)
    assert fused.state is None
    model.action_loss(fused.predictions, batch["actions"], batch["mask"]).backward()
    reference.fused = False
    expected = reference(**batch)
    reference.action_loss(expected.predictions, batch["actions"], batch["mask"]).backward()
    real = batch["mask"]
    torch.testing.assert_close(fused.predictions[real], expected.predictions[real], rtol=1e-10, atol=1e-12)
    grads = {n: q.grad for n, q in reference.named_parameters() if q.grad is not None}
    assert grads.keys() == {n for n, q in model.named_parameters() if q.grad is not None}
    for name, param in model.named_parameters():
        if name in grads:
            want = grads[name] * (1.0 / (1.0 - p) if name in scaled else 1.0)
            torch.testing.assert_close(param.grad, want, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("overrides", [{"n_layers": 3}, {"n_layers": 2, "n_heads": 4}, {"n_layers": 1}])
def test_fused_dropout_manual_backward_equals_autograd_with_random_masks(
    monkeypatch, overrides: dict
) -> None:
    """With real (random) dropout masks, the hand-written backward passes give the same predictions and every
    parameter gradient as autograd of the same fused forward (the same masks replayed), float64."""
    from rl_transformers.policies import dt_fast

    drawn: list[torch.Tensor] = []
    replay: list[torch.Tensor] = []
    original = dt_fast._keep_mask

    def recording(x, p):
        mask = original(x, p) if not replay else replay.pop(0)
        drawn.append(mask)
        return mask

    monkeypatch.setattr(dt_fast, "_keep_mask", recording)
    model = make_model(k=4, backbone=tiny(dropout=0.3, **overrides)).double().train()
    batch = _padded_batch(4)
    results = []
    for manual in (True, False):
        monkeypatch.setattr(dt_fast, "MANUAL_BACKWARD", manual)
        model.zero_grad()
        out = model(**batch)
        model.action_loss(out.predictions, batch["actions"], batch["mask"]).backward()
        results.append((out.predictions, {n: q.grad.clone() for n, q in model.named_parameters()}))
        if manual:
            replay, drawn = drawn, []
    (pred_manual, grads_manual), (pred_auto, grads_auto) = results
    assert (
        not replay and len(drawn) == 3 * overrides["n_layers"] + 1
    )  # every mask replayed, in the same order
    assert any(not bool(mask.all()) for mask in drawn)  # the masks drop something
    real = batch["mask"]
    torch.testing.assert_close(pred_manual[real], pred_auto[real], rtol=1e-10, atol=1e-12)
    for name, g in grads_auto.items():
        torch.testing.assert_close(grads_manual[name], g, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("shape", [(999,), (64, 59, 59), (7, 3)])
def test_keep_mask_is_unbiased_at_every_position(shape) -> None:
    """Each entry of _keep_mask (the halves of 64-bit draws) is kept with probability 1 - p, the even and odd
    entries alike (odd sizes included), and the mask takes only the values 0 and 1."""
    from rl_transformers.policies.dt_fast import _keep_mask

    torch.manual_seed(0)
    reps = 200_000 // int(np.prod(shape)) + 1
    for p in (0.1, 0.5, 0.9):
        masks = torch.stack([_keep_mask(torch.empty(shape), p) for _ in range(reps)]).reshape(reps, -1)
        assert masks.shape[1] == int(np.prod(shape)) and masks.dtype == torch.float32
        assert bool(((masks == 0) | (masks == 1)).all())
        for half in (masks[:, 0::2], masks[:, 1::2]):
            n = half.numel()
            assert abs(half.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    assert bool((_keep_mask(torch.empty(1000), 1.0 - 1e-12) == 0).all())
    assert bool((_keep_mask(torch.empty(1000), 1e-12) == 1).all())
