"""Study records are checked against their task before they reach a published page.

Before, ``records.problem`` checked finiteness only: a score of 1e9 on a task whose returns are at most 1, a
curve point of 5, a local uncommitted ``result.json`` that replaced the committed record of its job (one
rebuild moved 13 page lines), and ``<img onerror=...>`` in a record's ``machine`` all went through
``--report-only`` into the page. Now every score, final return and curve point must lie within the task's
possible returns (``envs.registry.return_bounds``: T-Maze ``[-1, 1]`` with the default penalty, POPGym
``[-1, 1]``), a local result that differs from the committed record is an error naming both, and free text is
escaped in Markdown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.registry import return_bounds
from rl_transformers.study import launch, records, report, suite
from rl_transformers.study.ranges import outside
from rl_transformers.utils.errors import UserError
from tests.study.test_records import GRU, TMAZE, finished

POPGYM = suite.tasks("ppo", ("RepeatPreviousEasy",))[0]


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"score": 1e9}, "score 1000000000.0 is outside the task's possible returns [-1.0, 1.0]"),
        ({"score": -1.2}, "score -1.2 is outside"),
        ({"final_return": 3.0}, "final_return 3.0 is outside"),
        ({"curve": [[1.0, 0.5], [2.0, 5.0]]}, "curve point at step 2 5.0 is outside"),
    ],
)
def test_an_impossible_score_is_refused(tmp_path: Path, changes: dict, says: str) -> None:
    job = launch.make_job(TMAZE, GRU, 0, "full", tmp_path / "runs")
    assert records.problem(finished(job, score=1.0, final_return=-1.0), job.spec) is None  # the bounds: fine
    assert records.problem(finished(job, score=1.0000000000000018), job.spec) is None  # float rounding
    why = records.problem(finished(job, **changes), job.spec)
    assert why is not None and why.startswith(says) and "rlt/TMaze-v0" in why
    committed = tmp_path / "encoders.json"
    committed.write_text(json.dumps([finished(job, **changes)]))
    with pytest.raises(UserError, match=r"is refused: .* is outside"):
        records.restore([job], committed)
    assert not (tmp_path / "runs").exists()  # nothing written


def test_the_range_comes_from_the_registry() -> None:
    """Independent values: T-Maze's worst return is L times its penalty, its best the goal reward."""
    assert return_bounds("rlt/TMaze-v0", {"corridor_length": 10}) == (-1.0, 1.0)
    assert return_bounds("rlt/TMaze-v0", {"corridor_length": 4, "penalty": -0.5, "goal_reward": 2.0}) == (
        -2.0,
        2.0,
    )
    assert return_bounds("rlt/popgym-RepeatPreviousEasy-v0") == (-1.0, 1.0)
    assert return_bounds("rlt/CartPoleNoVel-v0") == (0.0, 500.0)
    assert return_bounds("CartPole-v1") is None  # not stated: not checked
    assert outside(1.01, (-1.0, 1.0)) and not outside(1.0 + 1e-12, (-1.0, 1.0))
    job = launch.make_job(POPGYM, GRU, 0, "full", Path("unused"))
    assert records.problem(finished(job, score=0.95), job.spec) is None
    assert "outside" in str(records.problem(finished(job, score=1.5), job.spec))


def test_a_local_result_never_silently_replaces_the_committed_record(tmp_path: Path) -> None:
    job = launch.make_job(TMAZE, GRU, 0, "full", tmp_path / "runs")
    committed = tmp_path / "encoders.json"
    committed.write_text(json.dumps([finished(job, score=0.0)]))
    job.dir.mkdir(parents=True)
    local = job.dir / "result.json"
    local.write_text(json.dumps(finished(job, score=0.95)))  # a plausible fake, never committed
    with pytest.raises(UserError, match="differs from the committed record") as info:
        records.restore([job], committed)
    message = str(info.value)
    assert str(local) in message and str(committed) in message and "0.95 here, 0.0 committed" in message
    local.write_text(json.dumps(finished(job, score=0.0, machine="another")))  # same results: no conflict
    assert records.restore([job], committed) == []
    local.rename(job.dir / "result.stale.json")  # --rerun-encoders moved it aside: the new run supersedes it
    local.write_text(json.dumps(finished(job, score=0.5)))
    assert records.restore([job], committed) == []


def test_free_text_is_escaped_in_the_page(tmp_path: Path) -> None:
    evil = '<img src=x onerror="alert(1)"> *bold* | cell'
    text = report.machines_text([{"machine": evil}])
    listed = text.split("): ", 1)[1]
    assert not re.search(r"(?<!\\)[<>*|]", listed)  # no markup character is left unescaped
    assert "\\<img" in listed and "\\*bold\\*" in listed and "\\| cell" in listed
    real = "Intel(R) Xeon(R) Processor, 2 cores, Python 3.11.7, torch 2.13.0+cpu"
    assert real in report.machines_text([{"machine": real}])  # committed pages rebuild unchanged
    job = launch.make_job(TMAZE, GRU, 0, "full", tmp_path)
    assert "one line" in str(records.problem(finished(job, machine="a\n## Fake heading"), job.spec))
    assert "not a git commit" in str(records.problem(finished(job, git_sha="<script>"), job.spec))
    assert records.problem(finished(job, git_sha="ac03c67-dirty", machine=real), job.spec) is None
