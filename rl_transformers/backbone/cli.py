"""tyro rules for :class:`BackboneConfig` on the command line: every field a flag, its options JSON strings.

``tyro.cli(Config, registry=cli_registry())`` turns every ``BackboneConfig`` field nested in ``Config`` into a
flag (``--backbone.attention linear``) and its ``*_options`` dicts into JSON strings
(``--backbone.memory-options '{"mem_len": 64}'``, :data:`rl_transformers.utils.cli.JsonDict`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from tyro.constructors import (
    ConstructorRegistry,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.utils.cli import JsonDict
from rl_transformers.utils.errors import UserError


def _field_help(cls: type, name: str) -> str | None:
    try:
        from tyro import _docstrings

        return _docstrings.get_field_docstring(cls, name, ())
    except Exception:  # private tyro API: help text is a nicety
        return None


def _flags_of(changes: dict[str, Any]) -> str:
    if not changes:
        return "the default backbone"
    shown = [
        f"--backbone.{k.replace('_', '-')} {json.dumps(v) if isinstance(v, dict) else v}"
        for k, v in changes.items()
    ]
    return ", ".join(shown)


_SELF_ONLY = {  # attention entries whose options make every token attend only itself
    "local": lambda o: o["window"] == 0,
    "longformer": lambda o: o["window"] == 0 and not o["global_tokens"],
    "etc": lambda o: o["window"] == 0 and o["n_global"] == 0,
}


def check_cli_backbone(cfg: BackboneConfig) -> None:
    """Refuse settings the backbone accepts (kernel tests use them) but that make no sense for a policy.

    A window of 0 without global tokens lets each token attend only itself: the model has no memory at all.
    """
    self_only = _SELF_ONLY.get(cfg.attention)
    if self_only is not None and self_only(cfg.attention_options):
        raise UserError(
            f"attention {cfg.attention!r} with window=0 lets each token attend only itself (no memory); "
            "use window >= 1"
        )


def cli_registry() -> ConstructorRegistry:
    """tyro rules: ``BackboneConfig`` fields as flags, its ``*_options`` as JSON strings.

    Changing an entry name without its options resets the options (``--backbone.attention linear``), as
    :meth:`BackboneConfig.replace` does.
    """
    registry = ConstructorRegistry()

    @registry.struct_rule
    def backbone_rule(info: StructTypeInfo) -> StructConstructorSpec | None:
        if info.type is not BackboneConfig:
            return None
        default = info.default if isinstance(info.default, BackboneConfig) else BackboneConfig()

        hints = typing.get_type_hints(BackboneConfig)
        fields = tuple(
            StructFieldSpec(
                name=f.name,
                type=JsonDict if f.name.endswith("_options") else hints[f.name],
                default=getattr(default, f.name),
                helptext=_field_help(BackboneConfig, f.name),
            )
            for f in dataclasses.fields(BackboneConfig)
        )

        def instantiate(**kwargs: Any) -> BackboneConfig:
            changes = {k: v for k, v in kwargs.items() if v != getattr(default, k)}
            try:
                cfg = default.replace(**changes) if changes else default
                check_cli_backbone(cfg)
            except ValueError as err:  # tyro prints it; name the flags the bad value came from
                raise UserError(f"{err} (from {_flags_of(changes)})") from err
            return cfg

        return StructConstructorSpec(instantiate=instantiate, fields=fields)

    return registry
