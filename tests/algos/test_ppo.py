"""PPO end to end on tiny settings: every action-space kind and core, determinism, bit-exact resume,
TensorBoard tags, Ctrl-C and NaN behaviour, and data-parallel training with 2 gloo ranks."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
import torch

from rl_transformers.algos.ppo import PPOTrainer, train
from rl_transformers.algos.ppo_checkpoint import load_policy
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone
from rl_transformers.runs.checkpoint_load import load_checkpoint
from rl_transformers.runs.distributed import parameter_checksum
from rl_transformers.utils import GracefulInterrupt, NonFiniteError
from rl_transformers.utils.errors import UserError

BATCH = 2 * 16  # num_envs * num_steps


def tiny(
    tmp_path: Path, env_id: str = "rlt/TMazeShort-v0", updates: int = 4, kind: str = "transformer", **kw
) -> TrainConfig:
    return TrainConfig(
        env_id=env_id,
        total_timesteps=updates * BATCH,
        num_envs=2,
        seed=3,
        policy=PolicyConfig(kind=kind, backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),  # type: ignore[arg-type]
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=2, info_every=1),
        run_root=str(tmp_path),
        progress=False,
        **kw,
    )


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["policy"]


def progress(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "env_id,kind",
    [
        ("rlt/TMazeShort-v0", "transformer"),  # Discrete
        ("rlt/RepeatPreviousMulti-v0", "transformer"),  # MultiDiscrete
        ("rlt/ContinuousRecall-v0", "transformer"),  # Box
        ("rlt/TMazeShort-v0", "lstm"),
        ("rlt/TMazeShort-v0", "mlp"),
    ],
    ids=["discrete", "multidiscrete", "box", "lstm", "mlp"],
)
def test_learn_runs(tmp_path: Path, env_id: str, kind: str) -> None:
    result = train(tiny(tmp_path, env_id, updates=8, kind=kind))
    assert result.step == 8 * BATCH
    run = result.run_dir
    assert run is not None and run.parent == tmp_path / "ppo" / env_id.replace("/", "-")
    assert run.name.endswith("-s3")
    saved = json.loads((run / "config.json").read_text())
    assert saved["env_id"] == env_id and saved["policy"]["kind"] == kind
    rows = progress(run)
    assert [r["step"] for r in rows] == [BATCH * (i + 1) for i in range(8)]
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in rows)
    assert result.episode_returns  # episodes finished and were counted
    policy, cfg = load_policy(run)
    assert cfg == tiny(tmp_path, env_id, updates=8, kind=kind)
    assert all(torch.equal(v, final_params(run)[k]) for k, v in policy.state_dict().items())


def test_seeded_runs_are_identical(tmp_path: Path) -> None:
    a = train(tiny(tmp_path / "a"))
    b = train(tiny(tmp_path / "b"))
    keys = ("train/loss", "train/approx_kl", "train/value_loss", "rollout/ep_rew_mean")
    rows_a, rows_b = progress(a.run_dir), progress(b.run_dir)
    assert [[r.get(k) for k in keys] for r in rows_a] == [[r.get(k) for k in keys] for r in rows_b]
    pa, pb = final_params(a.run_dir), final_params(b.run_dir)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_resume_continues_bit_exactly(tmp_path: Path) -> None:
    straight = train(tiny(tmp_path / "straight", updates=6))
    first = train(tiny(tmp_path / "split", updates=6), callback=lambda tr: tr.update < 3)  # stop after 3
    assert first.interrupted and first.step == 3 * BATCH
    resumed = train(dataclasses.replace(tiny(tmp_path / "split", updates=6), resume=str(first.run_dir)))
    assert resumed.run_dir == first.run_dir and resumed.step == 6 * BATCH
    ps, pr = final_params(straight.run_dir), final_params(resumed.run_dir)
    assert all(torch.equal(ps[k], pr[k]) for k in ps)
    # the logged curve continues: one row per update, same losses as the straight run
    rows_s, rows_r = progress(straight.run_dir), progress(resumed.run_dir)
    assert [r["step"] for r in rows_r] == [r["step"] for r in rows_s]
    assert [r["train/loss"] for r in rows_r] == [r["train/loss"] for r in rows_s]


def test_resume_runs_the_evaluation_a_kill_cut_short(tmp_path: Path) -> None:
    """The checkpoint of an evaluation step is written before the evaluation: a run killed between the two (the
    checkpoint there, no logged row of that step) and resumed evaluates that step first, as the straight run did."""
    every = dict(eval_every=2 * BATCH, save_every=2 * BATCH, eval_episodes=2)
    straight = train(tiny(tmp_path / "straight", updates=6, **every))
    split = tmp_path / "split"
    shutil.copytree(straight.run_dir, split)
    for name in (f"step_{6 * BATCH}.pt", "last.pt", "best.pt", "index.json"):
        (split / "checkpoints" / name).unlink(missing_ok=True)
    rows = [r for r in progress(split) if r["step"] < 4 * BATCH]  # the kill came before step 4B's row
    (split / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    resume = str(split / "checkpoints" / f"step_{4 * BATCH}.pt")
    resumed = train(dataclasses.replace(tiny(tmp_path / "straight", updates=6, **every), resume=resume))
    assert sorted(resumed.evaluations) == [4 * BATCH, 6 * BATCH]
    evals = {r["step"]: r["eval/mean_reward"] for r in progress(split) if "eval/mean_reward" in r}
    assert evals == {
        r["step"]: r["eval/mean_reward"] for r in progress(straight.run_dir) if "eval/mean_reward" in r
    }


def test_a_separate_critic_trains_saves_and_resumes_bit_exactly(tmp_path: Path) -> None:
    """critic="separate": the twin state goes through rollouts, storage, checkpoints and a resume."""

    def cfg(root: Path) -> TrainConfig:
        base = tiny(root, updates=4)
        return dataclasses.replace(base, policy=dataclasses.replace(base.policy, critic="separate"))

    straight = train(cfg(tmp_path / "straight"))
    first = train(cfg(tmp_path / "split"), callback=lambda tr: tr.update < 2)
    resumed = train(dataclasses.replace(cfg(tmp_path / "split"), resume=str(first.run_dir)))
    ps, pr = final_params(straight.run_dir), final_params(resumed.run_dir)
    assert any(k.startswith("core.critic.") for k in ps) and all(torch.equal(ps[k], pr[k]) for k in ps)
    policy, saved = load_policy(resumed.run_dir)
    assert saved.policy.critic == "separate" and policy.critic.in_features == 16


def test_obs_normalisation_statistics_and_resume(tmp_path: Path) -> None:
    """norm_obs: the statistics count every rollout step, are saved, and resume continues bit-exactly."""

    def cfg(root: Path) -> TrainConfig:
        base = tiny(root, updates=4)
        return dataclasses.replace(base, policy=dataclasses.replace(base.policy, norm_obs=True))

    straight = train(cfg(tmp_path / "straight"))
    policy, _ = load_policy(straight.run_dir)
    assert policy.obs_norm is not None and float(policy.obs_norm.count) == 4 * BATCH
    assert float(policy.obs_norm.var.min()) < 1.0  # TMaze observations are mostly zeros: not the identity
    first = train(cfg(tmp_path / "split"), callback=lambda tr: tr.update < 2)
    resumed = train(dataclasses.replace(cfg(tmp_path / "split"), resume=str(first.run_dir)))
    ps, pr = final_params(straight.run_dir), final_params(resumed.run_dir)
    assert "obs_norm.mean" in ps and all(torch.equal(ps[k], pr[k]) for k in ps)


def test_tensorboard_tags(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(tiny(tmp_path, updates=2, eval_every=BATCH, eval_episodes=2))
    acc = EventAccumulator(str(result.run_dir))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    expected = {
        "rollout/ep_rew_mean",
        "rollout/ep_len_mean",
        "train/loss",
        "train/approx_kl",
        "train/clip_fraction",
        "train/entropy_loss",
        "train/value_loss",
        "train/policy_gradient_loss",
        "train/explained_variance",
        "train/learning_rate",
        "time/fps",
        "eval/mean_reward",
        "eval/mean_ep_length",
        "backbone/gate_openness/layer0",
        "backbone/memory_fill",
    }
    assert expected <= scalars, expected - scalars
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]
    assert (result.run_dir / "checkpoints" / "best.pt").exists()


def test_best_checkpoint_is_the_best_evaluated_model(tmp_path: Path) -> None:
    """Every evaluation saves the evaluated model, so best.pt is the argmax of eval/mean_reward (first on ties)."""
    cfg = tiny(
        tmp_path, "rlt/CartPoleNoVel-v0", updates=6, eval_every=BATCH, eval_episodes=2, keep_checkpoints=10
    )
    result = train(cfg)
    evals = [(r["step"], r["eval/mean_reward"]) for r in progress(result.run_dir)]
    assert len(evals) == 6
    best_step, best_value = max(evals, key=lambda sv: (sv[1], -sv[0]))
    ckpt = result.run_dir / "checkpoints"
    index = json.loads((ckpt / "index.json").read_text())
    assert (index["best"]["step"], index["best"]["metric_value"]) == (best_step, best_value)
    best = load_checkpoint(ckpt / "best.pt")["policy"]
    same_step = load_checkpoint(ckpt / f"step_{best_step}.pt")["policy"]
    assert all(torch.equal(best[k], same_step[k]) for k in best)


def test_ctrl_c_saves_a_checkpoint_and_stops(tmp_path: Path) -> None:
    def interrupt(trainer: PPOTrainer) -> None:
        if trainer.update == 2:
            # only under the trainer's handler: outside it SIGINT would interrupt the pytest worker itself
            assert isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), GracefulInterrupt)
            os.kill(os.getpid(), signal.SIGINT)  # handled by GracefulInterrupt: finish the update, save, stop

    result = train(tiny(tmp_path, updates=6), callback=interrupt)
    assert result.interrupted and result.step == 2 * BATCH
    ckpt = load_checkpoint(result.run_dir)
    assert ckpt["global_step"] == 2 * BATCH and ckpt["update"] == 2


def test_nan_stops_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path: Path, capsys) -> None:
    def poison(trainer: PPOTrainer) -> None:
        if trainer.update == 2:
            with torch.no_grad():
                next(trainer.policy.critic.parameters()).fill_(float("nan"))

    with pytest.raises(NonFiniteError):
        train(tiny(tmp_path, updates=6, save_every=BATCH), callback=poison)
    err = capsys.readouterr().err
    assert "non-finite" in err and "last good checkpoint" in err
    run = next((tmp_path / "ppo").glob("*/*"))
    ckpt = load_checkpoint(run)
    assert ckpt["global_step"] == 2 * BATCH  # the poisoned update 3 never saved
    assert all(torch.isfinite(v).all() for v in ckpt["policy"].values() if v.is_floating_point())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank: int, world: int, port: int, cfg: TrainConfig, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    record = {}

    def snapshot(trainer: PPOTrainer) -> None:
        record["checksum"] = parameter_checksum(trainer.policy)
        record["actions"] = trainer.storage.actions.clone()
        norm = trainer.policy.obs_norm
        if norm is not None:
            record["obs_norm"] = torch.cat([norm.mean.reshape(-1), norm.var.reshape(-1), norm.count.view(1)])

    result = train(cfg, callback=snapshot)
    torch.save({**record, "step": result.step}, Path(out) / f"rank{rank}.pt")


def test_two_gloo_ranks_keep_identical_parameters(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    cfg = tiny(tmp_path, updates=3)
    cfg = dataclasses.replace(
        cfg,
        total_timesteps=3 * BATCH * 2,  # global steps: 3 updates of both ranks
        policy=dataclasses.replace(cfg.policy, norm_obs=True),
    )
    mp.spawn(_rank_worker, args=(2, _free_port(), cfg, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["step"] == r1["step"] == 3 * BATCH * 2
    assert torch.equal(r0["checksum"], r1["checksum"])  # replicas identical after 3 updates
    assert not torch.equal(r0["actions"], r1["actions"])  # ... trained on different data (own envs)
    # observation statistics: merged over both ranks' rollouts, identical on both
    assert torch.equal(r0["obs_norm"], r1["obs_norm"]) and float(r0["obs_norm"][-1]) == 3 * BATCH * 2
    assert len(list((tmp_path / "ppo").glob("*/*"))) == 1  # only rank 0 writes a run directory


def test_cli_parsing_and_config_round_trip() -> None:
    import tyro

    from rl_transformers.backbone.cli import cli_registry
    from rl_transformers.utils.config_json import from_dict, to_jsonable

    args = [
        "--policy",
        "gru",
        "--backbone.attention",
        "linear",
        "--backbone.memory",
        "None",
        "--backbone.position",
        "rope",
        "--backbone.block-options",
        '{"ffn_chunks": 2}',
        "--ppo.seq-len",
        "8",
        "--env-kwargs",
        '{"corridor_length": 3}',
        "--ppo.aux-weights",
        "ponder",
        "0.1",
    ]
    cfg = tyro.cli(TrainConfig, registry=cli_registry(), args=args)
    bb = cfg.policy.backbone
    assert cfg.policy.kind == "gru" and cfg.ppo.seq_len == 8 and cfg.env_kwargs == {"corridor_length": 3}
    assert (bb.attention, bb.memory, bb.position) == ("linear", None, "rope")
    assert "max_cache" not in bb.attention_options  # the default attention's options were dropped
    assert bb.block == "gtrxl" and bb.block_options["ffn_chunks"] == 2
    assert cfg.ppo.aux_weight("ponder") == 0.1 and cfg.ppo.aux_weight("other") == cfg.ppo.aux_coef
    assert from_dict(TrainConfig, json.loads(json.dumps(to_jsonable(cfg)))) == cfg
    with pytest.raises(SystemExit):
        tyro.cli(TrainConfig, registry=cli_registry(), args=["--backbone.memory-options", "not json"])


def test_bad_settings_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of seq_len"):
        PPOConfig(num_steps=20, seq_len=8)
    with pytest.raises(ValueError, match="less than one update"):
        PPOTrainer(dataclasses.replace(tiny(tmp_path), total_timesteps=8))
    with pytest.raises(ValueError, match="num_minibatches=9"):
        PPOTrainer(
            dataclasses.replace(tiny(tmp_path), ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=9))
        )


def test_ppo_loss_hand_computed() -> None:
    import math

    from rl_transformers.algos.ppo_update import ppo_loss
    from rl_transformers.algos.storage import SequenceBatch

    def t(*v: float) -> torch.Tensor:
        return torch.tensor([list(v)], dtype=torch.float64)

    batch = SequenceBatch(
        obs=None,
        actions=None,
        log_probs=t(0, 0),
        values=t(0, 0),
        advantages=t(1, -1),
        returns=t(0.5, 0.5),
        episode_starts=None,
    )
    ppo = PPOConfig(norm_adv=False, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, aux_weights={"x": 0.5})
    new_lp = t(math.log(1.5), math.log(0.5))
    loss, terms = ppo_loss(new_lp, t(1, 3), t(1, -0.1), {"x": torch.tensor(2.0)}, batch, ppo)
    # ratios 1.5, 0.5: pg = mean(max(-1.5, -1.2), max(0.5, 0.8)) = -0.2
    # values: clipped [0.2, -0.1]; 0.5 * mean(max(.25, .09), max(.36, .36)) = 0.1525
    assert terms["pg"] == pytest.approx(-0.2)
    assert terms["v"] == pytest.approx(0.1525)
    assert terms["clip"] == 1.0
    assert terms["kl"] == pytest.approx(((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2)
    assert float(loss) == pytest.approx(-0.2 - 0.01 * 2 + 0.5 * 0.1525 + 0.5 * 2.0)


def test_a_budget_below_one_update_is_a_user_error(tmp_path: Path) -> None:
    """A flag combination a person can fix names the flags and the least budget (no traceback from the CLI)."""
    with pytest.raises(UserError, match=r"--total-timesteps.*use at least 32"):
        train(dataclasses.replace(tiny(tmp_path), total_timesteps=10))
