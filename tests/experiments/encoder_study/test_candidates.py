"""The candidate-default decision rule (``experiments.encoder_study.candidates``) on hand-built records: a candidate default replaces
GTrXL's default only when it is nowhere below it and somewhere above it, on the rungs that separated, once every
such rung has all its seeds."""

from __future__ import annotations

from experiments.encoder_study import candidates as cc
from experiments.encoder_study import plan as cp
from experiments.encoder_study.report import cells

ROPE, CRITIC = (e.name for e in cp.CANDIDATES)


def runs(scores: dict[str, dict[str, float]]) -> list[dict]:
    """Every rung x (gtrxl, both candidates) x seed at the rung's maximum (so all tie), except
    ``scores[rung][name]``."""
    out = []
    for r in cp.RUNGS:
        for name in (cc.DEFAULT, ROPE, CRITIC):
            value = scores.get(r.name, {}).get(name, r.high)
            out += [{"task": r.name, "encoder_name": name, "preset": cp.UNTUNED, "seed": s,
                     "final_return": value} for s in cp.SEEDS]  # fmt: skip
    return out


def decide(found: list[dict], unseparated: frozenset[str] = frozenset(), stopped: frozenset[str] = frozenset(),
           complete: bool = True) -> str:  # fmt: skip
    by_cell = cells(found)
    settled = frozenset(r.name for r in cp.RUNGS) if complete else frozenset()
    return cc.decision(cc.candidate_comparisons(by_cell, reps=50), by_cell, unseparated, stopped, settled)


def test_a_candidate_above_on_one_rung_and_tied_elsewhere_qualifies() -> None:
    found = runs({"RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0, CRITIC: -0.5}})
    text = decide(found)
    assert f"`{ROPE}` qualifies (above the default on 1 of {len(cp.RUNGS)} separating rungs" in text
    assert text.endswith(
        "`position=rope` is GTrXL's default." if cc.applied("position=rope") else cc.NOT_APPLIED
    )


def test_the_decision_says_whether_the_library_default_follows_it(monkeypatch) -> None:
    from rl_transformers.policies import gtrxl

    found = runs({"RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0, CRITIC: -0.5}})
    assert not cc.applied("position=rope") and not cc.applied("critic=separate")  # xl_relative, shared
    assert cc.applied("") and decide(found).endswith("`position=rope`, not GTrXL's own default (below it on "
                                                      "CartPoleNoVel at PPO's defaults: encoder_study.md), the "
                                                      "recipes' default (default_recipe.md).")  # fmt: skip
    monkeypatch.setattr(gtrxl.PolicyConfig, "__eq__", lambda a, b: True)  # every config "is" the default
    assert decide(found).endswith("`position=rope` is GTrXL's default.")


def test_below_anywhere_disqualifies_and_then_the_default_stays() -> None:
    found = runs({
        "RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0, CRITIC: 1.0},
        "TMaze30": {ROPE: 0.0},  # rope worse than the default here
        "TMaze10": {CRITIC: 0.4},  # and the critic here
    })  # fmt: skip
    assert "no candidate qualifies" in decide(found) and "default stays" in decide(found)
    # a rung that did not separate is left out: rope's loss on it no longer counts, the critic's still does
    text = decide(found, unseparated=frozenset({"TMaze30"}))
    assert f"`{ROPE}` qualifies" in text and f"of {len(cp.RUNGS) - 1} separating rungs" in text


def test_several_qualify_the_most_rungs_above_wins() -> None:
    found = runs({
        "RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0, CRITIC: 1.0},
        "RepeatPreviousHard": {cc.DEFAULT: -0.5, ROPE: -0.5, CRITIC: 1.0},
    })  # fmt: skip
    assert f"`{CRITIC}` qualifies (above the default on 2 of" in decide(found)


def test_the_decision_waits_for_every_seed_and_for_the_whole_study() -> None:
    found = runs({"RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0}})
    missing = [
        r for r in found if not (r["task"] == "TMaze400" and r["seed"] == 2 and r["encoder_name"] == ROPE)
    ]
    assert decide(missing).startswith("**Decision**: pending (1 of 9 rungs still running: TMaze400)")
    assert f"`{ROPE}` qualifies" in decide(
        missing, stopped=frozenset({"TMaze400"})
    )  # stopped: not waited for
    text = decide(found, complete=False)
    assert (
        text.startswith("**Decision**: pending (the other rows' runs of RepeatPreviousEasy, ")
        and "TMaze400" in text
    )
    by_cell = cells(found)  # one rung left to settle: the decision names it and waits for it only
    comps, rungs = cc.candidate_comparisons(by_cell, reps=50), frozenset(r.name for r in cp.RUNGS)
    left = cc.decision(comps, by_cell, frozenset(), frozenset(), rungs - {"RepeatPreviousHard"})
    assert (
        left
        == "**Decision**: pending (the other rows' runs of RepeatPreviousHard decide whether it separated)."
    )
    assert f"`{ROPE}` qualifies" in cc.decision(comps, by_cell, frozenset(), frozenset(), rungs)


def test_the_section_shows_a_row_per_candidate_and_marks_left_out_rungs() -> None:
    found = runs({"RepeatPreviousMedium": {cc.DEFAULT: -0.5, ROPE: 1.0}})
    everything = frozenset(r.name for r in cp.RUNGS)
    lines = cc.candidate_lines(cells(found), 50, frozenset({"TMaze100"}), frozenset({"TMaze400"}), everything)
    assert lines[0] == "## Candidate defaults against GTrXL's default"
    header = next(line for line in lines if line.startswith("| candidate |"))
    assert "TMaze100 (did not separate)" in header and "TMaze400 (stopped)" in header
    rope = next(line for line in lines if line.startswith(f"| `{ROPE}`"))
    assert "1.00 [1.00, 1.00] **above**" in rope and rope.count("0.50 [0.50, 0.50]") == len(cp.RUNGS) - 1
