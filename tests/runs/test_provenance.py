"""``runs.provenance``: the commit comes from the package's checkout; each invocation appends one record."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_transformers.runs import provenance
from rl_transformers.runs.provenance import (
    PACKAGE_DIR,
    SYSTEM_INFO_FILE,
    git_sha,
    read_invocations,
    record_invocation,
)


def test_git_sha_comes_from_the_package_checkout_not_the_cwd(tmp_path: Path, monkeypatch) -> None:
    expected = subprocess.run(
        ["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.chdir(tmp_path)  # not a git checkout
    sha = git_sha()
    if expected:
        assert sha is not None and sha.removesuffix("-dirty") == expected
    assert git_sha(tmp_path) is None


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_git_sha_marks_uncommitted_changes(tmp_path: Path) -> None:
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
           "-c", "core.hooksPath=/dev/null"]  # fmt: skip
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_sha(tmp_path) == head
    (tmp_path / "a.txt").write_text("2")
    assert git_sha(tmp_path) == head + "-dirty"
    assert not (tmp_path / ".git" / "index.lock").exists()


def test_a_failing_status_keeps_the_commit(monkeypatch) -> None:
    def fake_run(cmd, **kwargs):
        if "status" in cmd:
            raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout", 0))
        assert "--no-optional-locks" in cmd  # never takes the index lock a user's commit needs
        return subprocess.CompletedProcess(cmd, 0, stdout="abc\n", stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    assert git_sha() == "abc-status-unknown"


def test_invocations_accumulate_with_command_step_and_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/train_gtrxl.py", "--seed", "3"])
    monkeypatch.setattr(provenance, "git_sha", lambda: "abc123")
    assert read_invocations(tmp_path) == []  # runs older than the file
    record_invocation(tmp_path, "cpu", step=0)
    monkeypatch.setattr(sys, "argv", ["/x/train_gtrxl.py", "--resume", "runs/r"])
    record_invocation(tmp_path, torch.device("cpu"), step=4096, world_size=2)
    first, second = read_invocations(tmp_path)
    assert first["command"] == ["train_gtrxl.py", "--seed", "3"] and first["start_step"] == 0
    assert second["command"] == ["train_gtrxl.py", "--resume", "runs/r"]
    assert (second["start_step"], second["world_size"], second["git_sha"]) == (4096, 2, "abc123")
    assert second["torch_version"] == torch.__version__ and second["device"] == "cpu"
    assert json.loads((tmp_path / SYSTEM_INFO_FILE).read_text())["invocations"][1] == second
    assert [p.name for p in tmp_path.iterdir()] == [SYSTEM_INFO_FILE]  # atomic: no temp file left beside it


@pytest.mark.parametrize("text", ["{not json", '{"invocations": 3}', "[1, 2]"])
def test_a_bad_file_is_named_and_never_stops_the_run(tmp_path: Path, capsys, text: str) -> None:
    (tmp_path / SYSTEM_INFO_FILE).write_text(text)
    with pytest.raises(ValueError, match=SYSTEM_INFO_FILE):
        read_invocations(tmp_path)
    record_invocation(tmp_path, "cpu", step=7)
    assert [r["start_step"] for r in read_invocations(tmp_path)] == [7]
    assert (tmp_path / (SYSTEM_INFO_FILE + ".unreadable")).read_text() == text  # kept aside, not lost
    assert "unreadable" in capsys.readouterr().err
