"""Train a Decision Transformer (or BC / %BC) on an offline dataset: Minari id, Minari directory or D4RL .hdf5.

The command is ``rlt train-dt``, defined in rl_transformers/agents/dt_command.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.agents.dt_command import command

if __name__ == "__main__":
    sys.exit(command())
