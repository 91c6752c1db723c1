"""The Optuna tuning tool: a tiny study runs, resumes from its SQLite file, refuses bad spaces and changed
settings; trials never use test seeds; the context knobs reach the built policy."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.study.encoders import policy_config
from rl_transformers.study.knobs import context_knob
from rl_transformers.study.tuning_space import SearchSpace
from rl_transformers.tune.seeds import (
    MAX_TRIALS,
    TEST_SEEDS,
    TUNING_SEED_BASE,
    check_disjoint,
    tuning_seed,
)
from rl_transformers.tune.tuner import (
    TuneConfig,
    best_trial,
    open_study,
    run_tuning,
    train_command,
    warmup_steps,
)
from rl_transformers.utils.errors import UserError

GRU = "policy=gru;hidden_size=8"


def tiny(out: Path, **changes) -> TuneConfig:
    base = TuneConfig(
        encoder=GRU,
        env_id="rlt/TMaze-v0",
        env_kwargs={"corridor_length": 2},
        total_timesteps=48,  # 3 updates of 2 envs x 8 steps
        num_envs=2,
        ppo=PPOConfig(num_steps=8, seq_len=8, num_minibatches=1, update_epochs=1),
        eval_every=16,  # an evaluation after every update
        eval_episodes=2,
        n_trials=2,
        out=out,
        space=SearchSpace(seq_len=(4, 8), knob=(4, 16)),
        device="cpu",
    )
    return dataclasses.replace(base, **changes)


def test_a_two_trial_study_runs_and_resumes_from_its_sqlite_file(tmp_path) -> None:
    import optuna

    cfg = tiny(tmp_path)
    study = run_tuning(cfg, log=lambda _: None)
    assert (tmp_path / f"{cfg.name}.db").is_file()
    first = [(t.number, t.state, t.params, t.value) for t in study.trials]
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for trial in study.trials:
        assert sorted(trial.intermediate_values) == [16, 32, 48]  # every evaluation reached the pruner
        assert trial.value == trial.intermediate_values[48]  # objective "final": the last evaluation
        assert set(trial.params) == {"learning_rate", "ent_coef", "seq_len", "hidden_size"}
        assert f"hidden_size={trial.params['hidden_size']}" in trial.user_attrs["spec"]
    best = json.loads((tmp_path / cfg.name / "best.json").read_text())
    assert best["value"] == max(v for *_, v in first)
    top = next(t for t in study.trials if t.number == best["trial"])
    assert best["curve"] == [[s, v] for s, v in sorted(top.intermediate_values.items())]  # the whole trial

    listed = json.loads((tmp_path / cfg.name / "trials.json").read_text())
    assert listed["settings"]["total_timesteps"] == cfg.total_timesteps
    assert [(t["trial"], t["params"], t["value"]) for t in listed["trials"]] == [
        (n, p, v) for n, _, p, v in first
    ]
    assert all(
        t["state"] == "complete" and [s for s, _ in t["curve"]] == [16, 32, 48] for t in listed["trials"]
    )

    reopened = run_tuning(dataclasses.replace(cfg, n_trials=3), log=lambda _: None)
    assert len(reopened.trials) == 3  # one trial added, the two stored ones kept as they were
    assert [(t.number, t.state, t.params, t.value) for t in reopened.trials[:2]] == first
    assert reopened.trials[2].state == optuna.trial.TrialState.COMPLETE
    assert reopened.trials[2].params not in [p for _, _, p, _ in first]  # not a replay of trial 0
    again = run_tuning(dataclasses.replace(cfg, n_trials=3), log=lambda _: None)
    assert len(again.trials) == 3  # nothing missing: nothing run
    assert len(json.loads((tmp_path / cfg.name / "trials.json").read_text())["trials"]) == 3

    for trial in reopened.trials:  # trials never use test seeds, in the study or in the saved run config
        seed = trial.user_attrs["seed"]
        assert seed == TUNING_SEED_BASE + trial.number and seed not in TEST_SEEDS
        saved = json.loads((Path(trial.user_attrs["run_dir"]) / "config.json").read_text())
        assert saved["seed"] == seed


def test_ctrl_c_during_a_trial_fails_it_and_stops_the_study(tmp_path, monkeypatch) -> None:
    """The trainer takes Ctrl-C / SIGTERM gracefully (saves, returns early). A trial stopped so used to be
    COMPLETE with the mean of its cut curve, and the study went on to the next trial; now it fails, the study
    stops, and a resume runs full trials in its place."""
    import os
    import signal
    import threading

    import optuna

    import rl_transformers as rlt

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the trainer's graceful Ctrl-C handler is installed in the main thread only")
    real = rlt.train_ppo

    def signalled(cfg, run_dir, callback):
        def first_update_then_ctrl_c(trainer):
            verdict = callback(trainer)
            os.kill(os.getpid(), signal.SIGINT)  # the trainer stops after this update
            return verdict

        return real(cfg, run_dir, callback=first_update_then_ctrl_c)

    cfg = tiny(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(rlt, "train_ppo", signalled)
        with pytest.raises(KeyboardInterrupt, match="trial 0 stopped by a signal at step 16"):
            run_tuning(cfg, log=lambda _: None)
    study = open_study(cfg, GRU)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]
    resumed = run_tuning(cfg, log=lambda _: None)
    states = [t.state for t in resumed.trials]
    assert states == [optuna.trial.TrialState.FAIL] + [optuna.trial.TrialState.COMPLETE] * 2


def test_a_study_refuses_other_settings_when_reopened(tmp_path) -> None:
    open_study(tiny(tmp_path), GRU)
    open_study(tiny(tmp_path, n_trials=5, threads=2), GRU)  # per-invocation fields may change
    with pytest.raises(UserError, match="total_timesteps: stored 48, now 64"):
        open_study(tiny(tmp_path, total_timesteps=64), GRU)


@pytest.mark.parametrize(
    ("space", "flag"),
    [
        (dict(learning_rate=(1e-2, 1e-4)), "--space.learning-rate"),
        (dict(learning_rate=(0.0, 1e-3)), "--space.learning-rate"),
        (dict(ent_coef=(0.1,)), "--space.ent-coef"),
        (dict(seq_len=()), "--space.seq-len"),
        (dict(seq_len=(8, 8)), "--space.seq-len"),
        (dict(knob=(16, 4)), "--space.knob"),
    ],
    ids=["lr-reversed", "lr-zero", "ent-one-bound", "no-window", "window-twice", "knob-reversed"],
)
def test_a_bad_search_space_is_refused_with_the_flag(space, flag) -> None:
    with pytest.raises(UserError, match=flag.replace(".", r"\.")):
        SearchSpace(**space)


def test_a_space_the_encoder_or_ppo_cannot_run_is_refused_before_any_trial(tmp_path) -> None:
    with pytest.raises(
        UserError, match=r"training windows \[3\] do not divide --ppo.num-steps 8; valid: \[1, 2, 4, 8\]"
    ):
        run_tuning(tiny(tmp_path, space=SearchSpace(seq_len=(4, 3))), log=lambda _: None)
    with pytest.raises(UserError, match=r"encoder .policy=mlp. has no context knob; drop --space\.knob"):
        run_tuning(tiny(tmp_path, encoder="policy=mlp"), log=lambda _: None)
    with pytest.raises(UserError, match="did you mean 'gtrxl'"):
        run_tuning(tiny(tmp_path, encoder="gtrx"), log=lambda _: None)
    assert list(tmp_path.iterdir()) == []  # no study was created


def test_tuning_seeds_are_disjoint_from_the_test_seeds() -> None:
    seeds = {tuning_seed(n) for n in range(0, MAX_TRIALS, 997)} | {tuning_seed(MAX_TRIALS - 1)}
    assert not seeds & set(TEST_SEEDS)
    assert set(TEST_SEEDS) >= {0, 1, 2}  # the study's seeds
    with pytest.raises(AssertionError, match="disjoint"):
        check_disjoint((5,), TEST_SEEDS)  # the check bites
    with pytest.raises(ValueError, match="outside"):
        tuning_seed(MAX_TRIALS)


@pytest.mark.parametrize(
    ("spec", "name", "read"),
    [
        ("", "mem_len", lambda p: p.backbone_config.options("memory").mem_len),
        (
            "attention=full;position=rope;memory=None",
            "max_cache",
            lambda p: p.backbone_config.options("attention").max_cache,
        ),
        (
            "attention=local;position=rope;memory=None",
            "window",
            lambda p: p.backbone_config.options("attention").window,
        ),
        ("memory=knn", "store_size", lambda p: p.backbone_config.options("memory").store_size),
        (GRU, "hidden_size", lambda p: p.core.d_out),
    ],
    ids=["gtrxl", "full", "local", "knn", "gru"],
)
def test_the_context_knob_reaches_the_built_policy(spec, name, read) -> None:
    from gymnasium import spaces

    from rl_transformers.policies.gtrxl import make_policy

    knob = context_knob(spec)
    assert knob is not None and knob.name == name
    space = spaces.Discrete(4)
    assert read(make_policy(policy_config(spec), space, space)) == knob.default
    assert read(make_policy(policy_config(knob.apply(spec, 23)), space, space)) == 23
    assert (
        context_knob("policy=mlp") is None
        and context_knob("attention=linear;position=rope;memory=None") is None
    )


def test_the_best_trials_command_trains_the_tuned_configuration(tmp_path) -> None:
    import tyro

    from rl_transformers.backbone.cli import cli_registry

    knob = context_knob("memory=compressive;d_ff=128")
    spec = knob.apply("memory=compressive;d_ff=128", 40)
    params = {"learning_rate": 1.5e-4, "ent_coef": 0.003, "seq_len": 4, "mem_len": 40}
    cfg = tiny(
        tmp_path, ppo=PPOConfig(num_steps=8, seq_len=8, num_minibatches=1, update_epochs=1, anneal_lr=False)
    )
    args = shlex.split(train_command(cfg, spec, params))
    assert args[:2] == ["python", "scripts/train_gtrxl.py"]
    parsed = tyro.cli(TrainConfig, args=args[2:], registry=cli_registry())
    assert parsed.policy == policy_config(spec)
    assert parsed.policy.backbone.options("memory").mem_len == 40
    tuned = dataclasses.replace(cfg.ppo, learning_rate=1.5e-4, ent_coef=0.003, seq_len=4)
    assert parsed.ppo == tuned  # searched values and the study's other PPO settings (anneal off included)
    assert (parsed.env_id, parsed.env_kwargs) == ("rlt/TMaze-v0", {"corridor_length": 2})
    assert (parsed.total_timesteps, parsed.num_envs) == (48, 2)


def test_a_tuned_width_keeps_the_policy_within_the_parameter_tolerance(tmp_path) -> None:
    """Without --space.knob the GRU's hidden size is searched only where the policy's parameter count stays
    within 10 % of the encoder's (counted here by building each policy); the range is stored with the study."""
    from rl_transformers.study.encoders import ppo_parameters
    from rl_transformers.tune.tuner import resolve_encoder, with_capacity_range

    env = "rlt/popgym-RepeatPreviousEasy-v0"
    cfg = dataclasses.replace(tiny(tmp_path), encoder="gru", env_id=env, env_kwargs={}, space=SearchSpace())
    spec = resolve_encoder("gru")
    knob = context_knob(spec)
    said: list[str] = []
    resolved = with_capacity_range(cfg, spec, knob, said.append)
    assert resolved.space.knob is not None
    low, high = resolved.space.knob

    def count(width: int) -> int:
        return ppo_parameters(knob.apply(spec, width), env)

    ref = count(knob.default)
    assert low < knob.default < high
    assert all(abs(count(v) - ref) <= 0.1 * ref for v in (low, high))
    assert abs(count(low - 1) - ref) > 0.1 * ref and abs(count(high + 1) - ref) > 0.1 * ref
    assert f"hidden_size searched in [{low}, {high}]" in said[0]
    assert resolved.settings()["space"]["knob"] == [low, high]  # stored: a resumed study searches the same
    wide = dataclasses.replace(cfg, space=SearchSpace(param_tolerance=None))
    assert with_capacity_range(wide, spec, knob) == wide  # the old half-to-twice range


def test_trials_tied_at_the_best_value_go_to_the_one_that_got_there_sooner() -> None:
    import optuna
    from optuna.distributions import FloatDistribution

    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}
    for curve in ([0.0, 0.5, 1.0], [0.5, 1.0, 1.0], [0.0, 0.0, 0.9], [0.5, 1.0, 1.0]):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": 0.5}, distributions=dist, value=curve[-1],
                intermediate_values=dict(enumerate(curve)),
            )
        )  # fmt: skip
    assert best_trial(study).number == 1  # 1.0 like trials 0 and 3, a higher mean than 0, earlier than 3


def test_the_pruner_waits_a_third_of_the_budget_by_default_as_rl_zoo(tmp_path) -> None:
    study = open_study(tiny(tmp_path), GRU)  # 48 env steps per trial
    assert warmup_steps(48, tiny(tmp_path).pruner_warmup_steps) == 16 and study.pruner._n_warmup_steps == 16
    assert warmup_steps(48, 0) == 0  # from the first evaluation, when asked
    with pytest.raises(UserError, match="pruner-warmup-steps"):
        tiny(tmp_path, pruner_warmup_steps=-1)
