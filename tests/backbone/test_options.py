"""The shared option validation (rl_transformers/backbone/options.py) and the aux-loss names entries declare."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest
import torch

from rl_transformers.backbone import BackboneConfig, available
from rl_transformers.backbone import registry as reg
from rl_transformers.backbone.config import options_to_dict
from rl_transformers.backbone.model import Backbone
from rl_transformers.backbone.options import (
    check_choice,
    check_int,
    check_number,
    check_pair,
    check_positions,
    check_positive,
    check_probability,
    check_types,
    literal_choices,
)
from rl_transformers.utils.errors import UserError

Color = Literal["red", "green", "blue"]


# -- value checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -3, True, 1.5, "2", None])
def test_check_int_refuses(value: object) -> None:
    with pytest.raises(UserError, match=rf"local window must be an int >= 1, got {value!r}"):
        check_int("local window", value, 1)


def test_check_int_accepts_and_optional() -> None:
    check_int("n", 0, 0)
    check_int("n", 7, 1)
    check_int("n", None, 1, optional=True)
    with pytest.raises(UserError, match=r"n must be an int >= 1 or None, got 0"):
        check_int("n", 0, 1, optional=True)


@pytest.mark.parametrize(
    ("kwargs", "good", "bad", "message"),
    [
        (
            dict(low=0.0, low_open=True),
            [1e-9, 3],
            [0, -1, float("inf"), float("nan"), "1"],
            "must be a number > 0",
        ),
        (dict(low=0.0), [0, 2.5], [-1e-9], "must be a number >= 0"),
        (dict(low=0.0, high=1.0), [0, 1, 0.5], [1.01, -0.1], r"must be in \[0, 1\]"),
        (dict(low=0.0, high=1.0, high_open=True), [0, 0.999], [1.0], r"must be in \[0, 1\)"),
        (dict(low=0.0, high=1.0, low_open=True), [1.0], [0.0], r"must be in \(0, 1\]"),
    ],
)
def test_check_number_intervals(kwargs: dict, good: list, bad: list, message: str) -> None:
    for value in good:
        check_number("x", value, **kwargs)
    for value in bad:
        with pytest.raises(UserError, match=rf"x {message}, got"):
            check_number("x", value, **kwargs)


def test_positive_and_probability() -> None:
    check_positive("lr", 3e-4)
    check_positive("kl", None, optional=True)
    with pytest.raises(UserError, match=r"lr must be a number > 0, got 0"):
        check_positive("lr", 0)
    check_probability("dropout", 0.0)
    with pytest.raises(UserError, match=r"dropout must be in \[0, 1\), got 1"):
        check_probability("dropout", 1)
    check_probability("p", 1.0, allow_one=True)
    with pytest.raises(UserError, match=r"or None, got True"):
        check_probability("p", True, optional=True)  # bools are not numbers here


def test_literal_choices_and_check_choice() -> None:
    assert literal_choices(Color) == ("red", "green", "blue")
    assert literal_choices(Color | None) == ("red", "green", "blue")
    check_choice("color", "green", Color)
    with pytest.raises(UserError) as info:
        check_choice("color", "gren", Color)
    message = str(info.value)
    assert "color='gren' is not one of ['red', 'green', 'blue']" in message
    assert "Did you mean 'green'?" in message
    with pytest.raises(UserError) as info:
        check_choice("kind", "zzz", ("a", "b"))
    assert "unknown kind 'zzz'" in str(info.value) and "Did you mean" not in str(info.value)


def test_pairs_and_positions() -> None:
    check_pair("shape", (2, 3), 1)
    for bad in [(0, 3), (2,), [2, 3], (2, 3, 4), (2, True)]:
        with pytest.raises(UserError, match=r"shape must be a pair \(rows, cols\) of ints >= 1"):
            check_pair("shape", bad, 1)
    check_positions("globals", (0, 4))
    with pytest.raises(UserError, match="repeated positions"):
        check_positions("globals", (1, 1))
    with pytest.raises(UserError, match=r"tuple of positions \(ints >= 0\)"):
        check_positions("globals", (-1,))


# -- annotation checks ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Opts:
    n: int = 1
    rate: float = 0.5
    flag: bool = False
    color: Color = "red"
    block: int | None = None
    shape: tuple[int, int] = (1, 1)
    dilation: tuple[int, ...] = (1,)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"n": "abc"}, r"e n='abc' \(str\) must be an int"),
        ({"n": 2.0}, r"e n=2.0 \(float\) must be an int"),
        ({"n": True}, r"e n=True \(bool\) must be an int"),
        ({"rate": "x"}, r"e rate='x' \(str\) must be a number"),
        ({"flag": 1}, r"e flag=1 \(int\) must be true/false"),
        ({"color": 3}, r"e color=3 \(int\) must be one of 'red', 'green', 'blue'"),
        ({"block": "7"}, r"e block='7' \(str\) must be an int or None"),
        ({"shape": (1, "a")}, r"e shape=\(1, 'a'\) \(tuple\) must be a list of values"),
        ({"dilation": 3}, r"e dilation=3 \(int\) must be a list of values"),
    ],
)
def test_check_types_refuses(values: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_types(_Opts, values, "e ")


def test_check_types_accepts() -> None:
    # ints for floats (JSON), None for optionals, lists for tuples, unknown colors left to the class
    check_types(
        _Opts, {"rate": 1, "block": None, "shape": [2, 3], "dilation": (1, 2), "color": "purple"}, "e "
    )


def _entries() -> list[tuple[str, str]]:
    return [(family, name) for family, names in available().items() for name in names]


@pytest.mark.parametrize(("family", "name"), _entries(), ids=lambda x: str(x))
def test_every_entrys_defaults_pass_the_annotation_check(family: str, name: str) -> None:
    """No false alarms: each entry's own defaults (as the JSON-like dict a config stores) type-check."""
    entry = reg.get(family, name)
    check_types(entry.options, options_to_dict(entry.options()), f"{family} {name!r} option ")
    assert reg.build_options(family, name, options_to_dict(entry.options())) == entry.options()


@pytest.mark.parametrize(
    ("kind", "name", "options", "message"),
    [
        ("memory", "xl", {"mem_len": "abc"}, r"memory 'xl' option mem_len='abc' \(str\) must be an int"),
        (
            "attention",
            "local",
            {"window": 2.5},
            r"attention 'local' option window=2.5 \(float\) must be an int",
        ),
        (
            "memory",
            "knn",
            {"gate": 1},
            r"memory 'knn' option gate=1 \(int\) must be one of 'per_head', 'spalm'",
        ),
        ("memory", "compressive", {"compression": "mean_pol"}, r"Did you mean 'mean_pool'"),
        (
            "depth",
            "early_exit",
            {"measure": "softmx"},
            r"not one of \['saturation', 'softmax', 'classifier'\]",
        ),
        ("attention", "linformer", {"share": "keyvalue"}, r"Did you mean 'key_value'"),
        ("attention", "strided", {"combine": "unoin"}, r"combine='unoin' is not one of"),
    ],
)
def test_backbone_config_reports_bad_options(kind: str, name: str, options: dict, message: str) -> None:
    extra = {"causal": False} if name == "linformer" else {}
    with pytest.raises(UserError, match=message):
        BackboneConfig(**{kind: name, f"{kind}_options": options}, **extra)


def test_backbone_config_fields() -> None:
    with pytest.raises(UserError, match=r"BackboneConfig.d_model='64' \(str\) must be an int"):
        BackboneConfig(d_model="64")  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"activation='gelu2' is not one of \['relu', 'gelu'\].*'gelu'"):
        BackboneConfig(activation="gelu2")  # type: ignore[arg-type]
    with pytest.raises(
        UserError, match=r"unknown BackboneConfig fields 'n_layer' \(did you mean 'n_layers'\?\)"
    ):
        BackboneConfig.from_dict({"n_layer": 2})


# -- aux losses -----------------------------------------------------------------------------------------------
AUX_CASES = {
    "universal": dict(depth="universal"),
    "early_exit": dict(depth="early_exit", depth_options={"measure": "classifier"}),
    "adaptive_span": dict(attention="adaptive_span"),
    "routing": dict(attention="routing", attention_options={"local_heads": 1, "local_window": 3}),
    "compressive": dict(memory="compressive", position="rope", memory_options={"mem_len": 2, "cmem_len": 2}),
}


@pytest.mark.parametrize("case", list(AUX_CASES))
def test_declared_aux_losses_match_the_forward(case: str) -> None:
    """``aux_loss_names`` (declared per entry) is exactly what a training forward reports."""
    cfg = BackboneConfig(d_model=8, n_heads=2, n_layers=2, **AUX_CASES[case])
    model = Backbone(cfg).train()
    x = torch.randn(2, 6, 8)
    state = model.init_state(2)
    seen: set[str] = set()
    for _ in range(3):  # compressive memory reports its losses once something was compressed
        out = model(x, state=state)
        state = out.state
        seen |= set(out.aux_losses)
    assert seen and seen == set(cfg.aux_loss_names)


def test_entries_without_aux_losses_declare_none() -> None:
    assert BackboneConfig().aux_loss_names == ()
    assert BackboneConfig(attention="linear", memory="xl").aux_loss_names == ()
