"""``python -m rl_transformers.cli <command> ...``: the ``rlt`` command without its installed script."""

from __future__ import annotations

import sys

from rl_transformers.cli import main

if __name__ == "__main__":
    sys.exit(main())
