"""Ctrl-C is how a resumable study or probe is stopped: the scripts say so in one line, without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_on_the_memory_probe_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    args = ["--out", str(tmp_path), "--encoders", "gru", "--ks", "1", "--seeds", "0", "--no-restore"]
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "experiments.memory_probe.run", *args, "--settings.updates", "1000000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RLT_DEBUG": "0", "PYTHONPATH": str(ROOT)},
        # as from a terminal: a test run started in the background (`cmd &` without job control) inherits
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler in the child
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the cell has started: main() is running
    assert first.startswith("[cell 1 of at most 1] gru"), first
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: finished cells are kept; rerun the same command to resume" in err
    assert "Traceback" not in err
