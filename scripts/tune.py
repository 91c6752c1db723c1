"""Tune PPO hyper-parameters of any encoder on any task with Optuna: TPE sampler, median pruner, a resumable
SQLite study.

The command is ``rlt tune``, defined in rl_transformers/tune/command.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.tune.command import command

if __name__ == "__main__":
    sys.exit(command())
