"""utils/atomic.py: a failed or interrupted write leaves the old file and no temp file; concurrent writers of
one target never share a temp file; hard link (or copy) replaces atomically; writers that open the file
themselves and whole directories get the same guarantees, the rename made durable; leftovers of dead builds are
cleaned, a live one's kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rl_transformers.utils import atomic
from rl_transformers.utils.atomic import (
    TEMP_PREFIX,
    atomic_file,
    atomic_link,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    clean_stale,
    new_temp_dir,
    replace_dir,
)


def test_text_and_json_round_trip_with_mode_0644(tmp_path: Path) -> None:
    path = atomic_write_text(tmp_path / "new" / "a.md", "héllo\n")  # the parent is created
    assert path.read_text(encoding="utf-8") == "héllo\n" and (path.stat().st_mode & 0o777) == 0o644
    atomic_write_json(tmp_path / "b.json", {"x": [1, 2]}, indent=1, sort_keys=True)
    assert (tmp_path / "b.json").read_text() == json.dumps({"x": [1, 2]}, indent=1) + "\n"


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, error: BaseException) -> None:
    path = atomic_write_text(tmp_path / "results.json", "old\n")

    def half_then_die(f) -> None:
        f.write(b"half of the new")
        raise error

    with pytest.raises(type(error)):
        atomic_write(path, half_then_die)
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_concurrent_writers_never_share_a_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "encoders.json"
    texts = [json.dumps({"writer": i, "pad": "x" * 200_000}) for i in range(8)]
    errors: list[BaseException] = []

    def write(text: str) -> None:
        try:
            atomic_write_text(path, text)
        except BaseException as err:  # a thread's exception would otherwise vanish
            errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and path.read_text() in texts  # one whole text, not an interleaving
    assert os.listdir(tmp_path) == ["encoders.json"]


def test_link_replaces_the_target_with_the_source_content(tmp_path: Path) -> None:
    src, dst = tmp_path / "step_8.pt", tmp_path / "last.pt"
    src.write_bytes(b"eight")
    dst.write_bytes(b"four")
    atomic_link(src, dst)
    assert dst.read_bytes() == b"eight" and sorted(os.listdir(tmp_path)) == ["last.pt", "step_8.pt"]


# -- writers that open the file themselves, whole directories (the dataset builders' writes) ---------------------
def _fsynced_dirs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record the directories :func:`fsync_dir` is called on (the rename made durable)."""
    seen: list[Path] = []
    real = atomic.fsync_dir
    monkeypatch.setattr(atomic, "fsync_dir", lambda d: (seen.append(Path(d)), real(d))[1])
    return seen


def test_atomic_file_replaces_the_target_and_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _fsynced_dirs(monkeypatch)
    target = tmp_path / "data" / "policy.zip"
    with atomic_file(target, suffix=".zip") as temp:
        assert temp.parent == target.parent and temp.name.startswith(TEMP_PREFIX) and temp.suffix == ".zip"
        temp.write_bytes(b"new")
        assert not target.exists()  # nothing at the target until the block ends
    assert target.read_bytes() == b"new" and os.listdir(target.parent) == ["policy.zip"]
    assert seen == [target.parent]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_atomic_file_keeps_the_old_file(tmp_path: Path, error: BaseException) -> None:
    target = atomic_write_text(tmp_path / "data.hdf5", "old")
    with pytest.raises(type(error)), atomic_file(target) as temp:
        temp.write_text("half")
        raise error
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["data.hdf5"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_replace_dir_swaps_in_the_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    seen = _fsynced_dirs(monkeypatch)
    target = tmp_path / "datasets" / "d-v0"
    for content in ("old", "new"):
        building = new_temp_dir(tmp_path / "datasets")
        assert building.name.startswith(f"{TEMP_PREFIX}{os.getpid()}-")
        (building / "data.txt").write_text(content)
        replace_dir(building, target)
        assert (target / "data.txt").read_text() == content
    assert os.listdir(tmp_path / "datasets") == ["d-v0"]  # neither the build nor the old copy is left
    assert seen == [target.parent, target.parent]


def test_clean_stale_removes_dead_builds_only(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that was a process and is gone now
    dead_dir = tmp_path / f"{TEMP_PREFIX}{dead.pid}-abcd"
    dead_dir.mkdir()
    dead_file = tmp_path / f"{TEMP_PREFIX}{dead.pid}-beef-data.hdf5"
    dead_file.write_text("half")
    live = tmp_path / f"{TEMP_PREFIX}{os.getpid()}-cafe"
    live.mkdir()
    other = tmp_path / "kept"
    other.mkdir()
    assert sorted(clean_stale(tmp_path)) == sorted([dead_dir, dead_file])
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "kept"])
    assert clean_stale(tmp_path / "missing") == []
