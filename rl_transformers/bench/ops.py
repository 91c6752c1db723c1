"""Implementations under test and the ready-to-time operations built from them.

An :class:`Impl` is one row source: the ``sdpa`` baseline, a registry attention (``ours``), or a third-party peer.
:func:`build_op` turns (impl, target, mode, shape) into an :class:`Op`: a module holding the weights, the inputs,
and a zero-argument ``call`` that runs one timed call of the mode.

Targets (shapes: B batch, H heads, L length, D head dim, d = H·D):

- ``kernel``: ``Attention.core(q, k, v, pos, pos, valid, ctx, fresh_state)`` on q, k, v (B, H, L, D) - the
  attention kernel with its own state handling, what a layer runs after the projections. Baseline:
  ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)``.
- ``layer``: the attention layer ``layer(x, ctx, state)`` with its q/k/v/o projections, x (B, L, d).
- ``model``: a pre-LN ``Backbone`` of ``n_layers`` blocks (FFN width 4d), x (B, L, d).
  For ``layer`` / ``model`` the baseline is the same target built with attention ``full`` (which dispatches to
  SDPA when the positional scheme leaves the logits alone; a logit-bias scheme is replaced by ``none`` for it).

Modes: ``forward`` (eval, no grad), ``backward`` (train mode, forward + gradients of all inputs and weights for a
fixed random output gradient, aux losses included), ``step`` (eval, one new token per row after a state holding
L past tokens, built beforehand in chunks of ``STATE_CHUNK``; baseline: append to a KV cache + SDPA).
Inputs are drawn in float64 from a seeded generator and cast, so every dtype sees the same values.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone import registry
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.model import Backbone
from rl_transformers.backbone.state import KVCache
from rl_transformers.bench.config import Shape

STATE_CHUNK = 1024
"""Past tokens per chunk when building the state of the ``step`` mode."""
LENGTH_FIELDS = ("seq_len", "max_seq_len", "max_len", "max_length")
"""Option fields that name the sequence length; filled with L unless given (e.g. a Linformer projection)."""

ImplKind = Literal["sdpa", "ours", "peer"]


@dataclass(frozen=True)
class Impl:
    """One implementation (a row of the results)."""

    name: str
    """Row label: ``sdpa``, a registry name, or ``peer:<package>``."""
    kind: ImplKind
    attention: str | None = None
    """Registry name (``ours``); ``full`` for the layer / model SDPA baseline."""
    options: dict[str, Any] = field(default_factory=dict)
    exact: bool = True
    """Capabilities.exact (peers: whether the peer computes exact softmax attention)."""
    streaming: str = "exact"
    causal_ok: bool = True
    noncausal_ok: bool = True
    peer: Any = None
    """A ``peers.Peer`` for third-party rows."""

    def run_causal(self, causal: bool) -> bool:
        """Masking this implementation runs under when ``causal`` is asked for (non-causal-only entries flip)."""
        if causal and not self.causal_ok:
            return False
        if not causal and not self.noncausal_ok:
            return True
        return causal


def registry_impls(names: tuple[str, ...], exclude: tuple[str, ...], options: dict[str, dict]) -> list[Impl]:
    """SDPA plus every registry attention (``available()`` at call time) selected by ``names`` / ``exclude``."""
    registered = registry.available()["attention"]
    for name in (*names, *exclude, *options):
        if name not in registered:
            raise registry._unknown("attention", name, sorted(registered))
    chosen = [n for n in (names or registered) if n not in exclude]
    impls = [Impl("sdpa", "sdpa", attention="full")]
    for name in chosen:
        caps = registry.capabilities("attention", name)
        impls.append(
            Impl(
                name,
                "ours",
                attention=name,
                options=dict(options.get(name, {})),
                exact=caps.exact,
                streaming=caps.streaming,
                causal_ok=caps.causal,
                noncausal_ok=caps.noncausal,
            )
        )
    return impls


def sdpa_position(position: str) -> str:
    """Position of the SDPA baseline: the same scheme unless it biases the logits (then ``none``)."""
    kind = registry.get("position", position).cls.kind
    return "none" if kind in ("bias", "scores") else position


def resolved_options(impl: Impl, length: int) -> dict[str, Any]:
    """The impl's options with length fields (``LENGTH_FIELDS``) set to L when the entry has them."""
    opts = dict(impl.options)
    if impl.attention is None or impl.kind != "ours":
        return opts
    names = {f.name for f in dataclasses.fields(registry.get("attention", impl.attention).options)}
    for name in LENGTH_FIELDS:
        if name in names and name not in opts:
            opts[name] = length
    return opts


def backbone_config(impl: Impl, shape: Shape, causal: bool, position: str, n_layers: int) -> BackboneConfig:
    """The config of an ``ours`` / ``sdpa`` implementation at this size (ValueError if unsupported)."""
    attention = impl.attention or "full"
    if impl.kind == "sdpa":
        position = sdpa_position(position)
    return BackboneConfig(
        d_model=shape.width,
        n_layers=n_layers,
        n_heads=shape.heads,
        attention=attention,
        attention_options=resolved_options(impl, shape.length),
        position=position,
        causal=causal,
    )


# -- modules ------------------------------------------------------------------------------------------------
class _AttentionModule(nn.Module):
    """One registry attention layer (index 0) and its positional scheme, built from ``cfg``."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.position = registry.get("position", cfg.position).cls(cfg, cfg.options("position"))
        self.attn = registry.get("attention", cfg.attention).cls(
            cfg, cfg.options("attention"), self.position, 0
        )
        self.causal = cfg.causal

    def init_state(self, batch: int, like: Tensor) -> Any:
        return self.attn.init_state(batch, like.device, like.dtype)


class KernelModule(_AttentionModule):
    """An attention layer and its positional scheme, called on q, k, v through ``core``."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, valid: Tensor, state: Any
    ) -> tuple[Tensor, Any, list[Tensor]]:
        ctx = ForwardContext(pos=pos, valid=valid, causal=self.causal)
        out, new_state = self.attn.core(q, k, v, pos, pos, valid, ctx, state)
        return out, new_state, list(ctx.aux.values())


class SDPAKernel(nn.Module):
    """The baseline kernel: ``F.scaled_dot_product_attention``; with a state it appends to a KV cache."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def init_state(self, batch: int, like: Tensor) -> Any:
        return None

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, valid: Tensor, state: Any
    ) -> tuple[Tensor, Any, list[Tensor]]:
        if state is not None:
            k = torch.cat([state[0], k], dim=2)
            v = torch.cat([state[1], v], dim=2)
        t, s = q.shape[2], k.shape[2]
        if not self.causal or t == 1:  # one new query after a cache sees every key
            return F.scaled_dot_product_attention(q, k, v), (k, v), []
        if t == s:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True), (k, v), []
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)  # bottom-right aligned
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (k, v), []


class LayerModule(_AttentionModule):
    """An attention layer with its projections, called as ``layer(x, ctx, state)``."""

    def forward(self, x: Tensor, pos: Tensor, valid: Tensor, state: Any) -> tuple[Tensor, Any, list[Tensor]]:
        ctx = ForwardContext(pos=pos, valid=valid, causal=self.causal)
        y, new_state = self.attn(x, ctx, state)
        return y, new_state, list(ctx.aux.values())


class ModelModule(nn.Module):
    """A ``Backbone``; ``pos`` / ``valid`` are implied by the state."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.backbone = Backbone(cfg)

    def init_state(self, batch: int, like: Tensor) -> Any:
        return self.backbone.init_state(batch, like.device, like.dtype)

    def forward(self, x: Tensor, pos: Tensor, valid: Tensor, state: Any) -> tuple[Tensor, Any, list[Tensor]]:
        out = self.backbone(x, state=state)
        return out.y, out.state, list(out.aux_losses.values())


# -- operations ----------------------------------------------------------------------------------------------
@dataclass
class Op:
    """A built operation: ``call()`` runs one timed call; ``output()`` the checked output (no grad)."""

    impl: Impl
    target: str
    mode: str
    shape: Shape
    causal: bool
    module: nn.Module
    inputs: dict[str, Tensor]
    """Token inputs: q, k, v (kernel) or x (layer / model); ``past_*`` for the step mode's state."""
    state: Any = None
    """Step mode: the state holding L past tokens."""
    grad_out: Tensor | None = None
    runner: Callable[..., Any] | None = None
    """What ``call`` invokes instead of ``module`` (a compiled module)."""

    @property
    def fn(self) -> Callable[..., Any]:
        return self.runner if self.runner is not None else self.module

    def _args(self) -> tuple[Any, ...]:
        shape = self.shape
        x_names = ("q", "k", "v") if "q" in self.inputs else ("x",)
        new = [self.inputs[n] for n in x_names]
        b, t = new[0].shape[0], new[0].shape[-2]
        start = shape.length if self.mode == "step" else 0
        device = new[0].device
        pos = (start + torch.arange(t, device=device)).expand(b, t)
        valid = torch.ones(b, t, dtype=torch.bool, device=device)
        state = self.state if self.mode == "step" else _init_state(self.module, b, new[0])
        return (*new, pos, valid, state)

    def call(self) -> Any:
        """One timed call of the mode."""
        if self.mode == "backward":
            out, _, aux = self.fn(*self._args())
            leaves = [t for t in self.inputs.values() if t.requires_grad]
            leaves += [p for p in self.module.parameters() if p.requires_grad]
            outputs = [out, *aux]
            grads = [self.grad_out, *[torch.ones_like(a) for a in aux]]
            return torch.autograd.grad(outputs, leaves, grads, allow_unused=True)
        with torch.no_grad():
            return self.fn(*self._args())[0]

    def output(self, seed: int | None = 0, use_runner: bool = False) -> Tensor:
        """The forward (or step) output of the same inputs, without gradients.

        The global RNG is seeded first (``seed``), so implementations that draw random numbers at every call
        (e.g. LSH rotations of a peer) give comparable outputs across dtypes. ``use_runner``: through the
        compiled module when there is one.
        """
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            return (self.fn if use_runner else self.module)(*self._args())[0]

    def twin(self, dtype: torch.dtype) -> Op:
        """The same op in ``dtype`` with the same (already rounded) weights and inputs - e.g. float64."""
        module = copy.deepcopy(self.module).to(dtype)
        inputs = {k: v.detach().to(dtype).requires_grad_(v.requires_grad) for k, v in self.inputs.items()}
        op = Op(self.impl, self.target, self.mode, self.shape, self.causal, module, inputs)
        op.grad_out = None if self.grad_out is None else self.grad_out.to(dtype)
        if self.mode == "step":
            op.state = build_state(module, inputs, self.target)
        return op


def _init_state(module: nn.Module, batch: int, like: Tensor) -> Any:
    """The empty state of a harness module (every module here defines ``init_state(batch, like)``)."""
    return module.init_state(batch, like)  # type: ignore[operator]


def _randn(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Seeded N(0, 1) inputs. On a GPU they are drawn there (float32, then cast): drawing them in float64 on the
    host took about a second per q / k / v tensor at 16K tokens x width 2048, which made input generation, not
    timing, the cost of a GPU sweep (the first H100 run: 57-130 s per group of 23 implementations)."""
    if gen.device.type == "cuda":
        return torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def build_module(
    impl: Impl, target: str, shape: Shape, causal: bool, position: str, n_layers: int
) -> nn.Module:
    """The module of an ``ours`` / ``sdpa`` implementation (float32, CPU, weights seeded by the caller)."""
    if impl.kind == "sdpa" and target == "kernel":
        return SDPAKernel(causal)
    if impl.kind == "peer":
        if target != "kernel":
            raise ValueError(f"peer {impl.name} has kernel rows only")
        return impl.peer.build(shape, causal)
    cfg = backbone_config(impl, shape, causal, position, n_layers if target == "model" else 1)
    if target == "kernel":
        if not registry.get("attention", cfg.attention).cls.kernel_form:
            raise ValueError(
                f"{cfg.attention} is a recurrent mixer whose gates read the layer input: it has no q, k, v "
                "kernel of its own; time it on the layer or model target"
            )
        return KernelModule(cfg)
    if target == "layer":
        return LayerModule(cfg)
    return ModelModule(cfg)


def build_state(module: nn.Module, inputs: dict[str, Tensor], target: str) -> Any:
    """State after the past tokens (``past_*`` inputs), built in chunks of ``STATE_CHUNK`` without gradients."""
    names = ("past_q", "past_k", "past_v") if target == "kernel" else ("past_x",)
    past = [inputs[n] for n in names]
    b, length = past[0].shape[0], past[0].shape[-2]
    state = _init_state(module, b, past[0])
    if isinstance(module, SDPAKernel):
        return (past[1], past[2])
    if (
        isinstance(module, KernelModule)
        and isinstance(state, KVCache)
        and type(module.attn).core is Attention.core
    ):
        # The default core only appends (and trims to max_cache): build the cache in one go.
        pos = torch.arange(length, device=past[0].device).expand(b, length)
        valid = torch.ones(b, length, dtype=torch.bool, device=past[0].device)
        return state.append(past[1], past[2], pos, valid, module.attn.max_cache)
    with torch.no_grad():
        for start in range(0, length, STATE_CHUNK):
            stop = min(length, start + STATE_CHUNK)
            chunk = [t[..., start:stop, :] for t in past]
            pos = torch.arange(start, stop, device=past[0].device).expand(b, stop - start)
            valid = torch.ones(b, stop - start, dtype=torch.bool, device=past[0].device)
            _, state, _ = module(*chunk, pos, valid, state)
    return state


def cheap_step_state(impl: Impl, target: str) -> bool:
    """Whether the step state of L past tokens is built without running the model over them (KV caches of
    kernels using the default ``core``: the cache is the past keys and values themselves)."""
    if target != "kernel":
        return False
    if impl.kind == "sdpa":
        return True
    if impl.kind != "ours" or impl.attention is None:
        return False
    cls = registry.get("attention", impl.attention).cls
    return cls.core is Attention.core and cls.init_state is Attention.init_state


def build_op(
    impl: Impl,
    target: str,
    mode: str,
    shape: Shape,
    *,
    causal: bool,
    position: str = "none",
    n_layers: int = 2,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Op:
    """Build the op of ``impl`` (weights and inputs seeded by ``seed``); raises ValueError if unsupported."""
    device = torch.device(device)
    if mode == "step" and impl.streaming == "none":
        raise ValueError("streaming='none': no streaming step")
    if mode == "step" and not causal:
        raise ValueError("the streaming step is causal; this entry runs non-causal only")
    torch.manual_seed(seed)
    module = build_module(impl, target, shape, causal, position, n_layers).to(device=device, dtype=dtype)
    module.train(mode == "backward")
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed + 1)
    b, h, d, length = shape.batch, shape.heads, shape.d_head, shape.length
    t = 1 if mode == "step" else length
    inputs: dict[str, Tensor] = {}
    if target == "kernel":
        for name in ("q", "k", "v"):
            inputs[name] = _randn(gen, (b, h, t, d), dtype, device)
        if mode == "step":
            for name in ("q", "k", "v"):
                inputs[f"past_{name}"] = _randn(gen, (b, h, length, d), dtype, device)
    else:
        inputs["x"] = _randn(gen, (b, t, shape.width), dtype, device)
        if mode == "step":
            inputs["past_x"] = _randn(gen, (b, length, shape.width), dtype, device)
    op = Op(impl, target, mode, shape, causal, module, inputs)
    if mode == "backward":
        for name in ("q", "k", "v", "x"):
            if name in inputs:
                inputs[name].requires_grad_(True)
        out_shape = (b, h, t, d) if target == "kernel" else (b, t, shape.width)
        op.grad_out = _randn(gen, out_shape, dtype, device)
    if mode == "step":
        op.state = build_state(module, inputs, target)
    return op


def compile_op(op: Op) -> Op:
    """A copy of ``op`` whose calls go through ``torch.compile(module)`` (compiled lazily on the first call)."""
    compiled = dataclasses.replace(op)
    compiled.runner = torch.compile(op.module)
    return compiled
