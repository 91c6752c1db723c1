"""Segment-level recurrence for the Decision Transformer (``--segments N``; RATE, Cherepanov et al. 2023, arXiv
2306.09459).

References are independent of the segment code: one forward pass over the whole N·K window (float64, no state),
a training step written out by hand (today's single-window update), and the T-Maze's own success flag. The
learning test builds a tiny T-Maze dataset with ``offline_data.memory_build``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401  (registers rlt/ ids)
from rl_transformers import tags as T
from rl_transformers.algos.dt import DTTrainer, train
from rl_transformers.algos.dt_checkpoint import load_policy
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.dt_data import DTBatch, TrajectoryDataset, segment_backward
from rl_transformers.algos.dt_setup import target_label
from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config
from rl_transformers.policies.dt_rollout import DTAgent
from rl_transformers.runs.distributed import DistContext
from rl_transformers.utils import linear_warmup
from rl_transformers.utils.errors import UserError

K, N = 3, 3


@dataclass(frozen=True)
class Ep:
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray


def episodes(seed: int = 0, lengths: tuple[int, ...] = (4, 9, 11, 2, 7)) -> list[Ep]:
    rng = np.random.default_rng(seed)
    return [Ep(rng.normal(size=(n, 3)), rng.uniform(-1, 1, size=(n, 2)), rng.normal(size=n)) for n in lengths]


def memory_model(mem_len: int, segments: int = N, memory: str = "xl", **options: int) -> DecisionTransformer:
    torch.manual_seed(0)
    backbone = dt_backbone_config(
        d_model=16,
        n_layers=2,
        n_heads=2,
        dropout=0.0,
        memory=memory,
        memory_options={"mem_len": mem_len, **options},
    )
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    obs = gym.spaces.Box(-np.inf, np.inf, (3,))
    return DecisionTransformer(
        obs, box, backbone, K, 32, return_scale=0.1, segments=segments, embed_dropout=0.0
    )


def full_window(segments: list[DTBatch]) -> DTBatch:
    return DTBatch(*(torch.cat([getattr(s, f) for s in segments], dim=1) for f in DTBatch.fields()))


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


# -- exactness --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("covered", [True, False], ids=["memory-covers", "memory-short"])
def test_segment_loss_equals_one_pass_float64(covered: bool) -> None:
    """Segments with carried xl memory covering the window give the one-pass loss (float64); a memory one step
    short of the window does not (the test can fail)."""
    mem_len = 3 * K * (N - 1) - (0 if covered else 3)
    model = memory_model(mem_len).double()
    data = TrajectoryDataset(episodes(), discrete_actions=False)
    segments = data.sample_segments(6, K, N, np.random.default_rng(1))
    segments = [
        DTBatch(*(t.double() if t.is_floating_point() else t for t in (getattr(s, f) for f in s.fields())))
        for s in segments
    ]
    model.zero_grad()
    terms = segment_backward(model, model, segments, lambda name: 1.0)
    segmented_grads = grads(model).clone()

    whole = full_window(segments)
    assert whole.mask[:, 0].all() and (~whole.mask).any()  # real windows, and padding in the batch
    model.zero_grad()
    out = model(**whole.model_inputs(), return_state=True)
    reference = model.action_loss(out.predictions, whole.actions, whole.mask)
    reference.backward()
    if covered:
        torch.testing.assert_close(terms["loss"], reference.detach(), rtol=0, atol=1e-12)
        # The memory is detached at segment boundaries: the gradient is not the one-pass gradient.
        assert not torch.allclose(segmented_grads, grads(model), rtol=0, atol=1e-9)
    else:
        assert abs(float(terms["loss"]) - float(reference.detach())) > 1e-9


def test_compressive_segments_train() -> None:
    """The compressive memory carries across segments too: finite loss, finite gradients, its aux losses."""
    model = memory_model(6, memory="compressive", cmem_len=4, rate=2)
    data = TrajectoryDataset(episodes(), discrete_actions=False)
    terms = segment_backward(
        model, model, data.sample_segments(4, K, N, np.random.default_rng(0)), lambda n: 1.0
    )
    assert torch.isfinite(terms["loss"]) and torch.isfinite(grads(model)).all()
    assert terms["aux"], "the compressive memory reports its local losses"


# -- sampling ---------------------------------------------------------------------------------------------------
def test_segments_are_consecutive_and_aligned() -> None:
    data = TrajectoryDataset(episodes(), discrete_actions=False)
    segments = data.sample_segments(256, K, N, np.random.default_rng(3))
    whole = full_window(segments)
    first = whole.timesteps[:, 0]
    assert (first % K == 0).all()  # a window starts where a rollout segment starts
    n_real = whole.mask.sum(1)
    for row in range(len(first)):
        real = whole.timesteps[row, : n_real[row]]
        assert torch.equal(real, first[row] + torch.arange(int(n_real[row])))  # consecutive steps
        assert whole.mask[row, : n_real[row]].all() and not whole.mask[row, n_real[row] :].any()
    # Episodes of 4, 2 and 7 <= N·K steps always start at 0; the 11-step one (4 segments) at 0 or K.
    assert set(first.tolist()) == {0, K}


# -- configuration ----------------------------------------------------------------------------------------------
def test_segments_need_memory_and_right_padding() -> None:
    with pytest.raises(UserError, match=r"--backbone.memory is None; choose one of .*xl"):
        DTConfig(dataset="x", segments=2)
    with pytest.raises(UserError, match="--padding right"):
        DTConfig(dataset="x", segments=2, padding="left", backbone=dt_backbone_config(memory="xl"))
    model = memory_model(12)
    assert DecisionTransformer.from_kwargs(model.init_kwargs()).segments == N
    assert "segments" not in memory_model(12, segments=1).init_kwargs()  # older checkpoints' kwargs unchanged


# -- rollout ----------------------------------------------------------------------------------------------------
def test_agent_carries_memory_like_one_pass() -> None:
    """The agent's segment mode (memory covering the episode) predicts what one pass over the whole history does,
    with two envs whose episodes start at different times."""
    steps = 10
    model = memory_model(3 * steps).double()
    agent = DTAgent(model, 2, target_return=3.0)
    rng = np.random.default_rng(0)
    history: list[list[tuple[float, np.ndarray, np.ndarray]]] = [[], []]
    rtg = np.array([3.0, 3.0])
    for t in range(steps):
        obs = rng.normal(size=(2, 3)).astype(np.float32)
        actions = agent.act(obs)
        assert agent.last_mode == "segment"
        for env in range(2):
            history[env].append((rtg[env], obs[env], actions[env]))
            rtg_seq = torch.tensor([h[0] for h in history[env]], dtype=torch.float32)[None]
            obs_seq = torch.tensor(np.stack([h[1] for h in history[env]]))[None]
            act_seq = torch.tensor(np.stack([h[2] for h in history[env]]), dtype=torch.float32)[None]
            act_seq[0, -1] = 0  # the current action is not known yet
            ts = torch.arange(len(history[env]))[None]
            with torch.no_grad():
                ref = model(
                    rtg_seq, obs_seq, act_seq, ts, torch.ones_like(ts, dtype=torch.bool), return_state=True
                )
            np.testing.assert_allclose(actions[env], ref.predictions[0, -1].numpy(), rtol=0, atol=1e-10)
        rewards = rng.normal(size=2)
        rtg = rtg - rewards
        done = np.array([False, t == 3])  # env 1 starts a new episode after 4 steps
        agent.observe(rewards, done)
        if done[1]:
            history[1], rtg[1] = [], 3.0
    assert agent.calls["segment"] == steps


# -- the trainer ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tmaze(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets

    root = tmp_path_factory.mktemp("minari")
    config = MemoryBuildConfig(
        task="tmaze", memory_lengths=(5,), num_episodes=200, num_ref_episodes=4, root=root, progress=False
    )
    (built,) = build_memory_datasets(config)
    return built.dataset_id, root


def tmaze_config(tmaze: tuple[str, Path], tmp_path: Path, **overrides: object) -> DTConfig:
    dataset, root = tmaze
    base: dict[str, object] = dict(
        dataset=dataset,
        dataset_root=root,
        backbone=dt_backbone_config(d_model=32, n_layers=1, n_heads=2, dropout=0.0),
        embed_dropout=0.0,
        context_len=2,
        total_steps=3,
        batch_size=16,
        warmup_steps=5,
        learning_rate=1e-3,
        eval_episodes=0,
        log_every=1000,
        save_every=1000,
        run_root=tmp_path / "runs",
        progress=False,
        seed=0,
    )
    base.update(overrides)
    return DTConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("memory", [None, "xl"], ids=["plain", "xl-memory"])
def test_one_segment_is_todays_step_bit_for_bit(tmaze, tmp_path: Path, memory: str | None) -> None:
    """``--segments 1`` is the single-window update, written out here by hand (same data stream)."""
    backbone = dt_backbone_config(d_model=32, n_layers=1, n_heads=2, dropout=0.0, memory=memory)
    config = tmaze_config(tmaze, tmp_path, backbone=backbone, segments=1)
    check_hand_written_updates(
        config, lambda data, rng: data.sample(config.batch_size, config.context_len, rng, config.padding)
    )


def check_hand_written_updates(config: DTConfig, sample: Callable[[TrajectoryDataset, Any], DTBatch]) -> None:
    """The trainer's updates equal the plain update written out here on ``sample``'s batches (same stream)."""
    trainer = DTTrainer(config, DistContext(), torch.device("cpu"))
    model = copy.deepcopy(trainer.model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay, fused=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup(s, config.warmup_steps))
    rng = np.random.default_rng([config.seed, 0])
    for _ in range(config.total_steps):
        trainer.update()
        batch = sample(trainer.data, rng)
        out = model(**batch.model_inputs())
        loss = model.action_loss(out.predictions, batch.actions, batch.mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
    for (name, p), q in zip(trainer.model.named_parameters(), model.parameters()):
        assert torch.equal(p, q), name
    trainer.close()


def success_rate(model: DecisionTransformer, corridor: int, episodes: int = 20) -> float:
    """T-Maze success over ``episodes`` (half with the goal north, half south: a memoryless policy gets 0.5)."""
    env = gym.make("rlt/TMaze-v0", corridor_length=corridor)
    agent = DTAgent(model, 1, target_return=1.0)
    wins = 0
    for i in range(episodes):
        obs, _ = env.reset(seed=i, options={"goal": 1 if i % 2 else -1})
        agent.reset()
        done, info = False, dict[str, object]()
        while not done:
            obs, reward, terminated, truncated, info = env.step(int(agent.act(obs[None])[0]))
            agent.observe(float(reward))
            done = terminated or truncated
        wins += bool(info.get("success"))
    env.close()
    return wins / episodes


LEARN = dict(total_steps=300, batch_size=32, learning_rate=3e-3)
"""Corridor 5 (cue at t = 0, used at t = 5), K = 2, 300 updates: about 3 s (plain) to 10-20 s (segments) on one
loaded core; seeds 0-3 all gave 0.50 (plain) and 1.00 (xl segments)."""


def test_plain_dt_misses_the_cue(tmaze, tmp_path: Path) -> None:
    """K = 2 without memory: at the junction the cue is 5 steps back, out of the window: a coin flip at best."""
    plain = train(tmaze_config(tmaze, tmp_path, **LEARN)).model
    assert plain is not None
    assert success_rate(plain, 5) <= 0.5


@pytest.mark.parametrize(
    ("memory", "options"),
    [
        pytest.param("xl", {"mem_len": 12}, id="xl"),  # 2 segments of 6 tokens: the window
        pytest.param(
            "compressive", {"mem_len": 6, "cmem_len": 6, "rate": 2}, id="compressive", marks=pytest.mark.slow
        ),
        # A local window of 3 tokens: segment 0's cue reaches the junction only through the compressed memory
        # (compressive) or the kNN store (knn).
        pytest.param("knn", {"mem_len": 3, "store_size": 32, "top_k": 8}, id="knn", marks=pytest.mark.slow),
    ],
)
def test_segment_memory_reaches_the_cue(tmaze, tmp_path: Path, memory: str, options: dict[str, int]) -> None:
    """K = 2 with 3 segments and a carried memory sees the cue, in training and in the rollout."""
    backbone = dt_backbone_config(
        d_model=32, n_layers=1, n_heads=2, dropout=0.0, memory=memory, memory_options=options
    )
    evaluation = dict(eval_episodes=10, eval_envs=5) if memory == "xl" else {}  # the trainer's rollouts too
    result = train(tmaze_config(tmaze, tmp_path, backbone=backbone, segments=3, **LEARN, **evaluation))
    assert result.run_dir is not None
    if evaluation:  # 10 episodes from the trainer's evaluation (DTAgent in segment mode, 5 envs at once)
        assert result.metrics[f"{T.EVAL_RETURN_MEAN}{target_label(1.0)}"] >= 0.9
    segmented = load_policy(result.run_dir)  # the checkpoint keeps segments: its rollout carries the memory
    assert segmented.segments == 3
    assert success_rate(segmented, 5) >= 0.9


# -- aligned windows (--window-starts aligned) ------------------------------------------------------------------
def test_aligned_windows_start_at_multiples_of_k(tmaze, tmp_path: Path) -> None:
    """Aligned windows start at j·K (timestep of the first real step), never elsewhere; with K ≥ T every window
    is its whole episode from t = 0 (the cue is in every window). Uniform starts do fall elsewhere."""
    trainer = DTTrainer(tmaze_config(tmaze, tmp_path), DistContext(), torch.device("cpu"))
    data = trainer.data
    rng = np.random.default_rng(0)
    for k in (2, 4):
        (batch,) = data.sample_segments(256, k, 1, rng)
        first = batch.timesteps[:, 0]
        assert batch.mask[:, 0].all() and (first % k == 0).all() and len(set(first.tolist())) > 1
    (whole,) = data.sample_segments(64, 6, 1, rng)  # corridor 5: 6 steps per episode
    assert (whole.timesteps[:, 0] == 0).all() and whole.mask.all()
    uniform = data.sample(256, 4, rng, "right")
    assert (uniform.timesteps[:, 0] % 4 != 0).any()
    trainer.close()


def test_aligned_update_is_the_hand_written_step(tmaze, tmp_path: Path) -> None:
    """``--window-starts aligned`` trains on ``sample_segments(B, K, 1)`` windows with the usual update (written
    out here by hand on the same data stream)."""
    config = tmaze_config(tmaze, tmp_path, window_starts="aligned", context_len=3)
    check_hand_written_updates(
        config, lambda data, rng: data.sample_segments(config.batch_size, config.context_len, 1, rng)[0]
    )


def test_aligned_windows_need_right_padding(tmaze, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"window_starts.*--padding right"):
        tmaze_config(tmaze, tmp_path, window_starts="aligned", padding="left")


def test_context_covering_the_corridor_reaches_the_cue(tmaze, tmp_path: Path) -> None:
    """K = 6 covers corridor 5 (6 steps) and aligned windows put the cue in every window: the plain DT (no
    memory) reads the cue at the junction; the trainer's success rate (the T-Maze's ``success`` flag) agrees
    with the hand-counted one."""
    config = tmaze_config(
        tmaze, tmp_path, context_len=6, window_starts="aligned", eval_episodes=10, eval_envs=5, **LEARN
    )
    result = train(config)
    assert result.model is not None
    assert result.metrics[f"{T.EVAL_SUCCESS_RATE}{target_label(1.0)}"] >= 0.9
    steps = [json.loads(line) for line in (result.run_dir / "progress.jsonl").read_text().splitlines()]
    assert [s[T.EVAL_SUCCESS_RATE] for s in steps if T.EVAL_SUCCESS_RATE in s][-1] >= 0.9
    assert success_rate(result.model, 5) >= 0.9
