"""``Backbone.forward(starts=...)``: rows restarting inside a chunk equal the token-by-token stream with resets.

The reference is the streaming contract itself: one token per call with ``reset`` at the starts. The chunk with
``starts`` must give the same outputs (float64, to rounding: the same sums over longer, masked key rows) and a
state from which the next chunk continues exactly as the stream does.
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.policies import gtrxl_backbone

B, T = 4, 12
TOL = 1e-12


def configs() -> dict[str, BackboneConfig]:
    small = dict(d_model=16, n_layers=2, n_heads=2)
    return {
        "gtrxl_xl_relative": gtrxl_backbone(16, 2, 2, mem_len=5).replace(attention_options={"max_cache": 5}),
        "xl_rope_sdpa": BackboneConfig(  # rope leaves the logits alone: the fused SDPA path with a mask
            **small,
            position="rope",
            memory="xl",
            memory_options={"mem_len": 7},
            attention_options={"max_cache": 7},  # XL replays the stream exactly within the memory's window
        ),
        "kv_cache_window": BackboneConfig(**small, position="rope", attention_options={"max_cache": 6}),
        "gaussian_prior_kv_cache": BackboneConfig(  # the study's PPO row: no XL memory, its own bounded cache
            **small, attention="gaussian_prior", position="xl_relative", attention_options={"max_cache": 6}
        ),
        "gaussian_prior_xl": gtrxl_backbone(16, 2, 2, mem_len=5).replace(
            attention="gaussian_prior", attention_options={"max_cache": 5}
        ),
        "kv_cache_absolute": BackboneConfig(**small, position="sinusoidal", block="pre_ln"),
        # feature-map attentions: running sums restarted by segment (the state is the sums; with XL memory a
        # chunk sees more than the stream's window, so that case is checked against packing, test_segment_path)
        "linear_rope": BackboneConfig(**small, attention="linear", position="rope"),
        "performer_rope": BackboneConfig(**small, attention="performer", position="rope"),
        # lsh: bucket ranks count only the query's own segment (dense path), its KV cache bounded as in PPO
        "lsh_kv_cache": BackboneConfig(
            **small, attention="lsh", position="rope", attention_options={"max_cache": 6, "chunk_size": 2}
        ),
        "rfa_normalized": BackboneConfig(
            **small, attention="rfa", position="rope", attention_options={"normalize": True}
        ),
    }


def streamed(
    bb: Backbone, x: torch.Tensor, starts: torch.Tensor, state: object
) -> tuple[torch.Tensor, object]:
    ys = []
    for t in range(x.shape[1]):
        out = bb(x[:, t : t + 1], state=state, reset=starts[:, t])
        ys.append(out.y)
        state = out.state
    return torch.cat(ys, dim=1), state


@pytest.mark.parametrize("name", sorted(configs()))
def test_chunk_with_starts_equals_the_stream_with_resets(name: str) -> None:
    torch.manual_seed(0)
    bb = Backbone(configs()[name]).double().eval()
    assert bb.segments_unsupported is None
    g = torch.Generator().manual_seed(1)
    warm = torch.randn(B, 6, 16, generator=g, dtype=torch.float64)
    x = torch.randn(B, T, 16, generator=g, dtype=torch.float64)
    nxt = torch.randn(B, 5, 16, generator=g, dtype=torch.float64)
    starts = torch.rand(B, T, generator=g) < 0.25
    starts[0, 0] = True  # a restart at the chunk's first token
    starts[1, 3] = starts[1, 4] = True  # a one-token episode
    starts[2] = False  # a row that continues its state throughout
    starts[3, -1] = True  # a restart at the last token
    with torch.no_grad():
        state = bb(warm).state  # a non-empty carried state
        want, want_state = streamed(bb, x, starts, state)
        out = bb(x, state=state, starts=starts)
        assert (out.y - want).abs().max() < TOL
        assert torch.equal(out.state.pos, want_state.pos)
        # the returned state continues like the stream's
        none = torch.zeros(B, nxt.shape[1], dtype=torch.bool)
        a, _ = streamed(bb, nxt, none, out.state)
        b, _ = streamed(bb, nxt, none, want_state)
        assert (a - b).abs().max() < TOL


def test_starts_bite() -> None:
    """The same chunk without ``starts`` differs: the test above can fail."""
    torch.manual_seed(0)
    bb = Backbone(configs()["gtrxl_xl_relative"]).double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, 16, generator=g, dtype=torch.float64)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[:, 5] = True
    with torch.no_grad():
        state = bb(torch.randn(B, 6, 16, generator=g, dtype=torch.float64)).state
        with_starts = bb(x, state=state, starts=starts).y
        without = bb(x, state=state).y
    assert torch.equal(with_starts[:, :5], without[:, :5])  # before the restart nothing changes
    assert (with_starts[:, 5:] - without[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "kw",
    [
        dict(attention="rfa", position="rope", attention_options={"gate": True}),  # a decaying state
        dict(memory="compressive", position="rope", memory_options={"compression": "most_used"}),
        dict(depth="universal", position="rope"),
        dict(attention="gaussian_prior", attention_options={"truncate_sigmas": 6.0}),
    ],
    ids=["rfa_gated", "memory_compressive_most_used", "depth_universal", "gaussian_prior_windowed"],
)
def test_unsupported_parts_refuse_starts(kw: dict) -> None:
    bb = Backbone(BackboneConfig(d_model=16, n_layers=2, n_heads=2, **kw))
    assert bb.segments_unsupported is not None
    with pytest.raises(ValueError, match="starts"):
        bb(torch.randn(2, 3, 16), starts=torch.zeros(2, 3, dtype=torch.bool))
