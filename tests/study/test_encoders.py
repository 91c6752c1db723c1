"""Encoder expansion: every registry attention becomes a buildable policy of the intended parameter count."""

from __future__ import annotations

import pytest

from rl_transformers.backbone import available, capabilities
from rl_transformers.study import encoders as enc
from rl_transformers.study.suite import ONLINE


@pytest.fixture(scope="module")
def ppo_rows() -> tuple[list[enc.Encoder], list[enc.Excluded]]:
    return enc.ppo_encoders()


def test_every_attention_is_a_row_or_excluded_for_lacking_causality(ppo_rows) -> None:
    rows, excluded = ppo_rows
    names = [e.name for e in rows]
    for att in available()["attention"]:
        if capabilities("attention", att).causal:
            assert att in names, f"causal attention {att} missing from the study"
        else:
            assert att in [x.name for x in excluded]
    for extra in ("gtrxl", "compressive", "knn", "universal", "early_exit", "gru", "lstm", "mlp"):
        assert extra in names
    assert len(set(names)) == len(names)


def test_positional_rule_picks_the_first_accepted_scheme(ppo_rows) -> None:
    rows, _ = ppo_rows
    for e in rows:
        if e.family != "attention":
            continue
        fields = enc.parse_spec(e.spec)
        assert fields["attention"] == e.name and fields["memory"] is None
        chosen = enc.POSITION_PREFERENCE.index(fields["position"])
        for earlier in enc.POSITION_PREFERENCE[:chosen]:  # every earlier scheme is refused
            with pytest.raises(ValueError, match=f"attention {e.name!r} cannot use position {earlier!r}"):
                enc.policy_config(f"attention={e.name};position={earlier};memory=None")


@pytest.mark.parametrize("task", [t.name for t in ONLINE])
def test_parameter_counts_within_ten_percent_on_every_task(ppo_rows, task: str) -> None:
    rows, _ = ppo_rows
    env_id = next(t for t in ONLINE if t.name == task).env_id
    target = enc.ppo_parameters("", env_id)
    for e in rows:
        n = enc.ppo_parameters(e.spec, env_id)  # builds the policy: the spec is valid
        assert abs(n - target) <= enc.TOLERANCE * target, (e.name, n, target)


def test_policy_config_applies_the_spec() -> None:
    cfg = enc.policy_config("policy=gru;hidden_size=100")
    assert cfg.kind == "gru" and cfg.width == 100
    cfg = enc.policy_config("attention=linear;position=rope;memory=None;d_ff=300")
    assert cfg.backbone.attention == "linear" and cfg.backbone.memory is None and cfg.backbone.d_ff == 300
    assert cfg.backbone.block == "gtrxl"  # everything else stays the GTrXL default
    default = enc.policy_config("")
    assert (default.backbone.attention, default.backbone.memory, default.backbone.position) == (
        "full", "xl", "xl_relative")  # fmt: skip
    with pytest.raises(ValueError, match="Did you mean 'position'"):
        enc.parse_spec("positon=rope")


def test_specs_keep_their_meaning_when_the_library_default_changes(monkeypatch) -> None:
    """Defaults that follow the evidence: the PPO base pins its positions, so flipping GTrXL's default neither relabels the
    committed records (keys hash the spec string) nor makes the ``gtrxl_rope`` row the ``gtrxl`` row."""
    from rl_transformers.policies import gtrxl

    before = {s: enc.policy_config(s) for s in ("", "position=rope", "memory=knn", "policy=gru")}
    preset = gtrxl.gtrxl_backbone
    monkeypatch.setattr(gtrxl, "gtrxl_backbone", lambda **kw: preset(**kw).replace(position="rope"))
    assert gtrxl.gtrxl_backbone().position == "rope"  # the patched library default
    after = {s: enc.policy_config(s) for s in before}
    assert after == before
    assert after[""].backbone.position == enc.PPO_BASE_POSITION == "xl_relative"
    assert after["position=rope"] != after[""]


def test_match_parameters_finds_the_closest_width() -> None:
    target = enc.ppo_parameters("")
    spec, n = enc.match_parameters("policy=gru", target, enc.ppo_parameters, "hidden_size", hi=1024)
    h = enc.parse_spec(spec)["hidden_size"]
    for other in (h - 1, h + 1):  # neighbours are no closer
        m = enc.ppo_parameters(f"policy=gru;hidden_size={other}")
        assert abs(m - target) >= abs(n - target)


def test_dt_rows_build_and_match() -> None:
    rows, excluded = enc.dt_encoders()
    target = enc.dt_parameters("attention=full")
    assert "full" in [e.name for e in rows]
    assert {x.name for x in excluded} == {a for a in available()["attention"]
                                         if not capabilities("attention", a).causal}  # fmt: skip
    for e in rows:
        assert abs(enc.dt_parameters(e.spec) - target) <= enc.TOLERANCE * target
        assert (
            abs(
                enc.dt_parameters(e.spec, "Pendulum-v1", 200)
                - enc.dt_parameters("attention=full", "Pendulum-v1", 200)
            )
            <= 0.1 * target
        )
