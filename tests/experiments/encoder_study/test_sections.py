"""The main page's screening and probe sections (``experiments.encoder_study.sections``), from hand-built documents; a missing
or malformed document gives a line, never an exception."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.encoder_study import sections
from rl_transformers.study import files


def enc(iqm: float, lo: float, hi: float, p_lo: float, p_hi: float) -> dict:
    return {"iqm": iqm, "ci_low": iqm - 0.1, "ci_high": iqm + 0.1, "prob_improvement": (lo + hi) / 2,
            "prob_ci_low": p_lo, "prob_ci_high": p_hi}  # fmt: skip


def test_the_screening_section_ranks_by_iqm_and_counts_the_sides_of_gru(tmp_path: Path) -> None:
    online = {"reference": "gru", "tasks": ["A", "B"], "encoders": {
        "gru": {"iqm": 0.5, "ci_low": 0.4, "ci_high": 0.6},
        "x": enc(0.7, 0, 0, 0.6, 0.9), "y": enc(0.1, 0, 0, 0.0, 0.2), "z": enc(0.3, 0, 0, 0.3, 0.7)}}  # fmt: skip
    (tmp_path / files.SCREENING_AGGREGATE).write_text(json.dumps({"online": online, "offline": {}}))
    text = "\n".join(sections.screening_lines(tmp_path))
    assert "`x` 0.70 [0.60, 0.80]; `gru` 0.50 [0.40, 0.60]; `z` 0.30" in text
    assert "1 worse, 1 better, 1 not separated" in text and "on 2 tasks (A, B)" in text


def test_the_probe_section_gives_the_longest_recall_per_bound(tmp_path: Path) -> None:
    def row(bound: str, successes: dict[int, bool]) -> dict:
        by_k = {str(k): {"status": "done", "updates_to_success": [5 if ok else None, None]}
                for k, ok in successes.items()}  # fmt: skip
        by_k["256"] = {"status": "stopped"}
        return {"encoder": "a", "bound": bound, "knob": "mem_len", "by_k": by_k}

    rows = [
        row("default", {1: True, 4: True, 16: False, 64: False}),
        row("cover", {1: True, 4: True, 16: True}),
    ]
    rows.append({"encoder": "b", "bound": "default", "knob": None, "by_k": {"1": {"status": "done",
                 "updates_to_success": [None]}}})  # fmt: skip
    (tmp_path / sections.PROBE).write_text(json.dumps({"rows": rows, "ks": [1, 4, 16], "seeds": [0, 1]}))
    lines = sections.probe_lines(tmp_path)
    assert "| `a` | mem_len | 4 (fails at 16) | 16 |" in lines
    assert "| `b` | – | – (fails at 1) | – (no reach knob) |" in lines


def test_missing_documents_give_a_line(tmp_path: Path) -> None:
    assert "Not available" in sections.screening_lines(tmp_path)[-1]
    (tmp_path / sections.PROBE).write_text("[1, 2]")
    assert "Not available" in sections.probe_lines(tmp_path)[-1]
