"""The study's encoders: registry expansion, the positional rule and parameter matching.

An encoder is an *override string*: ``;``-separated ``field=value`` items applied to a base configuration.
``policy`` (transformer | gru | lstm | mlp) and ``hidden_size`` set :class:`PolicyConfig` fields; every other
key is a :class:`BackboneConfig` field (dict options as JSON, ``None`` for None, integers as integers). PPO
encoders start from the study's PPO base (:func:`ppo_base`: the GTrXL preset of
:func:`~rl_transformers.policies.gtrxl.gtrxl_backbone`, ``full`` + ``xl`` memory (32) + ``gtrxl`` block, d=64,
2 layers, 4 heads, with its positions pinned to :data:`PPO_BASE_POSITION`); DT encoders from the study's DT
backbone (:func:`dt_base`: the paper's GPT-2 block, position ``none``, d=64, 2 layers, 1 head).

The PPO base's positions are pinned, not read from the library default: a job's key hashes its spec
*string*, so a spec must keep the meaning it was measured with when the library default changes (defaults
that follow the evidence). ``""`` is the study's ``gtrxl`` row and ``position=rope`` its ``gtrxl_rope`` row, whatever
``train_gtrxl.py`` defaults to (``tests/study/test_study_defaults.py`` holds every committed spec to that).

PPO rows (read from ``available()`` at run time, so new registry entries join automatically):

- ``gtrxl``: the default, unchanged;
- one row per causal attention: the default with that attention and **no XL memory** (each attention keeps
  its own streaming cache, bounded to the policy's ``context_len`` = 64 past tokens through ``max_cache``;
  adaptive_span's own bound is max_span + ramp), position = the first
  of :data:`POSITION_PREFERENCE` the attention accepts (``xl_relative`` as in GTrXL, else ``rope``, else
  ``none``); attentions without causal support (``linformer``) are listed as excluded with the reason;
- every other memory (``compressive``, ``knn``) and adaptive depth (``universal``, ``early_exit``) swapped
  into the default;
- the baselines ``gru``, ``lstm`` and ``mlp`` behind the same actor-critic interface.

DT rows: one per attention the DT backbone accepts (its own default position ``none``; the DT adds learned
timestep embeddings). Parameter matching: every encoder's total policy parameters are brought within ±10 %
(:data:`TOLERANCE`) of its reference (the GTrXL default on :data:`REFERENCE_ENV`; the DT with ``full``
attention on CartPole-v1) by choosing the FFN width ``d_ff`` (transformers) or ``hidden_size``
(GRU / LSTM / MLP) whose count is closest, by bisection (counts grow monotonically with both).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.registry import available, capabilities
from rl_transformers.policies.sizing import TOLERANCE, closest_value
from rl_transformers.utils.errors import UserError, choice_hint

POSITION_PREFERENCE = ("xl_relative", "rope", "none")
"""PPO attention rows take the first of these positional schemes the attention accepts."""
REFERENCE_ENV = "rlt/popgym-RepeatPreviousEasy-v0"
"""Spaces on which PPO parameter counts are matched (the heads differ slightly per task)."""
PPO_BASE_POSITION = "xl_relative"
"""Positions of the PPO base (spec ``""``): GTrXL's default when the studies' records were measured."""
POLICY_KEYS = {"policy": "kind", "hidden_size": "hidden_size", "critic": "critic"}
BASELINES = ("gru", "lstm", "mlp")


@dataclass(frozen=True)
class Encoder:
    """A row of the study: a short name, its override string, the family it varies and a note."""

    name: str
    spec: str
    family: str
    note: str = ""

    @property
    def kind(self) -> str:
        return str(parse_spec(self.spec).get("policy", "transformer"))


@dataclass(frozen=True)
class Excluded:
    name: str
    reason: str


# -- override strings -------------------------------------------------------------------------------------
def parse_spec(spec: str) -> dict[str, Any]:
    """``"attention=linear;memory=None;d_ff=512"`` -> {"attention": "linear", "memory": None, "d_ff": 512}."""
    valid = {f.name for f in dataclasses.fields(BackboneConfig)} | set(POLICY_KEYS)
    out: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"encoder spec {spec!r}: {part!r} is not field=value")
        key, raw = (s.strip() for s in part.split("=", 1))
        if key not in valid:
            import difflib

            close = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"encoder spec {spec!r}: unknown field {key!r}.{hint} Valid: {sorted(valid)}")
        out[key] = _value(raw)
    return out


def _value(raw: str) -> Any:
    if raw == "None":
        return None
    if raw[:1] in "{[":
        return json.loads(raw)
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", raw):
        return float(raw)
    return raw


def format_spec(fields: dict[str, Any]) -> str:
    parts = []
    for key, value in fields.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"{key}={text}")
    return ";".join(parts)


def label(spec_or_name: str) -> str:
    """A file-name-safe label."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", spec_or_name).strip("-") or "default"


def dt_base() -> BackboneConfig:
    from rl_transformers.policies.decision_transformer import dt_backbone_config

    return dt_backbone_config(d_model=64, n_layers=2)


def ppo_base() -> BackboneConfig:
    """The PPO encoders' base (spec ``""``): the GTrXL preset with :data:`PPO_BASE_POSITION` positions."""
    from rl_transformers.policies.gtrxl import gtrxl_backbone

    return gtrxl_backbone().replace(position=PPO_BASE_POSITION)


def policy_config(spec: str) -> Any:
    """The PPO :class:`PolicyConfig` of an override string (:func:`ppo_base` + overrides)."""
    from rl_transformers.policies.gtrxl import PolicyConfig

    fields = parse_spec(spec)
    policy = {POLICY_KEYS[k]: fields.pop(k) for k in list(fields) if k in POLICY_KEYS}
    return PolicyConfig(backbone=ppo_base().replace(**fields), **policy)


def dt_backbone(spec: str) -> BackboneConfig:
    fields = parse_spec(spec)
    bad = sorted(set(fields) & set(POLICY_KEYS))
    if bad:
        raise ValueError(f"encoder spec {spec!r}: {bad} are PPO-only fields (the DT is a transformer)")
    return dt_base().replace(**fields)


# -- parameter counts -------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _spaces(env_id: str) -> tuple[Any, Any]:
    import gymnasium as gym

    import envs  # noqa: F401  (registers rlt/ ids)

    env = gym.make(env_id)
    spaces = (env.observation_space, env.action_space)
    env.close()
    return spaces


def ppo_parameters(spec: str, env_id: str = REFERENCE_ENV) -> int:
    from rl_transformers.policies.gtrxl import make_policy

    obs_space, act_space = _spaces(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy = make_policy(policy_config(spec), obs_space, act_space)
    return sum(p.numel() for p in policy.parameters())


def dt_parameters(spec: str, env_id: str = "CartPole-v1", max_ep_len: int = 500) -> int:
    """Parameters of the Decision Transformer with this backbone on ``env_id``'s spaces (context 10)."""
    from rl_transformers.policies.decision_transformer import DecisionTransformer

    obs_space, act_space = _spaces(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DecisionTransformer(
            obs_space, act_space, dt_backbone(spec), context_len=10, max_ep_len=max_ep_len
        )
    return sum(p.numel() for p in model.parameters())


def match_parameters(
    spec: str, target: int, count: Callable[[str], int], key: str, lo: int = 4, hi: int = 2048
) -> tuple[str, int]:
    """The spec with ``key`` (d_ff or hidden_size) set so its count is closest to ``target``."""

    def with_key(v: int) -> str:
        fields = parse_spec(spec)
        fields[key] = v
        return format_spec(fields)

    out = with_key(closest_value(lambda v: count(with_key(v)), target, lo, hi))
    return out, count(out)


# -- expansion --------------------------------------------------------------------------------------------
def _accepts(build: Callable[[], Any]) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build()
    except (ValueError, TypeError, NotImplementedError) as exc:
        return str(exc)
    return None


def ppo_encoders(match: bool = True) -> tuple[list[Encoder], list[Excluded]]:
    """Every PPO row of the study (see the module docstring) and the attentions left out, with reasons."""
    rows: list[tuple[str, str, str, str]] = [("gtrxl", "", "default", "full + xl + xl_relative + gtrxl")]
    excluded: list[Excluded] = []
    names = available()
    for att in names["attention"]:
        if not capabilities("attention", att).causal:
            excluded.append(
                Excluded(att, "no causal mode (needs the whole sequence); a policy must be causal")
            )
            continue
        reason = "no positional scheme accepted"
        for pos in POSITION_PREFERENCE:
            spec = f"attention={att};position={pos};memory=None"
            error = _accepts(partial(ppo_parameters, spec))
            if error is None:
                rows.append((att, spec, "attention", f"position {pos}"))
                break
            reason = error
        else:
            excluded.append(Excluded(att, reason))
    for mem in names["memory"]:
        if mem != "xl":
            rows.append((mem, f"memory={mem}", "memory", "GTrXL default with this memory"))
    for depth in names["depth"]:
        if depth != "fixed":
            rows.append((depth, f"depth={depth}", "depth", "GTrXL default with this depth"))
    for kind in BASELINES:
        rows.append((kind, f"policy={kind}", "baseline", ""))
    target = ppo_parameters("")
    out = []
    for name, spec, family, note in rows:
        if spec and match:
            error = _accepts(partial(ppo_parameters, spec))
            if error is not None:
                excluded.append(Excluded(name, error))
                continue
            n = ppo_parameters(spec)
            if abs(n - target) > TOLERANCE * target:
                key = "hidden_size" if family == "baseline" else "d_ff"
                spec, _ = match_parameters(spec, target, ppo_parameters, key)
        out.append(Encoder(name, spec, family, note))
    return out, excluded


def dt_encoders(match: bool = True) -> tuple[list[Encoder], list[Excluded]]:
    """One DT row per attention the DT backbone accepts (position ``none``), parameter-matched to ``full``."""
    out: list[Encoder] = []
    excluded: list[Excluded] = []
    target = dt_parameters("attention=full")
    for att in available()["attention"]:
        spec = f"attention={att}"
        error = _accepts(partial(dt_parameters, spec))
        if error is not None:
            excluded.append(Excluded(att, error))
            continue
        if match and abs(dt_parameters(spec) - target) > TOLERANCE * target:
            spec, _ = match_parameters(spec, target, dt_parameters, "d_ff")
        out.append(Encoder(att, spec, "attention", "position none (DT timestep embedding)"))
    return out, excluded


def select(encoders: list[Encoder], names: tuple[str, ...], source: str = "--encoders") -> list[Encoder]:
    """The encoders with these names (all when empty); an unknown name raises `UserError` naming the closest."""
    if not names:
        return encoders
    known = sorted({e.name for e in encoders})
    for name in names:
        if name not in known:
            raise UserError(f"unknown encoder {name!r}; {choice_hint(name, known)}", source=source)
    return [e for e in encoders if e.name in names]
