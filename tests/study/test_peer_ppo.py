"""The peer runner: the zoo's recipe read as data, and the side-by-side command on a tiny budget."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest

from rl_transformers.study.peer_ppo import parse_policy_kwargs, peer_model_kwargs, schedule, zoo_recipe
from rl_transformers.utils.errors import UserError


def test_policy_kwargs_are_parsed_as_data() -> None:
    from torch import nn

    text = (
        "dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, net_arch=dict(pi=[64], vf=[64]))"
    )
    assert parse_policy_kwargs(text) == {
        "ortho_init": False,
        "activation_fn": nn.ReLU,
        "lstm_hidden_size": 64,
        "net_arch": {"pi": [64], "vf": [64]},
    }
    for bad in ("__import__('os').system('true')", "dict(a=open('x'))", "dict(a=nn.Module)", "[1, 2]"):
        with pytest.raises(UserError, match="policy_kwargs"):
            parse_policy_kwargs(bad)


def test_zoo_schedules() -> None:
    assert schedule("lin_0.001")(0.25) == pytest.approx(0.00025)
    assert schedule(0.2) == 0.2


def test_recipe_from_a_file_and_unknown_entries(tmp_path: Path) -> None:
    path = tmp_path / "ppo_lstm.yml"
    path.write_text("Task-v0:\n  n_steps: 32\n  learning_rate: lin_0.001\n  normalize: True\n")
    recipe = zoo_recipe("Task-v0", path)
    kwargs = peer_model_kwargs(recipe)
    assert kwargs["n_steps"] == 32 and kwargs["learning_rate"](1.0) == pytest.approx(1e-3)
    with pytest.raises(UserError, match="'Other-v0' is not in"):
        zoo_recipe("Other-v0", path)
    path.write_text("Task-v0:\n  frame_stack: 4\n")
    with pytest.raises(UserError, match="frame_stack"):
        zoo_recipe("Task-v0", path)


def test_installed_zoo_recipe_is_the_published_one() -> None:
    if importlib.util.find_spec("rl_zoo3") is None:  # not importorskip: importing rl_zoo3 patches gymnasium
        pytest.skip("the peers extra (rl_zoo3) is not installed")
    recipe = zoo_recipe("CartPoleNoVel-v1")
    assert (recipe["n_envs"], recipe["n_steps"], recipe["batch_size"], recipe["n_epochs"]) == (8, 32, 256, 20)
    assert (recipe["gamma"], recipe["gae_lambda"], recipe["learning_rate"]) == (0.98, 0.8, "lin_0.001")


def test_reading_the_zoo_recipe_leaves_gymnasium_unpatched() -> None:
    """rl_zoo3's import swaps gymnasium's TimeLimit for its own subclass process-wide; the recipe is read from its
    file without that import, so this library's envs keep gymnasium's wrapper (a fresh process: other tests may
    have imported rl_zoo3 in this one)."""
    import subprocess
    import sys

    if importlib.util.find_spec("rl_zoo3") is None:
        pytest.skip("the peers extra (rl_zoo3) is not installed")
    code = (
        "import gymnasium, sys\n"
        "from rl_transformers.study.peer_ppo import zoo_recipe\n"
        "assert zoo_recipe('CartPoleNoVel-v1')['n_envs'] == 8\n"
        "print(gymnasium.wrappers.TimeLimit.__module__, 'rl_zoo3' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["gymnasium.wrappers.common", "False"]


def test_compare_command_on_a_tiny_budget(tmp_path: Path) -> None:
    pytest.importorskip("sb3_contrib", reason="the peers extra (sb3-contrib) is not installed")
    from rl_transformers.study.peer_compare import run_arms
    from rl_transformers.study.peer_report import load_records, summarise, table

    run_arms("rlt/CartPoleNoVel-v0", ("peer", "lstm_zoo"), (0,), 512, 2, tmp_path)
    records = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/s0.json")}
    assert set(records) == {"peer", "lstm_zoo"}
    assert records["peer"]["parameters"] == records["lstm_zoo"]["parameters"] == 43_331
    for record in records.values():
        assert len(record["returns"]) == 2 and all(r >= 1 for r in record["returns"])
        assert record["cpu_seconds"] > 0
        assert record["git_sha"] and record["machine"] and "command" in record
    assert records["lstm_zoo"]["curve"][0][0] == 256  # every 10th update
    assert records["lstm_zoo"]["config"]["recipe"].endswith("rlt/CartPoleNoVel-v0/lstm")  # its flags equal it
    rows = "\n".join(table(summarise(load_records(tmp_path)), 475.0, "peer"))
    assert "| peer | 43331 | 1 |" in rows and "| lstm_zoo | 43331 | 1 |" in rows
    mtime = (tmp_path / "peer" / "s0.json").stat().st_mtime
    run_arms("rlt/CartPoleNoVel-v0", ("peer",), (0,), 512, 2, tmp_path)  # finished records are kept
    assert (tmp_path / "peer" / "s0.json").stat().st_mtime == mtime


def test_the_peer_runs_beside_checkpointing_library_runs(tmp_path: Path) -> None:
    """--save-every checkpoints the library's runs; the peer's run (which does not checkpoint) still records."""
    pytest.importorskip("sb3_contrib", reason="the peers extra (sb3-contrib) is not installed")
    from rl_transformers.study.peer_compare import run_arms

    run_arms("rlt/CartPoleNoVel-v0", ("peer",), (0,), 512, 2, tmp_path, save_every=256)
    assert json.loads((tmp_path / "peer" / "s0.json").read_text())["total_timesteps"] == 512


def test_recurrent_arms_are_parameter_matched_to_the_transformer(tmp_path: Path) -> None:
    """On a task without a zoo entry the library's arms stand alone: gtrxl, lstm and gru on equal terms (the same
    defaults, parameter counts within 10 % of the GTrXL's)."""
    from rl_transformers.study.peer_compare import run_arms

    run_arms("rlt/TMazeShort-v0", ("gtrxl", "lstm", "gru"), (0,), 2048, 2, tmp_path)
    params = {
        a: json.loads((tmp_path / a / "s0.json").read_text())["parameters"] for a in ("gtrxl", "lstm", "gru")
    }
    assert params["gtrxl"] > 100_000
    for arm in ("lstm", "gru"):
        assert abs(params[arm] - params["gtrxl"]) <= 0.1 * params["gtrxl"], params


def test_gru_seq128_trains_on_windows_of_128(tmp_path: Path) -> None:
    """The whole-window GRU arm: its run's saved config has rollouts and training windows of 128 steps."""
    from rl_transformers.study.peer_compare import run_arms

    run_arms("rlt/TMazeShort-v0", ("gru_seq128",), (0,), 4096, 2, tmp_path)
    record = json.loads((tmp_path / "gru_seq128" / "s0.json").read_text())
    assert (record["config"]["ppo"]["num_steps"], record["config"]["ppo"]["seq_len"]) == (128, 128)
    assert record["config"]["policy"]["kind"] == "gru" and record["total_timesteps"] == 4096


def test_compare_command_takes_several_extra_flags() -> None:
    import tyro

    from tests.script_module import load_script

    compare = load_script("compare_peer")
    args = ["--arms", "gtrxl", "--extra=--norm-obs", "--extra=--ppo.num-steps=128"]
    cfg = tyro.cli(compare.CompareConfig, args=args)
    assert cfg.extra == ("--norm-obs", "--ppo.num-steps=128")
    assert tyro.cli(compare.CompareConfig, args=[]).extra == ()


TINY = ("--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--ppo.update-epochs", "1")
TINY += ("--backbone.d-model", "16", "--backbone.n-layers", "1", "--backbone.n-heads", "2", "--no-progress")


def test_a_run_killed_midway_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """--save-every: the comparison and its training run are killed together (a job's end); the same command
    then resumes the run from its last checkpoint instead of starting it again, and the record says so."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from rl_transformers.runs.checkpoint_load import read_checkpoint
    from rl_transformers.study.peer_compare import PARTIAL, ROOT, run_arms

    args = ("rlt/TMazeShort-v0", ("gtrxl",), (0,), 12_800, 2, tmp_path, TINY, 64)
    code = (
        f"from pathlib import Path\nfrom rl_transformers.study.peer_compare import run_arms\nrun_arms{args!r}"
    )
    code = code.replace("PosixPath(", "Path(")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    work, deadline = tmp_path / PARTIAL / "gtrxl-s0", time.monotonic() + 120
    while not list(work.rglob("checkpoints/last.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "gtrxl" / "s0.json").exists()
    (last,) = work.rglob("checkpoints/last.pt")
    stopped = int(read_checkpoint(last)["global_step"])
    assert 0 < stopped < 12_800

    run_arms(*args)
    record = json.loads((tmp_path / "gtrxl" / "s0.json").read_text())
    assert record["resumed_at"] == [stopped] and record["total_timesteps"] == 12_800
    assert record["cpu_steps"] == 12_800 - stopped and record["parameters"] is not None
    steps = [step for step, _ in record["curve"]]
    # the resumed run continued the same progress log, whose rows past the checkpoint were dropped
    assert all(a < b for a, b in itertools.pairwise(steps)) and steps[-1] > stopped
    assert not work.exists()  # the partial run is gone once its record is written


def test_a_partial_run_of_another_command_is_refused(tmp_path: Path) -> None:
    from rl_transformers.runs.ledger import start_job
    from rl_transformers.study.peer_compare import PARTIAL, run_arms

    work = tmp_path / PARTIAL / "gtrxl-s0"
    start_job(work, {"arm": "gtrxl", "seed": 0, "flags": ["--norm-obs"]})
    with pytest.raises(UserError, match=r"interrupted run of .*--norm-obs") as err:
        run_arms("rlt/TMazeShort-v0", ("gtrxl",), (0,), 1024, 2, tmp_path, TINY, 64)
    assert str(work) in str(err.value) and not (tmp_path / "gtrxl" / "s0.json").exists()


def test_a_checkpointed_partial_run_without_a_ledger_is_refused_not_deleted(tmp_path: Path) -> None:
    from rl_transformers.study.peer_compare import PARTIAL, run_arms

    checkpoint = (
        tmp_path / PARTIAL / "gtrxl-s0" / "gtrxl-s0" / "ppo" / "x" / "run" / "checkpoints" / "last.pt"
    )
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"a checkpoint")
    with pytest.raises(UserError, match=r"no job\.json saying which command") as err:
        run_arms("rlt/TMazeShort-v0", ("gtrxl",), (0,), 1024, 2, tmp_path, TINY, 64)
    assert str(checkpoint.parents[5]) in str(err.value) and checkpoint.read_bytes() == b"a checkpoint"


@pytest.mark.parametrize(
    ("start", "end", "recorded"),
    [("abc1234", "abc1234", "abc1234"), ("abc1234", "def5678", "abc1234-dirty"),
     ("abc1234-dirty", "def5678", "abc1234-dirty")],
)  # fmt: skip
def test_a_commit_made_while_a_run_ran_is_not_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str, end: str, recorded: str
) -> None:
    """The record names the commit a run began under, and marks it ``-dirty`` where the checkout moved before the
    run's end (its processes imported both)."""
    from rl_transformers.study import peer_compare

    shas = iter([start, end])
    monkeypatch.setattr(
        peer_compare, "provenance", lambda: {"git_sha": next(shas), "machine": "m", "command": "python x"}
    )
    monkeypatch.setattr(peer_compare, "run_library_arm", lambda *args: {"returns": [1.0]})
    peer_compare.run_arms("rlt/TMazeShort-v0", ("gtrxl",), (0,), 64, 1, tmp_path)
    assert json.loads((tmp_path / "gtrxl" / "s0.json").read_text())["git_sha"] == recorded


def test_a_kept_run_holds_its_checkpoint_and_is_never_overwritten(tmp_path: Path) -> None:
    """--keep-runs: the finished run's folder stays in <out>/runs/, named by the record, with the final checkpoint a
    later stage can start from; a kept folder whose record is missing is refused rather than replaced."""
    from rl_transformers.runs.checkpoint_load import read_checkpoint
    from rl_transformers.study.peer_compare import KEPT, PARTIAL, run_arms

    run_arms("rlt/TMazeShort-v0", ("gtrxl",), (0,), 256, 2, tmp_path, TINY, keep_runs=True)
    record = json.loads((tmp_path / "gtrxl" / "s0.json").read_text())
    run_dir = tmp_path / record["run_dir"]
    assert (
        run_dir.is_relative_to(tmp_path / KEPT / "gtrxl-s0")
        and not (tmp_path / PARTIAL / "gtrxl-s0").exists()
    )
    assert json.loads((run_dir / "config.json").read_text()) == record["config"]
    assert (
        int(read_checkpoint(run_dir / "checkpoints" / "last.pt")["global_step"]) == record["total_timesteps"]
    )

    (tmp_path / "gtrxl" / "s0.json").unlink()
    with pytest.raises(
        UserError, match=r"already holds a kept run runs/gtrxl-s0 but no record gtrxl/s0\.json"
    ):
        run_arms("rlt/TMazeShort-v0", ("gtrxl",), (0,), 256, 2, tmp_path, TINY, keep_runs=True)
    assert (run_dir / "checkpoints" / "last.pt").exists()
