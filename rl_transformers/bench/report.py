"""Results: JSON (with a checked schema), Markdown tables, crossover lengths and plots.

Crossover: for each series (variant, position, target, mode, masking, H, D) with a ratio to SDPA at several
lengths, the crossover length is the shortest measured L from which the variant is faster than SDPA at every
longer measured L, "faster" meaning that the inter-quartile ranges of the two timings do not overlap (variant
q3 < SDPA q1; overlapping ranges are a tie, whatever the medians say); ``crossover_interp`` interpolates
log(ratio) linearly in log(L) between the last non-winning length (when its ratio is >= 1) and the first
winning one. None = it never wins within the measured lengths (or stops winning later).
Lengths at which SDPA itself was skipped while the variant ran are listed as ``runs_where_sdpa_skipped``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.extras import need
from rl_transformers.utils.tables import markdown_table

ROW_SCHEMA: dict[str, tuple[type, ...]] = {
    "variant": (str,),
    "kind": (str,),
    "attention": (str, type(None)),
    "options": (dict,),
    "exact": (bool,),
    "streaming": (str,),
    "position": (str,),
    "target": (str,),
    "mode": (str,),
    "causal": (bool,),
    "causal_requested": (bool,),
    "batch": (int,),
    "heads": (int,),
    "d_head": (int,),
    "length": (int,),
    "dtype": (str,),
    "device": (str,),
    "compiled": (bool,),
    "status": (str,),
    "reason": (str,),
    "note": (str,),
    "time_ms": (float, type(None)),
    "time_ms_q1": (float, type(None)),
    "time_ms_q3": (float, type(None)),
    "time_ms_iqr": (float, type(None)),
    "repeats": (int,),
    "loops": (int, type(None)),
    "early_stop": (bool,),
    "first_call_ms": (float, type(None)),
    "tokens_per_s": (float, type(None)),
    "flops": (float,),
    "tflops": (float, type(None)),
    "peak_mem_bytes": (int, type(None)),
    "mem_method": (str, type(None)),
    "mem_estimate_bytes": (float, type(None)),
    "ratio_sdpa": (float, type(None)),
    "num_err": (float, type(None)),
    "num_tol": (float, type(None)),
    "ref_err": (float, type(None)),
    "ref_tol": (float, type(None)),
    "probe": (dict, type(None)),
    "checked_at": (int, type(None)),
    "loadavg": (float,),
}
"""Required keys of a result row and their JSON types."""
META_SCHEMA: dict[str, tuple[type, ...]] = {
    "torch_version": (str,),
    "device": (str,),
    "device_name": (str,),
    "dtype": (str,),
    "git_sha": (str, type(None)),
    "threads": (int,),
    "cores": (int,),
    "loadavg_start": (list,),
    "loadavg_end": (list,),
    "timestamp": (str,),
    "config": (dict,),
    "registry": (dict,),
    "notes": (list,),
    "wall_s": (float,),
}
STATUSES = ("ok", "approx", "failed", "skipped", "error")


def validate_results(results: dict[str, Any]) -> None:
    """Raise ValueError naming the first missing key / wrong type (ints accepted where floats are expected)."""
    for key in ("schema_version", "meta", "rows", "crossover"):
        if key not in results:
            raise ValueError(f"results lack {key!r}")
    _check_keys("meta", results["meta"], META_SCHEMA)
    for i, row in enumerate(results["rows"]):
        _check_keys(f"rows[{i}]", row, ROW_SCHEMA)
        if row["status"] not in STATUSES:
            raise ValueError(f"rows[{i}].status={row['status']!r} is not one of {list(STATUSES)}")
        timed = row["time_ms"] is not None
        if timed != (row["status"] in ("ok", "approx")):
            raise ValueError(
                f"rows[{i}] ({row['variant']}): status {row['status']!r} but time_ms={row['time_ms']}"
            )


def _check_keys(where: str, data: dict[str, Any], schema: dict[str, tuple[type, ...]]) -> None:
    for key, types in schema.items():
        if key not in data:
            raise ValueError(f"{where} lacks key {key!r}")
        value = data[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ValueError(f"{where}.{key}={value!r} is not of type {[t.__name__ for t in types]}")


# -- crossover --------------------------------------------------------------------------------------------
def _series_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row["variant"],
        row["position"],
        row["target"],
        row["mode"],
        row["causal"],
        row["heads"],
        row["d_head"],
    )


def _group_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["position"], row["target"], row["mode"], row["causal"], row["batch"], row["heads"], row["d_head"],
            row["length"])  # fmt: skip


def sdpa_rows(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The timed eager SDPA row of every group (same position, target, mode, masking and size)."""
    return {
        _group_key(r): r
        for r in rows
        if r["kind"] == "sdpa" and not r["compiled"] and r["time_ms"] is not None
    }


def versus_sdpa(row: dict[str, Any], sdpa: dict[str, Any] | None) -> str | None:
    """faster / slower when the inter-quartile ranges of the two timings do not overlap, else tie."""
    if sdpa is None or row["time_ms"] is None or row["time_ms_q1"] is None or sdpa["time_ms_q1"] is None:
        return None
    if row["time_ms_q3"] < sdpa["time_ms_q1"]:
        return "faster"
    if row["time_ms_q1"] > sdpa["time_ms_q3"]:
        return "slower"
    return "tie"


def crossovers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per non-SDPA series (see the module docstring)."""
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    sdpa_skipped: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    baselines = sdpa_rows(rows)
    for row in rows:
        if row["kind"] == "sdpa":
            if row["time_ms"] is None and not row["compiled"]:
                sdpa_skipped[_series_key(row)[1:]].add(row["length"])  # the series key without the variant
            continue
        series[_series_key(row)].append(row)
    out = []
    for key, items in series.items():
        items = sorted(items, key=lambda r: r["length"])
        measured = [
            (r["length"], r["ratio_sdpa"], versus_sdpa(r, baselines.get(_group_key(r)))) for r in items
        ]
        measured = [m for m in measured if m[1] is not None]
        crossover, interp = None, None
        for idx in range(len(measured)):
            if all(verdict == "faster" for _, _, verdict in measured[idx:]):
                crossover = measured[idx][0]
                interp = float(crossover)
                if idx > 0:
                    (l0, r0, _), (l1, r1, _) = measured[idx - 1], measured[idx]
                    if r0 >= 1.0 > r1:
                        frac = math.log(r0) / (math.log(r0) - math.log(r1))
                        interp = float(math.exp(math.log(l0) + frac * (math.log(l1) - math.log(l0))))
                break
        skipped = sdpa_skipped.get(key[1:])
        out.append(
            {
                "variant": key[0],
                "position": key[1],
                "target": key[2],
                "mode": key[3],
                "causal": key[4],
                "heads": key[5],
                "d_head": key[6],
                "ratios": {str(length): ratio for length, ratio, _ in measured},
                "verdicts": {str(length): verdict for length, _, verdict in measured},
                "wins_at": [length for length, _, verdict in measured if verdict == "faster"],
                "crossover": crossover,
                "crossover_interp": interp,
                "max_length": measured[-1][0] if measured else None,
                "runs_where_sdpa_skipped": sorted(
                    r["length"]
                    for r in items
                    if r["time_ms"] is not None and skipped and r["length"] in skipped
                ),
            }
        )
    return out


# -- Markdown ---------------------------------------------------------------------------------------------
def _fmt_len(length: int) -> str:
    return f"{length // 1024}K" if length >= 1024 and length % 1024 == 0 else str(length)


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def _cell(row: dict[str, Any], verdict: str | None = None) -> str:
    if row["time_ms"] is not None:
        text = f"{_fmt_ms(row['time_ms'])} ms"
        if row["ratio_sdpa"] is not None and row["kind"] != "sdpa":
            text += f" ({'≈' if verdict == 'tie' else ''}{row['ratio_sdpa']:.2f}×)"
        if row["early_stop"]:
            text += "†"
        return text
    if row["status"] == "skipped":
        reason = row["reason"]
        for word in ("memory", "time"):
            if reason.startswith(f"skipped ({word})"):
                return f"skipped ({word})"
        return "n/a"
    return row["status"].upper()


def _fmt_err(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


def _fmt_mib(value: float | None) -> str:
    return "" if value is None else f"{value / 2**20:.0f}"


def _group_table(items: list[dict[str, Any]], baselines: dict[Any, Any]) -> list[str]:
    """One (position, target, mode, H, D) group as a pivot table: a row per variant, a column per length."""
    lengths = sorted({r["length"] for r in items})
    headers = ["variant", *(f"L={_fmt_len(n)}" for n in lengths), "peak MiB (longest run)", "num err",
               "err vs full attn", "notes"]  # fmt: skip
    rows = []
    by_variant: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in items:
        by_variant[r["variant"]][r["length"]] = r
    for variant, per_len in by_variant.items():
        cells = [
            _cell(per_len[n], versus_sdpa(per_len[n], baselines.get(_group_key(per_len[n]))))
            if n in per_len
            else ""
            for n in lengths
        ]
        timed = [per_len[n] for n in lengths if n in per_len and per_len[n]["peak_mem_bytes"] is not None]
        peak = _fmt_mib(timed[-1]["peak_mem_bytes"]) if timed else ""
        errs = [per_len[n] for n in lengths if n in per_len and per_len[n]["num_err"] is not None]
        num = _fmt_err(max(r["num_err"] for r in errs)) if errs else ""
        refs = [per_len[n] for n in lengths if n in per_len and per_len[n]["ref_err"] is not None]
        ref = _fmt_err(refs[-1]["ref_err"]) if refs else ""
        first = next(iter(per_len.values()))
        notes = sorted({r["note"] for r in per_len.values() if r["note"] and "early stop" not in r["note"]})
        failed = [r["reason"] for r in per_len.values() if r["status"] in ("failed", "error")]
        tag = "" if first["exact"] else "approx"
        probe = next((r["probe"] for r in per_len.values() if r["probe"]), None)
        if probe and probe.get("ok") and probe.get("density") is not None:
            mask = "causal" if first["causal"] else "full"
            tag = f"softmax on {probe['density']:.0%} of the {mask} mask at L={probe.get('length')}" + (
                " + bias" if probe["biased"] else ""
            )
        note = "; ".join(x for x in [tag, *notes, *failed[:1]] if x)
        rows.append([variant, *cells, peak, num, ref, note])
    return markdown_table(headers, rows)


def _crossover_table(results: dict[str, Any]) -> list[str]:
    """The crossover lengths vs SDPA, a row per (variant, target, mode, position, H, D)."""
    crossings = []
    for c in results["crossover"]:
        if not c["ratios"]:
            continue
        if c["crossover"] is None:
            cross = f"never (≤ {_fmt_len(c['max_length'])})"
        else:
            cross = f"{_fmt_len(c['crossover'])} (interp. {c['crossover_interp']:.0f})"
        wins = ", ".join(_fmt_len(n) for n in c["wins_at"]) or "-"
        skipped = ", ".join(_fmt_len(n) for n in c["runs_where_sdpa_skipped"]) or "-"
        crossings.append([c["variant"], c["target"], c["mode"], c["position"], f"{c['heads']}, {c['d_head']}", cross,
                          wins, skipped])  # fmt: skip
    headers = [
        "variant",
        "target",
        "mode",
        "position",
        "H, D",
        "crossover L",
        "wins at",
        "runs where SDPA was skipped",
    ]
    return markdown_table(headers, crossings)


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown: header, one pivot table per (position, target, mode, H, D), crossovers, rows."""
    meta, rows = results["meta"], results["rows"]
    cfg = meta["config"]
    lines = [
        f"# Backbone benchmark ({meta['device']}, {meta['dtype']})",
        "",
        f"- device: {meta['device_name']} · threads {meta['threads']} of {meta['cores']} cores · "
        f"torch {meta['torch_version']} · git {meta['git_sha']}",
        f"- {meta['timestamp']} · load {meta['loadavg_start'][0]:.1f} → {meta['loadavg_end'][0]:.1f} · "
        f"wall {meta['wall_s'] / 60:.1f} min · repeats {cfg['repeats']} (round-robin), median (IQR in JSON)",
        "- cells: median ms per call (ratio to SDPA, same run; ≈ = inter-quartile ranges overlap: a tie); "
        "† = early stop (slow repeats); FAILED = correctness gate failed, not timed; n/a = mode not supported "
        "(reason in JSON)",
    ]
    lines += [f"- note: {note}" for note in meta.get("notes", [])]
    baselines = sdpa_rows(rows)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["position"], row["target"], row["mode"], row["heads"], row["d_head"])].append(row)
    for (position, target, mode, heads, d_head), items in groups.items():
        batches = sorted({r["batch"] for r in items})
        lines += [
            "",
            f"## {target} · {mode} · position {position} · H={heads}, D={d_head}, B={'/'.join(map(str, batches))}",
            "",
            *_group_table(items, baselines),
        ]
    lines += ["", "## Crossover vs SDPA", "", *_crossover_table(results)]
    return "\n".join(lines) + "\n"


# -- plots ------------------------------------------------------------------------------------------------
def plot(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Time and peak memory vs L (log-log), one line per variant, SDPA in thick black; one PNG per group."""
    need("matplotlib", "the benchmark's plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in results["rows"]:
        groups[(row["position"], row["target"], row["mode"], row["heads"], row["d_head"])].append(row)
    paths = []
    cmap = plt.get_cmap("tab20")
    for (position, target, mode, heads, d_head), items in groups.items():
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        variants = sorted({r["variant"] for r in items}, key=lambda v: (not v.startswith("sdpa"), v))
        for idx, variant in enumerate(variants):
            pts = sorted((r for r in items if r["variant"] == variant), key=lambda r: r["length"])
            sdpa = variant.startswith("sdpa")
            dashed = "--" if "non-causal" in variant else "-"
            style = dict(color="black", linewidth=3.0, marker="o", linestyle=dashed, zorder=10) if sdpa else dict(
                color=cmap(idx % 20), linewidth=1.3, marker="os^vD<>"[idx % 7],
                linestyle=("-", "--", ":")[idx // 20 % 3],
            )  # fmt: skip
            for ax, key, scale in ((axes[0], "time_ms", 1.0), (axes[1], "peak_mem_bytes", 1 / 2**20)):
                xs = [r["length"] for r in pts if r[key] is not None and r["time_ms"] is not None]
                ys = [
                    max(r[key] * scale, 1e-2) for r in pts if r[key] is not None and r["time_ms"] is not None
                ]
                if xs:
                    ax.plot(xs, ys, label=variant, **style)
        for ax, ylabel in (
            (axes[0], "median time per call (ms)"),
            (axes[1], "peak extra memory (MiB, floor 0.01)"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
        fig.suptitle(
            f"{target} · {mode} · position {position} · H={heads}, D={d_head} ({results['meta']['device']})"
        )
        fig.tight_layout(rect=(0, 0, 0.83, 1))
        path = out_dir / f"{position}-{target}-{mode}-H{heads}-D{d_head}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_all(results: dict[str, Any], out: Path, plots: bool = True) -> dict[str, Path]:
    """results.json, results.md and plots/*.png under ``out``."""
    validate_results(results)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=1, default=_json_default) + "\n")
    atomic_write_text(paths["markdown"], markdown(results))
    if plots:
        plot(results, out / "plots")
        paths["plots"] = out / "plots"
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {value!r}")
