"""The encoder study page's parameter section: counts from hand-built records, ratios to the untuned reference on
the same task, and the line naming the rows outside the tolerance (copied into the README headline)."""

from __future__ import annotations

from experiments.encoder_study import headline
from experiments.encoder_study import plan as cp
from experiments.encoder_study.sizes import UNEQUAL, parameter_lines, ratios, unequal_rows
from rl_transformers.study.encoders import Encoder


def rec(name: str, preset: str, task: str, parameters: int) -> dict:
    return {"encoder_name": name, "preset": preset, "task": task, "parameters": parameters}


GTRXL, GRU, WIDE = (Encoder(n, "", "x") for n in ("gtrxl", "gru", "wide"))
FOUND = [
    rec("gtrxl", cp.UNTUNED, "A", 1000), rec("gtrxl", cp.UNTUNED, "B", 2000),
    rec("gru", cp.UNTUNED, "A", 1090), rec("gru", cp.UNTUNED, "B", 1900),  # within 10 % on each task
    rec("gru", cp.TUNED, "A", 2100), rec("gru", cp.TUNED, "B", 2000),  # 2.1x on A, 1.0x on B
    rec("wide", cp.UNTUNED, "B", 2300),  # 1.15x
]  # fmt: skip


def test_ratios_are_to_the_untuned_reference_on_the_same_task() -> None:
    got = ratios(FOUND)
    assert got[("gru", cp.UNTUNED)] == [1.09, 0.95]
    assert got[("gru", cp.TUNED)] == [2.1, 1.0]
    assert got[("wide", cp.UNTUNED)] == [1.15]


def test_rows_outside_the_tolerance_are_named_with_their_variant() -> None:
    assert unequal_rows(FOUND, [GTRXL, GRU, WIDE]) == ["`gru` (tuned, 1.00–2.10×)", "`wide` (untuned, 1.15×)"]
    assert unequal_rows(FOUND[:4], [GTRXL, GRU]) == []
    lines = parameter_lines(FOUND, [GTRXL, GRU, WIDE])
    assert "| `gru` | 1,090–1,900 | 0.95–1.09 | 2,000–2,100 | 1.00–2.10 |" in lines
    unequal = [line for line in lines if line.startswith(UNEQUAL)]
    assert len(unequal) == 1 and "against the tuned `gru`" in unequal[0]
    assert not [line for line in parameter_lines(FOUND[:4], [GTRXL, GRU]) if line.startswith(UNEQUAL)]


def test_the_readme_headline_copies_the_unequal_sizes_line() -> None:
    page = "\n".join(["**Complete.** x", "", "## Verdict", "", *parameter_lines(FOUND, [GTRXL, GRU]), ""])
    block = headline.headline(page)
    assert "- Not parameter-matched (outside 10%; the page's Parameters): `gru` (tuned, 1.00–2.10×)" in block
    assert not [line for line in headline.headline(page.replace(UNEQUAL, "x")) if "matched" in line]
