"""benchmarks/profile_ppo.py: a real profile of a tiny PPO config (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies.ppo_profile import profile_ppo, render
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone

ROOT = Path(__file__).resolve().parents[3]


def tiny() -> TrainConfig:
    return TrainConfig(
        env_id="rlt/TMazeShort-v0",
        num_envs=2,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=1),
        eval_every=0,
        progress=False,
        threads=1,
    )


def test_profile_tables_cover_each_phase() -> None:
    """Shares of the listed ops plus "other" add to 1 per phase; the training pass runs matrix products; the
    top rows are sorted by share; the Markdown names every phase."""
    result = profile_ppo(tiny(), warmup=1, top=40)  # wide enough that timing noise cannot drop the products
    assert result["steps"] == 32
    for phase in ("rollout", "train"):
        table = result[phase]
        shares = [row["share"] for row in table["ops"]]
        assert abs(sum(shares) - 1.0) < 1e-9 and table["self_cpu_s"] > 0
        assert shares[:5] == sorted(shares[:5], reverse=True) and table["ops"][-1]["op"].startswith("other")
    assert any(row["op"] in ("aten::mm", "aten::addmm", "aten::bmm") for row in result["train"]["ops"])
    text = render(result, ["# t"])
    assert "## rollout:" in text and "## train:" in text


def test_script_writes_json_and_markdown(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/profile_ppo.py", "--env-id", "rlt/TMazeShort-v0", "--num-envs", "2",
         "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--ppo.num-minibatches", "2", "--warmup", "1",
         "--top", "3", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["command"].startswith("python benchmarks/profile_ppo.py --env-id rlt/TMazeShort-v0")
    assert len(report["train"]["ops"]) == 4 and (tmp_path / "profile.md").read_text().startswith(
        "# PPO profile"
    )
    bad = subprocess.run(
        [sys.executable, "benchmarks/profile_ppo.py", "--top", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert (
        bad.returncode == 2
        and "Traceback" not in bad.stderr
        and "top (--top) must be an int >= 1" in bad.stderr
    )


def test_shapes_of_splits_an_operator_by_input_shape() -> None:
    """The by-shape rows of an operator add up to at most its own share, name real shapes and are sorted."""
    result = profile_ppo(tiny(), warmup=1, top=50, shapes_of=("aten::mm",))
    for phase in ("rollout", "train"):
        table = result[phase]
        rows = table["by_shape"]
        assert rows and all(row["op"] == "aten::mm" and row["shapes"].startswith("[[") for row in rows)
        shares = [row["share"] for row in rows]
        assert shares == sorted(shares, reverse=True)
        own = next(row["share"] for row in table["ops"] if row["op"] == "aten::mm")
        assert abs(sum(shares) - own) < 1e-9  # top=50 lists every shape: they add up to the op's share
    assert "### train: by input shape" in render(result, ["# t"])
    assert "by_shape" not in profile_ppo(tiny(), warmup=1, top=3)["train"]


PROFILES = sorted((ROOT / "benchmarks" / "results").rglob("profile.json"))


@pytest.mark.parametrize("path", PROFILES, ids=[p.parent.name for p in PROFILES])
def test_the_committed_profile_tables_rebuild_byte_for_byte(path: Path) -> None:
    """Each committed profile.md is its header lines followed by what ``render`` writes from profile.json."""
    page = path.with_suffix(".md").read_text(encoding="utf-8")
    header = page.split("\n## ")[0].rstrip("\n").split("\n")
    assert render(json.loads(path.read_text(encoding="utf-8")), header) == page
