"""PPO env steps/s of every registered attention inside the RL loop, as a table (JSON + Markdown).

Each attention runs the same :class:`~rl_transformers.algos.ppo.TrainConfig` (the caller's flags: env,
sizes, memory, position ...) with only ``backbone.attention`` changed (its options reset to the entry's
defaults), through :func:`rl_transformers.algos.throughput.measure_throughput` (warm-up updates, then timed updates
of rollout + training). One fresh process per measurement, one at a time: no shared allocator or thread
state, and a crash or a refused configuration costs only its own row. With ``rounds`` > 1 the whole list is
measured again in a rotated order and each figure is the median over rounds. ``ratio_full`` = env steps/s
of the attention / that of ``full`` in the same run. The parameter count of every row is reported, so rows
of different sizes are not compared as equals.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import statistics
import traceback
from pathlib import Path
from typing import Any

from benchmarks.studies.meta import load_text
from rl_transformers.runs.provenance import finish_machine_info
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.tables import markdown_table

STATUS_OK, STATUS_UNSUPPORTED, STATUS_ERROR = "ok", "unsupported", "error"


def config_for(cfg: Any, attention: str) -> Any:
    """``cfg`` (a TrainConfig) with ``policy.backbone.attention`` = ``attention`` (ValueError if refused)."""
    backbone = cfg.policy.backbone.replace(attention=attention)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, backbone=backbone))


def _worker(
    cfg: Any, attention: str | None, updates: int, warmup: int, queue: Any, env_modules: tuple[str, ...] = ()
) -> None:
    try:
        try:
            run_cfg = cfg if attention is None else config_for(cfg, attention)
        except ValueError as err:
            queue.put({"status": STATUS_UNSUPPORTED, "reason": str(err)})
            return
        from rl_transformers.algos.throughput import measure_throughput

        if env_modules:  # environments defined outside the allow-list (e.g. cleanrl's pom_env), trusted here
            from envs.resolve import allow_env_modules

            allow_env_modules(env_modules)

        result = measure_throughput(run_cfg, updates, warmup)
        queue.put({"status": STATUS_OK, **result})
    except Exception as err:  # reported on the row
        tail = traceback.format_exc().strip().splitlines()[-3:]
        queue.put({"status": STATUS_ERROR, "reason": f"{type(err).__name__}: {err} | {' / '.join(tail)}"})


def measure_one(
    cfg: Any,
    attention: str | None,
    updates: int,
    warmup: int,
    timeout_s: float,
    env_modules: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One measurement of ``cfg`` (with ``attention`` when given) in a fresh (spawned) process."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    args = (cfg, attention, updates, warmup, queue, env_modules)
    proc = ctx.Process(target=_worker, args=args, daemon=True)
    proc.start()
    try:
        result = queue.get(timeout=timeout_s)
    except Exception:  # queue.Empty, or the worker died without reporting
        result = {
            "status": STATUS_ERROR,
            "reason": f"no result within {timeout_s:g} s (exit {proc.exitcode})",
        }
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return result


def run(
    cfg: Any,
    attentions: list[str],
    updates: int,
    warmup: int,
    rounds: int = 1,
    timeout_s: float = 1800.0,
    log: Any = print,
) -> dict[str, Any]:
    """Rows of every attention (medians over ``rounds``) and the ratio to ``full`` (measured too)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    names = list(dict.fromkeys(["full", *attentions]))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if results[name] and results[name][-1]["status"] != STATUS_OK:
                continue  # refused or crashed once: not retried
            try:
                config_for(cfg, name)  # refused configurations need no process
            except ValueError as err:
                result = {"status": STATUS_UNSUPPORTED, "reason": str(err)}
            else:
                result = measure_one(cfg, name, updates, warmup, timeout_s)
            results[name].append(result)
            shown = f"{result['steps_per_s']:.0f} env steps/s" if result["status"] == STATUS_OK else result
            log(f"[round {r + 1}/{rounds}] {name}: {shown}")
    rows = {name: _row(name, runs) for name, runs in results.items() if name in attentions or name == "full"}
    base, base_cpu = rows["full"].get("steps_per_s"), rows["full"].get("steps_per_cpu_s")
    for row in rows.values():
        if row.get("steps_per_s") is not None and base:
            row["ratio_full"] = round(row["steps_per_s"] / base, 3)
        if row.get("steps_per_cpu_s") is not None and base_cpu:
            row["ratio_full_cpu"] = round(row["steps_per_cpu_s"] / base_cpu, 3)
    return {"rows": list(rows.values())}


def _row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == STATUS_OK]
    if not ok:
        return {"attention": name, "status": runs[-1]["status"], "reason": runs[-1].get("reason", "")}
    row: dict[str, Any] = {"attention": name, "status": STATUS_OK, "reason": "", "rounds": len(ok)}
    for key in ("steps_per_s", "steps_per_cpu_s", "rollout_steps_per_s", "train_steps_per_s"):
        if all(key in r for r in ok):
            row[key] = round(statistics.median(r[key] for r in ok), 1)
    row["steps_per_s_rounds"] = [round(r["steps_per_s"], 1) for r in ok]
    row["parameters"] = int(ok[0]["parameters"])
    row["threads"], row["num_envs"] = int(ok[0]["threads"]), int(ok[0]["num_envs"])
    row["ratio_full"] = None
    return row


def config_summary(cfg: Any) -> dict[str, Any]:
    """The settings shared by every row (JSON-able)."""
    backbone = cfg.policy.backbone
    return {
        "env_id": cfg.env_id,
        "num_envs": cfg.num_envs,
        "num_steps": cfg.ppo.num_steps,
        "seq_len": cfg.ppo.seq_len,
        "update_epochs": cfg.ppo.update_epochs,
        "num_minibatches": cfg.ppo.num_minibatches,
        "threads": cfg.threads,
        "backbone": {
            k: v for k, v in backbone.to_dict().items() if k not in ("attention", "attention_options")
        },
        "context_len": cfg.policy.context_len,
        "bound_context": cfg.policy.bound_context,
    }


def build_report(
    table: dict[str, Any],
    cfg: Any,
    command: str,
    updates: int,
    warmup: int,
    rounds: int,
    machine: dict[str, Any],
) -> dict:
    """The results record; ``machine`` is :func:`machine_info` taken before the measurement."""
    report = {
        "command": command,
        "config": config_summary(cfg),
        "updates": updates,
        "warmup": warmup,
        "rounds": rounds,
        "machine": finish_machine_info(machine),
        **table,
    }
    return json.loads(json.dumps(report, default=str))


def write(report: dict[str, Any], out: Path) -> None:
    """``out``/results.json and results.md (atomic writes)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "results.md", render_markdown(report))


def render_markdown(report: dict[str, Any]) -> str:
    meta, cfg = report["machine"], report["config"]
    bb = cfg["backbone"]
    lines = [
        "# PPO throughput per attention (env steps/s, rollout + training)",
        "",
        f"Command: `{report['command']}`",
        "",
        f"- config: env {cfg['env_id']} · {cfg['num_envs']} envs x {cfg['num_steps']} steps · seq_len "
        f"{cfg['seq_len']} · {cfg['update_epochs']} epochs x {cfg['num_minibatches']} minibatches · "
        f"d_model {bb['d_model']} · {bb['n_layers']} layers · {bb['n_heads']} heads · memory {bb['memory']} · "
        f"position {bb['position']} · block {bb['block']}",
        f"- timing: {report['warmup']} warm-up + {report['updates']} timed updates per process, "
        f"{report['rounds']} round(s), medians",
        f"- machine: {meta['device_name']} · threads {meta['threads']} of {meta['cores']} cores · torch "
        f"{meta['torch_version']} · git {meta['git_sha']} · {load_text(meta)}",
        "",
    ]
    headers = ["attention", "env steps/s", "ratio to full", "env steps/CPU-s", "ratio (CPU)", "rollout steps/s",
               "train steps/s", "parameters", "status"]  # fmt: skip
    lines += markdown_table(headers, [throughput_cells(row) for row in report["rows"]], "lrrrrrrrl")
    return "\n".join(lines) + "\n"


def throughput_cells(row: dict[str, Any]) -> list[str]:
    """One attention's cells of the throughput table ("—" and the reason for one that did not run)."""
    if row["status"] != STATUS_OK:
        return [row["attention"], *["—"] * 7, f"{row['status']}: {row['reason'][:160]}"]
    cpu, cpu_ratio = row.get("steps_per_cpu_s"), row.get("ratio_full_cpu")
    return [
        row["attention"],
        f"{row['steps_per_s']:,.0f}",
        f"{row['ratio_full']:.2f}",
        "—" if cpu is None else f"{cpu:,.0f}",
        "—" if cpu_ratio is None else f"{cpu_ratio:.2f}",
        f"{row['rollout_steps_per_s']:,.0f}",
        f"{row['train_steps_per_s']:,.0f}",
        f"{row['parameters']:,}",
        "ok",
    ]
