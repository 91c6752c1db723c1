"""Build D4RL-style offline datasets (random / medium / medium-replay / expert / medium-expert) as Minari.

The command is ``rlt make-dataset``, defined in offline_data/build_command.py: ``--help`` lists its flags.
"""

import sys

from offline_data.build_command import command

if __name__ == "__main__":
    sys.exit(command())
