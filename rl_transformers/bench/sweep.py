"""Encoder sweep: train GTrXL-PPO and Decision Transformer with several backbone variants x seeds, fixed budgets.

Method. Every (algorithm, variant, seed) is one run of the real training CLI (``scripts/train_gtrxl.py``,
``scripts/train_dt.py``) in a subprocess with one torch thread (``--threads 1``, ``OMP_NUM_THREADS=1``); up to
``workers`` (default: the usable cores) run at once. Each run owns ``<out>/<algo>/<variant>/s<seed>/`` and points
the trainer's run root there, so its ``runs/<algo>/<env>/<stamp>-s<seed>/progress.jsonl`` lands inside. When
the subprocess exits 0 the runner parses the progress file into ``result.json`` (curve, final return, steps,
wall-clock, parameters); a run directory with a ``result.json`` is finished and skipped on the next invocation
(resume); a failed run leaves ``failed.json`` and is retried. The summary - per algorithm and variant: final
return mean ± 95% confidence half-width over seeds (Student t, n - 1 degrees of freedom), steps/s, wall-clock,
parameters - goes to ``summary.md`` / ``summary.json``, learning curves (mean over seeds on a common step grid,
shaded 95% CI) to ``curves-<algo>.png``, and one TensorBoard run per variant to ``tensorboard/<algo>/<variant>``.

Variants are backbone overrides: ``"local"`` (attention name) or ``"attention=linear;position=rope;memory=None"``
(``;``-separated ``field=value`` of ``BackboneConfig``; dict options as JSON). They become the trainers'
``--backbone.<field> <value>`` flags. The final return is the mean of the last ``final_window`` logged values of
the first metric found: PPO ``eval/mean_reward`` then ``rollout/ep_rew_mean``; DT ``eval/normalized_score`` then
``eval/return_mean``. Parameters: ``n_parameters`` / ``parameters`` when the run logs them, else the backbone's
parameter count rebuilt from the run's ``config.json`` (marked ``backbone``).

The :class:`Trainer` protocol (command builder + result parser) is what the runner needs; tests drive it with a
fake training script.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rl_transformers.backbone import registry
from rl_transformers.backbone.config import BackboneConfig

ROOT = Path(__file__).resolve().parents[2]
"""Repository root (where ``scripts/`` lives)."""

T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
        2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
        2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)  # fmt: skip
"""Student t 0.975 quantiles for 1..30 degrees of freedom."""


def t_quantile_975(df: int) -> float:
    """0.975 quantile of Student's t with ``df`` degrees of freedom (table to 30, Cornish-Fisher beyond)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959963984540054
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, 95% CI half-width t_{0.975, n-1} · s / √n); half-width None for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci95 of no values")
    mean = statistics.fmean(values)
    if n == 1:
        return mean, None
    return mean, t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)


# -- variants ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A backbone override: the spec string, its label and the ``BackboneConfig`` fields it sets."""

    spec: str
    fields: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return re.sub(r"[^A-Za-z0-9._=+-]+", "-", self.spec).strip("-") or "default"

    def flags(self) -> list[str]:
        out = []
        for key, value in self.fields:
            if value is None:
                text = "None"
            elif isinstance(value, (dict, list)):
                text = json.dumps(value)
            else:
                text = str(value)
            out += [f"--backbone.{key.replace('_', '-')}", text]
        return out


def parse_variant(spec: str) -> Variant:
    """``"local"`` or ``"attention=linear;position=rope;memory=None"`` (see the module docstring)."""
    valid = [f.name for f in dataclasses.fields(BackboneConfig)]
    items: list[tuple[str, Any]] = []
    for i, part in enumerate(p.strip() for p in spec.split(";")):
        if not part:
            continue
        if "=" not in part:
            if i != 0:
                raise ValueError(
                    f"variant {spec!r}: {part!r} is not field=value (only the first item may be bare)"
                )
            key, raw = "attention", part
        else:
            key, raw = (s.strip() for s in part.split("=", 1))
        key = key.replace("-", "_")
        if key not in valid:
            import difflib

            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"variant {spec!r}: unknown backbone field {key!r}.{hint} Valid fields: {valid}")
        items.append((key, _parse_value(raw)))
    return Variant(spec, tuple(items))


def _parse_value(raw: str) -> Any:
    if raw == "None":
        return None
    if raw[:1] in "{[":
        return json.loads(raw)
    return raw


# -- trainers ---------------------------------------------------------------------------------------------
@dataclass
class Parsed:
    """What a trainer's run directory yields."""

    curve: list[tuple[float, float]]
    """(step, return metric) pairs in order."""
    metric: str
    final_step: float
    parameters: float | None = None
    parameters_source: str | None = None


class Trainer(Protocol):
    """Builds a training command and parses its outputs."""

    name: str

    def command(self, variant: Variant, seed: int, run_dir: Path) -> list[str]: ...

    def parse(self, run_dir: Path) -> Parsed: ...


@dataclass(frozen=True)
class ScriptTrainer:
    """A training CLI with the project's conventions (tyro flags, ``progress.jsonl`` under a run root)."""

    name: str
    script: str
    args: tuple[str, ...]
    """Fixed arguments: environment / dataset and budget."""
    metrics: tuple[str, ...]
    """Return metrics in order of preference."""
    root_flag: str = "--run-root"
    seed_flag: str = "--seed"
    extra: tuple[str, ...] = ("--threads", "1", "--no-progress")
    python: str = sys.executable
    final_window: int = 1

    def command(self, variant: Variant, seed: int, run_dir: Path) -> list[str]:
        script = self.script if os.path.isabs(self.script) else str(ROOT / self.script)
        return [
            self.python, script, *self.args, self.seed_flag, str(seed), self.root_flag, str(run_dir / "runs"),
            *self.extra, *variant.flags(),
        ]  # fmt: skip

    def parse(self, run_dir: Path) -> Parsed:
        files = sorted((run_dir / "runs").rglob("progress.jsonl"), key=lambda p: p.stat().st_mtime)
        if not files:
            raise FileNotFoundError(f"no progress.jsonl under {run_dir / 'runs'}")
        records = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
        metric = next((m for m in self.metrics if any(m in r for r in records)), None)
        if metric is None:
            raise ValueError(f"{files[-1]} has none of the metrics {list(self.metrics)}")
        curve = [(float(r.get("step", i)), float(r[metric])) for i, r in enumerate(records) if metric in r]
        curve = [(s, v) for s, v in curve if math.isfinite(v)]
        final_step = max((float(r.get("step", 0)) for r in records), default=0.0)
        params, source = None, None
        for r in reversed(records):
            for key in ("n_parameters", "parameters"):
                if key in r:
                    params, source = float(r[key]), "logged"
                    break
            if params is not None:
                break
        if params is None:
            params, source = _backbone_parameters(files[-1].parent / "config.json")
        return Parsed(curve, metric, final_step, params, source)


def _find_backbone(tree: Any) -> dict[str, Any] | None:
    if isinstance(tree, dict):
        if "attention" in tree and "d_model" in tree:
            return tree
        for value in tree.values():
            found = _find_backbone(value)
            if found is not None:
                return found
    return None


def _backbone_parameters(config_path: Path) -> tuple[float | None, str | None]:
    if not config_path.exists():
        return None, None
    backbone = _find_backbone(json.loads(config_path.read_text()))
    if backbone is None:
        return None, None
    from rl_transformers.backbone import Backbone

    valid = {f.name for f in dataclasses.fields(BackboneConfig)}
    model = Backbone(BackboneConfig.from_dict({k: v for k, v in backbone.items() if k in valid}))
    return float(sum(p.numel() for p in model.parameters())), "backbone"


# -- config -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepConfig:
    """Encoder sweep (see ``rl_transformers/bench/sweep.py``)."""

    variants: tuple[str, ...] = ("full", "local", "attention=linear;position=rope;memory=None")
    """Backbone variants: an attention name or ';'-separated BackboneConfig field=value overrides."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds per variant."""
    algos: tuple[Literal["ppo", "dt"], ...] = ("ppo",)
    """Trainers: ppo (GTrXL-PPO on a memory task) and/or dt (Decision Transformer on a dataset)."""
    ppo_env_id: str = "rlt/TMaze-v0"
    """Memory task of the PPO runs."""
    ppo_total_timesteps: int = 100_000
    """Environment steps per PPO run (fixed budget)."""
    ppo_args: str = ""
    """Extra flags for scripts/train_gtrxl.py, one shell-quoted string (e.g. "--num-envs 8 --eval-every 20000")."""
    dt_dataset: str = ""
    """Dataset of the DT runs (Minari id / directory / D4RL .hdf5); required with algos dt."""
    dt_total_steps: int = 5_000
    """Gradient updates per DT run (fixed budget)."""
    dt_args: str = ""
    """Extra flags for scripts/train_dt.py, one shell-quoted string (e.g. "--dataset-root datasets/minari")."""
    workers: int | None = None
    """Runs in parallel (default: usable cores); each run uses one torch thread."""
    out: Path = Path("runs/sweep")
    """Sweep directory: run dirs, summary.md / summary.json, curves-*.png, tensorboard/."""
    timeout_s: float | None = None
    """Kill a run after this many seconds (it is then retried on the next invocation)."""
    final_window: int = 1
    """Final return = mean of the last this many logged values of the return metric."""
    dry_run: bool = False
    """Print the commands of the unfinished runs and exit."""

    def __post_init__(self) -> None:
        if not self.variants or not self.seeds or not self.algos:
            raise ValueError("variants, seeds and algos must not be empty")
        for algo in self.algos:
            if algo not in ("ppo", "dt"):
                raise ValueError(f"unknown algo {algo!r}; valid: ['dt', 'ppo']")
        if "dt" in self.algos and not self.dt_dataset:
            raise ValueError("algos include 'dt' but --dt-dataset is empty")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.final_window < 1:
            raise ValueError(f"final_window must be >= 1, got {self.final_window}")
        for spec in self.variants:
            parse_variant(spec)


def build_trainers(cfg: SweepConfig) -> list[ScriptTrainer]:
    """ScriptTrainers for the configured algorithms (flags of scripts/train_gtrxl.py and train_dt.py)."""
    trainers = []
    if "ppo" in cfg.algos:
        trainers.append(
            ScriptTrainer(
                name="ppo",
                script="scripts/train_gtrxl.py",
                args=(
                    "--env-id",
                    cfg.ppo_env_id,
                    "--total-timesteps",
                    str(cfg.ppo_total_timesteps),
                    *shlex.split(cfg.ppo_args),
                ),
                metrics=("eval/mean_reward", "rollout/ep_rew_mean"),
                root_flag="--run-root",
                final_window=cfg.final_window,
            )
        )
    if "dt" in cfg.algos:
        trainers.append(
            ScriptTrainer(
                name="dt",
                script="scripts/train_dt.py",
                args=(
                    "--dataset",
                    cfg.dt_dataset,
                    "--total-steps",
                    str(cfg.dt_total_steps),
                    *shlex.split(cfg.dt_args),
                ),
                metrics=("eval/normalized_score", "eval/return_mean"),
                root_flag="--runs-dir",
                final_window=cfg.final_window,
            )
        )
    return trainers


# -- running ----------------------------------------------------------------------------------------------
@dataclass
class Job:
    trainer: Any
    variant: Variant
    seed: int
    run_dir: Path


def _run_job(job: Job, timeout: float | None, final_window: int) -> dict[str, Any]:
    run_dir = job.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir / "runs", ignore_errors=True)  # a previous failed attempt
    (run_dir / "failed.json").unlink(missing_ok=True)
    cmd = job.trainer.command(job.variant, job.seed, run_dir)
    (run_dir / "command.json").write_text(json.dumps(cmd) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        try:
            proc = subprocess.run(
                cmd, cwd=run_dir, env=env, stdout=out, stderr=err, timeout=timeout, check=False
            )
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - start
    base = {"algo": job.trainer.name, "variant": job.variant.spec, "seed": job.seed, "wall_s": wall}
    if code != 0:
        tail = (run_dir / "stderr.log").read_text()[-2000:]
        failure = {**base, "returncode": code, "stderr_tail": tail}
        (run_dir / "failed.json").write_text(json.dumps(failure, indent=1) + "\n")
        return {**failure, "status": "failed"}
    try:
        parsed = job.trainer.parse(run_dir)
    except (OSError, ValueError) as exc:
        failure = {**base, "returncode": 0, "stderr_tail": f"parse error: {exc}"}
        (run_dir / "failed.json").write_text(json.dumps(failure, indent=1) + "\n")
        return {**failure, "status": "failed"}
    values = [v for _, v in parsed.curve[-final_window:]]
    result = {
        **base,
        "status": "done",
        "metric": parsed.metric,
        "final_return": statistics.fmean(values) if values else None,
        "final_step": parsed.final_step,
        "steps_per_s": parsed.final_step / wall if wall > 0 else None,
        "parameters": parsed.parameters,
        "parameters_source": parsed.parameters_source,
        "curve": parsed.curve,
    }
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(run_dir / "result.json")  # atomic: a result.json is always complete
    return result


def run_sweep(
    cfg: SweepConfig, trainers: Sequence[Trainer] | None = None, log: Any = print
) -> dict[str, Any]:
    """Run the unfinished runs of ``cfg`` in parallel, then write the summary, plots and TensorBoard runs."""
    chosen: list[Any] = list(trainers) if trainers is not None else list(build_trainers(cfg))
    variants = [parse_variant(s) for s in cfg.variants]
    out = Path(cfg.out)
    jobs, done = [], 0
    for trainer in chosen:
        for variant in variants:
            for seed in cfg.seeds:
                run_dir = out / trainer.name / variant.label / f"s{seed}"
                if (run_dir / "result.json").exists():
                    done += 1
                    continue
                jobs.append(Job(trainer, variant, seed, run_dir))
    if cfg.dry_run:
        for job in jobs:
            log(" ".join(job.trainer.command(job.variant, job.seed, job.run_dir)))
        return {"pending": len(jobs), "done": done}
    workers = min(cfg.workers or _cores(), max(1, len(jobs)))
    registry.available()  # load the registry here: its lazy first load is not thread-safe (parsers run in threads)
    log(f"sweep: {done} finished, {len(jobs)} to run on {workers} workers -> {out}")
    with cf.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_job, job, cfg.timeout_s, cfg.final_window): job for job in jobs}
        for fut in cf.as_completed(futures):
            res = fut.result()
            job = futures[fut]
            extra = (
                f"final {res['final_return']}" if res["status"] == "done" else f"FAILED ({res['returncode']})"
            )
            log(f"  {job.trainer.name}/{job.variant.label}/s{job.seed}: {res['wall_s']:.0f} s, {extra}")
    summary = summarize(out, chosen, variants, cfg.seeds)
    write_summary(summary, out)
    return summary


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- summary ----------------------------------------------------------------------------------------------
def summarize(
    out: Path, trainers: Sequence[Trainer], variants: Sequence[Variant], seeds: Sequence[int]
) -> dict:
    rows = []
    for trainer in trainers:
        for variant in variants:
            results, failed = [], []
            for seed in seeds:
                run_dir = out / trainer.name / variant.label / f"s{seed}"
                if (run_dir / "result.json").exists():
                    results.append(json.loads((run_dir / "result.json").read_text()))
                elif (run_dir / "failed.json").exists():
                    failed.append(json.loads((run_dir / "failed.json").read_text()))
            finals = [r["final_return"] for r in results if r["final_return"] is not None]
            mean, half = mean_ci95(finals) if finals else (None, None)
            rate = [r["steps_per_s"] for r in results if r["steps_per_s"]]
            params = [r["parameters"] for r in results if r["parameters"] is not None]
            rows.append(
                {
                    "algo": trainer.name,
                    "variant": variant.spec,
                    "label": variant.label,
                    "n_seeds": len(finals),
                    "n_failed": len(failed),
                    "metric": results[0]["metric"] if results else None,
                    "final_return_mean": mean,
                    "final_return_ci95": half,
                    "final_returns": finals,
                    "steps_per_s": statistics.fmean(rate) if rate else None,
                    "wall_s_mean": statistics.fmean(r["wall_s"] for r in results) if results else None,
                    "parameters": params[0] if params else None,
                    "parameters_source": results[0].get("parameters_source") if results else None,
                    "curves": {str(r["seed"]): r["curve"] for r in results},
                    "failures": [f"s{f['seed']}: {f['returncode']}" for f in failed],
                }
            )
    return {"out": str(out), "rows": rows}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[tuple[float, float, float | None, int]]:
    """(step, mean, 95% CI half-width, n) on the union of steps; each curve interpolated within its range."""
    steps = sorted({float(s) for c in curves for s, _ in c})
    out = []
    for step in steps:
        values = []
        for c in curves:
            if c and c[0][0] <= step <= c[-1][0]:
                values.append(_interp(c, step))
        if values:
            mean, half = mean_ci95(values)
            out.append((step, mean, half, len(values)))
    return out


def _interp(curve: Sequence[Sequence[float]], x: float) -> float:
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return float(curve[-1][1])


def _fmt(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = [
        "| algo | variant | seeds | final return (mean ± 95% CI) | metric | steps/s | wall-clock (s) | "
        "parameters | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        if r["final_return_mean"] is None:
            ret = "-"
        elif r["final_return_ci95"] is None:
            ret = f"{r['final_return_mean']:.3g} (n=1)"
        else:
            ret = f"{r['final_return_mean']:.3g} ± {r['final_return_ci95']:.2g}"
        params = _fmt(r["parameters"], 4) + (" (backbone)" if r["parameters_source"] == "backbone" else "")
        lines.append(
            f"| {r['algo']} | {r['variant']} | {r['n_seeds']} | {ret} | {r['metric'] or ''} | "
            f"{_fmt(r['steps_per_s'])} | {_fmt(r['wall_s_mean'])} | {params} | {r['n_failed'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """summary.json, summary.md, curves-<algo>.png and tensorboard/<algo>/<variant>/."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(summary_markdown(summary))
    _plot_curves(summary, out)
    _tensorboard(summary, out)


def _plot_curves(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for algo in sorted({r["algo"] for r in summary["rows"]}):
        fig, ax = plt.subplots(figsize=(8, 5))
        metric = ""
        for r in (r for r in summary["rows"] if r["algo"] == algo):
            agg = mean_curve(list(r["curves"].values()))
            if not agg:
                continue
            metric = r["metric"] or metric
            xs = [a[0] for a in agg]
            ys = [a[1] for a in agg]
            (line,) = ax.plot(xs, ys, label=f"{r['variant']} (n={r['n_seeds']})")
            lo = [a[1] - (a[2] or 0.0) for a in agg]
            hi = [a[1] + (a[2] or 0.0) for a in agg]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        ax.set_xlabel("step")
        ax.set_ylabel(metric or "return")
        ax.set_title(f"{algo}: mean over seeds, shaded 95% CI")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"curves-{algo}.png", dpi=110)
        plt.close(fig)


def _tensorboard(summary: dict[str, Any], out: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for r in summary["rows"]:
        log_dir = out / "tensorboard" / r["algo"] / r["label"]
        shutil.rmtree(log_dir, ignore_errors=True)  # rewritten from the results on every invocation
        with SummaryWriter(log_dir=str(log_dir)) as writer:
            for step, mean, half, n in mean_curve(list(r["curves"].values())):
                writer.add_scalar("sweep/return_mean", mean, global_step=int(step))
                writer.add_scalar("sweep/seeds", n, global_step=int(step))
                if half is not None:
                    writer.add_scalar("sweep/return_ci95", half, global_step=int(step))
            for seed, curve in r["curves"].items():
                for step, value in curve:
                    writer.add_scalar(f"sweep/return_seed{seed}", value, global_step=int(step))
            writer.add_text("sweep/variant", f"{r['algo']} · {r['variant']} · metric {r['metric']}")
