"""One context knob per study encoder: the setting that bounds how far back it can see (or how much it holds).

The memory probe (:mod:`experiments.memory_probe.probe`) runs every encoder with its knob at the default and raised
to cover the lookup distance k; the tuner (:mod:`rl_transformers.tune.tuner`) searches it. A knob is either a
**reach** (a length in tokens: a query sees keys up to about that many steps back, per layer) or a
**capacity** (a width: what a recurrent state can hold). Which one an encoder has, read from its configuration
(:func:`context_knob`):

- Transformer-XL memory (``xl``, ``compressive``; Dai et al. 2019, arXiv 1901.02860; Rae et al. 2019, arXiv
  1911.05507): ``mem_len`` (reach; full attention's cache is bounded to it by the policy);
- ``knn`` memory (Wu et al. 2022, arXiv 2203.08913): ``store_size``, the retrieval store behind the local
  memory (reach);
- attentions without memory, by the first option they have: ``max_cache`` (the KV window; default the
  policy's ``context_len``, which bounds it), ``window`` (longformer, etc, local), ``max_span``
  (adaptive_span), ``flange`` (block_local), ``block_size`` (blockwise; a block pattern sees distance k from
  part of the positions only);
- kernel attentions with random features (``rfa``, ``performer``): ``n_features`` (capacity of the state);
- GRU / LSTM: ``hidden_size`` (capacity);
- none: the MLP, ``linear`` and ``memory_compressed`` (state over the whole past, no size knob),
  ``block_local_2d`` (a fixed 2-D image pattern).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rl_transformers.study.encoders import format_spec, parse_spec, policy_config

KnobKind = Literal["reach", "capacity"]
ATTENTION_REACH = ("max_cache", "window", "max_span", "flange", "block_size")
"""Attention options that bound the reach, in order of preference."""
CAPACITY_OPTIONS = ("n_features",)
MEMORY_REACH = {"xl": "mem_len", "compressive": "mem_len", "knn": "store_size"}


@dataclass(frozen=True)
class Knob:
    """A context knob: its name, where it lives (policy / memory / attention options), kind and default."""

    name: str
    where: Literal["policy", "memory", "attention"]
    kind: KnobKind
    default: int

    def apply(self, spec: str, value: int) -> str:
        """The override string ``spec`` with this knob set to ``value``."""
        fields = parse_spec(spec)
        if self.where == "policy":
            fields[self.name] = int(value)
            return format_spec(fields)
        # Only the spec's own options and the knob: the base configuration fills in the rest (and a name
        # change of the family resets its options, so nothing of the base's other family can leak in).
        key = f"{self.where}_options"
        fields[key] = {**fields.get(key, {}), self.name: int(value)}
        return format_spec(fields)

    def covering(self, k: int) -> int:
        """The smallest value that covers a lookup ``k`` steps back in one layer, never below the default."""
        if self.kind != "reach":
            return self.default
        return max(self.default, k + 1)


def context_knob(spec: str, context_len: int | None = None) -> Knob | None:
    """The context knob of an encoder's override string (see the module docstring); None when it has none."""
    config = policy_config(spec)
    if config.kind in ("gru", "lstm"):
        return Knob("hidden_size", "policy", "capacity", config.width)
    if config.kind == "mlp":
        return None
    backbone = config.backbone
    if backbone.memory is not None:
        name = MEMORY_REACH.get(backbone.memory)
        if name is None:
            return None
        return Knob(name, "memory", "reach", int(getattr(backbone.options("memory"), name)))
    options: Any = backbone.options("attention")
    for name in (*ATTENTION_REACH, *CAPACITY_OPTIONS):
        if not hasattr(options, name):
            continue
        value = getattr(options, name)
        if name == "max_cache" and value is None:
            value = context_len if context_len is not None else config.context_len
        if not isinstance(value, int):  # e.g. blockwise's block_size=None: the whole call, no bound
            return None
        return Knob(name, "attention", "capacity" if name in CAPACITY_OPTIONS else "reach", value)
    return None


__all__ = ["Knob", "KnobKind", "context_knob"]
