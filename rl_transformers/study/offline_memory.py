"""The offline memory table: the Decision Transformer on T-Maze corridors, one row per causal attention and memory.

Data: the passive T-Maze (Bakker 2001; in the form of Ni et al. 2023, arXiv 2307.03864) built
locally by :data:`DATASET_COMMAND` (500 episodes per corridor length L: 80 % scripted oracle, 20 % uniform random;
the cue of t = 0 is needed at t = L). A DT must carry the cue L steps to choose the arm; the score is the
**success rate** at the target return 1 over :data:`RECIPE` ``eval_episodes`` greedy episodes (the env's
``success`` flag). Rows (every row gets the same recipe, budget and seeds):

- **attention** rows: every causal attention the DT backbone accepts (:func:`~rl_transformers.study.encoders.
  dt_encoders`, parameter-matched to ``full``), context K = L + 1 steps (3K tokens: the whole episode), windows
  aligned to the episode start (``--window-starts aligned``: the cue is in every training window). Each keeps
  its default options, so a windowed attention whose layers x window is shorter than 3(L + 1) tokens cannot
  reach the cue (docs/offline_memory.md, "Reach"): the table shows where each one stops working.
- **memory** rows (RATE, Cherepanov et al. 2023, arXiv 2306.09459): ``full`` attention with K_s = ⌈(L + 1) / 3⌉
  and ``--segments 3``, the memory carried across the segments in training and in the rollout: ``xl``
  (mem_len 3K_s(N - 1) tokens: exactly the window), ``compressive`` (3K_s recent + 3K_s compressed at rate 2)
  and ``knn`` (3K_s local, a store of 6K_s, top 8).
- the **floor**: ``full`` with K = K_s and no memory: the cue is out of its context at the junction, so it
  can only guess (a memoryless policy's success is the share of evaluation episodes with its favoured cue).

This module is the table itself (its rows, recipe, tasks and jobs), which the long-context DT benchmark
(:mod:`rl_transformers.bench.dt_long`) measures too; running it is an experiment of its own
(``experiments/offline_memory/``: ``python -m experiments.offline_memory.run``). Jobs, resume, locks, records
and their restore are the study's (:mod:`~rl_transformers.study.launch`, :mod:`~rl_transformers.study.records`): a
job is one (L, row, seed) under ``<out>/offline_memory/dt/TMaze<L>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.study import launch
from rl_transformers.study.encoders import Encoder, dt_encoders, format_spec, parse_spec
from rl_transformers.study.records import Job
from rl_transformers.study.suite import DATASET_ROOT, Task

PRESET = "offline_memory"
LENGTHS = (10, 25, 50)
"""Corridor lengths L of the table (datasets of :data:`DATASET_COMMAND`). Corridor 200 left the table on the
corridor-50 evidence (docs/offline_memory.md, "Why the table stops at corridor 50"): about 43 core-hours at
2,000 updates, over the table's planned 20, for a column the update budget, not the attention, would decide."""
SEGMENTS = 3
"""N of the memory rows: K_s = ⌈(L + 1) / N⌉ steps per segment."""
SEEDS = (0, 1, 2)
DATASET_NAME = "mixed-e0-r20-v0"
DATASET_COMMAND = (
    "python scripts/make_memory_dataset.py --task tmaze --memory-lengths 10 25 50 --random-share 0.2 "
    "--root datasets/minari"
)
BUDGET = {10: 400, 25: 600, 50: 800}
"""Gradient updates per corridor length (evaluations at every quarter)."""
ASSUMED_UPDATES_PER_S = {10: 20.0, 25: 12.0, 50: 7.0}
"""--dry-run's rate (updates/s, evaluations included, one core) for a cell no finished run has measured: from
single full-attention runs on the development machine."""
RECIPE: dict[str, Any] = {
    "batch_size": 32,
    "learning_rate": 3e-3,
    "warmup_steps": 50,
    "embed_dropout": 0.0,
    "eval_episodes": 50,
    "eval_envs": 10,
    "log_every": 100,
    "window_starts": "aligned",
}
"""DT settings of every row (with backbone dropout 0): at the study's DT settings (dropout 0.1, learning rate
6e-4, uniform window starts) ``full`` with K = 51 stayed at chance on corridor 50 for 600 updates; with these it
solves it in 300."""
BACKBONE = {"dropout": 0.0}
MEMORIES = ("xl", "compressive", "knn")
FLOOR = "floor"


def segment_len(length: int) -> int:
    """K_s of corridor ``length``: N segments of K_s steps cover its L + 1 steps."""
    return -(-(length + 1) // SEGMENTS)


def memory_options(memory: str, length: int) -> dict[str, int]:
    """Options of a memory row on corridor ``length`` (in tokens: 3 per step)."""
    tokens = 3 * segment_len(length)
    if memory == "xl":
        return {"mem_len": tokens * (SEGMENTS - 1)}
    if memory == "compressive":
        return {"mem_len": tokens, "cmem_len": tokens, "rate": 2}
    if memory == "knn":
        return {"mem_len": tokens, "store_size": 2 * tokens, "top_k": 8}
    raise ValueError(f"no options for memory {memory!r}")


@dataclass(frozen=True)
class Row:
    """A row of the table; :meth:`encoder` and :meth:`dt_args` give its job on one corridor length."""

    name: str
    family: str
    """attention | memory | floor."""
    spec: str
    """Backbone overrides common to every length (the attention rows' parameter-matched spec)."""
    note: str = ""

    def encoder(self, length: int) -> Encoder:
        fields = {**parse_spec(self.spec), **BACKBONE}
        if self.family == "memory":
            fields.update(memory=self.name, memory_options=memory_options(self.name, length))
        return Encoder(self.name, format_spec(fields), self.family, self.note)

    def dt_args(self, length: int) -> dict[str, Any]:
        if self.family == "attention":
            return {**RECIPE, "context_len": length + 1}
        segments = SEGMENTS if self.family == "memory" else 1
        return {**RECIPE, "context_len": segment_len(length), "segments": segments}


ATTENTIONS = (
    "full", "local", "block_local", "block_local_2d", "blockwise", "strided", "fixed", "longformer", "bigbird",
    "etc", "lsh", "routing", "memory_compressed", "linear", "performer", "rfa", "gaussian_prior", "adaptive_span",
)  # fmt: skip
"""The attention rows the table was run with (the causal attentions the DT backbone accepted then): frozen, so
an attention registered later does not turn the finished table into a partial one; it joins by a new run."""


def rows(match: bool = True) -> list[Row]:
    """Every row: the DT attention rows (:data:`ATTENTIONS`, in the registry's order), the memories, the floor."""
    attention, _ = dt_encoders(match)
    missing = sorted(set(ATTENTIONS) - {e.name for e in attention})
    if missing:
        raise ValueError(
            f"the offline memory table's attentions {missing} are not DT encoders of the registry"
        )
    out = [Row(e.name, "attention", e.spec, "K = L + 1") for e in attention if e.name in ATTENTIONS]
    out += [Row(m, "memory", "attention=full", f"full, K_s, {SEGMENTS} segments") for m in MEMORIES]
    out.append(Row(FLOOR, "floor", "attention=full", "full, K_s, no memory"))
    return out


def task(length: int) -> Task:
    budget = BUDGET.get(length, BUDGET[max(BUDGET)])
    return Task(
        name=f"TMaze{length}",
        algo="dt",
        tag="memory",
        budget={PRESET: budget},
        eval_every={PRESET: max(1, budget // 4)},
        dataset=f"rlt/tmaze-{length}/{DATASET_NAME}",
        target=1.0,
        score_note="success rate at target return 1",
    )


DATASETS = DATASET_ROOT
"""Root of the Minari datasets, relative to the checkout (the worker resolves it; an absolute path stays)."""


def make_job(length: int, row: Row, seed: int, out: Path) -> Job:
    return launch.make_job(
        task(length), row.encoder(length), seed, PRESET, out, dt=row.dt_args(length), dataset_root=DATASETS
    )
