"""Train a memory policy with PPO: GTrXL by default, any backbone variant, or an LSTM / GRU / MLP baseline.

The command is ``rlt train-ppo``, defined in rl_transformers/agents/ppo_command.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.agents.ppo_command import command

if __name__ == "__main__":
    sys.exit(command())
