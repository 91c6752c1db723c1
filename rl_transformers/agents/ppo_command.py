"""Train a memory policy with PPO: GTrXL by default, any backbone variant, or an LSTM / GRU / MLP baseline.

    python scripts/train_gtrxl.py                                    # GTrXL on rlt/TMaze-v0
    python scripts/train_gtrxl.py --env-id rlt/CartPoleNoVel-v0 --total-timesteps 500000
    python scripts/train_gtrxl.py --backbone.attention linear --backbone.memory None --backbone.position rope
    python scripts/train_gtrxl.py --backbone.memory-options '{"mem_len": 64}' --ppo.seq-len 32
    python scripts/train_gtrxl.py --policy lstm                      # baseline, sized to GTrXL's parameters
    python scripts/train_gtrxl.py --policy gru --no-match-params     # baseline of width backbone.d_model
    python scripts/train_gtrxl.py --resume runs/ppo/rlt-TMaze-v0/<run>/   # continue a run
    python scripts/train_gtrxl.py --init-from runs/ppo/rlt-TMaze-v0/<run>/ --env-kwargs '{"corridor_length": 400}'
                                                                     # a new run from that run's policy weights
    python scripts/train_gtrxl.py --env-id rlt/CartPoleNoVel-v0 --recipe none  # library defaults, no recipe
    torchrun --nproc_per_node 2 scripts/train_gtrxl.py --threads 1   # data-parallel PPO (gloo on CPU)

Writes runs/ppo/<env>/<YYYYmmdd-HHMMSS>-s<seed>/ (config.json, TensorBoard events, progress.jsonl, checkpoints/),
greedy evaluation every --eval-every steps (eval/mean_reward selects best.pt). Prints the parameter count at the
start (with --policy lstm|gru|mlp also the transformer policy's: --match-params, on by default, sizes the
baseline's hidden size to it within 10 %, as the encoder study does) and a JSON summary at the end (the last
logged rollout/ep_rew_mean and eval/mean_reward). Ctrl-C saves a checkpoint and exits; a non-finite loss stops
the run and keeps the last good checkpoint. The run flags (--run-root, --seed, --threads, --device, --resume,
--verbose, --progress, --allow-env-modules) are the same as train_dt.py's. A task with an entry in
rl_transformers/algos/ppo_recipes.yml (per env id and policy, as rl-zoo's hyperparameter files) starts from it:
the entry is printed, flags given override it, --recipe none opts out, --recipe FILE reads another file.
"""

from __future__ import annotations

from typing import Any

from rl_transformers.algos import recipes
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import RESUME_PER_INVOCATION, TrainConfig
from rl_transformers.algos.ppo_sizing import match_run_config
from rl_transformers.backbone.cli import cli_registry
from rl_transformers.runs.lifecycle import summary_text
from rl_transformers.runs.resume import parse_cli  # --resume: flags default to the saved config
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.training import NonFiniteError


def main() -> int:
    """Parse ``sys.argv`` (a fresh run starts from its task's recipe), train, print the JSON summary; the exit
    status: 0, or 1 when a non-finite loss stopped the run."""

    def parse(default: TrainConfig | None = None) -> TrainConfig:
        extra: dict[str, Any] = {} if default is None else {"default": default}
        return parse_cli(
            TrainConfig,
            per_invocation=RESUME_PER_INVOCATION,
            registry=cli_registry(),
            description=__doc__,
            **extra,
        )

    cfg = parse()
    if cfg.resume is None:  # a fresh run takes its task's recipe (a resumed one keeps its saved config)
        cfg = recipes.resolve(cfg, parse)
    cfg = match_run_config(cfg)  # --match-params: lstm / gru / mlp sized to the transformer's parameter count
    try:
        result = train(cfg)
    except NonFiniteError:
        return 1
    if result.run_dir is not None:  # the last logged rollout/ep_rew_mean, eval/mean_reward (as TensorBoard)
        print(summary_text(result))
    return 0


def command() -> int:
    """``rlt train-ppo`` / ``scripts/train_gtrxl.py``: :func:`main` on ``sys.argv``, user errors as one line."""
    return run_cli(main)
