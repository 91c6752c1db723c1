"""The ``rlt`` command: one installed entry point (``pyproject.toml`` ``[project.scripts]``) over the library's
commands, each the same command as a script of a checkout (``rlt train-ppo`` is ``scripts/train_gtrxl.py``:
the same flags, defaults, output and exit status).

    rlt --help                      # the commands, one line each
    rlt train-ppo --help            # a command's flags
    python -m rl_transformers.cli   # the same without the installed script

Dispatch is lazy: a command's module (and torch with it) is imported only when that command runs, so
``rlt --help`` answers at once. The commands live with their layer; this package sits above every other part
(tests/test_import_graph.py):

- :mod:`~rl_transformers.agents.ppo_command`, :mod:`~rl_transformers.agents.dt_command`,
  :mod:`~rl_transformers.agents.evaluate_command` - train PPO / DT, evaluate a run;
- :mod:`offline_data.build_command` - build D4RL-style Minari datasets;
- :mod:`~rl_transformers.tune.command` - Optuna tuning; :mod:`~rl_transformers.bench.command` - the attention
  benchmark;
- :mod:`~rl_transformers.cli.study` - the encoder study (``scripts/encoder_study.py``).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rl_transformers import startup

PROG = "rlt"
EXIT_USAGE = 2
"""No command or an unknown one: the status of a user error (``rl_transformers.utils.errors``, which is not
imported here: ``rl_transformers.utils`` imports torch)."""


@dataclass(frozen=True)
class Command:
    """One subcommand: the module whose ``command() -> int`` runs it, its one-line summary and its script."""

    module: str
    summary: str
    script: str


COMMANDS: dict[str, Command] = {
    "train-ppo": Command(
        "rl_transformers.agents.ppo_command",
        "train a memory policy with PPO: GTrXL, any backbone variant, or an LSTM / GRU / MLP baseline",
        "train_gtrxl",
    ),
    "train-dt": Command(
        "rl_transformers.agents.dt_command",
        "train a Decision Transformer (or BC / %BC) on an offline dataset",
        "train_dt",
    ),
    "evaluate": Command(
        "rl_transformers.agents.evaluate_command",
        "evaluate a finished PPO or DT run: mean ± std return, per-episode JSON, optional video",
        "evaluate",
    ),
    "make-dataset": Command(
        "offline_data.build_command",
        "build D4RL-style offline datasets (random / medium / expert ...) as Minari",
        "make_dataset",
    ),
    "tune": Command(
        "rl_transformers.tune.command",
        "tune PPO hyper-parameters of any encoder on any task with Optuna",
        "tune",
    ),
    "study": Command(
        "rl_transformers.cli.study",
        "the encoder study: every registered encoder online (PPO) and offline (DT), rliable aggregates",
        "encoder_study",
    ),
    "bench": Command(
        "rl_transformers.bench.command",
        "benchmark every registered attention against SDPA: time, memory, error, crossover",
        "benchmark_backbones",
    ),
}
"""The subcommands in the order ``rlt --help`` lists them."""


def usage() -> str:
    """``rlt --help``: the usage line and one line per command."""
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: {PROG} {{{','.join(COMMANDS)}}} [OPTIONS]",
        "",
        "rl_transformers' commands (each also runs as scripts/<script>.py in a checkout).",
        "",
        "commands:",
        *(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()),
        "",
        "options:",
        "  -h, --help    this list; rlt <command> --help shows a command's flags",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rlt <command> [flags]`` (``argv``: the words after ``rlt``, default ``sys.argv[1:]``); returns the
    command's exit status. No command or an unknown one prints the valid commands and returns 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not args or args[0] not in COMMANDS:
        close = difflib.get_close_matches(args[0], list(COMMANDS), n=1) if args else []
        given = f"unknown command {args[0]!r}" if args else "no command given"
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(usage().splitlines()[0], file=sys.stderr)
        print(f"error: {given}; valid: {', '.join(COMMANDS)}{hint}", file=sys.stderr)
        return EXIT_USAGE
    name, rest = args[0], args[1:]
    saved = sys.argv
    sys.argv = [f"{PROG} {name}", *rest]  # the command parses sys.argv; its usage line reads "rlt <command>"
    startup.install(command=True)  # Ctrl-C while the command imports torch: one line, exit 130
    try:
        return importlib.import_module(COMMANDS[name].module).command()
    finally:
        sys.argv = saved
