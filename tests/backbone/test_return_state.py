"""``Backbone.forward(return_state=False)`` (PPO's training pass drops the new state): the same outputs, losses
and gradients as ``return_state=True``, no state, and the memory written only when it makes losses there or diagnostics are collected."""

from __future__ import annotations

import pytest
import torch

from tests.backbone import invariants as inv

MEMORIES = {
    None: {},
    "xl": {"mem_len": 3},
    "knn": {"mem_len": 2, "store_size": 6, "top_k": 2},
    "compressive": {"mem_len": 2, "cmem_len": 2, "rate": 2},
}


@pytest.mark.parametrize("memory", list(MEMORIES), ids=lambda m: str(m))
def test_dropping_the_state_changes_nothing_else(memory: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    bb = inv.tiny_backbone(memory=memory, memory_options=MEMORIES[memory]).train()
    x = torch.randn(2, 9, bb.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        state = inv.run_chunks(bb, x[:, :7], [4, 3])[1]  # a filled memory (store / compressed slots too)
    reset = torch.tensor([False, True])
    outs = []
    for keep in (True, False):
        bb.zero_grad()
        out = bb(x[:, 7:], state=state, reset=reset, return_state=keep)
        loss = out.y.square().sum() + sum(out.aux_losses.values(), torch.zeros((), dtype=torch.float64))
        loss.backward()
        outs.append((out, {n: p.grad.clone() for n, p in bb.named_parameters() if p.grad is not None}))
    (kept, grads_kept), (dropped, grads_dropped) = outs
    assert kept.state is not None and dropped.state is None
    torch.testing.assert_close(dropped.y, kept.y, atol=0, rtol=0)
    assert dropped.aux_losses.keys() == kept.aux_losses.keys()
    assert bool(kept.aux_losses) == (memory == "compressive")  # its compressor's losses, made at the write
    for name in kept.aux_losses:
        torch.testing.assert_close(dropped.aux_losses[name], kept.aux_losses[name], atol=0, rtol=0)
    assert grads_dropped.keys() == grads_kept.keys()
    for name in grads_kept:
        torch.testing.assert_close(grads_dropped[name], grads_kept[name], atol=0, rtol=0)
    if memory is not None:  # written only for the losses it makes at the write (compressive's)
        calls: list[int] = []
        write = bb.memory.write
        monkeypatch.setattr(bb.memory, "write", lambda s, ctx: calls.append(1) or write(s, ctx))
        bb(x[:, 7:], state=state, return_state=False)
        assert len(calls) == (1 if bb.memory.aux_losses else 0)
        assert bool(bb.memory.aux_losses) == (memory == "compressive")
        bb.collect_info = True  # diagnostics report the memory's fill: written then
        bb(x[:, 7:], state=state, return_state=False)
        assert len(calls) == (2 if bb.memory.aux_losses else 1)
