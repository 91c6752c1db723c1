"""Command-line helpers shared by the scripts (tyro): :data:`JsonDict`, a dict flag given as one JSON string.

The rules that turn ``BackboneConfig`` fields into flags live with the backbone
(:func:`rl_transformers.backbone.cli.cli_registry`); this module imports nothing of the package.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from tyro.constructors import PrimitiveConstructorSpec


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
