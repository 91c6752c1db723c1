r"""Build D4RL-style offline datasets (random / medium / medium-replay / expert / medium-expert) as Minari.

Trains (or loads) a Stable-Baselines3 behaviour policy on a Gymnasium task and writes one Minari dataset
per kind with reference scores; see `offline_data.build` for the method and the seeds. Examples:

    python scripts/make_dataset.py --env-id Hopper-v5 --root datasets/minari          # D4RL-like Hopper
    python scripts/make_dataset.py --env-id CartPole-v1 --medium-return 100 \
        --total-timesteps 50000 --eval-freq 5000 --num-episodes 200 --kinds random medium expert

The offline memory datasets (T-Maze, RepeatPrevious: scripted oracles, no training) have their own script,
scripts/make_memory_dataset.py.
"""

from __future__ import annotations

import json

import tyro

from offline_data.build import build_datasets
from offline_data.build_config import BuildConfig
from rl_transformers.utils.errors import run_cli


def main(config: BuildConfig) -> None:
    """Build the datasets of ``config`` and print a JSON summary (ids, paths, mean returns, reference scores)."""
    result = build_datasets(config)
    summary = {
        kind: {
            "id": result.dataset_ids[kind],
            "path": str(result.paths[kind]),
            "mean_return": round(result.mean_returns[kind], 3),
        }
        for kind in config.kinds
    }
    print(
        json.dumps(
            {
                "datasets": summary,
                "ref_scores": [result.ref_min_score, result.ref_max_score],
                "ref_scores_source": result.ref_scores_source,
                "policies": {k: str(v) for k, v in result.policies.items()},
            },
            indent=2,
        )
    )


def command() -> int:
    """``rlt make-dataset`` / ``scripts/make_dataset.py``: the flags of :class:`BuildConfig` on ``sys.argv``, then
    :func:`main`; user errors as one line."""
    run_cli(lambda: main(tyro.cli(BuildConfig, description=__doc__)))
    return 0
