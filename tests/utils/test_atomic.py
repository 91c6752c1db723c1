"""utils/atomic.py: a failed or interrupted write leaves the old file and no temp file; concurrent writers of
one target never share a temp file; hard link (or copy) replaces atomically."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from rl_transformers.utils.atomic import atomic_link, atomic_write, atomic_write_json, atomic_write_text


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
