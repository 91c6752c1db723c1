"""The ecosystem's yardstick: sb3-contrib's ``RecurrentPPO`` with rl-baselines3-zoo's published recipe, run on
this library's tasks under this library's evaluation protocol (the final policy, greedy, ``episodes`` fresh
episodes), so its returns stand beside ours in one table.

The recipe is read from the installed ``rl_zoo3`` package's own ``hyperparams/ppo_lstm.yml`` (YAML, read with
``yaml.safe_load``); its ``policy_kwargs`` string is parsed by :func:`parse_policy_kwargs`, which accepts only
``dict(...)`` of literals and the activation names of :data:`ACTIVATIONS` (the zoo itself ``eval``s it; here
nothing from the file runs). The zoo's conventions are kept: ``lin_<x>`` is a linear schedule from x to 0,
``normalize: True`` wraps the training envs in ``VecNormalize`` (observations and rewards, with the recipe's γ)
and the evaluation env in a frozen copy of its observation statistics without reward scaling.

``ZOO_KEYS`` maps this library's env ids to the zoo's entry for the same task (``rlt/CartPoleNoVel-v0`` keeps
x and θ; the zoo's ``CartPoleNoVel-v1`` zeroes the two velocities: the same information).
"""

from __future__ import annotations

import ast
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.utils.errors import UserError

ZOO_KEYS = {"rlt/CartPoleNoVel-v0": "CartPoleNoVel-v1"}
"""This library's env id -> the rl-zoo entry of the same task."""
ACTIVATIONS = ("ReLU", "Tanh", "GELU", "ELU", "LeakyReLU", "SiLU")
"""``nn.<name>`` values a zoo ``policy_kwargs`` may name."""
RECIPE_KEYS = frozenset(
    {
        "n_envs",
        "n_timesteps",
        "policy",
        "n_steps",
        "batch_size",
        "gae_lambda",
        "gamma",
        "n_epochs",
        "ent_coef",
        "vf_coef",
        "max_grad_norm",
        "learning_rate",
        "clip_range",
        "normalize",
        "policy_kwargs",
    }
)


def zoo_folder() -> Path:
    """The installed rl_zoo3 package's folder, found without importing it: importing rl_zoo3 replaces gymnasium's
    ``TimeLimit`` with its own subclass for the whole process (its ``gym_patches``), which would change every env
    made afterwards, this library's included."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the peer needs rl_zoo3 and sb3-contrib: pip install -e '.[peers]'")
    return Path(next(iter(spec.submodule_search_locations)))


def zoo_recipe(zoo_key: str, path: Path | None = None) -> dict[str, Any]:
    """The zoo's ``ppo_lstm.yml`` entry ``zoo_key`` (from the installed rl_zoo3 unless ``path`` is given)."""
    import yaml

    if path is None:
        path = zoo_folder() / "hyperparams" / "ppo_lstm.yml"
    table = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(table, dict) or zoo_key not in table:
        keys = sorted(table) if isinstance(table, dict) else []
        raise UserError(f"rl-zoo recipe {zoo_key!r} is not in {path}; its entries: {keys}")
    recipe = dict(table[zoo_key])
    unknown = sorted(set(recipe) - RECIPE_KEYS)
    if unknown:
        raise UserError(f"rl-zoo recipe {zoo_key!r} ({path}) has keys this runner does not map: {unknown}")
    return recipe


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "dict") or node.args:
            raise ValueError(f"only dict(key=value, ...) calls are allowed, got {ast.unparse(node)!r}")
        return {kw.arg: _literal(kw.value) for kw in node.keywords}
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nn":
        if node.attr not in ACTIVATIONS:
            raise ValueError(f"activation nn.{node.attr} is not one of {list(ACTIVATIONS)}")
        return ("activation", node.attr)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values) if k is not None}
    return ast.literal_eval(node)


def parse_policy_kwargs(text: str) -> dict[str, Any]:
    """A zoo ``policy_kwargs`` string (``"dict(ortho_init=False, activation_fn=nn.ReLU, ...)"``) as a dict;
    activations become torch classes. Anything but literals, ``dict(...)`` and ``nn.<activation>`` is refused."""
    from torch import nn

    try:
        value = _literal(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError) as err:
        raise UserError(f"rl-zoo policy_kwargs {text!r} is not plain data: {err}") from None
    if not isinstance(value, dict):
        raise UserError(f"rl-zoo policy_kwargs {text!r} is not a dict")

    def resolve(v: Any) -> Any:
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "activation":
            return getattr(nn, v[1])
        if isinstance(v, dict):
            return {k: resolve(x) for k, x in v.items()}
        if isinstance(v, list):
            return [resolve(x) for x in v]
        return v

    return resolve(value)


def schedule(value: Any) -> Any:
    """A zoo rate: ``lin_<x>`` -> SB3 schedule from x to 0 (progress_remaining x), else the number."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[len("lin_") :])
        return lambda progress_remaining: progress_remaining * start
    return float(value)


@dataclass
class PeerResult:
    """One peer run: the final greedy policy's returns and its cost."""

    env_id: str
    zoo_key: str
    seed: int
    total_timesteps: int
    returns: list[float]
    parameters: int
    cpu_seconds: float
    wall_seconds: float

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def steps_per_cpu_second(self) -> float:
        return self.total_timesteps / max(self.cpu_seconds, 1e-9)


def peer_model_kwargs(recipe: dict[str, Any]) -> dict[str, Any]:
    """``RecurrentPPO`` keyword arguments of a zoo recipe (env, seed and budget excluded)."""
    kwargs: dict[str, Any] = {}
    for key in ("n_steps", "batch_size", "gae_lambda", "gamma", "n_epochs", "ent_coef", "vf_coef"):
        if key in recipe:
            kwargs[key] = recipe[key]
    if "max_grad_norm" in recipe:
        kwargs["max_grad_norm"] = float(recipe["max_grad_norm"])
    for key in ("learning_rate", "clip_range"):
        if key in recipe:
            kwargs[key] = schedule(recipe[key])
    if "policy_kwargs" in recipe:
        raw = recipe["policy_kwargs"]
        kwargs["policy_kwargs"] = parse_policy_kwargs(raw) if isinstance(raw, str) else dict(raw)
    return kwargs


def run_peer(
    env_id: str,
    seed: int,
    episodes: int = 50,
    total_timesteps: int | None = None,
    zoo_key: str | None = None,
    recipe_path: Path | None = None,
) -> PeerResult:
    """Train ``RecurrentPPO`` with the zoo's recipe on ``env_id`` and evaluate its final policy greedily."""
    import gymnasium as gym
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import envs  # noqa: F401  (registers the rlt/ ids)

    key = zoo_key or ZOO_KEYS.get(env_id)
    if key is None:
        raise UserError(
            f"no rl-zoo recipe is mapped to {env_id!r}; mapped: {sorted(ZOO_KEYS)} (or pass --zoo-key)"
        )
    recipe = zoo_recipe(key, recipe_path)
    budget = int(total_timesteps if total_timesteps is not None else recipe["n_timesteps"])
    gamma = float(recipe.get("gamma", 0.99))
    venv = make_vec_env(env_id, n_envs=int(recipe.get("n_envs", 1)), seed=seed)
    normalize = bool(recipe.get("normalize", False))
    if normalize:
        venv = VecNormalize(venv, gamma=gamma)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    policy = recipe.get("policy", "MlpLstmPolicy")
    model = RecurrentPPO(policy, venv, seed=seed, device="cpu", **peer_model_kwargs(recipe))
    model.learn(total_timesteps=budget)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    returns = _evaluate(model, gym.make(env_id), venv if normalize else None, episodes, seed)
    n_params = sum(p.numel() for p in model.policy.parameters())
    return PeerResult(env_id, key, seed, budget, returns, n_params, cpu, wall)


def _evaluate(model: Any, env: Any, norm: Any, episodes: int, seed: int) -> list[float]:
    """Greedy returns of ``episodes`` episodes (seeds 10**6 + seed * 1000 + i), LSTM state reset per episode;
    observations normalised with the training statistics (frozen) when ``norm`` is a VecNormalize."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=10**6 + seed * 1000 + i)
        state, start, total, done = None, np.ones((1,), dtype=bool), 0.0, False
        while not done:
            x = obs[None] if norm is None else norm.normalize_obs(obs[None])
            action, state = model.predict(x, state=state, episode_start=start, deterministic=True)
            a = action[0]
            obs, reward, terminated, truncated, _ = env.step(a.item() if a.ndim == 0 else a)
            total += float(reward)
            start = np.zeros((1,), dtype=bool)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns
