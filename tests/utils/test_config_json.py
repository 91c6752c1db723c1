"""Configs to JSON and back: nested frozen dataclasses, defaults, unknown fields, unconvertible values."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Literal

import pytest

from rl_transformers.utils.config_json import from_dict, load_config, save_config, to_jsonable


class Block(enum.Enum):
    PRE_LN = "pre_ln"
    GTRXL = "gtrxl"


@dataclasses.dataclass(frozen=True)
class Inner:
    n_layers: int = 2
    """layers."""
    block: Block = Block.PRE_LN
    """block type."""
    options: dict[str, float] = dataclasses.field(default_factory=dict)
    """free-form options."""


@dataclasses.dataclass(frozen=True)
class Outer:
    env_id: str = "CartPole-v1"
    """environment."""
    learning_rate: float = 3e-4
    """Adam step size."""
    hidden: tuple[int, ...] = (64, 64)
    """MLP widths."""
    pair: tuple[int, str] = (1, "a")
    """heterogeneous tuple."""
    data_dir: Path | None = None
    """optional path."""
    inner: Inner = dataclasses.field(default_factory=Inner)
    """nested config."""
    maybe_inner: Inner | None = None
    """optional nested config."""
    per_seed: dict[int, Path] = dataclasses.field(default_factory=dict)
    """int keys (strings in JSON)."""
    mode: Literal["max", "min"] = "max"
    """a literal."""


def test_config_json_round_trip_for_nested_frozen_dataclass(tmp_path: Path) -> None:
    config = Outer(
        learning_rate=1,  # an int in a float field comes back as a float that compares equal
        hidden=(128, 32, 8),
        data_dir=Path("/data/hopper"),
        inner=Inner(n_layers=4, block=Block.GTRXL, options={"gate_bias": 2.0}),
        maybe_inner=Inner(n_layers=1),
        per_seed={0: Path("a.pt"), 7: Path("b.pt")},
        mode="min",
    )
    path = save_config(tmp_path, config)
    assert path == tmp_path / "config.json"
    raw = json.loads(path.read_text())
    assert raw["hidden"] == [128, 32, 8]
    assert raw["data_dir"] == "/data/hopper"
    assert raw["inner"] == {"n_layers": 4, "block": "gtrxl", "options": {"gate_bias": 2.0}}
    assert raw["per_seed"] == {"0": "a.pt", "7": "b.pt"}
    rebuilt = from_dict(Outer, raw)
    assert rebuilt == config
    assert isinstance(rebuilt.hidden, tuple) and isinstance(rebuilt.data_dir, Path)
    assert rebuilt.inner.block is Block.GTRXL
    assert load_config(tmp_path, Outer) == config  # the run directory is enough
    assert load_config(path) == raw
    assert not [p for p in tmp_path.iterdir() if p.name != "config.json"]  # no temp file left


def test_from_dict_uses_defaults_and_rejects_unknown_fields() -> None:
    assert from_dict(Outer, {"inner": {"n_layers": 3}}) == Outer(inner=Inner(n_layers=3))
    with pytest.raises(ValueError, match=r"unknown field 'learning_rat'.*did you mean 'learning_rate'"):
        from_dict(Outer, {"learning_rat": 0.1})
    with pytest.raises(ValueError, match=r"Outer\.inner\.block.*valid: \['pre_ln', 'gtrxl'\]"):
        from_dict(Outer, {"inner": {"block": "post_ln"}})
    assert from_dict(Outer, {"old_field": 1}, strict=False) == Outer()


def test_to_jsonable_names_what_it_cannot_convert() -> None:
    with pytest.raises(TypeError, match=r"config\['options'\]\['fn'\]: cannot convert object"):
        to_jsonable({"options": {"fn": object()}})
    assert to_jsonable({"fn": object}, strict=False) == {"fn": str(object)}
    assert to_jsonable({"s": frozenset({3, 1})}) == {"s": [1, 3]}
