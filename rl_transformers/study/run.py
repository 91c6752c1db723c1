"""The study driver: plan the jobs of a preset, run the unfinished ones, rebuild the documents.

``run_study(StudyConfig(...))`` expands the encoders (registry read now), makes one job per (task, encoder,
seed), moves aside the results of ``rerun_encoders`` (a dry run only counts them), and - unless ``dry_run`` /
``report_only`` - runs the pending and failed jobs (local pool or Ray), seed-major so partial results cover
every encoder evenly. Then it collects every finished run of the preset and writes the documents into ``docs``.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rl_transformers.study import encoders as enc
from rl_transformers.study import launch, report, suite
from rl_transformers.study.aggregate import REPS

METHOD = """\
Every encoder is trained with the **same hyper-parameters on a task** (as POPGym did): PPO with the defaults of
`PPOConfig` (32 envs × 64 steps per update, 16-step training windows, 4 epochs × 4 minibatches, lr 3e-4 annealed,
γ 0.99, λ 0.95, clip 0.2, entropy 0.01), an evaluation of 16 greedy episodes every `eval_every` steps (POPGym
tasks: every 16,384, the last at the budget; T-Maze 10: every 10,240, so the last is at 122,880 and its final 4
updates of 131,072 are not evaluated - the PPO trainer evaluates only at multiples of `eval_every`).
**Score** = POPGym's MMER: the maximum over evaluations of the mean greedy return (POPGym tasks on their
[-1, 1] scale; T-Maze: the greedy return, which is the success rate when the agent keeps to the schedule and a
lower bound otherwise); `final_return` in encoders.json is the mean greedy return of the last evaluation (DT:
its raw mean return, not normalized). Table cells are mean ± sample std (n − 1) over seeds. Offline: the Decision
Transformer (d 64, 2 layers, 1 head, context 10, batch 64, lr 6e-4, warm-up 200) on two locally built Minari
datasets; score = normalized score 100·(R − ref_min)/(ref_max − ref_min) of the final evaluation (10 episodes) at
the fixed target return. **Encoders**: the GTrXL default (`full` + `xl` memory of 32 + `xl_relative` + `gtrxl`
block, d 64, 2 layers, 4 heads); one row per registered causal attention = the default with that attention and
no XL memory (each attention keeps its own streaming cache, bounded to 64 past tokens - `max_cache`, set by
the policy's `bound_context`; adaptive_span keeps its own bound, max_span + ramp = 288), with the first
positional scheme it accepts from (`xl_relative`, `rope`, `none`); the other memories (`compressive`, `knn`)
and depths (`universal`, `early_exit`) swapped into the default; GRU, LSTM and MLP cores behind the same
actor-critic. **Parameters** are matched within ±10 % to the GTrXL default (online; offline: to the DT with
`full` attention) by the FFN width `d_ff`
(transformers) or `hidden_size` (baselines), by bisection on the count; every count is reported. Aggregates
use `rliable` (Agarwal et al. 2021, arXiv 2108.13264): IQM with stratified-bootstrap 95 % CIs (2,000
resamples), score-distribution performance profiles, probability of improvement over GRU (offline: over the
`full` attention). One run = one subprocess with one torch thread; at most 2 at a time on this machine."""

NOTES = """\
- The budget is the limit: PPO runs get 131k-197k env steps (64-96 updates), about what GTrXL needs on T-Maze 10
  (113k) and RepeatPreviousEasy (184k, docs/results/online.md). The budget check above shows what GRU makes of
  it: it learns T-Maze 10, both PositionOnlyCartPole tasks and RepeatPreviousEasy (still rising at 197k), gains
  little on MineSweeperEasy and nothing on CountRecallEasy, so on those two the budget limits the conclusion.
  Replacements for them were tried with GRU and MLP (seed 0, the same settings, not recorded here):
  RepeatFirstEasy (neither learns), HigherLowerEasy (the MLP scores 0.5 from the first evaluation: no memory
  needed), MultiarmedBanditEasy (GRU stays around 0) and VelocityOnlyCartPoleEasy (GRU solves it by 16k steps);
  none separates encoders better, so the suite was kept. Scores are means over 16 greedy evaluation episodes,
  so they move in steps of at least 1/16.
- Cost: the full grid (576 runs) needs about 13 hours of 2 cores at the measured rates (the "Cost" line above
  counts what is done; `--dry-run` estimates the rest), well over the 8 hours aimed for; the budgets at which GRU
  learns were kept over the time target, and the study runs in parts.
- Steps/s are measured on a machine shared with other jobs (up to 2 concurrent runs plus other work, e.g.
  test suites), so they are comparable within this study only roughly; the idle-machine per-attention speed is
  in benchmarks/results/ppo_throughput/results.md.
- `fixed`, `strided` and `bigbird` kept an unbounded streaming cache until commit `4eb9e34` (their
  context grew over the whole run, ending 5-10x slower than `full`); their earlier results were discarded and
  re-run with the same 64-key bound (`max_cache`) as every other attention row.
- Rows that compute the same policy (the summary's "Equal runs" lists rows whose evaluation curves coincide).
  Online, `local` (window 64) attends to exactly the keys of `full` under the shared 64-key bound, so its runs
  are `full`'s. `early_exit` trains at full depth (CALM's protocol: exits apply in evaluation only) and its
  default measure, saturation, has no parameters, so its training is `gtrxl`'s bit for bit; its evaluations can
  differ only where a token exits (cosine between a layer's output and input >= 0.99). They differ only at the
  first evaluation (16k steps) of 3 of its 18 runs (GTrXL's gates start near identity, so early on a layer
  changes a token little); every later evaluation equals `gtrxl`'s, and so do all 18 scores and final returns
  (layer-1 saturation over 16 greedy episodes of `train_gtrxl.py --env-id rlt/TMaze-v0 --backbone.depth
  early_exit --total-timesteps 40000`, read by a hook on `EarlyExitDepth.confidence`: 0.95-0.98, no exit).
  At its defaults, early exit changes nothing in these 2-layer policies; measuring it needs a calibrated
  threshold (CALM) or exits in training (`exit_in_training`), which this study does not tune.
- Offline, the DT sees 10 steps = 30 tokens. `local`, `block_local`, `blockwise` and `bigbird` give identical
  runs on both datasets (seed by seed: their patterns coincide on 30 tokens), and `full` differs from them in
  principle only by the random stream of its fused training path's dropout masks (`policies/dt_fast.py`); the
  spread between these rows (CartPole mean normalized score 18.3 vs 23.2; offline IQM 0.451 vs 0.465) is seed
  noise, and most offline differences are within it.
- Until commit `e74a8fd` a run stopped by SIGTERM (the study killed at the end of a working session) was
  scored on the steps it had done: the trainer saves and returns, and the worker wrote a result. Nine committed
  records were such runs (RepeatPreviousEasy `block_local`, `block_local_2d`, `blockwise`, `gaussian_prior`
  seed 0; T-Maze 10 `early_exit`, `knn`, `universal` seed 1; CartPole DT `linear`, `memory_compressed` seed 0).
  They were discarded and re-run; a result now needs its whole budget.
- `universal` was re-run after commit `7874116`. Its timestep signal (a sinusoid of unit size added before each
  step, cos 0 = 1 on half the coordinates) drowned the policy's observation features (~0.2 per coordinate): every
  `universal` row sat at the MLP level (PositionOnlyCartPoleEasy 0.05 for the first 65k steps, 0.90 without the
  signal). The signal is now scaled by each token's input RMS, as large relative to the features as in the paper
  (√d-scaled embeddings), and the ponder cost is weighted 0.01 as in tensor2tensor's implementation (it was 1).
- `routing` was re-run after commit `516d907`, which weights its commitment loss 1e-4 as the reference implementation
  (it was 1: the loss, ~1.7 at the start against a PPO loss of ~0.06, took nearly all of the clipped gradient;
  T-Maze 10 seeds 1 and 2 never left 0; seed 1 reaches 0.75 with the fix).
- `adaptive_span` was re-run after commit `c3bab3f`, which weights its L1 span penalty 2e-6 per token of mean
  span as the reference implementation (it was mean span / max span at weight 1, ~2,000x heavier: ~0.5 per layer
  against a PPO loss of ~0.01-0.1). The re-run changed little: online IQM 0.357 -> 0.362 over the five tasks
  complete then, offline 0.427 -> 0.490, both within their CIs.
- `linformer` has no causal mode and cannot be a policy or a DT encoder (listed as excluded)."""


@dataclass(frozen=True)
class StudyConfig:
    """The encoder study (rl_transformers/study)."""

    preset: Literal["quick", "full"] = "quick"
    """Budgets and seeds: quick (1 seed, 4 updates; a smoke run) or full (3 seeds, 64-96 updates)."""
    parts: tuple[Literal["online", "offline"], ...] = ("online", "offline")
    """Which suites to run: online (PPO) and/or offline (DT)."""
    tasks: tuple[str, ...] = ()
    """Only these tasks (default: the whole suite of the chosen parts)."""
    encoders: tuple[str, ...] = ()
    """Only these encoders by name (default: every row)."""
    seeds: tuple[int, ...] | None = None
    """Override the preset's seeds."""
    rerun_encoders: tuple[str, ...] = ()
    """Move aside the finished results of these encoders (e.g. after an attention got faster) so they run again."""
    out: Path = Path("runs/study")
    """Run directories: <out>/<preset>/<algo>/<task>/<encoder>/s<seed>/."""
    docs: Path | None = None
    """Where to write encoders.{md,json}, encoders_aggregate.json and plots/ (default: <out>/<preset>/docs)."""
    workers: int = 2
    """Runs at once (local pool) / CPUs of a local Ray instance."""
    launcher: Literal["local", "ray"] = "local"
    """local process pool, or ray (tasks with 1 CPU each)."""
    ray_address: str | None = None
    """ray.init(address=...) of an existing cluster (default: start a local instance)."""
    timeout_s: float | None = 3600.0
    """Kill a run after this many seconds (failed: it runs again on the next invocation); its worker stops too."""
    dry_run: bool = False
    """Print the run count and an estimated time from measured steps/s, then exit; nothing on disk changes."""
    report_only: bool = False
    """Only rebuild the documents from finished runs."""
    restore: bool = True
    """Before running, restore finished runs from the committed records <docs>/encoders.json (matched by job key)
    into run directories without a result, so a fresh checkout resumes where the committed results end."""


def plan(cfg: StudyConfig) -> tuple[list[launch.Job], dict]:
    """The jobs of ``cfg`` (seed-major order) and the report context."""
    preset = suite.check_preset(cfg.preset)
    seeds = cfg.seeds if cfg.seeds is not None else suite.SEEDS[preset]
    ctx: dict = {
        "tasks": {},
        "task_notes": {},
        "encoders": {},
        "excluded": {},
        "expected": {},
        "preset": preset,
    }
    jobs: list[launch.Job] = []
    parts: tuple[tuple[str, suite.Algo], ...] = (("online", "ppo"), ("offline", "dt"))
    for part, algo in parts:
        if part not in cfg.parts:
            continue
        tasks = suite.tasks(algo, cfg.tasks) if cfg.tasks else suite.tasks(algo)
        if not tasks:
            continue
        rows, excluded = enc.ppo_encoders() if algo == "ppo" else enc.dt_encoders()
        rows = enc.select(rows, cfg.encoders)
        ctx["tasks"][algo] = [t.name for t in tasks]
        ctx["encoders"][algo] = [(e.name, e.spec, e.family, e.note) for e in rows]
        ctx["excluded"][algo] = [(x.name, x.reason) for x in excluded]
        ctx["expected"][algo] = len(tasks) * len(rows) * len(seeds)
        unit = "env steps" if algo == "ppo" else "updates"
        for t in tasks:
            budget = f"{t.budget[preset]:,} {unit}, eval every {t.eval_every[preset]:,}, seeds {list(seeds)}"
            ctx["task_notes"][t.name] = (t.tag, budget, t.score_note)
        for seed in seeds:
            for t in tasks:
                for e in rows:
                    jobs.append(launch.make_job(t, e, seed, preset, Path(cfg.out)))
    return jobs, ctx


def estimate(jobs: list[launch.Job], out: Path) -> tuple[float, int]:
    """Estimated seconds of one worker for ``jobs`` from measured rates of finished runs, and how many had none.

    Rate per job (steps/s online, updates/s for DT), from the finished runs of any preset: the median of the same
    (task, encoder); else the encoder's median over its runs of the same algorithm times the task's speed factor
    (the median, over the task's finished runs, of their rate / their encoder's median: how much the task's
    environment slows every encoder; 1 while the task has none); else the median of every finished run of the
    algorithm. Plus 10 s of process start-up per job.
    """
    finished = [json.loads(p.read_text()) for p in Path(out).rglob("result.json")]
    runs = [(r["algo"], r["task"], r["encoder_name"], x) for r in finished
            if (x := r.get("steps_per_s") or r.get("updates_per_s"))]  # fmt: skip
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_encoder: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_algo: dict[str, list[float]] = defaultdict(list)
    for algo, task, name, x in runs:
        by_pair[(task, name)].append(x)
        by_encoder[(algo, name)].append(x)
        by_algo[algo].append(x)
    encoder_rate = {k: statistics.median(v) for k, v in by_encoder.items()}
    ratios: dict[str, list[float]] = defaultdict(list)
    for algo, task, name, x in runs:
        ratios[task].append(x / encoder_rate[(algo, name)])
    task_factor = {t: statistics.median(v) for t, v in ratios.items()}

    total, unknown = 0.0, 0
    for job in jobs:
        algo, task, name = job.spec["algo"], job.spec["task"], job.spec["encoder_name"]
        if by_pair.get((task, name)):
            rate = statistics.median(by_pair[(task, name)])
        elif (algo, name) in encoder_rate:
            rate = encoder_rate[(algo, name)] * task_factor.get(task, 1.0)
        elif by_algo.get(algo):
            rate = statistics.median(by_algo[algo])
        else:
            unknown += 1
            rate = 1000.0 if algo == "ppo" else 20.0
        total += job.spec["budget"] / rate + 10.0
    return total, unknown


def run_study(cfg: StudyConfig, log=print) -> dict:
    jobs, _ = plan(cfg)
    # The documents always describe the whole preset (both parts, every task and encoder), whatever subset
    # this invocation runs, so running one task never drops another task's results from encoders.json.
    every_job, ctx = plan(replace(cfg, parts=("online", "offline"), tasks=(), encoders=()))
    out = Path(cfg.out)
    docs = cfg.docs if cfg.docs is not None else out / cfg.preset / "docs"
    # A dry run changes nothing on disk: it counts the results it would restore as finished and those it would
    # move aside as to run.
    restored: set[Path] = set()
    if cfg.restore and (docs / "encoders.json").exists():
        restored = {j.dir for j in launch.restore(every_job, docs / "encoders.json", dry_run=cfg.dry_run)}
        if restored:
            verb = "would restore" if cfg.dry_run else "restored"
            log(f"{verb} {len(restored)} finished runs from {docs / 'encoders.json'}")
    rerun: set[Path] = set()
    if cfg.rerun_encoders:
        enc.select([enc.Encoder(n, "", "") for n in {j.spec["encoder_name"] for j in jobs}], cfg.rerun_encoders,
                   "--rerun-encoders")  # fmt: skip
        rerun = {j.dir for j in launch.invalidate(jobs, cfg.rerun_encoders, dry_run=cfg.dry_run)}
        if cfg.dry_run:
            rerun |= {
                j.dir for j in jobs if j.dir in restored and j.spec["encoder_name"] in cfg.rerun_encoders
            }
        verb = "would move" if cfg.dry_run else "moved"
        log(f"{verb} aside {len(rerun)} results of {list(cfg.rerun_encoders)}")
    states = {
        j.dir: "pending" if j.dir in rerun else "done" if j.dir in restored else launch.status(j)
        for j in jobs
    }
    todo = [j for j in jobs if states[j.dir] != "done"]
    n_failed = sum(1 for j in todo if states[j.dir] == "failed")
    n_short = sum(1 for j in todo if states[j.dir] == "incomplete")
    log(f"study {cfg.preset}: {len(jobs)} runs, {len(jobs) - len(todo)} finished, {len(todo)} to run "
        f"({n_failed} failed before, {n_short} stopped before their budget)")  # fmt: skip
    if cfg.dry_run:
        seconds, unknown = estimate(todo, out)
        workers = f"{cfg.workers} worker" + ("s" if cfg.workers != 1 else "")
        unmeasured = f" ({unknown} runs without a measured rate: assumed 1,000 steps/s, 20 updates/s)"
        log(f"estimated {seconds / 3600:.2f} h on 1 worker, {seconds / 3600 / max(1, cfg.workers):.2f} h on "
            f"{workers}" + (unmeasured if unknown else ""))  # fmt: skip
        return {"jobs": len(jobs), "todo": len(todo), "seconds": seconds}
    if todo and not cfg.report_only:
        if cfg.launcher == "ray":
            launch.run_ray(todo, cfg.ray_address, cfg.workers, cfg.timeout_s, log)
        else:
            launch.run_local(todo, cfg.workers, cfg.timeout_s, log)
    ctx["command"] = rebuild_command(cfg, docs)
    ctx["method"], ctx["notes"] = METHOD, NOTES
    ctx["planned"] = dict(Counter(j.spec["task"] for j in every_job))
    specs = {j.spec["key"]: j.spec for j in every_job}
    records = [
        r
        for r in report.collect(out, cfg.preset)
        if r.get("key") in specs and launch.complete(r, specs[r["key"]])
    ]
    log(f"building the documents from {len(records)} runs: rliable's bootstrap ({REPS:,} resamples per CI) "
        "takes minutes (about 6 on one core for the full preset)")  # fmt: skip
    aggs = report.write_report(records, docs, ctx)
    log(f"wrote {docs}/encoders.md, encoders.json ({len(records)} runs), encoders_aggregate.json, plots/")
    return {"jobs": len(jobs), "records": len(records), "aggregates": aggs}


def rebuild_command(cfg: StudyConfig, docs: Path) -> str:
    parts = ["--preset", cfg.preset]
    if cfg.seeds is not None:
        parts += ["--seeds", *map(str, cfg.seeds)]
    parts += ["--out", str(cfg.out), "--docs", str(docs), "--report-only"]
    return "python scripts/encoder_study.py " + " ".join(shlex.quote(p) for p in parts)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use scripts/encoder_study.py")
