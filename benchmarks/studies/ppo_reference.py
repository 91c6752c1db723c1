"""PPO env steps/s against cleanrl's ``ppo_trxl`` at an equal parameter count, run side by side.

Reference: cleanrl's ``cleanrl/ppo_trxl/ppo_trxl.py`` (Huang et al. 2022, JMLR 23(274); the TrXL-PPO of
Pleines et al. 2023, "Memory Gym", arXiv 2309.17207) with its documented ProofofMemory-v0 command: 16 envs x
128 steps, 8 minibatches, 4 epochs, a 4-layer TrXL of width 64 with 1 head, a 16-step memory window and no
positional encoding - 88,579 parameters. Its code is not part of this project: the caller points ``cleanrl_dir``
at a checkout (the script and its ``pom_env.py``) and ``cleanrl_python`` at an interpreter that has its
dependencies (gymnasium 0.29, memory-gym, einops, tyro, tensorboard, torch); it runs unmodified in a
temporary directory with one torch thread (``OMP_NUM_THREADS=1``).

Ours runs :func:`rl_transformers.algos.throughput.measure_throughput` on the same environment (``pom_env`` imported
from ``cleanrl_dir``) with the same rollout and update shape, for models sized to the same parameter count
(:data:`OUR_MODELS`; the counts are measured and reported, never assumed). Rates are steady-state env steps/s
of rollout + training, warm-up iterations excluded on both sides: cleanrl's printed cumulative ``SPS`` at
iteration i gives its elapsed time i·batch / SPS_i, and the rate is taken between the last warm-up iteration and
the last one. Measurements alternate between the candidates (rotated each round); medians over rounds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.studies.ppo_throughput import STATUS_OK, measure_one
from rl_transformers.utils.errors import UserError

CLEANRL_POM_FLAGS = (
    "--env_id", "ProofofMemory-v0", "--num_envs", "16", "--num_steps", "128", "--num_minibatches", "8",
    "--update_epochs", "4", "--trxl_num_layers", "4", "--trxl_num_heads", "1", "--trxl_dim", "64",
    "--trxl_memory_length", "16", "--trxl_positional_encoding", "none", "--vf_coef", "0.1",
    "--max_grad_norm", "0.5", "--init_lr", "3.0e-4", "--init_ent_coef", "0.001", "--clip_coef", "0.2",
    "--no-cuda",
)  # fmt: skip
"""cleanrl's documented ProofofMemory-v0 command (docs/rl-algorithms/ppo-trxl.md) minus the step budget."""
NUM_ENVS, NUM_STEPS = 16, 128
ENV_ID = "pom_env:ProofofMemory-v0"

OUR_MODELS: dict[str, dict[str, Any]] = {
    # cleanrl's shape (4 pre-LN layers, width 64, 1 head, XL memory of 16 steps, no positions); the FFN width
    # (cleanrl's "FFN" is one d x d layer, ours two) brings the count to 89,091 (+0.6 %).
    "pre_ln d64 x4": dict(d_model=64, n_layers=4, n_heads=1, d_ff=32, block="pre_ln"),
    # our default block (GTrXL gates: 6 d x d matrices per sub-layer) at the same depth: width 32 for the count.
    "gtrxl d32 x4": dict(d_model=32, n_layers=4, n_heads=1, d_ff=80, block="gtrxl"),
}
"""Our models compared (BackboneConfig fields; memory xl of 16 steps, attention full, position none)."""


def our_config(model: dict[str, Any], threads: int = 1, compile: bool = False) -> Any:
    """The TrainConfig of one of :data:`OUR_MODELS` with cleanrl's rollout / update shape (``compile``: the
    acting step compiled, ``--compile``)."""
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.backbone.config import BackboneConfig
    from rl_transformers.policies.gtrxl import PolicyConfig

    backbone = BackboneConfig(
        attention="full", position="none", memory="xl", memory_options={"mem_len": 16}, **model
    )
    ppo = PPOConfig(num_steps=NUM_STEPS, seq_len=16, num_minibatches=8, update_epochs=4)
    policy = PolicyConfig(backbone=backbone, context_len=16)
    return TrainConfig(
        env_id=ENV_ID,
        num_envs=NUM_ENVS,
        policy=policy,
        ppo=ppo,
        threads=threads,
        progress=False,
        device="cpu",
        compile=compile,
    )


_LINE = re.compile(r"^\s*(\d+)\s+SPS=\s*(\d+)\s")


def steady_rate(stdout: str, batch: int, warmup: int) -> float:
    """Env steps/s between iteration ``warmup`` (0: the start) and the last one, from cleanrl's printed lines."""
    points = [(int(m.group(1)), int(m.group(2))) for line in stdout.splitlines() if (m := _LINE.match(line))]
    if not points:
        raise ValueError(f"no '<iteration> SPS=<n>' lines in cleanrl's output: {stdout[-500:]!r}")
    elapsed = {i: i * batch / sps for i, sps in points if sps > 0}
    last = max(elapsed)
    if warmup >= last:
        raise ValueError(f"need more than {warmup} iterations, got {last}")
    start = elapsed.get(warmup, 0.0) if warmup else 0.0
    return (last - warmup) * batch / (elapsed[last] - start)


def run_cleanrl(
    cleanrl_dir: Path, python: str, updates: int, warmup: int, timeout_s: float
) -> dict[str, Any]:
    """cleanrl's script, unmodified, in a temporary directory; its steady-state env steps/s."""
    batch = NUM_ENVS * NUM_STEPS
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory(prefix="cleanrl_") as tmp:
        for name in ("ppo_trxl.py", "pom_env.py"):
            shutil.copy(cleanrl_dir / name, Path(tmp) / name)
        cmd = [
            python,
            "ppo_trxl.py",
            *CLEANRL_POM_FLAGS,
            "--total_timesteps",
            str((updates + warmup) * batch),
        ]
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "error", "reason": f"cleanrl did not finish within {timeout_s:g} s"}
    if proc.returncode != 0:
        return {"status": "error", "reason": proc.stderr.strip()[-800:]}
    return {"status": STATUS_OK, "steps_per_s": steady_rate(proc.stdout, batch, warmup)}


def cleanrl_parameters(cleanrl_dir: Path, python: str) -> int:
    """Parameter count of cleanrl's Agent for ProofofMemory (observation Box(3), 2 actions, 16 steps)."""
    code = (
        "import sys, numpy as np, gymnasium as gym; sys.argv = ['x']; import ppo_trxl as m; "
        "a = m.Args(trxl_num_layers=4, trxl_num_heads=1, trxl_dim=64, trxl_memory_length=16, "
        "trxl_positional_encoding='none'); "
        "agent = m.Agent(a, gym.spaces.Box(-1, 1, (3,), np.float32), (2,), 16); "
        "print(sum(p.numel() for p in agent.parameters()))"
    )
    env = os.environ | {"PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [python, "-c", code], cwd=cleanrl_dir, env=env, capture_output=True, text=True, timeout=300
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines or not lines[-1].isdigit():
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"cannot build cleanrl's Agent with {python} in {cleanrl_dir}: {why} (install cleanrl's ppo_trxl "
            "dependencies into that interpreter: its pyproject.toml lists them)",
            source="--cleanrl-python",
        )
    return int(lines[-1])


CLEANRL_FILES = ("ppo_trxl.py", "pom_env.py")


def cleanrl_source(cleanrl_dir: Path) -> dict[str, Any]:
    """Which cleanrl code was measured: the sha256 of each file run and, in a git checkout, its commit (else
    None), so a published comparison names the exact cleanrl code it ran."""
    files = {name: hashlib.sha256((cleanrl_dir / name).read_bytes()).hexdigest() for name in CLEANRL_FILES}
    try:
        out = subprocess.run(
            ["git", "-C", str(cleanrl_dir), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
        commit = out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        commit = None
    return {"git_commit": commit, "sha256": files}


COMPILED = " --compile"
"""Suffix of our rows measured with the acting step compiled."""


def compare(
    cleanrl_dir: Path,
    cleanrl_python: str,
    updates: int,
    warmup: int,
    rounds: int,
    log: Any = print,
    compile: bool = False,
) -> dict[str, Any]:
    """Side-by-side rounds of cleanrl and each of :data:`OUR_MODELS` (with ``compile``, also each compiled:
    rows named with :data:`COMPILED`); rows with medians, speed-ups and, for ours, the rollout and training
    rates (where an iteration's time goes)."""
    cleanrl_dir = cleanrl_dir.resolve()
    if not all((cleanrl_dir / name).is_file() for name in CLEANRL_FILES):
        raise UserError(
            f"{cleanrl_dir} must hold cleanrl's ppo_trxl.py and pom_env.py", source="--cleanrl-dir"
        )
    source = cleanrl_source(cleanrl_dir)  # before the runs: what is measured is what is named
    # before the runs too: an interpreter without cleanrl's dependencies stops here, not after the timing
    params = {"cleanrl ppo_trxl": cleanrl_parameters(cleanrl_dir, cleanrl_python)}
    if str(cleanrl_dir) not in sys.path:
        sys.path.insert(0, str(cleanrl_dir))  # pom_env for our envs (spawned workers inherit sys.path)
    names = ["cleanrl ppo_trxl", *OUR_MODELS, *([m + COMPILED for m in OUR_MODELS] if compile else [])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if name == "cleanrl ppo_trxl":
                result = run_cleanrl(cleanrl_dir, cleanrl_python, updates, warmup, timeout_s=1800)
            else:
                model = OUR_MODELS[name.removesuffix(COMPILED)]
                cfg = our_config(model, compile=name.endswith(COMPILED))
                result = measure_one(cfg, None, updates, warmup, 1800, env_modules=("pom_env",))
            runs[name].append(result)
            log(f"[round {r + 1}/{rounds}] {name}: {result.get('steps_per_s', result)}")
    rows = []
    for name in names:
        ok = [x for x in runs[name] if x["status"] == STATUS_OK]
        row: dict[str, Any] = {"model": name, "status": STATUS_OK if ok else "error"}
        if not ok:
            row["reason"] = runs[name][-1].get("reason", "")
        else:
            row["steps_per_s"] = round(statistics.median(x["steps_per_s"] for x in ok), 1)
            row["steps_per_s_rounds"] = [round(x["steps_per_s"], 1) for x in ok]
            for phase in ("rollout_steps_per_s", "train_steps_per_s"):  # ours only: cleanrl prints one rate
                if phase in ok[0]:
                    row[phase] = round(statistics.median(x[phase] for x in ok), 1)
            if "parameters" in ok[0]:
                params[name] = int(ok[0]["parameters"])
        row["parameters"] = params.get(name)
        row["config"] = OUR_MODELS.get(name.removesuffix(COMPILED), {"flags": " ".join(CLEANRL_POM_FLAGS)})
        rows.append(row)
    base = rows[0].get("steps_per_s")
    for row in rows:
        if base and row.get("steps_per_s"):
            row["speedup_vs_cleanrl"] = round(row["steps_per_s"] / base, 2)
            row["parameters_vs_cleanrl"] = round(row["parameters"] / params["cleanrl ppo_trxl"], 3)
    shape = dataclasses.asdict(our_config(next(iter(OUR_MODELS.values()))).ppo)
    return {
        "rows": rows,
        "cleanrl": source,
        "ppo": {k: shape[k] for k in ("num_steps", "seq_len", "num_minibatches", "update_epochs")},
    }
