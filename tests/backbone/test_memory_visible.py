"""``XLMemory.read_visible``: the XL memory's columns invalid in every row are left out of eager forwards.

Reference: the same forwards reading every column (``xl.TRIM_INVALID = False``). With episodes shorter than
the memory (resets), the oldest columns are invalid everywhere; dropping them removes exact zeros from the
softmax sums, so outputs and gradients agree to float64 rounding (1e-12, relative 1e-10 for gradients).
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import Backbone
from rl_transformers.backbone.memory import xl
from rl_transformers.policies import gtrxl_backbone

B, D, M = 3, 16, 8


def backbone() -> Backbone:
    torch.manual_seed(0)
    return Backbone(gtrxl_backbone(D, 2, 2, mem_len=M).replace(attention_options={"max_cache": M})).double()


def stream(bb: Backbone, x: torch.Tensor, resets: torch.Tensor, project: bool) -> list[torch.Tensor]:
    ys = []
    with torch.no_grad():
        state = bb.init_state(B)
        state = bb.project_memory(state) if project else state
        for t in range(x.shape[0]):
            out = bb(x[t], state=state, reset=resets[t])
            ys.append(out.y)
            state = out.state
    return ys


@pytest.mark.parametrize("project", [False, True], ids=["plain", "projected"])
def test_acting_without_never_visible_columns_equals_reading_all(
    project: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    bb = backbone()
    g = torch.Generator().manual_seed(1)
    steps = 20
    x = torch.randn(steps, B, 1, D, generator=g, dtype=torch.float64)
    resets = torch.zeros(steps, B, dtype=torch.bool)
    resets[::4] = True  # episodes of 4 steps: at least half the memory is invalid in every row
    resets[10, 1] = False  # one longer episode
    widths: list[int] = []
    real = xl.XLMemory.read

    def recording(self, state):  # type: ignore[no-untyped-def]
        widths.append(state.h.shape[2])
        return real(self, state)

    monkeypatch.setattr(xl.XLMemory, "read", recording)
    trimmed = stream(bb, x, resets, project)
    assert min(widths) < max(widths) <= M and min(widths[1:]) < M  # it trims (the test can fail)
    monkeypatch.setattr(xl, "TRIM_INVALID", False)
    widths.clear()
    full = stream(bb, x, resets, project)
    assert set(widths) == {M}
    for a, b in zip(trimmed, full, strict=True):
        assert (a - b).abs().max() < 1e-12


def test_training_chunk_and_gradients_without_never_visible_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    bb = backbone()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a memory with 3 valid columns of 8 in the fullest row
        state = bb(torch.randn(B, 5, D, generator=g, dtype=torch.float64)).state
        state = bb(
            torch.randn(B, 3, D, generator=g, dtype=torch.float64), state=state, reset=torch.ones(B).bool()
        ).state
    assert state.memory.valid.any(0).tolist() == [False] * 5 + [True] * 3  # 5 columns are left out
    x = torch.randn(B, 6, D, generator=g, dtype=torch.float64)
    starts = torch.zeros(B, 6, dtype=torch.bool)
    starts[0, 2] = starts[2, 0] = True

    def run() -> list[torch.Tensor]:
        bb.zero_grad(set_to_none=True)
        y = bb(x, state=state, starts=starts).y
        y.pow(2).sum().backward()
        return [y.detach(), *(p.grad for p in bb.parameters() if p.grad is not None)]

    trimmed = run()
    monkeypatch.setattr(xl, "TRIM_INVALID", False)
    full = run()
    assert len(trimmed) == len(full) > 10
    assert (trimmed[0] - full[0]).abs().max() < 1e-12
    for a, b in zip(trimmed[1:], full[1:], strict=True):
        assert (a - b).abs().max() < 1e-10 * max(float(b.abs().max()), 1e-3)
