"""Where a PPO update spends its time: ``torch.profiler`` over one rollout and one training pass.

Used by ``benchmarks/profile_ppo.py`` ("where the time goes, with a profile"). After ``warmup`` whole
updates, one :func:`~rl_transformers.algos.rollout.collect_rollout` and one
:meth:`~rl_transformers.algos.ppo.PPOTrainer.train_epochs` run under the CPU profiler, each separately. Per
phase the table lists the operators by self CPU time (time inside the operator itself, children excluded),
with their share of the phase's total self time, call counts and mean time per call; the rest is summed in
one row. Shares are ratios within one profile, so they compare across machines better than absolute times;
the profiler adds its own per-op overhead, which inflates the share of many small ops. ``shapes_of`` names
operators (e.g. ``aten::copy_``) whose time is also split by input shape, to tell which tensors they move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from rl_transformers.algos.ppo import PPOTrainer
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.rollout import collect_rollout
from rl_transformers.runs.distributed import DistContext, resolve_device
from rl_transformers.utils.tables import markdown_table
from rl_transformers.utils.training import available_cores, set_threads


def op_table(run: Callable[[], Any], top: int, shapes_of: tuple[str, ...] = ()) -> dict[str, Any]:
    """Profile ``run()`` once: total self CPU time (s) and the ``top`` operators by self time (share, calls,
    mean µs), the rest in one "other" row; with ``shapes_of``, also each named operator's ``top`` input shapes
    by self time (``by_shape``: op, shapes, share of the phase, calls)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=bool(shapes_of)) as prof:
        run()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    by_shape: list[dict[str, Any]] = []
    grouped = prof.key_averages(group_by_input_shape=True) if shapes_of else []  # one grouping for every op
    for op in shapes_of:
        shaped = [e for e in grouped if e.key == op]
        shaped.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        by_shape += [
            {
                "op": op,
                "shapes": str(e.input_shapes),
                "share": e.self_cpu_time_total / total,
                "calls": int(e.count),
            }
            for e in shaped[:top]
        ]
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        {
            "op": e.key,
            "share": e.self_cpu_time_total / total,
            "calls": int(e.count),
            "mean_us": e.self_cpu_time_total / max(1, e.count),
        }
        for e in events[:top]
    ]
    rest = events[top:]
    if rest:
        rows.append(
            {
                "op": f"other ({len(rest)} ops)",
                "share": sum(e.self_cpu_time_total for e in rest) / total,
                "calls": int(sum(e.count for e in rest)),
                "mean_us": None,
            }
        )
    out: dict[str, Any] = {"self_cpu_s": total / 1e6, "ops": rows}
    if shapes_of:
        out["by_shape"] = by_shape
    return out


def profile_ppo(
    cfg: TrainConfig, warmup: int = 2, top: int = 12, shapes_of: tuple[str, ...] = ()
) -> dict[str, Any]:
    """{"rollout": table, "train": table, "steps": env steps per phase} for ``cfg`` (see the module docstring)."""
    set_threads(cfg.threads or available_cores())
    trainer = PPOTrainer(cfg, device=resolve_device(cfg.device, DistContext()))
    ppo = cfg.ppo

    def rollout() -> None:
        trainer.loop, _ = collect_rollout(
            trainer.policy, trainer.envs, trainer.storage, trainer.loop, ppo.gamma, ppo.gae_lambda
        )

    try:
        for _ in range(warmup):
            rollout()
            trainer.train_epochs()
        out: dict[str, Any] = {
            "rollout": op_table(rollout, top, shapes_of),
            "train": op_table(trainer.train_epochs, top, shapes_of),
        }
    finally:
        trainer.close()
    out["steps"] = trainer.batch_size
    out["threads"] = torch.get_num_threads()
    out["parameters"] = sum(p.numel() for p in trainer.policy.parameters())
    return out


def render(result: dict[str, Any], header: list[str]) -> str:
    """Markdown: the header lines, then one table per phase."""
    lines = [*header, ""]
    for phase in ("rollout", "train"):
        table = result[phase]
        lines += [
            f"## {phase}: {table['self_cpu_s']:.3f} s of self CPU time for {result['steps']:,} env steps",
            "",
            *markdown_table(
                ["op", "share", "calls", "mean µs"], [op_cells(row) for row in table["ops"]], "lrrr"
            ),
            "",
        ]
        if table.get("by_shape"):
            lines += [
                f"### {phase}: by input shape",
                "",
                *markdown_table(
                    ["op", "input shapes", "share", "calls"],
                    [
                        [
                            f"`{row['op']}`",
                            f"`{row['shapes']}`",
                            f"{100 * row['share']:.2f} %",
                            f"{row['calls']:,}",
                        ]
                        for row in table["by_shape"]
                    ],
                    "llrr",
                ),
                "",
            ]
    return "\n".join(lines)


def op_cells(row: dict[str, Any]) -> list[str]:
    """One op's cells of a phase's table: its share of the self CPU time, calls and mean time per call."""
    mean = "" if row["mean_us"] is None else f"{row['mean_us']:.1f}"
    return [f"`{row['op']}`", f"{100 * row['share']:.1f} %", f"{row['calls']:,}", mean]
