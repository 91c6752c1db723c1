"""What a T-Maze PPO run's updates did, from its ``progress.jsonl`` (plain or gzipped): the figures the page
quotes for the corridor probes.

Per log:

- ``turned_at``: the first env step whose training return (``rollout/ep_rew_mean``) is at least ``--turned``
  (0.4: the policy turns at the junction, the first phase passed), or None;
- within the window of env steps [``--window`` LO, HI): the training return's range, and the medians of the
  policy entropy per step, of the approximate KL per update and of the clip fraction, and the share of updates
  whose entropy per step is at least ln 2 / (L + 1), what a policy gives that is sure everywhere but flips a
  coin between the arms at the junction of a corridor of length L.

    python -m experiments.memory_tasks.update_stats LOG [LOG ...] --corridor 400 [--window 1000000 8000000]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from pathlib import Path
from typing import Any

from rl_transformers.utils.errors import UserError, run_cli


def read_log(path: Path) -> list[dict[str, Any]]:
    """The rows of a progress log (``.gz``: gzipped); a missing file or a line that is not JSON is a
    :class:`UserError` naming the file (and the line)."""
    if not path.is_file():
        raise UserError(f"progress log {path} does not exist (a run's progress.jsonl, or .jsonl.gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise UserError(f"{path}, line {number}: not a JSON row ({err.msg})") from err
    return rows


def summarise(
    rows: list[dict[str, Any]], corridor: int, window: tuple[float, float], turned: float = 0.4
) -> dict[str, Any]:
    """The figures of one log (see the module docstring); window medians are None when no update falls in it."""
    returns = [(r["step"], r["rollout/ep_rew_mean"]) for r in rows if "rollout/ep_rew_mean" in r]
    updates = [r for r in rows if "train/approx_kl" in r and window[0] <= r["step"] < window[1]]
    inside = [value for step, value in returns if window[0] <= step < window[1]]
    entropy = [-r["train/entropy_loss"] for r in updates]
    coin = math.log(2) / (corridor + 1)

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "turned_at": next((step for step, value in returns if value >= turned), None),
        "return_range": [min(inside), max(inside)] if inside else None,
        "updates": len(updates),
        "entropy": median(entropy),
        "coin_share": sum(e >= coin for e in entropy) / len(entropy) if entropy else None,
        "approx_kl": median([r["train/approx_kl"] for r in updates]),
        "clip_fraction": median([r["train/clip_fraction"] for r in updates]),
    }


def _rounded(value: Any) -> Any:
    """Floats (also inside a list) to 3 significant digits, for printing."""
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return float(f"{value:.3g}") if isinstance(value, float) else value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", type=Path, nargs="+", help="progress.jsonl files (or .jsonl.gz)")
    parser.add_argument("--corridor", type=int, required=True, help="corridor length L")
    parser.add_argument("--window", type=float, nargs=2, default=(1e6, math.inf), metavar=("LO", "HI"))
    parser.add_argument("--turned", type=float, default=0.4, help="training return of the first phase")
    args = parser.parse_args(argv)
    for log in args.logs:
        figures = summarise(read_log(log), args.corridor, tuple(args.window), args.turned)
        print(log, json.dumps({key: _rounded(value) for key, value in figures.items()}))


if __name__ == "__main__":
    run_cli(main)
