"""Ctrl-C while a script is still importing ends in one line and exit status 130, never a traceback.

The import window is made deterministic: a script in a ``scripts/`` folder beside the package (as in the
checkout) imports ``rl_transformers``, says so, then keeps importing (a module-level sleep stands in for
torch). SIGINT is sent once it has said so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rl_transformers.startup import MESSAGE

REPO = Path(__file__).resolve().parents[2]

SLOW = """
import sys
import rl_transformers  # the first import of every script
print("imported", flush=True)
import time
time.sleep(60)  # still importing (torch takes seconds)
"""


def _interrupt_after_first_line(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a test run started in the background (`cmd &` without job control) inherits
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler in the child
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "imported"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.skipif(os.name != "posix", reason="SIGINT")
def test_sigint_during_imports_is_one_line_and_130(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "rl_transformers").symlink_to(REPO / "rl_transformers")
    (tmp_path / "scripts" / "slow.py").write_text(SLOW)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RLT_DEBUG", None)
    done = _interrupt_after_first_line([sys.executable, "scripts/slow.py"], tmp_path, env)
    assert done.returncode == 130 and done.stderr.strip() == MESSAGE, done.stderr[-2000:]
    debug = _interrupt_after_first_line([sys.executable, "scripts/slow.py", "--debug"], tmp_path, env)
    assert "Traceback" in debug.stderr and "KeyboardInterrupt" in debug.stderr  # --debug keeps it


@pytest.mark.skipif(os.name != "posix", reason="SIGINT")
def test_a_library_user_keeps_the_usual_traceback(tmp_path: Path) -> None:
    """Outside the checkout's scripts/ the package installs nothing."""
    (tmp_path / "mine.py").write_text(SLOW)
    done = _interrupt_after_first_line(
        [sys.executable, "mine.py"], tmp_path, {**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert "Traceback" in done.stderr and MESSAGE not in done.stderr
