"""The DT throughput candidates (benchmarks/studies/dt_models.py): compiled ones compute the eager loss."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["rl_transformers_compiled", "rl_transformers_generic_compiled"])
def test_compiled_dt_candidates_compute_the_eager_loss(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled candidates run the same model and loss as the eager ones (dynamo with the eager backend here:
    the wiring is tested, inductor is the benchmark's business) and train the same parameters."""
    import functools

    import torch

    from benchmarks.studies import dt_models

    monkeypatch.setattr(dt_models.torch, "compile", functools.partial(torch.compile, backend="eager"))
    shape = dt_models.DTShape(batch_size=4, context_len=5, d_model=16, n_layers=1, dropout=0.0)
    batch = dt_models.make_batch(shape, torch.device("cpu"))
    torch.manual_seed(0)
    eager = dt_models.BUILDERS[name.removesuffix("_compiled")](shape, torch.device("cpu"))
    torch.manual_seed(0)
    compiled = dt_models.BUILDERS[name](shape, torch.device("cpu"))
    assert compiled is not None and eager is not None
    want, got = eager.loss(batch), compiled.loss(batch)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    got.backward()
    assert all(p.grad is not None for p in compiled.module.parameters() if p.requires_grad)
