"""experiments/memory_tasks/curriculum_400.sh, run with a stand-in for python that records each command and makes
the run folder a real training run would: the shipped protocol's commands, the optional stages and flags, and
resuming without repeating a finished stage."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "memory_tasks" / "curriculum_400.sh"
FAKE = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[0] == "scripts/train_gtrxl.py":
    root, seed = args[args.index("--run-root") + 1], args[args.index("--seed") + 1]
    (Path(root) / "ppo" / "rlt-TMazeAltLong-v0" / f"20261202-000000-s{{seed}}").mkdir(parents=True)
if "experiments.memory_tasks.transfer" in args:
    Path(args[args.index("--out") + 1]).write_text("{{}}")
"""


def run(tmp_path: Path, seeds: list[str], **env: str) -> list[list[str]]:
    """The script's commands, one list of arguments per call of python (after this call only)."""
    log, fake = tmp_path / "calls.jsonl", tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    before = log.read_text().count("\n") if log.exists() else 0
    subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), *seeds],
        env={**os.environ, "PYTHON": str(fake), **env},
        check=True,
        capture_output=True,
    )
    return [json.loads(line) for line in log.read_text().splitlines()[before:]]


def flag(call: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in a command."""
    for i, arg in enumerate(call):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return call[i + 1]
    raise AssertionError(f"{name} not in {call}")


def test_the_shipped_protocol_trains_stage_1_then_corridor_400_from_its_weights(tmp_path: Path) -> None:
    stage1, transfer, last = run(tmp_path, ["30"])
    assert stage1[0] == "scripts/train_gtrxl.py" and flag(stage1, "--seed") == "30"
    assert "--total-timesteps" not in " ".join(stage1)  # the corridor-100 recipe's own budget
    assert transfer[:2] == ["-m", "experiments.memory_tasks.transfer"] and transfer[3:6] == [
        "--corridors", "100", "400"
    ]  # fmt: skip
    assert last[0] == "scripts/compare_peer.py" and flag(last, "--total-timesteps") == "500000"
    assert "--keep-runs" in last  # stage 2's checkpoints stay for a later stage
    extra = [a.removeprefix("--extra=") for a in last if a.startswith("--extra=")]
    assert flag(extra, "--init-from") == transfer[2] and transfer[2].endswith("-s30/checkpoints/last.pt")
    assert json.loads(flag(extra, "--env-kwargs")) == {"corridor_length": 400}
    assert json.loads(flag(extra, "--backbone.memory-options")) == {"mem_len": 512}
    assert flag(extra, "--ppo.num-steps") == "256" and flag(extra, "--ppo.anneal-horizon") == "4000000"
    assert not any(a.startswith(("--stop-at", "--eval-every")) for a in extra)


def test_via_stages_stop_at_and_resuming(tmp_path: Path) -> None:
    env = {
        "VIA": "200 300",
        "VIA_STEPS": "1000",
        "STAGE2_STEPS": "3000",
        "STOP_AT": "0.9",
        "EVAL_EVERY": "500",
    }
    _, _, c200, c300, last = run(tmp_path, ["31"], **env)
    for call, corridor, memory in ((c200, 200, 256), (c300, 300, 384)):
        assert flag(call, "--total-timesteps") == "1000" and flag(call, "--stop-at") == "0.9"
        assert call[call.index("--eval-every") :].count("--eval-every=500") == 1  # the later flag wins
        assert json.loads(flag(call, "--env-kwargs")) == {"corridor_length": corridor}
        assert json.loads(flag(call, "--backbone.memory-options")) == {"mem_len": memory}
    assert "/stage1/s31/" in flag(c200, "--init-from") and "/c200/s31/" in flag(c300, "--init-from")
    extra = [a.removeprefix("--extra=") for a in last if a.startswith("--extra=")]
    assert "/c300/s31/" in flag(extra, "--init-from") and flag(last, "--total-timesteps") == "3000"
    assert flag(extra, "--stop-at") == "0.9" and flag(extra, "--eval-every") == "500"
    # a second call keeps the finished stages and their transfer rows: only the last stage runs again (its
    # records are compare_peer's to keep)
    (again,) = run(tmp_path, ["31"], **env)
    assert again[0] == "scripts/compare_peer.py"


def test_a_longer_last_corridor_after_a_stage_at_400(tmp_path: Path) -> None:
    """LAST=1000 after VIA=400: the last stage trains corridor 1,000 from the corridor-400 stage's weights with an
    XL memory scaled to it, and records where its corridor says."""
    _, transfer, c400, last = run(tmp_path, ["32"], VIA="400", LAST="1000")
    assert transfer[transfer.index("--corridors") + 1 :][:2] == ["100", "1000"]
    assert json.loads(flag(c400, "--backbone.memory-options")) == {"mem_len": 512}
    extra = [a.removeprefix("--extra=") for a in last if a.startswith("--extra=")]
    assert "/c400/s32/" in flag(extra, "--init-from") and flag(last, "--out").endswith("/out/c1000")
    assert json.loads(flag(extra, "--env-kwargs")) == {"corridor_length": 1000}
    assert json.loads(flag(extra, "--backbone.memory-options")) == {"mem_len": 1280}


def test_save_every_checkpoints_the_last_stage_only(tmp_path: Path) -> None:
    """SAVE_EVERY makes the last stage resumable and keeps KEEP_CHECKPOINTS of its checkpoints; the stages before
    it do not checkpoint (they are short and restart whole)."""
    _, _, c400, last = run(
        tmp_path, ["33"], VIA="400", LAST="1000", SAVE_EVERY="250000", KEEP_CHECKPOINTS="80"
    )
    assert flag(last, "--save-every") == "250000" and "--extra=--keep-checkpoints=80" in last
    assert not any(a.startswith(("--save-every", "--keep-checkpoints")) for a in c400)
    (tmp_path / "plain").mkdir()
    _, _, plain = run(tmp_path / "plain", ["33"])
    assert not any("save-every" in a or "keep-checkpoints" in a for a in plain)


def test_no_output_folder_is_a_usage_error() -> None:
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode != 0 and "usage: curriculum_400.sh OUT SEED" in result.stderr
