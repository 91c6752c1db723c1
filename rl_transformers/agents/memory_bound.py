"""One estimate of the memory a model configuration needs, and the bound every size read from a file meets.

A checkpoint's config, a tuning study's stored parameters or a ``best.json`` can name any size: ``mem_len``
10^9 (the XL memory preallocates (B, M, d) per layer), ``n_layers`` 10^4, a GRU ``hidden_size`` 10^7. Before
anything is built from such a file, :func:`check_memory` estimates what the model needs at the run's batch
and refuses above a limit (:data:`DEFAULT_LIMIT_GIB`, raised knowingly with ``--max-memory-gib`` /
``max_memory_gib=``), with a message stating the estimate. The estimate, in float32 values::

    P = L (4 d^2 + 2 d f + 9 d) + E                 parameters (E: embeddings and heads, given by the caller)
    S = L (M + C + T) 6 d                           per sequence: memories M, attention caches C, the context T
                                                    (hidden state, keys, values, position terms and their
                                                    copies: about 6 d values per token and layer, measured)
    A = H T (M + C + T) + T f                       one layer's attention scores and feed-forward activations
    bytes = 4 (P + B (S + A))

with d = d_model, L = n_layers, H = n_heads, f = d_ff (4d when unset), B the batch (envs or windows), M the
memory options' lengths (``mem_len``, ``cmem_len``, ``store_size``), C the largest attention cache option
(``max_cache``, ``max_span``, ``max_len``, ``window``) or the policy's context. Recurrent cores (GRU / LSTM of
width h, k layers): P = k g h (h + h + 2) (g = 3 or 4 gates), S = k 2 h. It is an estimate within a small factor
of what the allocator sees (a one-layer d = 16 GTrXL with ``mem_len`` 10^6 at 2 envs: estimate 0.95 GiB, peak
resident memory 0.96 GB above the process's start), meant to stop sizes that are orders of magnitude off, not to budget a run.

:func:`check_weights_count` compares the parameter estimate with the values a checkpoint ships: a config that
describes a model far larger than its weights (``n_layers`` 10^4 next to one layer's tensors) is refused before
even the shape check builds it.
"""

from __future__ import annotations

import math
from typing import Any

from rl_transformers.utils.errors import UserError

__all__ = [
    "DEFAULT_LIMIT_GIB",
    "LIMIT_FLAG",
    "backbone_bytes",
    "check_memory",
    "check_weights_count",
    "policy_bytes",
]

DEFAULT_LIMIT_GIB = 4.0
"""Largest estimate accepted from a file unless raised knowingly (``--max-memory-gib``)."""
LIMIT_FLAG = "--max-memory-gib"
MEMORY_LENGTHS = ("mem_len", "cmem_len", "store_size")
CACHE_LENGTHS = ("max_cache", "max_span", "max_len", "window")
_BYTES = 4  # float32


def _int(options: Any, name: str) -> int:
    value = getattr(options, name, None) if not isinstance(options, dict) else options.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _options(backbone: Any, part: str) -> Any:
    try:
        return backbone.options(part)
    except Exception:  # an options object that does not build: its own check reports it later
        return getattr(backbone, f"{part}_options", {}) or {}


def backbone_params(backbone: Any) -> int:
    """P without E: the backbone's layers (see the module docstring)."""
    d, layers = int(backbone.d_model), int(backbone.n_layers)
    f = int(backbone.d_ff or 4 * d)
    return layers * (4 * d * d + 2 * d * f + 9 * d)


def backbone_bytes(backbone: Any, batch: int, tokens: int, context: int = 0, extra_params: int = 0) -> int:
    """Estimated bytes of a backbone run on ``batch`` sequences of ``tokens`` tokens per forward, with caches of
    ``context`` tokens when its attention options name none (see the module docstring)."""
    d, layers, heads = int(backbone.d_model), int(backbone.n_layers), int(backbone.n_heads)
    f = int(backbone.d_ff or 4 * d)
    memory = _options(backbone, "memory") if backbone.memory is not None else {}
    m = sum(_int(memory, name) for name in MEMORY_LENGTHS)
    attention = _options(backbone, "attention")
    c = max([_int(attention, name) for name in CACHE_LENGTHS] + [int(context)])
    t = int(tokens)
    per_sequence = layers * (m + c + t) * 6 * d + heads * t * (m + c + t) + t * f
    return _BYTES * (backbone_params(backbone) + int(extra_params) + int(batch) * per_sequence)


def policy_bytes(policy: Any, batch: int, tokens: int, n_inputs: int = 0) -> int:
    """Estimated bytes of a PPO policy (:class:`~rl_transformers.policies.PolicyConfig`) on ``batch`` envs or
    sequences of ``tokens`` steps; ``n_inputs``: the observation size."""
    kind = getattr(policy, "kind", "transformer")
    if kind in ("gru", "lstm"):
        h = int(policy.hidden_size or getattr(policy, "width", 0) or 0)
        k = int(getattr(policy, "rnn_layers", 1))
        gates = 4 if kind == "lstm" else 3
        params = k * gates * h * (2 * h + 2) + h * int(n_inputs)
        return _BYTES * (params + int(batch) * (k * 2 * h + int(tokens) * gates * h))
    if kind == "mlp":
        return _BYTES * int(n_inputs) * int(batch)
    context = int(getattr(policy, "context_len", 0) or 0)
    return backbone_bytes(policy.backbone, batch, tokens, context, extra_params=int(n_inputs) * 64)


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_memory(estimate: int, source: str, what: str, limit_gib: float | None = None) -> None:
    """Refuse (:class:`UserError`) an ``estimate`` in bytes above ``limit_gib`` (default
    :data:`DEFAULT_LIMIT_GIB`): ``what`` the configuration came from ``source``."""
    limit = DEFAULT_LIMIT_GIB if limit_gib is None else float(limit_gib)
    if not (limit > 0 and math.isfinite(limit)):
        raise UserError(f"must be a positive number of GiB, got {limit_gib!r}", source=LIMIT_FLAG)
    if estimate > limit * 2**30:
        raise UserError(
            f"{what} needs an estimated {_gib(estimate)} (parameters, memories, caches and contexts at its "
            f"batch), above the {_gib(limit * 2**30)} allowed for sizes read from a file; if that is "
            f"really meant, raise the limit knowingly with {LIMIT_FLAG} (max_memory_gib=)",
            source=source,
        )


def check_weights_count(estimated_params: int, state: Any, source: str, what: str) -> None:
    """Refuse a config whose parameter estimate is far above the values ``state`` (a state dict) ships: the
    config does not describe these weights, and building it first would take the time and memory it names."""
    shipped = (
        sum(int(v.numel()) for v in state.values() if hasattr(v, "numel")) if isinstance(state, dict) else 0
    )
    if estimated_params > 8 * shipped + 1_000_000:
        raise UserError(
            f"its {what} describes a model of about {estimated_params:,} parameters, but the checkpoint ships "
            f"{shipped:,} values: the config does not describe these weights (nothing was built)",
            source=source,
        )
