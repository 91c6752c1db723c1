"""The kernel census (``bench/kernels.py``) on hand-countable calls: backends seen and FLOPs really done."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rl_transformers.backbone.attention import _flex
from rl_transformers.bench.kernels import census
from tests.backbone.test_local import make_inputs, make_layer, run_layer

B, H, T, D = 2, 3, 40, 16


def qkv(requires_grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def test_fused_cpu_sdpa_counts_the_causal_half_and_the_backward() -> None:
    q, k, v = qkv()
    found = census(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert found.backends == ["cpu_flash"]
    assert found.flops == 4 * B * H * T * T * D / 2
    q, k, v = qkv(requires_grad=True)
    found = census(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    assert found.backends == ["cpu_flash"]
    assert found.flops == 3.5 * 4 * B * H * T * T * D  # not causal: the whole square, forward + backward


def test_math_backend_and_plain_products_are_counted_as_matmuls() -> None:
    q, k, v = qkv()
    with sdpa_kernel(SDPBackend.MATH):
        found = census(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert found.backends == ["math"]
    assert found.flops == 4 * B * H * T * T * D  # the unfused form computes the whole square
    found = census(lambda: torch.matmul(q, k.transpose(-1, -2)))
    assert found.backends == ["matmul"] and found.flops == 2 * B * H * T * T * D


@pytest.mark.filterwarnings("ignore:.*torch.compile:UserWarning")
def test_flex_calls_are_counted_from_their_block_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_flex, "FLEX_PATH", "always")
    monkeypatch.setattr(_flex, "BLOCK", 16)
    att = make_layer("local", True, n_heads=H, d_head=D, window=4)
    x = make_inputs(1, H, 64, 64, d=D)
    with torch.no_grad():
        found = census(lambda: run_layer(att, *x))
    # 64 queries / keys in 4 x 4 tiles of 16; window 4 (causal): the diagonal tiles and the ones just before
    tiles = 4 + 3
    assert found.backends == ["flex"]
    assert found.flops == 4 * D * tiles * 16 * 16 * H
    assert _flex.WORK is None  # the census leaves nothing recording
