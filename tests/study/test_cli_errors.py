"""Unknown names on the study's command line are user errors: `run_cli` prints them without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_transformers.backbone import available
from rl_transformers.study import encoders as enc
from rl_transformers.study import run, suite
from rl_transformers.study.flags import configure
from rl_transformers.utils.errors import UserError, run_cli

# the study's row names without the (slow) parameter matching: every attention plus the baselines
ROWS = [enc.Encoder(name, f"attention={name}", "attention") for name in available()["attention"]]
ROWS += [enc.Encoder(name, f"policy={name}", "baseline") for name in enc.BASELINES]


def test_select_names_the_closest_encoder() -> None:
    assert "linear" in [e.name for e in ROWS]
    with pytest.raises(
        UserError, match=r"^--encoders: unknown encoder 'lnear'; valid: .*did you mean 'linear'"
    ) as err:
        enc.select(ROWS, ("gru", "lnear"))
    assert err.value.source == "--encoders"
    with pytest.raises(UserError, match=r"^--rerun-encoders: unknown encoder 'lstn'.*did you mean 'lstm'"):
        enc.select(ROWS, ("lstn",), "--rerun-encoders")
    assert [e.name for e in enc.select(ROWS, ("lstm", "gru"))] == ["gru", "lstm"]  # known names still select


def test_unknown_task_and_preset_are_user_errors() -> None:
    with pytest.raises(UserError, match=r"^--tasks: unknown task 'TMaze1'.*did you mean 'TMaze10'"):
        suite.tasks("ppo", ("TMaze1",))
    with pytest.raises(
        UserError, match=r"^--preset: unknown preset 'ful'; valid: quick, full \(did you mean 'full'\?\)"
    ):
        suite.check_preset("ful")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"encoders": ("lnear",)}, "error: --encoders: unknown encoder 'lnear'"),
        ({"rerun_encoders": ("gr",)}, "error: --rerun-encoders: unknown encoder 'gr'"),
        ({"tasks": ("TMaze1",)}, "error: --tasks: unknown task 'TMaze1'"),
    ],
    ids=["encoders", "rerun-encoders", "tasks"],
)
def test_run_cli_prints_the_error_without_a_traceback(
    overrides: dict,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    monkeypatch.setattr(enc, "ppo_encoders", lambda match=True: (list(ROWS), []))
    cfg = configure(run.StudyConfig, parts=("online",), out=tmp_path / "runs", dry_run=True, **overrides)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: run.run_study(cfg, log=lambda _msg: None), argv=["encoder_study.py"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(expected) and "did you mean" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "runs").exists()  # refused before any run directory is made


def test_a_bad_start_limit_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    monkeypatch.setattr(enc, "ppo_encoders", lambda match=True: (list(ROWS), []))
    cfg = configure(run.StudyConfig, parts=("online",), out=tmp_path / "runs", stop_starting_after_h=-2.0)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: run.run_study(cfg, log=lambda _msg: None), argv=["encoder_study.py"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --stop-starting-after-h: must be a positive number of hours, got -2.0")
    assert "Traceback" not in err and not (tmp_path / "runs").exists()
