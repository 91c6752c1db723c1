"""One study run in its own process: ``python -m rl_transformers.study.worker <run dir>/job.json [--deadline-s S]``.

Reads the job (algo, task, encoder spec, seed, budget), calls the trainer's public ``train`` function
(:func:`rl_transformers.algos.ppo.train` / :func:`rl_transformers.algos.dt.train`) with the run directory
``<run dir>/run`` (a PPO run interrupted earlier resumes from its checkpoint when that continues it bit for
bit: :mod:`~rl_transformers.study.attempts`), then reads the evaluation series the trainer logged to ``progress.jsonl`` and writes
``<run dir>/result.json`` atomically (the record of :func:`make_record`). Exit code 0 only with a result: a
run that the trainer stopped early (SIGTERM or Ctrl-C: it saves and returns) writes no result and exits with
:data:`EXIT_INTERRUPTED`, so the study runs it again instead of scoring a shortened run. The record names the
commit (``git_sha``) and the machine (:func:`~rl_transformers.study.records.machine_text`) the run ran at.

``--deadline-s`` (the launcher passes its run timeout): the worker stops itself then, as if sent SIGTERM, and
exits at once :data:`DEADLINE_GRACE_S` later if it is still alive (:data:`WATCHDOG_S` later still, from a C
thread, if it is stuck where Python handlers cannot run: :func:`arm_deadline`). The launcher kills a worker at
its timeout anyway; the deadline matters when the launcher is gone (killed on a Ray node), so that an orphaned
worker ends before its job's lock expires for other hosts (``joblock.GRACE_S`` after the timeout) and never
runs next to the invocation that takes the job over.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rl_transformers.runs.provenance import git_sha
from rl_transformers.study.attempts import Attempt, code_identity, finish_attempt, plan_attempt, start_attempt
from rl_transformers.study.records import UNKNOWN, machine_text
from rl_transformers.utils.atomic import atomic_write_json

EXIT_INTERRUPTED = 3
"""Exit code of a run that the trainer stopped before its budget (no result.json written)."""
EXIT_DEADLINE = 4
"""Exit code of a worker still alive :data:`DEADLINE_GRACE_S` after its deadline (it ignored the SIGTERM)."""
DEADLINE_GRACE_S = 60.0
"""From the deadline's SIGTERM to the hard exit: time for the trainer to save its checkpoint."""
WATCHDOG_S = 60.0
"""From the hard exit's due time to faulthandler's (for a worker whose signal handlers cannot run)."""
MAX_DEADLINE_S = 1e9
"""Deadlines from this many seconds up (``inf`` included) mean none: the timers do not take them."""


class Interrupted(RuntimeError):
    """The trainer returned early (``interrupted``): the run is no result."""


def _check_complete(result: Any) -> None:
    if result.interrupted:
        raise Interrupted(f"the trainer stopped at step {result.step} before the budget (interrupted)")


def arm_deadline(seconds: float, grace_s: float = DEADLINE_GRACE_S, watchdog_s: float = WATCHDOG_S) -> None:
    """After ``seconds``: SIGTERM to this process (the trainer saves and returns; no result); after ``grace_s``
    more: exit with :data:`EXIT_DEADLINE` at once. Both run as a Python signal handler, which waits for the
    main thread to come back from C code; a worker stuck inside one C call (a deadlocked op) is ended
    ``watchdog_s`` later still by :func:`faulthandler.dump_traceback_later` (a C thread: it prints every
    thread's stack to stderr and exits with code 1). POSIX only (SIGALRM); elsewhere only the watchdog and the
    launcher's timeout bound the run. :func:`disarm_deadline` cancels all three."""
    faulthandler.dump_traceback_later(seconds + grace_s + watchdog_s, exit=True)
    if hasattr(signal, "SIGALRM"):
        fired: list[bool] = []

        def on_alarm(signum: int, frame: Any) -> None:
            if fired:
                print(f"still running {grace_s:g} s after the deadline: exiting", file=sys.stderr, flush=True)
                os._exit(EXIT_DEADLINE)
            fired.append(True)
            print(f"deadline of {seconds:g} s reached: stopping (no result)", file=sys.stderr, flush=True)
            signal.setitimer(signal.ITIMER_REAL, grace_s)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    print(f"deadline: this worker stops itself after {seconds:g} s", flush=True)


def disarm_deadline() -> None:
    """Cancel :func:`arm_deadline` (once the trainer has returned: the record is written in any case)."""
    faulthandler.cancel_dump_traceback_later()
    if hasattr(signal, "SIGALRM"):
        signal.setitimer(signal.ITIMER_REAL, 0)


def parse_deadline(text: str) -> float | None:
    """``--deadline-s``: a positive number of seconds; ``inf`` or anything from :data:`MAX_DEADLINE_S` up (past
    what the timers take) means no deadline (None)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise ValueError(f"--deadline-s must be a positive number of seconds, got {text!r}")
    return value if value < MAX_DEADLINE_S else None


def success_fields(run: Path) -> dict[str, Any]:
    """``success`` (the last evaluation's success rate) and ``success_curve`` of a run whose env reports
    success (the T-Maze: PPO and DT log ``eval/success_rate``); empty otherwise."""
    success = read_series(run / "progress.jsonl", "eval/success_rate")
    if not success:
        return {}
    return {"success": success[-1][1], "success_curve": [list(p) for p in success]}


def read_series(progress: Path, key: str) -> list[tuple[float, float]]:
    """(step, value) of every finite ``key`` entry in a progress.jsonl."""
    out: list[tuple[float, float]] = []
    for line in progress.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if key in row and row[key] is not None and math.isfinite(float(row[key])):
            out.append((float(row.get("step", len(out))), float(row[key])))
    return out


def _ppo(job: dict[str, Any], run: Path, attempt: Attempt) -> dict[str, Any]:
    from rl_transformers.algos.ppo import train
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.policies.gtrxl import make_policy
    from rl_transformers.study.encoders import _spaces, policy_config
    from rl_transformers.study.records import PPO_NUM_ENVS

    cfg = TrainConfig(
        env_id=job["env_id"],
        env_kwargs=job.get("env_kwargs", {}),
        total_timesteps=job["budget"],
        num_envs=job.get("num_envs", PPO_NUM_ENVS),
        seed=job["seed"],
        policy=policy_config(job["encoder"]),
        ppo=PPOConfig(**job.get("ppo", {})),
        eval_every=job["eval_every"],
        eval_final=False,  # the study's protocol: evaluations at multiples of eval_every only
        eval_episodes=job.get("eval_episodes", 16),
        threads=1,
        device="cpu",
        run_root=run.parent,
        keep_checkpoints=1,
        progress=False,
        resume=attempt.checkpoint,
    )
    start = time.perf_counter()
    result = train(cfg, run_dir=run)
    wall = attempt.credit_s + time.perf_counter() - start
    _check_complete(result)
    obs_space, act_space = _spaces(job["env_id"]) if not job.get("env_kwargs") else _env_spaces(job)
    policy = make_policy(cfg.policy, obs_space, act_space)
    curve = read_series(run / "progress.jsonl", "eval/mean_reward")
    record = make_record(job, curve, result.step, wall, sum(p.numel() for p in policy.parameters()))
    if attempt.resumed_from:
        record["resumed_from"] = list(attempt.resumed_from)
    return {**record, **success_fields(run)}


def _env_spaces(job: dict[str, Any]) -> tuple[Any, Any]:
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make(job["env_id"], **job["env_kwargs"])
    spaces = (env.observation_space, env.action_space)
    env.close()
    return spaces


def _checkout_path(path: str) -> Path:
    """A job's path: relative ones (the dataset root) are relative to the checkout the worker runs from."""
    from rl_transformers.study.launch import ROOT

    return ROOT / path


def _dt(job: dict[str, Any], run: Path) -> dict[str, Any]:
    from rl_transformers.algos.dt import train
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.study.encoders import dt_backbone

    cfg = DTConfig(
        dataset=job["dataset"],
        dataset_root=_checkout_path(job["dataset_root"]),
        backbone=dt_backbone(job["encoder"]),
        total_steps=job["budget"],
        eval_every=job["eval_every"],
        target_returns=(job["target"],),
        seed=job["seed"],
        device="cpu",
        threads=1,
        run_root=run.parent,
        progress=False,
        save_every=job["budget"],
        keep_checkpoints=0,
        **job.get("dt", {}),
    )
    start = time.perf_counter()
    result = train(cfg, run_dir=run)
    wall = time.perf_counter() - start
    _check_complete(result)
    curve = read_series(run / "progress.jsonl", "eval/normalized_score")
    returns = read_series(run / "progress.jsonl", "eval/return_mean")
    if result.model is None:
        raise RuntimeError("the DT trainer returned no model")
    record = make_record(job, curve, result.step, wall, sum(p.numel() for p in result.model.parameters()))
    record["score"] = curve[-1][1] if curve else None  # DT: normalized score of the final evaluation
    record["final_return"] = returns[-1][1] if returns else None
    record["env_steps"] = None
    record["updates"] = result.step
    record["steps_per_s"] = None
    record["updates_per_s"] = result.step / wall if wall > 0 else None
    return {**record, **success_fields(run)}


def make_record(
    job: dict[str, Any], curve: list[tuple[float, float]], steps: int, wall: float, parameters: int
) -> dict[str, Any]:
    """One run's record: the documented fields plus the evaluation curve and the job's identity."""
    return {
        "algo": job["algo"],
        "task": job["task"],
        "encoder": job["encoder"],
        "encoder_name": job["encoder_name"],
        "seed": job["seed"],
        "preset": job["preset"],
        "score": max(v for _, v in curve) if curve else None,
        "final_return": curve[-1][1] if curve else None,
        "env_steps": steps,
        "steps_per_s": steps / wall if wall > 0 else None,
        "wall_s": wall,
        "parameters": parameters,
        "curve": curve,
        "key": job["key"],
    }


def main(argv: list[str]) -> int:
    usage = "usage: python -m rl_transformers.study.worker <run dir>/job.json [--deadline-s SECONDS]"
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--deadline-s"):
        print(usage, file=sys.stderr)
        return 2
    if len(argv) == 3:
        try:
            deadline = parse_deadline(argv[2])
        except ValueError as err:
            print(f"{err}; {usage}", file=sys.stderr)
            return 2
        if deadline is not None:
            arm_deadline(deadline)
    job_path = Path(argv[0])
    job = json.loads(job_path.read_text())
    run = job_path.parent / "run"
    sha = git_sha()  # the code this run is about to run (``-dirty``: with uncommitted changes)
    host = machine_text()
    code = code_identity()
    attempt = plan_attempt(job, run, code, host)
    if attempt.checkpoint is None:
        import shutil

        shutil.rmtree(run, ignore_errors=True)  # a previous attempt that cannot be continued
    else:
        print(f"resuming from {attempt.checkpoint} (step {attempt.resumed_from[-1]:,})", flush=True)
    start_attempt(job, run, attempt, code, host)
    try:
        record = _dt(job, run) if job["algo"] == "dt" else _ppo(job, run, attempt)
    except Interrupted as err:
        print(f"no result: {err}; the study runs this job again", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        disarm_deadline()  # a signal after the trainer returned must not kill the worker before it writes
    record["git_sha"] = sha or UNKNOWN
    record["machine"] = host
    atomic_write_json(job_path.parent / "result.json", record, indent=1)
    finish_attempt(run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
