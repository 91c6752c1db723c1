"""Markdown tables and the plot of a GPU suite run (:mod:`benchmarks.studies.gpu_suite`).

Attention cells read ``time ms (×ratio to SDPA)``; a row that was not timed shows its status (``failed``,
``skipped (memory)``, ...) instead, so no variant is hidden. The "physical limit" section sets the 16K rows of
SDPA and of the fastest efficient attention against the device's measured matrix-product rate (dense-equivalent
FLOPs, the harness's formula) and copy bandwidth (the fewest bytes the kernel must move: q, k, v read and the
output written once; forward + backward also reads the output gradient and writes three input gradients).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rl_transformers.utils.extras import need
from rl_transformers.utils.tables import markdown_row, markdown_table

ATTENTION_COLUMNS = ("variant",)
"""First column of every attention table; one further column per length L."""
LIMIT_LENGTH = 16384
"""Length of the physical-limit comparison (16K tokens)."""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _cell(row: dict[str, Any]) -> str:
    if row.get("time_ms") is None:
        return str(row.get("status"))
    ratio = row.get("ratio_sdpa")
    return f"{_fmt(row['time_ms'])} ms" + (f" (×{ratio:.2f})" if ratio is not None else "")


def attention_tables(rows: list[dict[str, Any]], title: str) -> list[str]:
    """One Markdown table per (target, mode): variants x lengths."""
    lines: list[str] = []
    groups = sorted(
        {(r["target"], r["mode"]) for r in rows}, key=lambda g: (g[0] != "kernel", g[1] != "forward")
    )
    for target, mode in groups:
        sub = [r for r in rows if r["target"] == target and r["mode"] == mode]
        lengths = sorted({r["length"] for r in sub})
        variants = sorted(
            {r["variant"] for r in sub}, key=lambda v: (not v.startswith(("sdpa", "peer:sdpa")), v)
        )
        table = []
        for variant in variants:
            cells = []
            for n in lengths:
                match = [r for r in sub if r["variant"] == variant and r["length"] == n]
                cells.append(_cell(match[0]) if match else "")
            table.append([variant, *cells])
        headers = ["variant", *(f"L = {n:,}" for n in lengths)]
        lines += [
            "",
            f"### {title}: {target}, {mode}",
            "",
            *markdown_table(headers, table, "l" + "r" * len(lengths)),
        ]
    return lines


def kernel_tables(rows: list[dict[str, Any]], title: str) -> list[str]:
    """Per variant and mode (kernel target), at its longest timed length: the attention kernels it ran
    (``backends``) and its real TFLOP/s (the FLOPs its kernels did, ``kernels.py``) beside the
    dense-equivalent TFLOP/s of the other tables."""
    timed = [r for r in rows if r["target"] == "kernel" and r.get("time_ms") is not None]
    if not any(r.get("backends") for r in timed):
        return []
    table = []
    for variant, mode in sorted({(r["variant"], r["mode"]) for r in timed}):
        row = max(
            (r for r in timed if r["variant"] == variant and r["mode"] == mode), key=lambda r: r["length"]
        )
        kernels = ", ".join(row.get("backends") or []) or "—"
        table.append(
            [
                variant,
                mode,
                f"{row['length']:,}",
                kernels,
                _fmt(row.get("real_tflops")),
                _fmt(row.get("tflops")),
            ]
        )
    headers = ["variant", "mode", "L", "kernels", "real TFLOP/s", "dense-equivalent TFLOP/s"]
    title_line = f"### {title}: kernels and real work (kernel target, longest timed L)"
    return ["", title_line, "", *markdown_table(headers, table, "llrlrr")]


def _min_bytes(row: dict[str, Any]) -> float:
    """Fewest bytes a kernel row must move (see the module docstring)."""
    elem = 4 if row.get("dtype") == "float32" else 2
    tensor = row["batch"] * row["heads"] * row["length"] * row["d_head"] * elem
    return tensor * (4 if row["mode"] == "forward" else 4 + 1 + 3)


def limit_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """SDPA and the fastest efficient attention at :data:`LIMIT_LENGTH` against the measured ceilings."""
    ceilings = results["stages"].get("ceilings", {}).get("data")
    attention = results["stages"].get("attention", {}).get("data")
    if not ceilings or not attention:
        return []
    timed = [
        r
        for r in attention["rows"]
        if r["target"] == "kernel" and r["time_ms"] is not None and r["length"] == LIMIT_LENGTH
    ]
    out = []
    for mode in ("forward", "backward"):
        rows = [r for r in timed if r["mode"] == mode]
        sdpa = [r for r in rows if r["kind"] == "sdpa"]
        # Exact and causal: an approximate or non-causal-only entry (linformer) does far less work than the
        # dense-equivalent count, so its "share of the matmul rate" would exceed 100 % and say nothing.
        ours = [
            r
            for r in rows
            if r["kind"] == "ours" and r["attention"] != "full" and r.get("exact") and r.get("causal", True)
        ]
        best = min(ours, key=lambda r: r["time_ms"]) if ours else None
        for label, row in (("sdpa", sdpa[0] if sdpa else None), ("fastest exact efficient attention", best)):
            if row is None:
                continue
            seconds = row["time_ms"] / 1e3
            out.append(
                {
                    "which": label,
                    "variant": row["variant"],
                    "mode": mode,
                    "tflops": row["tflops"],
                    "share_matmul": row["tflops"] / ceilings["matmul_tflops"],
                    "tb_per_s": _min_bytes(row) / seconds / 1e12,
                    "share_copy": _min_bytes(row) / seconds / 1e12 / ceilings["copy_tb_per_s"],
                }
            )
    return out


def slower_than_sdpa(results: dict[str, Any]) -> list[str]:
    """Registry attentions slower than SDPA, or not timed, at :data:`LIMIT_LENGTH` (kernel, bf16)."""
    attention = results["stages"].get("attention", {}).get("data")
    if not attention:
        return []
    out = []
    for r in attention["rows"]:
        if r["kind"] != "ours" or r["target"] != "kernel" or r["length"] != LIMIT_LENGTH:
            continue
        if r["time_ms"] is None:
            out.append(f"{r['variant']} ({r['mode']}): {r['status']} {r.get('reason') or ''}".strip())
        elif r["ratio_sdpa"] is not None and r["ratio_sdpa"] > 1:
            out.append(f"{r['variant']} ({r['mode']}): ×{r['ratio_sdpa']:.2f} SDPA's time")
    return out


ROW_KEY = ("variant", "target", "mode", "length", "dtype", "causal")
"""What makes two attention rows the same measurement (for :func:`merge_results`)."""


def merge_results(base: dict[str, Any], other: dict[str, Any]) -> int:
    """Merge a later run's attention rows into ``base`` (a re-run of some targets on the same device, e.g. after
    a fix): a row of the same key replaces ``base``'s, a row without one is added; returns how many rows came
    in. Refuses another device: times and ratios are only comparable within one. The "groups not run" note is
    recounted from ``base``'s plan, and the merge is recorded in ``base["merged"]`` (command, commit, rows)."""
    devices = [r["stages"].get("device", {}).get("data", {}).get("device_name") for r in (base, other)]
    if devices[0] != devices[1]:
        raise ValueError(f"cannot merge runs of different devices: {devices[0]!r} and {devices[1]!r}")
    merged = 0
    for name in ("attention", "attention_fp32"):
        new = other["stages"].get(name, {})
        old = base["stages"].get(name, {})
        if new.get("status") != "ok" or old.get("status") != "ok":
            continue
        rows = {tuple(r.get(k) for k in ROW_KEY): r for r in old["data"]["rows"]}
        for row in new["data"]["rows"]:
            rows[tuple(row.get(k) for k in ROW_KEY)] = row
            merged += 1
        old["data"]["rows"] = list(rows.values())
        old["data"]["notes"] = [n for n in old["data"].get("notes", []) if not n.startswith("time budget")]
        missing = _groups_not_run(old["data"])
        if missing:
            old["data"]["notes"].append(
                f"time budget reached: {missing} groups (position, target, mode, size) not run"
            )
    base.setdefault("merged", []).append(
        {"command": other.get("command"), "git_commit": other.get("git_commit"), "rows_merged": merged}
    )
    return merged


def _groups_not_run(data: dict[str, Any]) -> int:
    """Groups (target, mode, length) of a stage's plan without a row."""
    cfg = data["config"]
    planned = {
        (t, m, s["length"])
        for t in cfg["targets"]
        for m in cfg["config"]["modes"]
        for s in cfg["shapes"]
        if t != "model" or s["length"] <= cfg["model_max_len"]
    }
    return len(planned - {(r["target"], r["mode"], r["length"]) for r in data["rows"]})


def _header(results: dict[str, Any]) -> list[str]:
    """Title, provenance (command, commit, merged re-measurements), device and the stage table."""
    stages = results["stages"]
    dev = stages.get("device", {}).get("data", {})
    lines = ["# GPU benchmark", ""]
    if results.get("dry_run"):
        lines += ["**Dry run** (toy sizes on the CPU): these numbers measure nothing.", ""]
    lines += [
        f"Command: `{results.get('command', '')}` · git `{results.get('git_commit')}`",
        "",
    ]
    for merged in results.get("merged", []):
        lines += [
            f"Rows re-measured on the same device by `{merged['command']}` · git `{merged['git_commit']}` "
            f"({merged['rows_merged']} rows)",
            "",
        ]
    lines += [
        f"Device: {dev.get('device_name')} · {dev.get('gpu_memory_gib', '—')} GiB · "
        f"{dev.get('multiprocessors', '—')} SMs · driver {dev.get('driver', '—')} · torch "
        f"{dev.get('torch_version')} · CUDA {dev.get('cuda_version')} · cuDNN {dev.get('cudnn_version', '—')} · "
        f"{dev.get('timestamp')}",
        "",
        *markdown_table(
            ["stage", "status", "seconds", "note"],
            [
                [name, rec["status"], rec.get("seconds", "—"), rec.get("reason", "")]
                for name, rec in stages.items()
            ],
            "llrl",
        ),
    ]
    return lines


def _ceiling_sections(results: dict[str, Any]) -> list[str]:
    """The measured ceilings, the 16K rows against them and the variants slower than SDPA there."""
    lines: list[str] = []
    ceil = results["stages"].get("ceilings", {}).get("data")
    if ceil:
        lines += [
            "",
            "## Measured ceilings",
            "",
            f"- matrix product {ceil['matmul_n']}³ {ceil['matmul_dtype']}: **{ceil['matmul_tflops']:.3g} TFLOP/s**",
            f"- device-to-device copy ({ceil['copy_bytes'] / 2**30:.1f} GiB read + written): "
            f"**{ceil['copy_tb_per_s']:.3g} TB/s**",
        ]
    limits = limit_rows(results)
    if limits:
        headers = ["which", "variant", "mode", "TFLOP/s", "share of matmul rate", "TB/s (fewest bytes)"]
        table = [
            [r["which"], r["variant"], r["mode"], f"{r['tflops']:.1f}", f"{r['share_matmul']:.1%}",
             f"{r['tb_per_s']:.3f}", f"{r['share_copy']:.1%}"]
            for r in limits
        ]  # fmt: skip
        lines += [
            "",
            f"## Against the physical limit (kernel, bf16, L = {LIMIT_LENGTH:,})",
            "",
            "TFLOP/s are dense-equivalent (a sparse or linear kernel does less work than they count).",
            "",
            *markdown_table([*headers, "share of copy"], table, "lllrrrr"),
        ]
    slow = slower_than_sdpa(results)
    if slow:
        lines += ["", f"## Slower than SDPA, or not timed, at L = {LIMIT_LENGTH:,} (kernel, bf16)", ""]
        lines += [f"- {s}" for s in slow]
    return lines


def _attention_sections(stages: dict[str, Any]) -> list[str]:
    """The bf16 and fp32 attention stages: shapes, notes, then their tables."""
    lines: list[str] = []
    for key, title in (("attention", "Attention, bf16"), ("attention_fp32", "Attention, fp32")):
        data = stages.get(key, {}).get("data")
        if data:
            lines += ["", f"## {title}", ""]
            cfg = data["config"]
            lines.append(
                f"Shapes: {', '.join(_shape(s) for s in cfg['shapes'])}; causal; median of "
                f"{cfg['repeats']} repeats (CUDA events) after warm-up; every timed row passed the gate."
            )
            lines += [f"- note: {n}" for n in data.get("notes", [])]
            lines += attention_tables(data["rows"], title)
            lines += kernel_tables(data["rows"], title)
    return lines


def _ppo_section(ppo: dict[str, Any]) -> list[str]:
    """PPO throughput of the default GTrXL per number of envs."""
    lines = [
        "",
        f"## PPO, default GTrXL on {ppo['env_id']}",
        "",
        *markdown_table(
            ["envs", "parameters", "rollout env steps/s", "update samples/s", "env steps/s (both)"],
            align="rrrrr",
        ),
    ]
    for r in ppo["rows"]:  # a row that did not run keeps its empty cells written "| |"
        if r["status"] != "ok":
            lines.append(f"| {int(r['num_envs'])} | {r['status']}: {r.get('reason', '')} | | | |")
            continue
        lines.append(
            markdown_row(
                [
                    int(r["num_envs"]),
                    f"{int(r['parameters']):,}",
                    f"{r['rollout_steps_per_s']:,.0f}",
                    f"{r['train_steps_per_s']:,.0f}",
                    f"{r['steps_per_s']:,.0f}",
                ]
            )
        )
    return lines


def _dt_section(dt: dict[str, Any]) -> list[str]:
    """Decision Transformer update rates of each candidate, against this library's."""
    lines = [
        "",
        "## Decision Transformer training updates",
        "",
        f"Shape {dt['shape']}; {dt['rounds']} interleaved rounds of {dt['steps']} updates (median round).",
        "",
    ]
    batch = dt["shape"]["batch_size"]
    table = [
        [name, f"{row['n_parameters']:,}", f"{row['wall_samples_per_s'] / batch:,.1f}",
         f"{row['wall_samples_per_s']:,.0f}", row.get("rl_transformers_speedup_wall", "1 (reference)")]
        for name, row in dt["table"].items()
    ]  # fmt: skip
    headers = ["candidate", "parameters", "updates/s", "samples/s", "rl_transformers speed-up"]
    lines += markdown_table(headers, table, "lrrrr")
    # a skipped candidate's empty cells are written "| |", as in the committed pages
    for name, why in dt.get("skipped", {}).items():
        lines.append(f"| {name} | skipped: {why} | | | |")
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The whole results page of a suite run: each stage that has data gets its section."""
    stages = results["stages"]
    lines = _header(results) + _ceiling_sections(results) + _attention_sections(stages)
    ppo = stages.get("ppo", {}).get("data")
    if ppo:
        lines += _ppo_section(ppo)
    dt = stages.get("dt", {}).get("data")
    if dt:
        lines += _dt_section(dt)
    return "\n".join(lines) + "\n"


def _shape(s: dict[str, Any]) -> str:
    return f"B{s['batch']}·H{s['heads']}·D{s['d_head']}·L{s['length']}"


def write_plot(results: dict[str, Any], path: Path) -> bool:
    """Kernel time vs L (log-log), forward and forward + backward, one line per variant; False if no data."""
    data = results["stages"].get("attention", {}).get("data")
    if not data:
        return False
    need("matplotlib", "the GPU report's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["target"] == "kernel" and r["time_ms"] is not None]
    variants = sorted({r["variant"] for r in rows})
    styles = list(itertools.product(("-", "--", ":"), ("o", "s", "^", "v", "D", "x", "+", "*")))
    cmap = plt.get_cmap("tab10")
    colours = [cmap(i) for i in range(10)]
    modes = [m for m in ("forward", "backward") if any(r["mode"] == m for r in rows)]
    if not modes:
        return False
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 5.5), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, mode in zip(axes, modes, strict=True):
        for i, variant in enumerate(variants):
            pts = sorted(
                (r["length"], r["time_ms"]) for r in rows if r["variant"] == variant and r["mode"] == mode
            )
            if not pts:
                continue
            line, marker = styles[i % len(styles)]
            sdpa = variant == "sdpa"
            ax.plot(
                *zip(*pts, strict=True),
                line,
                marker=marker,
                color="black" if sdpa else colours[i % len(colours)],
                linewidth=2.5 if sdpa else 1.2,
                label=variant,
            )
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", title=f"kernel, {mode} (bf16, causal)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time per call (ms)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(f"Attention kernels on {results['stages']['device']['data'].get('device_name')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return True
