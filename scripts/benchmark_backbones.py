"""Benchmark every registered attention against SDPA: time, memory, error, crossover (rl_transformers.bench).

The command is ``rlt bench``, defined in rl_transformers/bench/command.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.bench.command import command

if __name__ == "__main__":
    sys.exit(command())
