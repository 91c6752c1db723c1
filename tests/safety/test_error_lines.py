"""Every hostile or broken input case gives an ``error:`` line (or is handled), never a traceback: a pickle in an SB3 zip, a
missing --medium-policy, a full disk while checkpointing or writing a dataset, a damaged progress.jsonl or
index.json (the resume goes on), bad DT model_kwargs, huge sizes from flags or saved configs, NaN weights."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from offline_data import write_minari_dataset
from offline_data.build import build_datasets
from offline_data.build_config import BuildConfig
from offline_data.errors import DatasetError
from offline_data.sb3_state import load_policy_weights
from rl_transformers.agents import load as load_agent
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.runs import checkpoint as checkpoint_module
from rl_transformers.runs.checkpoint import CheckpointManager, CheckpointWriteError
from rl_transformers.utils.checks import MAX_EVAL_EPISODES, MAX_NUM_ENVS
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError, run_cli, storage_failure
from tests.safety.runs import BATCH, Evil, random_episodes, rewrite_last, tiny

ROOT = Path(__file__).resolve().parents[2]
TORCH_ADVICE = "weights_only` set to `False"


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = train(tiny(tmp_path_factory.mktemp("ppo"), save_every=BATCH))
    assert result.run_dir is not None
    return result.run_dir


@pytest.fixture
def run_copy(ppo_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(ppo_run, tmp_path / "run")
    return tmp_path / "run"


def resume(ppo_run: Path, run: Path) -> TrainConfig:
    return dataclasses.replace(tiny(ppo_run.parents[2], updates=3, save_every=BATCH), resume=str(run))


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


# -- SB3 zips and policy flags ----------------------------------------------------------------------------------
def test_pickle_in_an_sb3_zip_is_refused_without_torchs_advice(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save({"weight": Evil(marker)}, buffer)
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("policy.pth", buffer.getvalue())
    with pytest.raises(DatasetError) as info:
        load_policy_weights(None, path)
    message = str(info.value)
    assert str(path) in message and "not a plain state_dict" in message and TORCH_ADVICE not in message
    assert not marker.exists()


def test_missing_medium_policy_is_an_error_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.zip"
    config = BuildConfig(
        env_id="CartPole-v1",
        kinds=("medium",),
        medium_policy=missing,
        root=tmp_path / "ds",
        policy_dir=tmp_path / "pol",
        ref_min_score=0.0,
        ref_max_score=500.0,
        progress=False,
    )
    with pytest.raises(UserError, match=f"--medium-policy {missing}: no such file"):
        build_datasets(config)
    with pytest.raises(FileNotFoundError):  # still a FileNotFoundError for existing callers
        build_datasets(config)
    out = script(
        "scripts/make_dataset.py", "--env-id", "CartPole-v1", "--kinds", "medium", "--medium-policy", str(missing),
        "--root", str(tmp_path / "ds"), "--policy-dir", str(tmp_path / "pol"), "--no-progress",
        "--ref-min-score", "0", "--ref-max-score", "500",
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"error: --medium-policy {missing}: no such file" in out.stderr


# -- full disks -------------------------------------------------------------------------------------------------
class FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails like a full disk (torch.save then raises RuntimeError)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return len(data)


def test_torch_save_on_a_full_disk_is_a_checkpoint_write_error(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(
        RuntimeError
    ) as raw:  # what torch really does on ENOSPC: the reason is only the context
        torch.save({"w": torch.zeros(10_000)}, FullDisk(500))
    assert storage_failure(raw.value) == "no space left on device"
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save({"w": torch.zeros(3)}, step=1)
    real = checkpoint_module.atomic_write

    def full(path, write):
        return real(path, lambda f: write(FullDisk(500)))

    monkeypatch.setattr(checkpoint_module, "atomic_write", full)
    with pytest.raises(CheckpointWriteError, match="no space left on device") as info:
        manager.save({"w": torch.zeros(10_000)}, step=2)
    assert info.value.errno == errno.ENOSPC and f"the last good checkpoint is {manager.last_path}" in str(
        info.value
    )
    monkeypatch.setattr(checkpoint_module, "atomic_write", real)
    assert torch.equal(manager.load("last")["w"], torch.zeros(3))


def test_full_disk_anywhere_is_an_error_line(capsys) -> None:
    """Writes outside the checkpoint manager (logs, eval files, h5py) that hit a full disk end as error lines."""

    def h5py_like() -> None:
        raise RuntimeError(
            "Can't write data (file write failed: ..., errno = 28, error message = 'No space')"
        )

    def log_write() -> None:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "run/progress.jsonl")
        except OSError as err:
            raise RuntimeError("logger failed") from err

    for fail in (h5py_like, log_write):
        with pytest.raises(SystemExit) as info:
            run_cli(fail, argv=["x"])
        assert info.value.code == 2
        assert capsys.readouterr().err.startswith("error: no space left on device")
    with pytest.raises(RuntimeError, match="a bug"):  # other errors keep their traceback

        def bug() -> None:
            raise RuntimeError("a bug")

        run_cli(bug, argv=["x"])


def test_dataset_write_refuses_a_disk_without_room(tmp_path: Path, monkeypatch) -> None:
    from offline_data import minari_write

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(minari_write.shutil, "disk_usage", lambda p: usage._replace(free=100_000))
    with pytest.raises(DatasetError, match="no space left on device for Minari dataset 'test/p/medium-v0'"):
        write_minari_dataset("test/p/medium-v0", random_episodes(3, 20), env="Pendulum-v1", root=tmp_path)
    assert [p.name for p in tmp_path.rglob("*") if not p.name.startswith(".")] == []  # nothing visible


# -- damaged logs and labels: the resume goes on ------------------------------------------------------------------
def test_garbage_progress_lines_are_reported_and_skipped(ppo_run: Path, run_copy: Path) -> None:
    log = run_copy / "progress.jsonl"
    good = [json.loads(line) for line in log.read_text().splitlines()]
    with log.open("ab") as f:
        f.write(b'[1, 2]\n"text"\n{"step": "x"}\n\xff\xfe garbage\n{"step": 1')
    with pytest.warns(UserWarning, match=r"skipped 5 damaged line\(s\)"):
        result = train(resume(ppo_run, run_copy))
    assert result.step == 3 * BATCH
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows[: len(good)] == good and rows[-1]["step"] == 3 * BATCH


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"last": {"step": "x"}}',
        b'{"metric": null, "mode": "max", "last": {"step": 64}, "best": {"step": [], "metric_value": 1}}',
        b"\xff",
    ],
    ids=["bad-json", "a-list", "string-step", "bad-best", "not-utf8"],
)
def test_garbage_index_is_rebuilt(ppo_run: Path, run_copy: Path, content: bytes) -> None:
    index = run_copy / "checkpoints" / "index.json"
    steps = json.loads(index.read_text())["steps"]
    index.write_bytes(content)
    with pytest.warns(UserWarning, match=f"ignoring {index}"):
        manager = CheckpointManager(run_copy)
    assert manager.last_step == max(steps)  # rebuilt from the step files
    index.write_bytes(content)
    with warnings.catch_warnings():  # the trainer's manager tracks a metric: a bad 'best' of null is not read
        warnings.simplefilter("ignore")
        result = train(resume(ppo_run, run_copy))
    assert result.step == 3 * BATCH and json.loads(index.read_text())["last"]["step"] == 3 * BATCH


# -- checkpoints and configs that size work ------------------------------------------------------------------------
def test_nan_weights_are_refused_at_load(run_copy: Path) -> None:
    def poison(c: dict) -> None:
        name = next(k for k, v in c["policy"].items() if v.is_floating_point())
        c["policy"][name].view(-1)[0] = float("nan")

    path = rewrite_last(run_copy, poison)
    with pytest.raises(UserError, match="NaN or infinite") as info:
        load_agent(path)
    assert str(path) in str(info.value)
    out = script("scripts/evaluate.py", str(run_copy), "--episodes", "1")
    assert out.returncode == 2 and "NaN or infinite" in out.stderr and "Traceback" not in out.stderr


def test_bad_dt_model_kwargs_are_an_error(tmp_path: Path) -> None:
    config = to_jsonable(DTConfig(dataset="x/y-v0"))
    for kwargs in ({"observation_space": "garbage"}, {}, {"backbone": 3}):
        path = tmp_path / "checkpoints" / "last.pt"
        path.parent.mkdir(exist_ok=True)
        torch.save({"config": config, "model": {"w": torch.ones(2)}, "model_kwargs": kwargs}, path)
        with pytest.raises(UserError, match="model_kwargs do not build a Decision Transformer") as info:
            load_agent(path)
        assert str(path) in str(info.value)
    torch.save({"config": config, "model": {"w": torch.tensor([float("inf")])}, "model_kwargs": {}}, path)
    with pytest.raises(UserError, match="NaN or infinite"):
        load_agent(path)


def test_model_kwargs_far_larger_than_the_weights_are_refused_before_allocating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DT checkpoint whose model_kwargs describe a model ~4,000x larger than the weights it ships is refused
    with an error line naming the mismatch; the large model is only ever built on the meta device (no storage)."""
    from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config

    obs = gym.spaces.Box(-1.0, 1.0, (3,))
    act = gym.spaces.Box(-1.0, 1.0, (2,))
    small = DecisionTransformer(obs, act, dt_backbone_config(d_model=16, n_layers=1, n_heads=1), 4, 10)
    kwargs = small.init_kwargs()
    kwargs["backbone"] = {**kwargs["backbone"], "d_model": 1024, "n_layers": 8}
    path = tmp_path / "checkpoints" / "last.pt"
    path.parent.mkdir()
    torch.save({"config": to_jsonable(DTConfig(dataset="x/y-v0")), "model": small.state_dict(),
                "model_kwargs": kwargs}, path)  # fmt: skip
    built: list[str] = []
    original = DecisionTransformer.__init__

    def spy(self, *args, **kw):  # type: ignore[no-untyped-def]
        built.append(str(torch.get_default_device()))
        original(self, *args, **kw)

    monkeypatch.setattr(DecisionTransformer, "__init__", spy)
    with pytest.raises(
        UserError, match=r"its model_kwargs describes a model of about [0-9,]+ parameters"
    ) as info:
        load_agent(path)
    assert str(path) in str(info.value) and "ships 3,692 values" in str(info.value)
    assert built == []  # refused from the sizes alone (agents/memory_bound.py): not even built on meta
    kwargs["backbone"] = {**kwargs["backbone"], "d_model": 32}  # close enough to pass the count: the shapes
    torch.save({"config": to_jsonable(DTConfig(dataset="x/y-v0")), "model": small.state_dict(),
                "model_kwargs": kwargs}, path)  # fmt: skip
    with pytest.raises(
        UserError, match=r"its weights do not fit the model its model_kwargs describe \("
    ) as info:
        load_agent(path)
    assert "in the file" in str(info.value) and built == ["meta"]  # the described model never got storage
    torch.save({"config": to_jsonable(DTConfig(dataset="x/y-v0")), "model": small.state_dict(),
                "model_kwargs": small.init_kwargs()}, path)  # fmt: skip
    assert load_agent(path) is not None and built[1:] == ["meta", "cpu"]  # a fitting one loads as before


def test_huge_sizes_from_flags_are_refused() -> None:
    base = tiny(Path("x"))
    with pytest.raises(UserError, match=f"num_envs .*is larger than the limit {MAX_NUM_ENVS:,}"):
        dataclasses.replace(base, num_envs=10**8)
    with pytest.raises(UserError, match="eval_episodes"):
        dataclasses.replace(base, eval_episodes=MAX_EVAL_EPISODES + 1)
    with pytest.raises(UserError, match="eval_envs"):
        DTConfig(dataset="x/y-v0", eval_envs=10**9)
    assert (
        dataclasses.replace(base, num_envs=MAX_NUM_ENVS).num_envs == MAX_NUM_ENVS
    )  # the limit itself is fine


@pytest.mark.parametrize(
    "change,expected",
    [
        (lambda c: c["config"].__setitem__("eval_episodes", 10**12), "eval_episodes"),
        (lambda c: c["config"].__setitem__("num_envs", 10**9), "num_envs"),
        (lambda c: c["config"].__setitem__("env_kwargs", {"corridor_length": 10**9}), "corridor_length"),
    ],
    ids=["eval-episodes", "num-envs", "corridor-length"],
)
def test_saved_configs_cannot_size_the_evaluation(run_copy: Path, change, expected: str) -> None:
    path = rewrite_last(run_copy, change)
    with pytest.raises(UserError, match=expected) as info:
        load_agent(path)
    assert str(path) in str(info.value)


def test_a_huge_corridor_in_a_dataset_spec_is_refused(tmp_path: Path) -> None:
    from envs.resolve import EnvRefusedError, resolve_env

    spec = json.loads(gym.registry["rlt/TMazeShort-v0"].to_json())
    spec["kwargs"]["corridor_length"] = 10**9
    with pytest.raises(EnvRefusedError, match="corridor_length=1000000000 is larger"):
        resolve_env(spec, source="dataset d")
