"""Side-by-side runs of this library's policies and sb3-contrib's RecurrentPPO (``scripts/compare_peer.py``).

One record per (arm, seed), ``<out>/<arm>/s<seed>.json``, written atomically once the run is evaluated, so an
interrupted comparison resumes where it stopped (and, with checkpoints, a run midway: :func:`run_arms`). A library arm is a ``scripts/train_gtrxl.py`` run with the
flags of :data:`ARMS` in a subprocess (one torch thread, no evaluation during training), then
``scripts/evaluate.py --episodes N`` on its final checkpoint; the peer arm is :func:`~.peer_ppo.run_peer`.
Both evaluate the final policy greedily on fresh episodes. CPU seconds are the training process's own
(user + system), so env steps per CPU-second compare the two implementations on one machine.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.runs.checkpoint_load import read_checkpoint
from rl_transformers.runs.ledger import LEDGER, note_resume, read_ledger, start_job
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
ZOO_CARTPOLE_NOVEL = [
    "--num-envs",
    "8",
    "--ppo.num-steps",
    "32",
    "--ppo.seq-len",
    "32",
    "--ppo.num-minibatches",
    "1",
    "--ppo.update-epochs",
    "20",
    "--ppo.gamma",
    "0.98",
    "--ppo.gae-lambda",
    "0.8",
    "--ppo.learning-rate",
    "1e-3",
    "--ppo.ent-coef",
    "0",
]
ZOO_LSTM = [
    *ZOO_CARTPOLE_NOVEL,
    *["--policy", "lstm", "--no-match-params", "--hidden-size", "64", "--critic", "separate"],
    *["--obs-encoder", "none", "--head-hidden", "64", "--init", "torch", "--ppo.vf-coef", "1.0"],
    *["--norm-obs", "--ppo.norm-reward", "--ppo.anneal-clip", "--ppo.no-clip-vloss"],
]
PARTIAL = ".partial"
"""The folder of ``--out`` that holds the runs under way when they checkpoint (``run_arms(save_every=...)``)."""
KEPT = "runs"
"""The folder of ``--out`` that keeps each finished library run (``run_arms(keep_runs=True)``): its config, progress
log, evaluation and checkpoints, e.g. to train a later stage from its weights (``--init-from``)."""
XL_RELATIVE = ["--backbone.position", "xl_relative"]
"""GTrXL's own positions, which the arms made before the recipes' default (rotary positions) keep."""
ARMS: dict[str, list[str]] = {
    "lstm_zoo": [*ZOO_LSTM, "--ppo.norm-obs-update", "step"],
    "lstm_zoo_obs_per_rollout": [*ZOO_LSTM, "--ppo.norm-obs-update", "rollout"],
    "lstm_zoo_raw": [
        *ZOO_CARTPOLE_NOVEL,
        *["--policy", "lstm", "--no-match-params", "--hidden-size", "64", "--critic", "separate"],
    ],
    "gtrxl": [],
    "lstm": ["--policy", "lstm"],
    "gru": ["--policy", "gru"],
    "gru_seq128": ["--policy", "gru", "--ppo.num-steps", "128", "--ppo.seq-len", "128"],
    "gtrxl_zoo": [
        *ZOO_CARTPOLE_NOVEL,
        *[
            "--norm-obs",
            "--ppo.norm-reward",
            "--ppo.anneal-clip",
            "--ppo.no-clip-vloss",
            "--ppo.vf-coef",
            "1.0",
        ],
        *XL_RELATIVE,
    ],
    "gtrxl_norm": ["--num-envs", "8", "--norm-obs", "--ppo.norm-reward", *XL_RELATIVE],
}
"""Library arms: train_gtrxl.py flags after the env id, seed and budget. ``lstm_zoo``: rl-zoo's CartPoleNoVel
recipe with the peer's network (an LSTM of 64 on the observation, a critic LSTM, one hidden layer of 64 in each
head, PyTorch's initialisation: 43,331 parameters, the peer's count) and every zoo convention (VecNormalize of
observations and rewards, each observation joining the statistics as it arrives, annealed clip range, no value
clipping, SB3's value loss without the ½, hence vf_coef 1.0 for the zoo's 0.5); ``lstm_zoo_obs_per_rollout``:
the same with the observation statistics merged once per rollout; ``lstm_zoo_raw``: the zoo's numbers on the library's LSTM policy without those
conventions; ``gtrxl``: the library's defaults under the recipe train_gtrxl.py applies (the transformer default's rotary positions and the task's entry); ``lstm`` / ``gru``:
the library's recurrent baselines with the same defaults, sized to the GTrXL's parameter count (within 10 %);
``gru_seq128``: that GRU trained on windows of 128 steps (rollouts of 128), so back-propagation through time
reaches a cue up to 128 steps back (the default windows of 16 cannot teach a recurrent state to keep it longer); ``gtrxl_zoo``: the default GTrXL
under the zoo's recipe and conventions; ``gtrxl_norm``: the library's PPO defaults with 8 envs and
VecNormalize-style observation and reward scaling. Both keep GTrXL's own ``xl_relative`` positions, as their
records (made before the recipes' transformer default) have them; ``gtrxl`` gets the default."""


def provenance() -> dict[str, Any]:
    """What a record says of the code and machine that made it (commit + ``-dirty`` for uncommitted code)."""
    import shlex

    import torch

    from rl_transformers.runs.provenance import device_name, git_sha

    return {
        "git_sha": git_sha(ROOT),
        "machine": device_name(torch.device("cpu")),
        "command": shlex.join(["python", *sys.argv]),
    }


def provenance_since(before: dict[str, Any]) -> dict[str, Any]:
    """:func:`provenance` at the end of a run that began under ``before``: where the checkout's commit moved
    meanwhile, the run's processes imported code of both (its evaluation starts after its training), so the record
    names the first commit marked ``-dirty`` and no single commit is claimed."""
    now = provenance()
    if now["git_sha"] != before["git_sha"] and before["git_sha"] is not None:
        now["git_sha"] = before["git_sha"].removesuffix("-dirty") + "-dirty"
    return now


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(cmd: list[str], log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed with exit {proc.returncode}; log: {log}")


def _train_command(
    arm: str, env_id: str, seed: int, steps: int, extra: tuple[str, ...], root: Path, save_every: int
) -> list[str]:
    """The ``train_gtrxl.py`` command of a fresh run of ``arm`` (one thread, no evaluation during training)."""
    train = [
        sys.executable,
        str(ROOT / "scripts" / "train_gtrxl.py"),
        "--env-id",
        env_id,
        "--seed",
        str(seed),
    ]
    train += ["--total-timesteps", str(steps), "--eval-every", "0", "--threads", "1", "--run-root", str(root)]
    if save_every > 0:
        train += ["--save-every", str(save_every), "--keep-checkpoints", "1"]
    return [*train, *ARMS[arm], *extra]


def _resume_point(work: Path, request: dict[str, Any]) -> Path | None:
    """The run directory of an interrupted run of the same ``request`` in ``work`` that has a checkpoint to
    resume, or None to start afresh (a run stopped before its first checkpoint is started again). A run of
    another request there is refused: resuming it would record the wrong flags; so is a checkpointed run with no
    ledger (whose request is unknown), rather than deleted."""
    ledger = read_ledger(work)
    last = [p.parent.parent for p in work.rglob("checkpoints/last.pt")]
    if ledger is None:
        if last:
            raise UserError(
                f"holds a checkpointed run but no {LEDGER} saying which command started it: delete the folder to "
                "start afresh",
                source=str(work),
            )
        return None
    if ledger.request != request:
        raise UserError(
            f"holds an interrupted run of {ledger.request}, not of {request}: run the same command to resume it, "
            "or delete the folder to start afresh",
            source=str(work),
        )
    return last[0] if last else None


def run_library_arm(
    arm: str,
    env_id: str,
    seed: int,
    steps: int,
    episodes: int,
    extra: tuple[str, ...],
    work: Path,
    save_every: int = 0,
) -> dict[str, Any]:
    """Train and evaluate one library arm in ``work``; the record's fields (see the module docstring). With
    ``save_every`` > 0 the run checkpoints every that many env steps, and a later call with the same ``work``
    resumes it from its last checkpoint; the record then lists the steps it resumed from (``resumed_at``), and
    its CPU seconds are those of the last stretch, over ``cpu_steps`` env steps."""
    root = work / f"{arm}-s{seed}"
    request = {"arm": arm, "env_id": env_id, "seed": seed, "steps": steps, "flags": [*ARMS[arm], *extra]}
    resume = _resume_point(work, request)
    resumed: list[int] = []
    if resume is None:
        shutil.rmtree(root, ignore_errors=True)
        start_job(work, request)
        train = _train_command(arm, env_id, seed, steps, extra, root, save_every)
    else:
        resumed = note_resume(work, int(read_checkpoint(resume / "checkpoints" / "last.pt")["global_step"]))
        train = [sys.executable, str(ROOT / "scripts" / "train_gtrxl.py"), "--resume", str(resume)]
    cpu0, wall0 = _child_cpu(), time.perf_counter()
    _run(train, work / f"{arm}-s{seed}.train{len(resumed)}.log")
    cpu, wall = _child_cpu() - cpu0, time.perf_counter() - wall0
    (run_dir,) = [p.parent for p in root.rglob("config.json")]
    _run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(run_dir), "--episodes", str(episodes)],
        work / f"{arm}-s{seed}.eval.log",
    )
    evaluated = json.loads((run_dir / "eval" / "evaluate-last.json").read_text(encoding="utf-8"))
    record = {
        "arm": arm,
        "flags": request["flags"],
        "env_id": env_id,
        "seed": seed,
        "total_timesteps": int(evaluated["step"]),
        "returns": [float(r) for r in evaluated["results"][0]["returns"]],
        "parameters": _parameters(work / f"{arm}-s{seed}.train0.log"),
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "config": json.loads((run_dir / "config.json").read_text(encoding="utf-8")),
        "curve": _curve(run_dir / "progress.jsonl"),
    }
    if resumed:
        record |= {"resumed_at": resumed, "cpu_steps": record["total_timesteps"] - resumed[-1]}
    return record


def _curve(progress: Path) -> list[list[float]]:
    """(env step, mean training return of the last 100 episodes), every 10th update."""
    curve = []
    for i, line in enumerate(progress.read_text(encoding="utf-8").splitlines()):
        row = json.loads(line)
        if i % 10 == 0 and "rollout/ep_rew_mean" in row:
            curve.append([int(row["step"]), round(float(row["rollout/ep_rew_mean"]), 2)])
    return curve


def _parameters(log: Path) -> int | None:
    """The parameter count train_gtrxl.py printed first ("ppo: 71,107 parameters; ...")."""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("ppo: ") and " parameters" in line:
            return int(line.split()[1].replace(",", ""))
    return None


def run_peer_arm(env_id: str, seed: int, steps: int, episodes: int) -> dict[str, Any]:
    import torch

    from rl_transformers.study.peer_ppo import run_peer

    torch.set_num_threads(1)
    result = run_peer(env_id, seed, episodes, steps)
    return {
        "arm": "peer",
        "peer": "sb3-contrib RecurrentPPO, rl-zoo ppo_lstm.yml",
        "zoo_key": result.zoo_key,
        "env_id": env_id,
        "seed": seed,
        "total_timesteps": result.total_timesteps,
        "returns": result.returns,
        "parameters": result.parameters,
        "cpu_seconds": result.cpu_seconds,
        "wall_seconds": result.wall_seconds,
    }


def run_arms(
    env_id: str,
    arms: tuple[str, ...],
    seeds: tuple[int, ...],
    steps: int,
    episodes: int,
    out: Path,
    extra: tuple[str, ...] = (),
    save_every: int = 0,
    keep_runs: bool = False,
) -> None:
    """Every (arm, seed) whose record is missing, seed-major (so a stopped comparison has whole seeds). With
    ``save_every`` > 0 a library run works in ``<out>/.partial/<arm>-s<seed>/``, checkpointing every that many env
    steps, so a run stopped midway resumes there (:func:`run_library_arm`); the folder goes once the record is
    written. With ``keep_runs`` it works there too and then moves to ``<out>/runs/<arm>-s<seed>/``, which the
    record names (``run_dir``); otherwise a run without checkpoints works in a temporary folder."""
    for seed in seeds:
        for arm in arms:
            path = out / arm / f"s{seed}.json"
            if path.exists():
                continue
            print(f"{arm} seed {seed}, {steps:,} env steps ...", flush=True)
            before = provenance()
            if arm == "peer":
                record = run_peer_arm(env_id, seed, steps, episodes)
            elif save_every > 0 or keep_runs:
                record = _run_in_out(arm, env_id, seed, steps, episodes, extra, out, save_every, keep_runs)
            else:
                with tempfile.TemporaryDirectory(prefix="rlt-peer-") as tmp:
                    record = run_library_arm(arm, env_id, seed, steps, episodes, extra, Path(tmp))
            record |= provenance_since(before)
            atomic_write_json(path, record)
            if arm != "peer" and (save_every > 0 or keep_runs):  # the peer's runs do not checkpoint
                work, kept = _run_folders(arm, seed)
                if keep_runs:
                    (out / work).rename(out / kept)
                else:
                    shutil.rmtree(out / work)
            print(f"  mean {np.mean(record['returns']):.4g}", flush=True)


def _run_folders(arm: str, seed: int) -> tuple[Path, Path]:
    """Where a library run works and, kept, ends up: ``.partial/<arm>-s<seed>`` and ``runs/<arm>-s<seed>``,
    relative to the comparison's folder."""
    name = f"{arm}-s{seed}"
    return Path(PARTIAL) / name, Path(KEPT) / name


def _run_in_out(
    arm: str,
    env_id: str,
    seed: int,
    steps: int,
    episodes: int,
    extra: tuple[str, ...],
    out: Path,
    save_every: int,
    keep_runs: bool,
) -> dict[str, Any]:
    """:func:`run_library_arm` in ``<out>/.partial/<arm>-s<seed>/``; with ``keep_runs`` the record names the
    folder the run will move to (``run_dir``, relative to ``out``), which must not exist yet: a kept run with no
    record is the user's to delete, not to overwrite."""
    partial, kept = _run_folders(arm, seed)
    work = out / partial
    if keep_runs and (out / kept).exists():
        raise UserError(
            f"already holds a kept run {kept} but no record {arm}/s{seed}.json: delete the folder to run it again",
            source=str(out),
        )
    work.mkdir(parents=True, exist_ok=True)
    record = run_library_arm(arm, env_id, seed, steps, episodes, extra, work, save_every)
    if keep_runs:
        run_dir = next((work / f"{arm}-s{seed}").rglob("config.json")).parent
        record["run_dir"] = str(kept / run_dir.relative_to(work))
        (out / KEPT).mkdir(exist_ok=True)
    return record
