"""PPO env steps/s vs cleanrl's ppo_trxl at an equal parameter count (benchmarks/studies/ppo_reference.py).

cleanrl is not a dependency: check out https://github.com/vwxyzjn/cleanrl, point --cleanrl-dir at its
cleanrl/ppo_trxl directory and --cleanrl-python at an interpreter with its dependencies (gymnasium 0.29,
memory-gym, einops, tyro, tensorboard, torch; e.g. a venv made with its cleanrl/ppo_trxl/pyproject.toml).

    python benchmarks/bench_ppo_vs_cleanrl.py --cleanrl-dir ~/cleanrl/cleanrl/ppo_trxl \\
        --cleanrl-python ~/cleanrl-venv/bin/python --rounds 3
    python benchmarks/bench_ppo_vs_cleanrl.py ... --compile --warmup 3     # ours also with --compile

Writes <out>/results.json and results.md (rates, parameter counts, speed-ups, command, git SHA, machine).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: benchmarks/ (not installed) imports from the checkout's root
    sys.path.insert(0, str(ROOT))

from benchmarks.studies import ppo_reference  # noqa: E402
from benchmarks.studies.meta import load_text  # noqa: E402
from rl_transformers.runs.provenance import finish_machine_info, machine_info  # noqa: E402
from rl_transformers.utils.atomic import atomic_write_text  # noqa: E402
from rl_transformers.utils.errors import run_cli  # noqa: E402
from rl_transformers.utils.tables import markdown_row, markdown_table  # noqa: E402


@dataclass(frozen=True)
class Args:
    cleanrl_dir: Path
    """Directory holding cleanrl's ppo_trxl.py and pom_env.py."""
    cleanrl_python: str = sys.executable
    """Interpreter that runs cleanrl's script (needs its dependencies)."""
    updates: int = 4
    """Timed PPO iterations per run (after the warm-up)."""
    warmup: int = 1
    """Untimed iterations first, on both sides."""
    rounds: int = 3
    """Alternating rounds (medians reported)."""
    out: Path = Path("benchmarks/results/ppo_vs_cleanrl")
    """Directory of results.json / results.md."""
    compile: bool = False
    """Also measure our models with the acting step compiled (``--compile``; use --warmup 3 so that the
    compilation stays out of the timing)."""


def cleanrl_text(source: dict | None) -> str:
    """The cleanrl code measured (results from before it was recorded say so)."""
    if not source:
        return "code not recorded"
    hashes = ", ".join(f"{name} sha256 {digest[:12]}" for name, digest in source["sha256"].items())
    return f"commit {source['git_commit'] or 'unknown (not a git checkout)'}; {hashes}"


def phases(row: dict) -> str:
    """Our rollout and training rates (an iteration's time split); cleanrl's script prints one rate only."""
    if "rollout_steps_per_s" not in row:
        return "–"
    return f"{row['rollout_steps_per_s']:,.0f} / {row['train_steps_per_s']:,.0f}"


def render(report: dict) -> str:
    meta, ppo = report["machine"], report["ppo"]
    lines = [
        "# PPO env steps/s vs cleanrl ppo_trxl at an equal parameter count (ProofofMemory-v0)",
        "",
        f"Command: `{report['command']}`",
        "",
        f"- shape: 16 envs x {ppo['num_steps']} steps, {ppo['num_minibatches']} minibatches, "
        f"{ppo['update_epochs']} epochs; 1 torch thread each; {report['warmup']} warm-up + {report['updates']} "
        f"timed iterations per run; {report['rounds']} alternating rounds, medians",
        f"- machine: {meta['device_name']} · {meta['cores']} cores · torch {meta['torch_version']} · "
        f"git {meta['git_sha']} · {load_text(meta)}",
        f"- cleanrl: {cleanrl_text(report.get('cleanrl'))}",
        "",
    ]
    headers = ["model", "parameters (vs cleanrl)", "env steps/s", "rounds", "speed-up vs cleanrl",
               "rollout / training steps/s"]  # fmt: skip
    lines += markdown_table(headers, align="lrrlrl")
    for row in report["rows"]:  # a failed model's row keeps its empty cells written "| |"
        failed = f"| {row['model']} | {row['parameters']} | error: {row.get('reason', '')[:200]} | | | |"
        lines.append(markdown_row(model_cells(row)) if row["status"] == "ok" else failed)
    return "\n".join(lines) + "\n"


def model_cells(row: dict) -> list[str]:
    """A measured model's cells: parameters (and their ratio to cleanrl's), env steps/s, rounds, speed-up, phases."""
    return [
        row["model"],
        f"{row['parameters']:,} ({row.get('parameters_vs_cleanrl', 1.0):.3f})",
        f"{row['steps_per_s']:,.0f}",
        str(row["steps_per_s_rounds"]),
        f"{row.get('speedup_vs_cleanrl', 1.0):.2f}",
        phases(row),
    ]


def main(args: Args) -> None:
    machine = machine_info("cpu", 1)  # load and time at the start of the measurement
    result = ppo_reference.compare(
        args.cleanrl_dir, args.cleanrl_python, args.updates, args.warmup, args.rounds, compile=args.compile
    )
    report = {
        "command": shlex.join(["python", "benchmarks/bench_ppo_vs_cleanrl.py", *sys.argv[1:]]),
        "updates": args.updates,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "machine": finish_machine_info(machine),
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "results.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write_text(args.out / "results.md", render(report))
    print(render(report))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(Args, description=__doc__)))
