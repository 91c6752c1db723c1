"""The Decision Transformer learns offline T-Maze corridor 10 under the shipped recipe.

The recipe is experiments/offline_tmaze_dt/recipe.json (the 10-seed experiment's, docs/results/offline_tmaze_dt.md):
``full`` attention with the whole episode in context (K = L + 1), aligned windows, cosine decay. The data is the
experiment's, built here by the project's builder (500 episodes: 80 % oracle, 20 % uniform random). A policy that
ignores the cue of t = 0 succeeds in about half of the episodes (0.44 or 0.56 of the 50 evaluation episodes), so
success >= 0.9 needs the cue carried to the junction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[2] / "experiments" / "offline_tmaze_dt" / "recipe.json"
LENGTH = 10
SEED = json.loads(RECIPE.read_text())["test_seeds"][str(LENGTH)][0]
"""The first test seed of corridor 10 (the experiment's record of it solves the corridor)."""


@pytest.mark.slow
def test_dt_solves_tmaze_corridor_10(tmp_path: Path) -> None:
    from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets
    from rl_transformers.algos.dt import DTConfig, train
    from rl_transformers.policies.decision_transformer import dt_backbone_config

    recipe = json.loads(RECIPE.read_text())
    root = tmp_path / "minari"
    (dataset,) = build_memory_datasets(
        MemoryBuildConfig(task="tmaze", memory_lengths=(LENGTH,), random_share=0.2, root=root, progress=False)
    )
    backbone = {**recipe["backbone"], **recipe.get("backbone_by_corridor", {}).get(str(LENGTH), {})}
    dt = dict(recipe["dt"])
    dt["target_returns"] = tuple(dt["target_returns"])
    budget = int(recipe["budget"][str(LENGTH)])
    config = DTConfig(
        dataset=dataset.dataset_id,
        dataset_root=root,
        context_len=LENGTH + 1,
        backbone=dt_backbone_config(**backbone),
        total_steps=budget,
        eval_every=0,
        seed=SEED,
        threads=1,
        run_root=tmp_path / "runs",
        progress=False,
        **dt,
    )
    result = train(config)
    final = result.evaluations[budget]
    print(
        f"corridor {LENGTH}, seed {SEED}: success {final['eval/success_rate@1']:.2f} after {budget} updates"
    )
    assert final["eval/success_rate@1"] >= 0.9, final
