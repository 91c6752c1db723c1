"""Command-line helpers shared by the training scripts (tyro): JSON-dict flags and BackboneConfig options.

``tyro.cli(Config, registry=cli_registry())`` turns every ``BackboneConfig`` field nested in ``Config`` into a
flag (``--backbone.attention linear``) and its ``*_options`` dicts into JSON strings
(``--backbone.memory-options '{"mem_len": 64}'``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Annotated, Any

from tyro.constructors import (
    ConstructorRegistry,
    PrimitiveConstructorSpec,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from rl_transformers.backbone import BackboneConfig


# -- JSON dicts and BackboneConfig options -----------------------------------------------------
def _parse_json_dict(args: list[str]) -> dict[str, Any]:
    try:
        value = json.loads(args[0])
    except json.JSONDecodeError as err:
        raise ValueError(
            f"expected a JSON object such as '{{\"mem_len\": 64}}', got {args[0]!r} ({err})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {args[0]!r}")
    return value


JsonDict = Annotated[
    dict,
    PrimitiveConstructorSpec(
        nargs=1,
        metavar="JSON",
        instance_from_str=_parse_json_dict,
        is_instance=lambda x: isinstance(x, dict),
        str_from_instance=lambda d: [json.dumps(d)],
    ),
]
"""A dict given on the command line as one JSON string."""


def _field_help(cls: type, name: str) -> str | None:
    try:
        from tyro import _docstrings

        return _docstrings.get_field_docstring(cls, name, ())
    except Exception:  # private tyro API: help text is a nicety
        return None


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
            return default.replace(**changes) if changes else default

        return StructConstructorSpec(instantiate=instantiate, fields=fields)

    return registry
