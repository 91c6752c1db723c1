"""experiments/_driver.py: a Decision Transformer run of an experiment, killed midway with its driver (a job's
end), resumes from its last checkpoint when the driver runs it again, and says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiments._driver import ROOT, train_dt

TOTAL = 400


def _settings(dataset: str) -> dict:
    return {
        "dataset": dataset,
        "context_len": 6,
        "batch_size": 8,
        "total_steps": TOTAL,
        "eval_every": 20,
        "eval_episodes": 2,
        "seed": 0,
        "backbone.d_model": 16,
        "backbone.n_layers": 1,
        "backbone.n_heads": 1,
    }


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets

    data = tmp_path / "minari"
    (dataset,) = build_memory_datasets(
        MemoryBuildConfig(task="tmaze", memory_lengths=(5,), random_share=0.2, root=data, progress=False)
    )
    settings, run_root, log = _settings(dataset.dataset_id), tmp_path / "runs", tmp_path / "run.log"
    code = "import sys; from pathlib import Path; from experiments._driver import train_dt\n"
    code += f"train_dt({settings!r}, {str(data)!r}, Path({str(run_root)!r}), Path({str(log)!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(run_root.glob("dt/*/*/checkpoints/last.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    run_dir, wall, resumed = train_dt(settings, data, run_root, log)
    assert len(resumed) == 1 and 0 < resumed[0] < TOTAL and wall > 0
    assert len(list(run_root.glob("dt/*/*"))) == 1  # the same run directory, continued
    steps = sorted(json.loads(p.read_text())["step"] for p in (run_dir / "eval").glob("step_*.json"))
    assert steps == list(range(20, TOTAL + 1, 20))  # every evaluation, those before the kill kept

    other = {**settings, "seed": 1}  # other settings in the same place: a fresh run, never a resume
    _, _, resumed = train_dt({**other, "total_steps": 20}, data, run_root, log)
    assert resumed == []
