"""``agents.offline_runs``: which run directories make a table, and clear errors for the ones that cannot."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from rl_transformers.agents.offline_runs import collect_runs, read_run
from rl_transformers.runs.provenance import SYSTEM_INFO_FILE
from rl_transformers.utils.errors import UserError
from tests.api.conftest import make_offline_run


def test_run_directories_are_found_below_symlinks_and_counted_once(tmp_path: Path) -> None:
    real = tmp_path / "real"
    make_offline_run(real, "dt", 0, {1.0: [1.0]})
    make_offline_run(real, "dt", 1, {1.0: [2.0]})
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert [r.seed for r in collect_runs([tmp_path / "link"])] == [0, 1]
    assert len(collect_runs([real, tmp_path / "link", real / "dt" / "ds" / "r-s0"])) == 2


def test_a_run_named_directly_must_be_usable(tmp_path: Path) -> None:
    run = make_offline_run(tmp_path, "dt", 0, {1.0: [1.0]})
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "seed": 0}))
    with pytest.raises(UserError, match="is not a DT / BC run"):
        collect_runs([run])
    with pytest.raises(UserError, match="no DT / BC run"):
        collect_runs([tmp_path])  # searched: a PPO run is skipped, and nothing is left
    other = make_offline_run(tmp_path / "b", "dt", 0, {1.0: [1.0]})
    for f in (other / "eval").iterdir():
        f.unlink()
    (other / "eval").rmdir()
    with pytest.raises(UserError, match="has no eval/ directory"):
        collect_runs([other])


def test_seeds_evaluated_at_different_steps_are_refused_unless_a_step_is_chosen(tmp_path: Path) -> None:
    make_offline_run(tmp_path, "dt", 0, {1.0: [1.0]}, step=100)
    short = make_offline_run(tmp_path, "dt", 1, {1.0: [2.0]}, step=50)
    with pytest.raises(UserError, match=r"different steps: 50 .*, 100 .*--step N") as err:
        collect_runs([tmp_path])
    assert str(short) in str(err.value)
    make_offline_run(tmp_path, "dt", 1, {1.0: [3.0]}, step=100, name="r-s1")  # now also evaluated at 100
    assert [r.step for r in collect_runs([tmp_path], step=100)] == [100, 100]
    with pytest.raises(UserError, match=r"no evaluation at step 7; it has steps \[100\]"):
        collect_runs([tmp_path], step=7)


def test_two_runs_of_one_experiment_and_seed_are_named(tmp_path: Path) -> None:
    first = make_offline_run(tmp_path, "bc", 1, {None: [1.0]})
    twin = make_offline_run(tmp_path, "bc", 1, {None: [2.0]}, name="again")
    with pytest.raises(UserError, match="two bc rlt/toy/medium-v0 runs with seed 1") as err:
        collect_runs([tmp_path])
    assert str(first) in str(err.value) and str(twin) in str(err.value)


def test_different_references_for_one_dataset_are_refused(tmp_path: Path) -> None:
    make_offline_run(tmp_path, "bc", 0, {None: [1.0]}, refs=(0.0, 100.0))
    make_offline_run(tmp_path, "bc", 1, {None: [1.0]}, refs=(0.0, 200.0))
    with pytest.raises(UserError, match="different reference scores"):
        collect_runs([tmp_path])


@pytest.mark.parametrize(
    ("config", "message"),
    [("[1, 2]", "expected a JSON object"), ('{"algo": "dt"}', "no integer 'seed'"), ("{", "cannot read it")],
)
def test_malformed_configs_are_named(tmp_path: Path, config: str, message: str) -> None:
    run = make_offline_run(tmp_path, "dt", 0, {1.0: [1.0]})
    (run / "config.json").write_text(config)
    with pytest.raises(UserError, match=message):
        read_run(run)


@pytest.mark.parametrize(
    ("episodes", "message"),
    [
        ([{"target": 1.0}], "KeyError"),
        ([{"target": 1.0, "returns": []}], "non-empty"),
        ([], ""),
    ],
)
def test_malformed_evaluations_are_named(tmp_path: Path, episodes: list, message: str) -> None:
    run = make_offline_run(tmp_path, "dt", 0, {1.0: [1.0]})
    (run / "eval" / "step_100.json").write_text(json.dumps({"step": 100, "episodes": episodes}))
    with pytest.raises(UserError, match=f"step_100.json: not an evaluation file.*{message}"):
        read_run(run)


def test_bad_references_and_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="ref_min < ref_max"):
        read_run(make_offline_run(tmp_path / "a", "bc", 0, {None: [1.0]}, refs=(5.0, 5.0)))
    run = make_offline_run(tmp_path / "b", "bc", 0, {None: [1.0]})
    (run / "checkpoints" / "last.pt").write_bytes(b"PK\x03\x04 not a torch archive")
    with pytest.warns(UserWarning, match="last.pt"):
        assert read_run(run).refs is None  # skipped with a warning, the table goes on


def test_unreadable_provenance_is_reported_not_fatal(tmp_path: Path) -> None:
    run = make_offline_run(tmp_path, "bc", 0, {None: [1.0]})
    (run / SYSTEM_INFO_FILE).write_text("{broken")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_run(run).invocations == []
    assert any(SYSTEM_INFO_FILE in str(w.message) for w in caught)


def test_a_run_in_progress_is_left_out_with_a_warning(tmp_path: Path) -> None:
    make_offline_run(tmp_path, "dt", 0, {1.0: [1.0]})
    busy = make_offline_run(tmp_path, "dt", 1, {1.0: [1.0]})
    (busy / "eval" / "step_100.json").unlink()  # the trainer made eval/ but has not evaluated yet
    with pytest.warns(UserWarning, match="no evaluation yet"):
        assert [r.seed for r in collect_runs([tmp_path])] == [0]
    with pytest.raises(UserError, match=r"no eval/step_<n>\.json"):
        collect_runs([busy])  # named directly: an error
