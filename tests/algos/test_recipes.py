"""Per-task recipes: the shipped file validates, bad files give errors naming file and line, a recipe applies
under the flags given, config.json records it, --recipe none opts out, a resume keeps the saved config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.recipes import Recipe, apply, config_path, find, load_recipes
from rl_transformers.policies import PolicyConfig
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipes.yml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_recipes_validate_and_build() -> None:
    recipes = load_recipes()
    assert recipes, "the shipped file holds entries"
    for (env_id, kind), recipe in recipes.items():
        policy = PolicyConfig(kind=kind if kind != "any" else "transformer")  # type: ignore[arg-type]
        cfg = apply(TrainConfig(env_id=env_id, policy=policy), recipe)
        assert cfg.recipe == recipe.source and recipe.source.startswith("ppo_recipes.yml:")


def test_config_path_finds_every_shipped_value_in_the_saved_config() -> None:
    for (env_id, kind), recipe in load_recipes().items():
        policy = PolicyConfig(kind=kind if kind != "any" else "transformer")  # type: ignore[arg-type]
        saved = to_jsonable(apply(TrainConfig(env_id=env_id, policy=policy), recipe))  # as config.json
        for key, value in recipe.values.items():
            node = saved
            for part in config_path(key):
                node = node[part]
            assert node == json.loads(json.dumps(value)), (env_id, kind, key)
    assert config_path("backbone.position") == ("policy", "backbone", "position")
    assert config_path("ppo.gamma") == ("ppo", "gamma")
    assert config_path("hidden_size") == ("policy", "hidden_size")
    assert config_path("num_envs") == ("num_envs",)


def test_the_zoo_entry_holds_the_zoo_values() -> None:
    recipe = find("rlt/CartPoleNoVel-v0", "lstm")
    assert recipe is not None
    cfg = apply(TrainConfig(env_id="rlt/CartPoleNoVel-v0", policy=PolicyConfig(kind="lstm")), recipe)
    assert (cfg.num_envs, cfg.ppo.num_steps, cfg.ppo.update_epochs, cfg.ppo.gamma) == (8, 32, 20, 0.98)
    assert cfg.policy.head_hidden == (64,) and cfg.ppo.norm_reward and not cfg.ppo.clip_vloss
    assert find("rlt/CartPoleNoVel-v0", "gru") is None and find("rlt/TMaze-v0", "lstm") is None


def test_the_shipped_default_lies_under_every_transformer_entry() -> None:
    hard = find("rlt/popgym-RepeatPreviousHard-v0", "transformer")
    assert hard is not None and hard.source.split(" + ")[0].endswith(" default/transformer")
    assert hard.values["backbone.position"] == "rope" and hard.values["backbone.memory_options"] == {
        "mem_len": 64
    }
    alone = find("rlt/TMaze-v0", "transformer")  # no entry: the default alone
    assert alone is not None and alone.values == {"backbone.position": "rope"}


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "rlt/NoSuchTask-v0:\n  lstm:\n    num_envs: 8\n",
            r"recipes.yml:1: unknown env id 'rlt/NoSuchTask-v0'",
        ),
        ("rlt/TMaze-v0:\n  rnn:\n    num_envs: 8\n", r"recipes.yml:2: unknown policy kind 'rnn'"),
        (
            "rlt/TMaze-v0:\n  lstm:\n    num_envs: 8\n    ppo.gama: 0.9\n",
            r"recipes.yml:4 .*'ppo.gama'.*ppo.gamma",
        ),
        ("rlt/TMaze-v0:\n  lstm:\n    num_envs: eight\n", r"recipes.yml:3 .*num_envs.*must be"),
        ("rlt/TMaze-v0:\n  lstm:\n    seed: 3\n", r"recipes.yml:3 .*unknown recipe key 'seed'"),
        ("rlt/TMaze-v0:\n  lstm:\n    ppo.gamma: [1\n", r"recipes.yml is not valid YAML"),
        ("- a list\n", r"top level must map env ids"),
        (
            "default:\n  transformer:\n    ppo.gama: 0.9\n",
            r"recipes.yml:3 \(default/transformer\).*'ppo.gama'",
        ),
    ],
    ids=["env-id", "kind", "key", "type", "bookkeeping", "yaml", "layout", "default-key"],
)
def test_bad_recipe_files_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_recipes(_write(tmp_path, text))


def test_any_entry_and_a_bad_value_combination(tmp_path: Path) -> None:
    path = _write(tmp_path, "rlt/TMaze-v0:\n  any:\n    ppo.seq_len: 5\n")
    recipe = find("rlt/TMaze-v0", "gru", path)
    assert isinstance(recipe, Recipe) and recipe.values == {"ppo.seq_len": 5}
    with pytest.raises(UserError, match=r"recipe .*recipes.yml:2 rlt/TMaze-v0/any: .*multiple of seq_len"):
        apply(TrainConfig(env_id="rlt/TMaze-v0"), recipe)


def test_a_task_entry_is_laid_over_the_default_entry(tmp_path: Path) -> None:
    text = (
        "default:\n  transformer:\n    norm_obs: true\n    ppo.gamma: 0.9\n"
        "rlt/TMaze-v0:\n  transformer:\n    ppo.gamma: 0.95\n  gru:\n    num_envs: 8\n"
    )
    path = _write(tmp_path, text)
    both = find("rlt/TMaze-v0", "transformer", path)
    assert both is not None and both.values == {"norm_obs": True, "ppo.gamma": 0.95}  # the task's value wins
    assert both.source == f"{path}:2 default/transformer + {path}:6 rlt/TMaze-v0/transformer"
    cfg = apply(TrainConfig(env_id="rlt/TMaze-v0"), both)
    assert cfg.ppo.gamma == 0.95 and cfg.policy.norm_obs and cfg.recipe == both.source
    alone = find("rlt/TMazeShort-v0", "transformer", path)  # a task without an entry gets the default
    assert alone is not None and alone.values == {"norm_obs": True, "ppo.gamma": 0.9}
    assert alone.source == f"{path}:2 default/transformer"
    gru = find("rlt/TMaze-v0", "gru", path)  # no default for the GRU: its own entry alone
    assert gru is not None and gru.values == {"num_envs": 8} and "default" not in gru.source
    assert find("rlt/TMazeShort-v0", "lstm", path) is None


def _train(tmp_path: Path, *flags: str) -> tuple[dict, str]:
    args = ["--total-timesteps", "256", "--eval-every", "0", "--no-progress", "--run-root", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_gtrxl.py"), *args, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (config,) = sorted(tmp_path.rglob("config.json"))
    return json.loads(config.read_text()), proc.stderr


def test_cli_applies_the_recipe_under_the_flags_given(tmp_path: Path) -> None:
    env = ["--env-id", "rlt/CartPoleNoVel-v0", "--policy", "lstm"]
    cfg, err = _train(tmp_path / "recipe", *env, "--ppo.gamma", "0.9", "--hidden-size", "32")
    assert "recipe: ppo_recipes.yml:" in err and "rlt/CartPoleNoVel-v0/lstm" in err
    assert cfg["recipe"].startswith("ppo_recipes.yml:") and cfg["num_envs"] == 8
    assert (
        cfg["ppo"]["gamma"] == 0.9 and cfg["ppo"]["gae_lambda"] == 0.8
    )  # the flag wins, the rest is the recipe
    assert cfg["policy"]["hidden_size"] == 32 and cfg["policy"]["head_hidden"] == [64]
    small = ["--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--no-match-params"]
    plain, err = _train(tmp_path / "none", *env, *small, "--recipe", "none")
    assert "recipe:" not in err and plain["recipe"] == "none" and plain["ppo"]["gamma"] == 0.99
    default, err = _train(tmp_path / "default", "--env-id", "rlt/TMazeShort-v0", *small[:-1])
    assert default["recipe"].endswith(" default/transformer") and "default/transformer" in err  # no entry
    assert default["policy"]["backbone"]["position"] == "rope"
    other, _ = _train(tmp_path / "no-entry", "--env-id", "rlt/TMazeShort-v0", "--policy", "gru", *small[:-1])
    assert other["recipe"] == "none"  # auto, but neither the task nor the default has a GRU entry
