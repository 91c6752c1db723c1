"""Provenance of a benchmark table: the code's git commit and the machine it ran on.

The records come from :mod:`rl_transformers.runs.provenance` (shared with the training runs'
``system_info.json``: ``git_sha``, ``machine_info``, ``finish_machine_info``); this module formats the load of a
measurement.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_text"]


def load_text(meta: dict[str, Any]) -> str:
    """The 1-minute load average at the start of a measurement and, when recorded, at its end."""
    text = f"load at start {(meta.get('loadavg_start') or ['?'])[0]}"
    if meta.get("loadavg_end"):
        text += f", at end {meta['loadavg_end'][0]} ({meta.get('timestamp')} to {meta.get('finished')})"
    return text
