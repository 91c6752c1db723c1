"""The README's encoder-study headline is rebuilt from the study's page: its status and its verdict's
summary lines, nothing else; the block between the README's markers is replaced and nothing outside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.encoder_study import headline, report
from experiments.encoder_study import plan as cp
from rl_transformers.study.encoders import Encoder
from rl_transformers.utils.errors import UserError

GRU = Encoder("gru", "policy=gru;hidden_size=8", "baseline")


def record(task: str, name: str, seed: int, final: float) -> dict:
    return {"task": task, "encoder_name": name, "preset": cp.UNTUNED, "seed": seed, "final_return": final,
            "score": final, "curve": [[2048.0, final]], "key": f"{task}-{name}-{seed}"}  # fmt: skip


def page(candidates: tuple[Encoder, ...] = ()) -> str:
    """A page from hand-built records: on TMaze30 "x" turns correctly (1.0) on every seed, GRU never (0.0)."""
    found = [record("TMaze30", n, s, 1.0 if n == "x" else 0.0) for n in ("gru", "x") for s in cp.SEEDS]
    rows = [GRU, Encoder("x", "attention=full", "attention")]
    aggs = report.family_aggregates(found, reps=20)
    return report.markdown(found, rows, {}, "cmd", aggs, candidates=candidates)


def test_the_headline_copies_the_status_and_the_verdict_lines_of_the_page() -> None:
    text = page()
    lines = headline.headline(text)
    assert lines[0] == headline.BEGIN and lines[-1] == headline.END
    runs = report.protocol_runs_per_rung(2, 0) * len(cp.RUNGS)
    assert f"6 of {runs} runs finished" in lines[1] and "PARTIAL" not in lines[1]
    verdict = [line for line in lines if line.startswith("- ")]
    assert [v.split(":")[0] for v in verdict] == [
        "- RepeatPrevious, tuned", "- RepeatPrevious, untuned", "- T-Maze, tuned", "- T-Maze, untuned"
    ]  # fmt: skip
    tmaze = next(v for v in verdict if v.startswith("- T-Maze, untuned"))
    assert "memory 30: `x` above GRU, 0 of 1 below" in tmaze
    assert tmaze.removeprefix("- T-Maze, untuned: ") in text  # copied, not recomputed
    assert not any(
        line.startswith("- Candidate defaults") for line in lines
    )  # no candidates here: no decision
    with_candidates = headline.headline(page(cp.CANDIDATES))
    assert with_candidates[-2] == (
        "- Candidate defaults: pending (9 of 9 rungs still "
        "running: " + ", ".join(r.name for r in cp.RUNGS) + ")."
    )
    complete = text.replace(headline.page_status(text), "Complete")
    assert "encoders.md), complete)" in headline.headline(complete)[1]


def test_a_page_without_status_or_verdict_is_refused() -> None:
    with pytest.raises(ValueError, match="no status line"):
        headline.headline("# a page\n\n## Verdict\n")
    with pytest.raises(ValueError, match="no '## Verdict' section"):
        headline.headline("**Complete.** text\n")


def test_only_the_block_between_the_markers_is_rewritten(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{headline.BEGIN}\nstale\n{headline.END}\nafter\n")
    (tmp_path / "encoders.md").write_text(page())
    assert headline.write_headline(readme, tmp_path / "encoders.md")
    text = readme.read_text()
    assert text.startswith(f"before\n{headline.BEGIN}\n**Encoder study") and text.endswith(
        f"{headline.END}\nafter\n"
    )
    assert "stale" not in text
    assert not headline.write_headline(readme, tmp_path / "encoders.md")  # unchanged: not rewritten
    assert not list(tmp_path.glob("*.tmp*"))


def test_a_readme_without_the_markers_gets_a_clear_error(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{headline.END}\n{headline.BEGIN}\n")  # wrong order
    (tmp_path / "encoders.md").write_text(page())
    with pytest.raises(UserError, match="no encoder-study headline block") as err:
        headline.write_headline(readme, tmp_path / "encoders.md")
    assert str(readme) in str(err.value)
    assert readme.read_text() == f"{headline.END}\n{headline.BEGIN}\n"
    with pytest.raises(UserError, match="cannot read the README"):
        headline.write_headline(tmp_path / "missing.md", tmp_path / "encoders.md")
