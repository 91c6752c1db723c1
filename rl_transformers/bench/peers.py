"""Peer rows: attention kernels of third-party PyPI packages, timed in the same run and at the same sizes.

Optional (``--peers``; install with the ``bench-peers`` extra). Kernel target only, forward and backward modes
(none of them exposes a streaming state). Settings are chosen to match our entries' defaults where a
counterpart exists:

====================================  =========================================================================
peer                                  call (q, k, v: (B, H, L, D))
====================================  =========================================================================
``x-transformers``                    ``x_transformers.attend.Attend(causal=..., flash=False)`` - materialised
                                      softmax attention (exact, full mask)
``local-attention``                   ``LocalAttention(window_size=64, causal=..., look_backward=1,
                                      exact_windowsize=True, autopad=True, use_rotary_pos_emb=False)`` - keys
                                      0 <= i - j <= 64 causally (= our ``local`` with window 64; exact)
``performer-pytorch``                 ``FastAttention(dim_heads=D, nb_features=64, causal=...)`` (= our
                                      ``performer`` default of 64 features; approximate; the causal path is
                                      the package's pure-PyTorch fallback without its CUDA kernel)
``reformer-pytorch``                  ``LSHAttention(bucket_size=32, n_hashes=2, causal=...)`` on shared
                                      qk = q, heads folded into the batch (approximate)
``linear-attention-transformer``      ``linear_attn`` / ``causal_linear_attn(bucket_size=64)`` (softmax
                                      feature maps, Shen et al. 2018; approximate). **Different operator**
                                      when causal: bucketed, each query sees only earlier buckets' keys (the
                                      first bucket outputs 0); its rows say so
====================================  =========================================================================
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from rl_transformers.backbone.reference import causal_mask

LOCAL_WINDOW = 64


@dataclass(frozen=True)
class Peer:
    """One third-party kernel (picklable: the build is looked up by name)."""

    name: str
    package: str
    """Import name checked by :meth:`installed`."""
    exact: bool
    causal_ok: bool = True
    noncausal_ok: bool = True
    random_per_call: bool = False
    """Draws random numbers in its own dtype at every call (so a float64 run is a different draw): its numerical
    error is checked as two seeded float32 runs being identical instead."""
    different_operator: str | None = None
    """Set when the peer's call computes a different (usually cheaper) operator than the entry it is compared
    with; the text is put on its rows ("different operator: ...") so its speed is not read as a like-for-like."""

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def build(self, shape: Any, causal: bool) -> nn.Module:
        with contextlib.redirect_stdout(io.StringIO()):  # performer-pytorch prints about its CUDA kernel
            return PeerKernel(_BUILDERS[self.name](shape, causal))

    @property
    def reference_mask(self) -> Callable[[int, bool, torch.device], Tensor | None] | None:
        """The mask this peer computes exactly (None: approximate, compared with the full mask)."""
        if self.name == "x-transformers" or self.name.startswith("sdpa-"):
            return _full_mask
        if self.name == "local-attention":
            return _local_mask
        return None


def _full_mask(length: int, causal: bool, device: torch.device) -> Tensor | None:
    return causal_mask(length, device=device) if causal else None


def _local_mask(length: int, causal: bool, device: torch.device) -> Tensor | None:
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    return (i - j >= 0) & (i - j <= LOCAL_WINDOW) if causal else (i - j).abs() <= LOCAL_WINDOW


class PeerKernel(nn.Module):
    """Adapter with the harness's kernel signature: forward(q, k, v, pos, valid, state) -> (out, None, [])."""

    def __init__(self, inner: tuple[nn.Module, Callable[..., Tensor]]) -> None:
        super().__init__()
        self.inner, self._call = inner

    def init_state(self, batch: int, like: Tensor) -> Any:
        return None

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, valid: Tensor, state: Any
    ) -> tuple[Tensor, Any, list[Tensor]]:
        return self._call(self.inner, q, k, v), None, []


def _x_transformers(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
    from x_transformers.attend import Attend

    return Attend(causal=causal, flash=False), lambda m, q, k, v: m(q, k, v)[0]


def _local_attention(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
    from local_attention import LocalAttention

    module = LocalAttention(
        window_size=LOCAL_WINDOW,
        causal=causal,
        look_backward=1,
        look_forward=0 if causal else 1,
        exact_windowsize=True,
        autopad=True,
        use_rotary_pos_emb=False,
    )
    return module, lambda m, q, k, v: m(q, k, v)


def _performer(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
    from performer_pytorch import FastAttention

    return FastAttention(dim_heads=shape.d_head, nb_features=64, causal=causal), lambda m, q, k, v: m(q, k, v)


def _reformer(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
    from reformer_pytorch.reformer_pytorch import LSHAttention

    def call(m: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        b, h, n, d = q.shape
        out = m(q.reshape(b * h, n, d), v.reshape(b * h, n, d))[0]
        return out.reshape(b, h, n, d)

    return LSHAttention(bucket_size=32, n_hashes=2, causal=causal), call


def _linear_attention(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
    from linear_attention_transformer.linear_attention_transformer import causal_linear_attn, linear_attn

    if causal:
        return nn.Identity(), lambda m, q, k, v: causal_linear_attn(q, k, v, bucket_size=64)
    return nn.Identity(), lambda m, q, k, v: linear_attn(q, k, v)


_BUILDERS: dict[str, Callable[[Any, bool], tuple[nn.Module, Callable[..., Tensor]]]] = {
    "x-transformers": _x_transformers,
    "local-attention": _local_attention,
    "performer-pytorch": _performer,
    "reformer-pytorch": _reformer,
    "linear-attention-transformer": _linear_attention,
}

PEERS = (
    Peer("x-transformers", "x_transformers", exact=True),
    Peer("local-attention", "local_attention", exact=True),
    Peer("performer-pytorch", "performer_pytorch", exact=False),
    Peer("reformer-pytorch", "reformer_pytorch", exact=False, random_per_call=True),
    Peer(
        "linear-attention-transformer",
        "linear_attention_transformer",
        exact=False,
        different_operator=(
            "causal path with its default bucket_size=64 is bucketed: a query sees only the keys of earlier "
            "buckets (none of its own bucket), so the first 64 outputs are 0; cheaper than per-token causal "
            "linear attention"
        ),
    ),
)


def _sdpa_backend(backend: str) -> Callable[[Any, bool], tuple[nn.Module, Callable[..., Tensor]]]:
    """SDPA forced onto one backend (``flash`` or ``efficient``) on CUDA.

    The forced backend raises when it cannot run the call (e.g. flash in float32), and the row says so. The
    float64 twin of the correctness gate runs through SDPA's math backend: neither fused backend has float64,
    and the twin checks the operator, not the kernel.
    """

    def build(shape: Any, causal: bool) -> tuple[nn.Module, Callable[..., Tensor]]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

        def call(m: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if q.dtype == torch.float64 or not q.is_cuda:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return nn.Identity(), call

    return build


SDPA_BACKENDS = ("flash", "efficient")
"""SDPA backends timed as their own rows with ``BenchConfig.sdpa_backends`` (CUDA only; CPU runs use the
default dispatch, so these rows equal ``sdpa`` there)."""
_BUILDERS.update({f"sdpa-{name}": _sdpa_backend(name) for name in SDPA_BACKENDS})


def sdpa_backend_impls() -> list[Any]:
    """Impl rows of SDPA forced onto each of :data:`SDPA_BACKENDS` (kernel target, exact, full mask)."""
    from rl_transformers.bench.ops import Impl

    return [
        Impl(
            f"peer:sdpa-{name}",
            "peer",
            exact=True,
            streaming="none",
            peer=Peer(f"sdpa-{name}", "torch", exact=True),
        )
        for name in SDPA_BACKENDS
    ]


def peer_impls() -> tuple[list[Any], list[str]]:
    """(Impl rows of the installed peers, names of the missing ones)."""
    from rl_transformers.bench.ops import Impl

    impls, missing = [], []
    for peer in PEERS:
        if not peer.installed():
            missing.append(peer.name)
            continue
        impls.append(
            Impl(
                f"peer:{peer.name}",
                "peer",
                exact=peer.exact,
                streaming="none",
                causal_ok=peer.causal_ok,
                noncausal_ok=peer.noncausal_ok,
                peer=peer,
            )
        )
    return impls, missing
