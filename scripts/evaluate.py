"""Evaluate a finished PPO or DT run: mean ± std return over N episodes, per-episode JSON, optional video.

The command is ``rlt evaluate``, defined in rl_transformers/agents/evaluate_command.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.agents.evaluate_command import command

if __name__ == "__main__":
    sys.exit(command())
