"""The verdict (``experiments.encoder_study.verdict``) on hand-built records: P(X > GRU) against GRU of the
same variant, above / below only when the interval excludes 0.5, rungs in memory order, pending rungs named."""

from __future__ import annotations

from experiments.encoder_study import plan as cp
from experiments.encoder_study import verdict as cv
from experiments.encoder_study.report import cells

EASY, MEDIUM = cp.rung("RepeatPreviousEasy"), cp.rung("RepeatPreviousMedium")


def record(task: str, name: str, variant: str, seed: int, final: float) -> dict:
    return {"task": task, "encoder_name": name, "preset": variant, "seed": seed, "final_return": final}


def test_the_verdict_compares_each_variant_with_gru_of_the_same_variant() -> None:
    found = []
    for s in (0, 1, 2):
        found += [
            record(EASY.name, "gru", cp.UNTUNED, s, -0.4 + 0.1 * s),  # normalized 0.07, 0.13, 0.2
            record(EASY.name, "x", cp.UNTUNED, s, 1.0),  # above every GRU run
            record(EASY.name, "y", cp.UNTUNED, s, -0.4 + 0.1 * s),  # the same runs as GRU
            record(EASY.name, "gru", cp.TUNED, s, 1.0),
            record(EASY.name, "x", cp.TUNED, s, 1.0),  # ties the tuned GRU: not above
        ]
    found.append(record(EASY.name, "z", cp.UNTUNED, 0, -0.9))  # below every GRU run, one seed
    out = cv.comparisons(cells(found), reps=200)["RepeatPrevious"]
    untuned, tuned = out[cp.UNTUNED][EASY.name], out[cp.TUNED][EASY.name]
    assert untuned["x"] == (1.0, 1.0, 1.0, 3) and cv.side(untuned["x"]) == "above"
    assert abs(untuned["y"][0] - 0.5) < 1e-9 and cv.side(untuned["y"]) == ""
    assert untuned["z"][:3] == (0.0, 0.0, 0.0) and untuned["z"][3] == 1 and cv.side(untuned["z"]) == "below"
    assert tuned["x"][:3] == (0.5, 0.5, 0.5) and cv.side(tuned["x"]) == ""
    assert MEDIUM.name not in out[cp.UNTUNED]  # no records there
    text = cv.summary("RepeatPrevious", cp.UNTUNED, out[cp.UNTUNED])
    assert text.startswith(
        "**Untuned**: memory 4 (1 of 3 seeds so far, not final): `x` above GRU, 1 of 3 below"
    )
    assert text.endswith("(memory 32, 64: not run yet).")
    assert "none above GRU" in cv.summary("RepeatPrevious", cp.TUNED, out[cp.TUNED])


def test_the_verdict_table_orders_rungs_by_memory_and_marks_partial_cells() -> None:
    assert [r.memory for r in cv.memory_rungs("T-Maze")] == [10, 30, 100, 400]
    assert cv.ladder_families() == ["RepeatPrevious", "T-Maze"]  # control and noisy have no memory length
    found = [record(MEDIUM.name, "gru", cp.UNTUNED, s, -0.5) for s in (0, 1, 2)]
    found += [record(MEDIUM.name, "x", cp.UNTUNED, s, 0.5) for s in (0, 1)]
    lines = cv.verdict_lines(cells(found), ["gru", "x"], reps=200)
    header = next(line for line in lines if line.startswith("| encoder | variant |"))
    assert header.split("|")[3:6] == [" memory 4 ", " memory 32 ", " memory 64 "]
    row = next(line for line in lines if line.startswith("| `x` | untuned |"))
    assert row.split("|")[3:6] == [" – ", " 1.00 [1.00, 1.00] **above** (2/3) ", " – "]
    assert not any(line.startswith("| `gru` |") for line in lines)  # the reference has no row
    assert (
        "**Untuned**: memory 32 (2 of 3 seeds so far, not final): `x` above GRU, 0 of 1 below (memory 4, 64: not "
        "run yet)." in lines
    )
    # a comparison counts the seeds of the pair: GRU's 2 against x's 3 is a partial cell too
    found = [record(MEDIUM.name, "gru", cp.UNTUNED, s, -0.5) for s in (0, 1)]
    found += [record(MEDIUM.name, "x", cp.UNTUNED, s, 0.5) for s in (0, 1, 2)]
    row = next(
        x for x in cv.verdict_lines(cells(found), ["gru", "x"], reps=50) if x.startswith("| `x` | untuned")
    )
    assert "**above** (2/3)" in row


def test_a_rung_that_did_not_separate_is_marked_and_left_out_of_the_summary() -> None:
    found = [record(EASY.name, "gru", cp.UNTUNED, s, -0.5) for s in (0, 1, 2)]
    found += [record(EASY.name, "x", cp.UNTUNED, s, -0.48) for s in (0, 1, 2)]
    lines = cv.verdict_lines(cells(found), ["gru", "x"], reps=100, unseparated=frozenset({EASY.name}))
    assert "**Untuned**: memory 4: did not separate (memory 32, 64: not run yet)." in lines
    header = next(line for line in lines if line.startswith("| encoder | variant |"))
    assert "memory 4 (did not separate)" in header
