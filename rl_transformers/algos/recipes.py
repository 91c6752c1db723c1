"""Per-task PPO recipes, as rl-zoo users know them: a YAML file keyed by env id and policy kind whose values
replace the library's defaults for that task; flags given on the command line still win.

The shipped file is ``rl_transformers/algos/ppo_recipes.yml``. Its layout::

    rlt/CartPoleNoVel-v0:          # a registered env id
      lstm:                        # the policy kind (transformer, lstm, gru, mlp) or "any"
        note: where the values come from      (free text, printed, never run)
        num_envs: 8                # a TrainConfig field by its flag name, dashes or underscores
        ppo.gamma: 0.98            # a PPOConfig field
        hidden_size: 64            # a PolicyConfig field (the policy's flags are top-level)
        backbone.position: rope    # a BackboneConfig field

      default:                     # optional: what every task starts from, for a policy kind (or "any")
        transformer:
          backbone.position: rope

A task's entry is laid over the file's ``default`` entry of the same kind (its own values win), so an entry
holds only what that task needs beyond the default; a task without an entry gets the default alone. Every value
is checked against the field's type, every key against the config's fields and every env id against
Gymnasium's registry when the file is read: a bad entry is a :class:`UserError` naming the file and line.
``scripts/train_gtrxl.py`` applies the recipe of its task and policy (``--recipe auto``, the default), prints
which entries, and records them in ``config.json`` (``recipe``); ``--recipe none`` opts out, and ``--recipe
FILE`` reads another file of the same layout. The values are data: nothing in a recipe file is imported or run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.utils.errors import UserError

SHIPPED = Path(__file__).with_name("ppo_recipes.yml")
KINDS = ("transformer", "lstm", "gru", "mlp", "any")
NOTE = "note"
DEFAULT = "default"
"""The top-level key of the entries every task starts from (not an env id)."""


@dataclass(frozen=True)
class Recipe:
    """One entry: where it came from and its values (flag-style keys, underscores)."""

    source: str
    """``<file>:<line> <env id>/<kind>``, or two of them joined by `` + `` (the default's, then the task's)."""
    values: dict[str, Any]
    note: str = ""


def _lines(path: Path, text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The YAML document and the 1-based line of every mapping key path."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UserError(f"recipe file {path} is not valid YAML: {err}") from None
    lines: dict[tuple[str, ...], int] = {}

    def walk(n: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                path_ = (*prefix, str(key.value))
                lines[path_] = key.start_mark.line + 1
                walk(value, path_)

    walk(node, ())
    return data, lines


def load_recipes(path: Path = SHIPPED) -> dict[tuple[str, str], Recipe]:
    """Every entry of a recipe file, validated (see the module docstring), keyed by (env id, kind)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"recipe file {path} cannot be read: {err.strerror or err}") from None
    data, lines = _lines(path, text)
    shown = (
        path.name if path == SHIPPED else str(path)
    )  # the shipped file by name: no install path in configs
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"recipe file {path}: the top level must map env ids to policies")
    recipes: dict[tuple[str, str], Recipe] = {}
    for env_id, kinds in data.items():
        where = f"{path}:{lines.get((str(env_id),), '?')}"
        if env_id != DEFAULT:
            _check_env_id(str(env_id), where)
        if not isinstance(kinds, dict):
            raise UserError(f"{where}: {env_id!r} must map policy kinds {list(KINDS)} to values")
        for kind, values in kinds.items():
            at = f"{path}:{lines.get((str(env_id), str(kind)), '?')}"
            if kind not in KINDS:
                raise UserError(f"{at}: unknown policy kind {kind!r} under {env_id!r}; valid: {list(KINDS)}")
            if not isinstance(values, dict):
                raise UserError(f"{at}: {env_id}/{kind} must map config fields to values")
            values = {str(k).replace("-", "_"): v for k, v in values.items()}
            note = values.pop(NOTE, "")
            for key, value in values.items():
                line = lines.get((str(env_id), str(kind), key), lines.get((str(env_id), str(kind)), "?"))
                check_value(key, value, f"{path}:{line} ({env_id}/{kind})")
            label = f"{shown}:{lines.get((str(env_id), str(kind)), '?')} {env_id}/{kind}"
            recipes[(str(env_id), str(kind))] = Recipe(label, values, str(note))
    return recipes


def _check_env_id(env_id: str, where: str) -> None:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the rlt/ ids)

    if env_id not in gym.registry:
        from rl_transformers.utils.errors import closest

        match = closest(env_id, list(gym.registry))
        hint = f" Did you mean {match!r}?" if match else ""
        raise UserError(f"{where}: unknown env id {env_id!r} (not in Gymnasium's registry).{hint}")


def _target(key: str) -> tuple[type, str, tuple[str, ...]]:
    """(dataclass, field, path of nested config fields) that a flag-style key sets."""
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.backbone.config import BackboneConfig
    from rl_transformers.policies.gtrxl import PolicyConfig

    head, _, rest = key.partition(".")
    if head == "ppo" and rest:
        return PPOConfig, rest, ("ppo",)
    if head == "backbone" and rest:
        return BackboneConfig, rest, ("policy", "backbone")
    if not rest and key in {f.name for f in dataclasses.fields(PolicyConfig)} - {"backbone"}:
        return PolicyConfig, key, ("policy",)
    if not rest and key == "policy":
        return PolicyConfig, "kind", ("policy",)
    return TrainConfig, key, ()


def config_path(key: str) -> tuple[str, ...]:
    """Where a recipe key's value sits in a run's ``config.json``: ``ppo.learning_rate`` -> ("ppo",
    "learning_rate"), ``backbone.position`` -> ("policy", "backbone", "position")."""
    _, name, nest = _target(key)
    return (*nest, name)


SETTABLE_TOP = frozenset({"env_kwargs", "total_timesteps", "num_envs", "eval_every", "eval_episodes"})
"""The TrainConfig fields a recipe may set (the run's bookkeeping stays the user's)."""


def check_value(key: str, value: Any, where: str) -> None:
    """UserError unless ``key`` names a settable field and ``value`` has its type."""
    from rl_transformers.backbone.options import check_types

    cls, name, nest = _target(key)
    valid = {f.name for f in dataclasses.fields(cls)}
    if name not in valid or (not nest and name not in SETTABLE_TOP):
        from rl_transformers.utils.errors import closest

        match = closest(key, sorted(settable_keys()))
        hint = f" Did you mean {match!r}?" if match else ""
        raise UserError(f"{where}: unknown recipe key {key!r}.{hint} Valid keys: {sorted(settable_keys())}")
    if isinstance(value, list):
        value = tuple(value)
    check_types(cls, {name: value}, f"{where}: {key}: ")


def settable_keys() -> set[str]:
    from rl_transformers.algos.ppo_config import PPOConfig
    from rl_transformers.backbone.config import BackboneConfig
    from rl_transformers.policies.gtrxl import PolicyConfig

    keys = set(SETTABLE_TOP) | {f"ppo.{f.name}" for f in dataclasses.fields(PPOConfig)}
    keys |= {f"backbone.{f.name}" for f in dataclasses.fields(BackboneConfig)}
    return keys | ({f.name for f in dataclasses.fields(PolicyConfig)} - {"backbone", "kind"})


def find(env_id: str, kind: str, path: Path = SHIPPED) -> Recipe | None:
    """The recipe of ``env_id`` for policy ``kind``: the task's entry (its own kind's, else its "any") laid over
    the file's default entry (likewise), either alone where the other is missing, or None."""
    recipes = load_recipes(path)

    def entry(key: str) -> Recipe | None:
        return recipes.get((key, kind)) or recipes.get((key, "any"))

    base, own = entry(DEFAULT), entry(env_id)
    if base is None or own is None:
        return own or base
    return Recipe(f"{base.source} + {own.source}", base.values | own.values, own.note or base.note)


def apply(cfg: Any, recipe: Recipe) -> Any:
    """``cfg`` (a TrainConfig) with the recipe's values and ``recipe`` set to its source."""
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, value in recipe.values.items():
        _, name, nest = _target(key)
        groups.setdefault(nest, {})[name] = tuple(value) if isinstance(value, list) else value
    try:
        policy = cfg.policy
        if ("policy", "backbone") in groups:
            backbone = dataclasses.replace(policy.backbone, **groups[("policy", "backbone")])
            policy = dataclasses.replace(policy, backbone=backbone)
        if ("policy",) in groups:
            policy = dataclasses.replace(policy, **groups[("policy",)])
        ppo = dataclasses.replace(cfg.ppo, **groups[("ppo",)]) if ("ppo",) in groups else cfg.ppo
        return dataclasses.replace(cfg, **groups.get((), {}), policy=policy, ppo=ppo, recipe=recipe.source)
    except ValueError as err:  # UserError included: a combination the configs refuse
        raise UserError(f"recipe {recipe.source}: {err}") from None


def resolve(cfg: Any, reparse: Any) -> Any:
    """``cfg`` of a fresh run with its recipe applied (``cfg.recipe``: auto, none or a file), printing which;
    ``reparse(defaults)`` parses the command line again over ``defaults``, so the flags given win."""
    import sys

    if cfg.recipe == "none":
        return cfg
    path = SHIPPED if cfg.recipe == "auto" else Path(cfg.recipe)
    recipe = find(cfg.env_id, cfg.policy.kind, path)
    if recipe is None:
        if cfg.recipe != "auto":
            raise UserError(f"--recipe {path}: no entry for {cfg.env_id!r} and policy {cfg.policy.kind!r}")
        return dataclasses.replace(cfg, recipe="none")
    blank = type(cfg)()
    base = dataclasses.replace(
        blank, env_id=cfg.env_id, policy=dataclasses.replace(blank.policy, kind=cfg.policy.kind)
    )
    out = dataclasses.replace(reparse(apply(base, recipe)), recipe=recipe.source)
    note = f" ({recipe.note})" if recipe.note else ""
    print(f"recipe: {recipe.source}{note}; flags given override it, --recipe none opts out", file=sys.stderr)
    return out
