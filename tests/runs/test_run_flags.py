"""Both training scripts share their run flags (names, types, defaults), print the parameter count at the start
and end with a JSON summary whose metrics are the last logged values; DT's removed flag names are clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.runs.config import RunConfig
from rl_transformers.runs.resume import parse_cli, saved_config
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError
from tests.runs.conftest import progress

ROOT = Path(__file__).resolve().parents[2]
SHARED_FLAGS = ("--run-root", "--verbose", "--threads", "--seed", "--device", "--resume", "--progress")
PPO_TINY = ["--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--ppo.num-minibatches", "2",
            "--ppo.update-epochs", "1", "--backbone.d-model", "16", "--backbone.n-heads", "2",
            "--backbone.n-layers", "1", "--no-progress", "--total-timesteps", "128", "--eval-every", "64",
            "--eval-episodes", "2", "--env-id", "rlt/TMazeShort-v0"]  # fmt: skip
DT_TINY = ["--backbone.d-model", "16", "--backbone.n-layers", "1", "--backbone.n-heads", "2", "--context-len", "4",
           "--batch-size", "8", "--warmup-steps", "2", "--no-progress", "--total-steps", "4", "--log-every", "2",
           "--eval-every", "2", "--eval-episodes", "1"]  # fmt: skip


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.mark.parametrize("name", ["train_gtrxl.py", "train_dt.py"])
def test_help_lists_the_shared_flags(name: str) -> None:
    text = script(name, "--help").stdout
    for flag in (*SHARED_FLAGS, "aux-weights", "aux-coef"):
        assert flag in text, (name, flag)
    for old in ("--runs-dir", "--log-stdout", "--aux-loss-weights"):
        assert old not in text, (name, old)


def test_shared_fields_have_one_name_type_and_default() -> None:
    shared = {f.name: f for f in dataclasses.fields(RunConfig)}
    for cls in (TrainConfig, DTConfig):
        own = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in shared.items():
            assert own[name].type == f.type and own[name].default == f.default, (cls.__name__, name)
    assert RunConfig.threads == 1 and RunConfig.seed == 1 and RunConfig.run_root == Path("runs")
    assert {"aux_coef", "aux_weights"} <= {f.name for f in dataclasses.fields(DTConfig)}
    ppo_fields = {
        f.name for f in dataclasses.fields(TrainConfig.__dataclass_fields__["ppo"].default_factory())
    }
    assert {"aux_coef", "aux_weights"} <= ppo_fields
    assert TrainConfig().eval_every > 0  # a default PPO run logs greedy evaluations
    assert TrainConfig(resume="runs/x").resume == Path("runs/x")  # resume is a Path for both


def test_removed_dt_names_are_clear_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """The pre-0.2 names of DT's run flags (--runs-dir, --log-stdout, --aux-loss-weights) are gone: the flag is
    refused naming it, and a saved config that still uses one is refused naming the field (and the valid ones)."""
    for old in ("--runs-dir", "--log-stdout", "--aux-loss-weights"):
        with pytest.raises(SystemExit) as exit_info:
            parse_cli(DTConfig, argv=["--dataset", "d.hdf5", old, *(["x"] if old == "--runs-dir" else [])])
        assert exit_info.value.code == 2
        assert old in capsys.readouterr().err
    current = to_jsonable(DTConfig(dataset="d.hdf5"))
    assert saved_config(DTConfig, {"config": current}, "ckpt.pt") == DTConfig(dataset="d.hdf5")
    for field, new in (
        ("runs_dir", "run_root"),
        ("log_stdout", "verbose"),
        ("aux_loss_weights", "aux_weights"),
    ):
        legacy = {k: v for k, v in current.items() if k != new} | {field: current[new]}  # a 0.1 config.json
        with pytest.raises(UserError, match=rf"ckpt.pt: invalid config: DTConfig: unknown field '{field}'"):
            saved_config(DTConfig, {"config": legacy}, "ckpt.pt")


@pytest.mark.parametrize("name", ["train_gtrxl.py", "train_dt.py"])
def test_cli_prints_parameters_and_the_logged_metrics(
    name: str, tmp_path: Path, lifecycle_dataset: Path
) -> None:
    import rl_transformers as rlt

    args = PPO_TINY if name == "train_gtrxl.py" else ["--dataset", str(lifecycle_dataset), *DT_TINY]
    out = script(name, *args, "--run-root", str(tmp_path)).stdout
    summary = json.loads(out[out.index("{\n") :])
    run_dir = Path(summary["run_dir"])
    agent = rlt.load(run_dir)
    model = agent.policy if name == "train_gtrxl.py" else agent.model
    assert f"{sum(p.numel() for p in model.parameters()):,} parameters" in out.splitlines()[0]
    rows = progress(run_dir)
    if name == "train_gtrxl.py":
        eval_tags = ["eval/mean_reward"]
    else:  # every target's number, named with its target (the targets as the evaluation file records them)
        targets = [
            e["target"] for e in json.loads((run_dir / "eval" / "step_4.json").read_text())["episodes"]
        ]
        eval_tags = [f"eval/return_mean@{t:g}" for t in targets]
        assert len(targets) == 2 and "eval/return_mean" not in summary["metrics"]
    assert set(eval_tags) <= set(summary["metrics"])
    for tag, value in summary["metrics"].items():
        assert value == [r[tag] for r in rows if tag in r][-1], tag
        assert summary["sources"][tag]["step"] == [r["step"] for r in rows if tag in r][-1], tag
    final = 128 if name == "train_gtrxl.py" else 4
    assert all(summary["sources"][t] == {"step": final, "checkpoint": "last.pt"} for t in eval_tags)
    assert summary["best"]["checkpoint"] == "best.pt" and (run_dir / "checkpoints" / "best.pt").is_file()
    assert summary["best"]["tag"] == ("eval/mean_reward" if name == "train_gtrxl.py" else eval_tags[0])
