"""One lifecycle, two trainers: every test runs against PPO and the Decision Transformer (``family`` fixture).

Resume continues bit-exactly, Ctrl-C saves and stops, a non-finite loss stops with the last good checkpoint
kept, a checkpoint is written before each evaluation, the parameter count is printed and logged, and the final
summary reports the values that were logged; each invocation leaves its provenance record."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from rl_transformers.runs.checkpoint_load import load_checkpoint
from rl_transformers.runs.lifecycle import summary_text
from rl_transformers.runs.provenance import read_invocations
from rl_transformers.utils import GracefulInterrupt, NonFiniteError
from rl_transformers.utils.params import count_parameters
from tests.runs.conftest import Family, progress, replace


def weights(family: Family, run_dir: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / name)[family.weights_key]


def saved_step(run_dir: Path) -> int:
    return json.loads((run_dir / "checkpoints" / "index.json").read_text())["last"]["step"]


def test_resume_continues_bit_exactly(family: Family, tmp_path: Path) -> None:
    straight = family.train(family.make(tmp_path / "straight", 6))
    stop_at_3 = lambda tr: family.iteration(tr) < 3  # noqa: E731  (False stops the run)
    first = family.train(family.make(tmp_path / "split", 6), callback=stop_at_3)
    assert first.interrupted and first.step == 3 * family.unit == saved_step(first.run_dir)
    resumed = family.train(replace(family.make(tmp_path / "split", 6), resume=first.run_dir))
    assert resumed.run_dir == first.run_dir and resumed.step == 6 * family.unit and not resumed.interrupted
    ws, wr = weights(family, straight.run_dir), weights(family, resumed.run_dir)
    assert ws.keys() == wr.keys() and all(torch.equal(ws[k], wr[k]) for k in ws)
    assert progress(resumed.run_dir) == progress(straight.run_dir)  # the curve continues, same values
    invocations = read_invocations(resumed.run_dir)  # one provenance record per invocation
    assert [r["start_step"] for r in invocations] == [0, 3 * family.unit]
    assert all(r["torch_version"] == torch.__version__ and "git_sha" in r for r in invocations)


def test_ctrl_c_saves_and_stops(family: Family, tmp_path: Path) -> None:
    def interrupt(trainer) -> None:
        if family.iteration(trainer) == 2:
            # only under the trainer's handler: outside it SIGINT would interrupt the pytest worker itself
            assert isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), GracefulInterrupt)
            os.kill(os.getpid(), signal.SIGINT)  # GracefulInterrupt: finish the iteration, save, stop

    result = family.train(family.make(tmp_path, 6), callback=interrupt)
    assert result.interrupted and result.step == 2 * family.unit
    assert saved_step(result.run_dir) == 2 * family.unit
    assert [r["step"] for r in progress(result.run_dir)][-1] == 2 * family.unit


def test_non_finite_stop_keeps_the_last_good_checkpoint(family: Family, tmp_path: Path, capsys) -> None:
    def poison(trainer) -> None:  # after iteration 2 is saved: the next update's loss is NaN
        if family.iteration(trainer) == 2:
            with torch.no_grad():
                for p in family.model(trainer).parameters():
                    p.fill_(float("nan"))

    with pytest.raises(NonFiniteError):
        family.train(family.make(tmp_path, 6, save_every=1), callback=poison)
    err = capsys.readouterr().err
    assert "non-finite" in err and "The last good checkpoint is" in err
    run = next(tmp_path.glob("*/*/*"))
    assert saved_step(run) == 2 * family.unit  # iteration 3 never saved
    assert str(run / "checkpoints" / "last.pt") in err
    assert all(torch.isfinite(v).all() for v in weights(family, run).values() if v.is_floating_point())


def test_checkpoint_is_written_before_evaluating(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_transformers.algos.dt import DTTrainer
    from rl_transformers.algos.ppo import PPOTrainer

    def boom(self):
        raise RuntimeError("evaluation broke")

    monkeypatch.setattr(PPOTrainer if family.name == "ppo" else DTTrainer, "_evaluation", boom)
    with pytest.raises(RuntimeError, match="evaluation broke"):
        family.train(family.make(tmp_path, 6, eval_every=2))
    run = next(tmp_path.glob("*/*/*"))
    assert load_checkpoint(run / "checkpoints" / "last.pt")[family.weights_key]
    assert saved_step(run) == 2 * family.unit  # the evaluated step was saved first


def test_parameter_count_printed_and_logged(family: Family, tmp_path: Path, capsys) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import rl_transformers as rlt

    result = family.train(family.make(tmp_path, 1))
    agent = rlt.load(result.run_dir)
    model = agent.policy if family.name == "ppo" else agent.model
    n = sum(p.numel() for p in model.parameters())  # rebuilt from the checkpoint, counted here
    assert n == count_parameters(model, trainable_only=False) > 0
    assert f"{n:,} parameters" in capsys.readouterr().out
    acc = EventAccumulator(str(result.run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("run/summary/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n"))["n_parameters"] == n


def test_final_summary_is_the_last_logged_value(family: Family, tmp_path: Path) -> None:
    result = family.train(family.make(tmp_path, 4, eval_every=2))
    rows = progress(result.run_dir)
    assert result.metrics, "no headline metric was logged"
    for tag, value in result.metrics.items():
        assert value == [r[tag] for r in rows if tag in r][-1], tag
    assert family.loss_tag in result.metrics or "rollout/ep_rew_mean" in result.metrics
    eval_tags = [t for t in result.metrics if t.startswith(family.eval_prefix)]
    assert eval_tags and all(result.metrics[t] == result.evaluations[4 * family.unit][t] for t in eval_tags)
    summary = json.loads(summary_text(result))
    assert summary["metrics"] == result.metrics and summary["step"] == 4 * family.unit
    assert summary["run_dir"] == str(result.run_dir) and summary["algo"] == family.name
    # each number names the step it was logged at and the checkpoint of that step
    for tag in result.metrics:
        assert summary["sources"][tag]["step"] == [r["step"] for r in rows if tag in r][-1], tag
    assert all(summary["sources"][t] == {"step": 4 * family.unit, "checkpoint": "last.pt"} for t in eval_tags)


def _rising_evaluation(family: Family, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each evaluation scores the trainer's step: the last one evaluated is the best."""
    from rl_transformers.algos.dt import DTTrainer
    from rl_transformers.algos.ppo import PPOTrainer

    def rising(self):
        step = float(family.iteration(self) * family.unit)
        return {family.best_tag: step}, step

    monkeypatch.setattr(PPOTrainer if family.name == "ppo" else DTTrainer, "_evaluation", rising)


def test_the_final_policy_is_evaluated_and_can_be_best(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5 iterations, evaluated every 2: at 2, 4 and the end (5); best.pt holds the final model when it scores
    best, and the summary says so."""
    _rising_evaluation(family, monkeypatch)
    result = family.train(family.make(tmp_path, 5, eval_every=2))
    u = family.unit
    assert sorted(result.evaluations) == [2 * u, 4 * u, 5 * u]
    run = result.run_dir
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert best["checkpoint_meta"]["step"] == 5 * u
    assert json.loads((run / "checkpoints" / "index.json").read_text())["best"]["step"] == 5 * u
    assert result.best == {
        "checkpoint": "best.pt",
        "step": 5 * u,
        "tag": result.best["tag"],
        "value": 5.0 * u,
    }
    assert result.best["tag"].startswith(family.eval_prefix.rstrip("@"))


def test_ppo_final_evaluation_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-eval-final keeps evaluations at multiples of eval_every (the encoder study's protocol): best.pt is
    then the step-4 model, and the summary's evaluation comes from step 4, not the last checkpoint."""
    from rl_transformers.algos.ppo import train
    from tests.runs.conftest import PPO_BATCH, _ppo_config

    family = Family("ppo", PPO_BATCH, _ppo_config, train, "policy", "train/loss", "train_gtrxl.py")
    _rising_evaluation(family, monkeypatch)
    result = train(_ppo_config(tmp_path, 5, eval_every=2, eval_final=False))
    u = PPO_BATCH
    assert sorted(result.evaluations) == [2 * u, 4 * u]
    assert result.best is not None and result.best["step"] == 4 * u
    assert result.sources["eval/mean_reward"]["step"] == 4 * u
    assert result.sources["eval/mean_reward"]["checkpoint"] == "best.pt"  # step_<4u>.pt too, best.pt named


def test_stop_at_stops_at_the_first_evaluation_that_reaches_it(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Evaluated every iteration, each scoring its step: --stop-at 3u stops after iteration 3 with last.pt that
    policy, reported as a reached target, not as an interruption."""
    _rising_evaluation(family, monkeypatch)
    u = family.unit
    result = family.train(family.make(tmp_path, 6, eval_every=1, stop_at=3.0 * u))
    assert result.target_reached and not result.interrupted
    assert result.step == 3 * u == saved_step(result.run_dir)
    assert sorted(result.evaluations) == [u, 2 * u, 3 * u]
    assert json.loads(summary_text(result))["target_reached"] is True
    assert f"--stop-at {3.0 * u:g} reached at step {3 * u}" in capsys.readouterr().err
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["stop_at"] == 3.0 * u


def test_stop_at_not_reached_runs_the_whole_budget(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rising_evaluation(family, monkeypatch)
    u = family.unit
    result = family.train(family.make(tmp_path, 4, eval_every=1, stop_at=4.5 * u))
    assert not result.target_reached and not result.interrupted and result.step == 4 * u


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stop_at": 0.9}, "--eval-every is 0"),
        ({"stop_at": float("nan"), "eval_every": 1}, "finite"),
        ({"stop_at": "high", "eval_every": 1}, "expected a number"),
    ],
)
def test_stop_at_without_evaluations_or_a_number_is_refused(
    family: Family, tmp_path: Path, overrides: dict, message: str
) -> None:
    from rl_transformers.utils.errors import UserError

    with pytest.raises(UserError, match=message):
        family.make(tmp_path, 2, **overrides)
