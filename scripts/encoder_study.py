"""Compare encoders as RL policy encoders (PPO online, the Decision Transformer offline), aggregated with rliable.

The command is ``rlt study``, defined in rl_transformers/cli/study.py: ``--help`` lists its flags.
"""

import sys

from rl_transformers.cli.study import command

if __name__ == "__main__":
    sys.exit(command())
