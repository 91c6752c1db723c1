"""Interleaved CPU-time and wall-clock timing of training updates, and the DT throughput table.

Each candidate's update is ``loss.backward()``, gradient clipping at 0.25 and an AdamW step (``fused=True``
on CPU / CUDA for every candidate, as the DT trainer builds it; the peers' own trainers use the unfused
default, about 1.6 ms more per update at the paper's size on one CPU thread). After
``warmup`` untimed updates per candidate, every round times ``steps`` updates of each candidate in turn — the
order rotated by one each round, so drift of the machine falls on every candidate alike — by two clocks:
``time.process_time`` (CPU seconds of this process: other processes do not inflate it) and
``time.perf_counter`` (wall clock). Throughput = steps · batch / seconds; the table gives the median round
of each clock, the rounds themselves, and the reference's ratio to each candidate by both clocks.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from benchmarks.studies.dt_models import Candidate
from benchmarks.studies.meta import load_text
from rl_transformers.algos.dt import FUSED_ADAMW_DEVICES
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.params import count_parameters
from rl_transformers.utils.tables import markdown_table


def make_update(candidate: Candidate, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    params = list(candidate.module.parameters())
    # The DT trainer's optimizer (rl_transformers/algos/dt.py), with the same options for every candidate.
    fused = all(p.device.type in FUSED_ADAMW_DEVICES for p in params) or None
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4, fused=fused)
    candidate.module.train()

    def update() -> None:
        loss = candidate.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(candidate.module.parameters(), 0.25)
        opt.step()

    return update


def run_rounds(
    candidates: dict[str, Candidate],
    batch: dict[str, torch.Tensor],
    device: torch.device,
    steps: int,
    rounds: int,
    warmup: int,
) -> dict[str, dict[str, list[float]]]:
    """Per candidate, the CPU and wall seconds of each round (``{"cpu": [...], "wall": [...]}``)."""
    updates = {name: make_update(c, batch) for name, c in candidates.items()}
    return time_rounds(updates, device, steps, rounds, warmup)


def time_rounds(
    updates: Mapping[str, Callable[[], object]],
    device: torch.device,
    steps: int,
    rounds: int,
    warmup: int,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Interleaved rounds of any update callables (the module docstring's method): per name, the CPU and wall
    seconds of each round's ``steps`` calls. ``on_round(r)`` after round r (progress), outside the clocks."""
    if steps < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"steps and rounds must be >= 1 and warmup >= 0, got {steps}, {rounds}, {warmup}")
    for update in updates.values():
        for _ in range(warmup):
            update()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": []} for name in updates}
    names = list(updates)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                sync()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for _ in range(steps):
                    updates[name]()
                sync()
                seconds[name]["cpu"].append(time.process_time() - cpu0)
                seconds[name]["wall"].append(time.perf_counter() - wall0)
            gc.collect()
            if on_round is not None:
                on_round(r)
    finally:
        if gc_was_enabled:
            gc.enable()
    return seconds


def summarise(
    candidates: dict[str, Candidate],
    seconds: dict[str, dict[str, list[float]]],
    samples_per_round: int,
    reference: str,
) -> dict[str, Any]:
    """Samples/s (median round) by both clocks, the rounds, parameter counts, and ratios to ``reference``.

    The ratio of ``reference`` to a candidate is the median over rounds of (candidate's time / reference's
    time) in that round: paired rounds cancel most of the machine's drift.
    """
    table: dict[str, dict[str, Any]] = {}
    for name, clocks in seconds.items():
        row: dict[str, Any] = {"n_parameters": count_parameters(candidates[name].module)}
        for clock, values in clocks.items():
            row[f"{clock}_samples_per_s"] = round(statistics.median(samples_per_round / s for s in values), 1)
            row[f"{clock}_rounds_s"] = [round(s, 4) for s in values]
        if reference in seconds and name != reference:
            for clock, values in clocks.items():
                paired = [c / r for c, r in zip(values, seconds[reference][clock], strict=True)]
                row[f"{reference}_speedup_{clock}"] = round(statistics.median(paired), 3)
        table[name] = row
    return {"table": table, "reference": reference}


def write_results(report: dict[str, Any], out: Path) -> None:
    """results.json and results.md under ``out`` (atomic writes)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "results.md", render_markdown(report))


def render_markdown(report: dict[str, Any]) -> str:
    ref = report["reference"]
    setup, meta = report.get("setup", {}), report.get("machine", {})
    lines = [
        "# Decision Transformer training throughput",
        "",
        f"Command: `{report.get('command', '')}`",
        "",
        f"- shape: {', '.join(f'{k} {v}' for k, v in setup.items())}",
        f"- machine: {meta.get('device_name')} · threads {meta.get('threads')} of {meta.get('cores')} cores · "
        f"torch {meta.get('torch_version')} · git {meta.get('git_sha')} · {load_text(meta)}",
        "",
    ]
    rows = []
    for name, row in report["table"].items():
        up_cpu = row.get(f"{ref}_speedup_cpu", "—" if name != ref else "1 (reference)")
        up_wall = row.get(f"{ref}_speedup_wall", "—" if name != ref else "1 (reference)")
        rows.append([name, f"{row['n_parameters']:,}", row["cpu_samples_per_s"], row["wall_samples_per_s"], up_cpu,
                     up_wall])  # fmt: skip
    headers = ["candidate", "parameters", "samples/s (CPU time)", "samples/s (wall)", f"{ref} speed-up (CPU)",
               f"{ref} speed-up (wall)"]  # fmt: skip
    lines += markdown_table(headers, rows, "lrrrrr")
    # a skipped candidate's empty cells are written "| |", as the committed pages have them
    for name, why in report.get("skipped", {}).items():
        lines.append(f"| {name} | — | skipped: {why} | | | |")
    return "\n".join(lines) + "\n"
