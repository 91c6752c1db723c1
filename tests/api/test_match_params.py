"""--match-params: an lstm / gru / mlp policy is sized to the transformer policy's parameter count with the
encoder study's own sizing code, both counts are printed, the width is saved, and a resume never re-sizes.

Counts are checked against policies built here and counted by ``utils.params.count_parameters`` (its own
de-duplicating count), the width against a brute-force scan of the neighbouring widths, and the study's
``match_parameters`` against ``match_width`` on the study's reference spaces.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the rlt/ ids)
from rl_transformers import load, train_ppo
from rl_transformers.algos.ppo_config import RESUME_PER_INVOCATION, PPOConfig, TrainConfig
from rl_transformers.algos.ppo_sizing import match_run_config
from rl_transformers.backbone.cli import cli_registry
from rl_transformers.policies.gtrxl import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.policies.sizing import match_width
from rl_transformers.runs.resume import parse_cli
from rl_transformers.study import encoders as study
from rl_transformers.utils.params import count_parameters

ENV = "rlt/TMaze-v0"
NUMBER = r"([\d,]+)"


def built_count(policy: PolicyConfig, env_id: str = ENV) -> int:
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_policy(policy, env.observation_space, env.action_space)
    env.close()
    return count_parameters(model, trainable_only=False)


def printed_counts(line: str) -> tuple[int, int, int, int]:
    """hidden size, baseline, transformer and unmatched counts of the printed line."""
    m = re.search(
        rf"hidden_size (\d+): {NUMBER} parameters; transformer policy: {NUMBER} .*keeps width \d+ \({NUMBER}\)",
        line,
    )
    assert m, line
    return tuple(int(g.replace(",", "")) for g in m.groups())  # type: ignore[return-value]


@pytest.mark.parametrize("kind", ["lstm", "gru", "mlp"])
def test_sized_baseline_matches_the_transformer_and_prints_true_counts(kind: str) -> None:
    lines: list[str] = []
    cfg = match_run_config(TrainConfig(env_id=ENV, policy=PolicyConfig(kind=kind)), echo=lines.append)
    (line,) = lines
    width, n_printed, ref_printed, default_printed = printed_counts(line)
    assert cfg.policy.hidden_size == width and cfg.policy.kind == kind and "within" in line

    n = built_count(cfg.policy)
    ref = built_count(PolicyConfig())  # the GTrXL default this config would otherwise train
    assert (n_printed, ref_printed) == (n, ref)
    assert default_printed == built_count(PolicyConfig(kind=kind)) < 0.5 * ref  # unmatched: far smaller
    assert abs(n - ref) <= study.TOLERANCE * ref, (n, ref)
    for other in (width - 1, width + 1):  # no neighbouring width is closer
        assert abs(n - ref) <= abs(built_count(dataclasses.replace(cfg.policy, hidden_size=other)) - ref)


def test_the_reference_is_the_configured_backbone() -> None:
    small = PolicyConfig(kind="gru", backbone=gtrxl_backbone(16, 1, 2, mem_len=8))
    cfg = match_run_config(TrainConfig(env_id=ENV, policy=small), echo=None)
    ref = built_count(dataclasses.replace(small, kind="transformer"))
    assert abs(built_count(cfg.policy) - ref) <= study.TOLERANCE * ref
    assert built_count(cfg.policy) < 0.5 * built_count(PolicyConfig())  # not the default GTrXL's count


def test_same_width_as_the_study() -> None:
    pytest.importorskip("popgym")  # the study's reference env
    obs_space, act_space = study._spaces(study.REFERENCE_ENV)
    for kind in ("gru", "lstm"):
        spec, _ = study.match_parameters(
            f"policy={kind}", study.ppo_parameters(""), study.ppo_parameters, "hidden_size"
        )
        sized, sizing = match_width(PolicyConfig(kind=kind), obs_space, act_space)
        assert sizing is not None and spec == f"policy={kind};hidden_size={sized.hidden_size}"


def parse(*argv: str) -> TrainConfig:
    return parse_cli(TrainConfig, per_invocation=RESUME_PER_INVOCATION, registry=cli_registry(), argv=argv)


def test_flags_decide_whether_to_size() -> None:
    assert parse("--policy", "lstm").policy.match_params is True  # the default
    off = parse("--policy", "lstm", "--no-match-params")
    assert off.policy.match_params is False
    lines: list[str] = []
    assert match_run_config(off, echo=lines.append) == off and lines == []  # width backbone.d_model
    given = parse("--policy", "lstm", "--hidden-size", "100")
    assert match_run_config(given, echo=lines.append).policy.hidden_size == 100 and lines == []
    transformer = parse()
    assert match_run_config(transformer, echo=lines.append) == transformer and lines == []


def test_width_is_saved_and_a_resume_keeps_it(tmp_path, capsys) -> None:
    cfg = TrainConfig(
        env_id=ENV,
        total_timesteps=64,
        num_envs=2,
        policy=PolicyConfig(kind="lstm", backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=1),
        eval_every=0,
        run_root=str(tmp_path),
        progress=False,
        threads=1,
    )
    run = train_ppo(cfg)
    out = capsys.readouterr().out
    width, n, _, _ = printed_counts(out)
    assert f"ppo: {n:,} parameters" in out  # the trainer built what was printed
    agent = load(run.run_dir)
    assert agent.config.policy.hidden_size == width
    assert count_parameters(agent.policy, trainable_only=False) == n

    # resuming with the fresh run's config (hidden_size unset) takes the saved width and prints nothing
    resumed = train_ppo(dataclasses.replace(cfg, resume=str(run.run_dir), total_timesteps=128))
    assert "--match-params" not in capsys.readouterr().out
    assert resumed.step == 128 and load(resumed.run_dir).config.policy.hidden_size == width
