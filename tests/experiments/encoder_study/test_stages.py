"""The encoder study's confirmation stage: its plan, tuned parameters read as data, the
tuning commands, and a tiny stage run end to end through the study's worker (real PPO runs on a corridor-2
T-Maze) with resume, restore and the README headline. Its documents' rules: test_report.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from experiments.encoder_study import headline, report, stages
from experiments.encoder_study import plan as cp
from rl_transformers.algos.ppo_config import PPOConfig
from rl_transformers.study.encoders import Encoder, parse_spec
from rl_transformers.study.flags import changed, configure
from rl_transformers.study.tuning_space import SearchSpace
from rl_transformers.tune.tuner import TuneConfig
from rl_transformers.utils.errors import UserError

GRU = Encoder("gru", "policy=gru;hidden_size=8", "baseline")
MLP = Encoder("mlp", "policy=mlp;hidden_size=8", "baseline")
GTRXL = Encoder("gtrxl", "", "default")


def best(encoder: Encoder, trials: int = cp.TRIALS, **params: object) -> dict:
    chosen = {"learning_rate": 1e-3, "ent_coef": 0.02, "seq_len": 4, "hidden_size": 12, **params}
    return {
        "study": cp.study_name(encoder),
        "params": chosen,
        "finished_trials": trials,
        "value": 0.25,
        "trial": 3,
    }


def write_best(tune_out: Path, encoder: Encoder, entry: dict) -> Path:
    path = tune_out / cp.study_name(encoder) / "best.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry))
    return path


def test_the_plan_crosses_tasks_encoders_variants_and_seeds_with_one_schedule(tmp_path: Path) -> None:
    """Every rung x seed x encoder has an untuned job, and a tuned one only for tuned encoders; every job anneals
    over the same horizon, so two budgets give the same learning rate at every step (unlike annealing over the
    budget, which the trainer does without the horizon)."""
    tuned = {"gru": cp.tuned_config(GRU, best(GRU), "hand"), "mlp": "not tuned yet"}
    jobs = cp.plan(cp.RUNGS, [GRU, MLP], cp.SEEDS, tuned, tmp_path)
    assert len(jobs) == len(cp.RUNGS) * len(cp.SEEDS) * 3 == 9 * 3 * 3
    assert len({j.dir for j in jobs}) == len({j.spec["key"] for j in jobs}) == len(jobs)
    assert {(j.spec["encoder_name"], j.spec["preset"]) for j in jobs} == {
        ("gru", cp.UNTUNED),
        ("gru", cp.TUNED),
        ("mlp", cp.UNTUNED),
    }
    assert all(j.spec["ppo"]["anneal_horizon"] == cp.ANNEAL_HORIZON for j in jobs)
    short = next(j for j in jobs if j.spec["task"] == "TMaze10")
    long = next(j for j in jobs if j.spec["task"] == "RepeatPreviousHard")
    assert short.spec["budget"] < long.spec["budget"] <= cp.ANNEAL_HORIZON
    a, b = PPOConfig(**short.spec["ppo"]), PPOConfig(**long.spec["ppo"])
    for step in (0, 2048, short.spec["budget"] - 2048, short.spec["budget"]):
        assert (
            a.horizon_rate(step)
            == b.horizon_rate(step)
            == pytest.approx(3e-4 * (1 - step / cp.ANNEAL_HORIZON))
        )
    assert a.horizon_rate(short.spec["budget"]) > 0  # not annealed to 0 at the short budget's end
    with pytest.raises(UserError, match="unknown task 'TMaze40'"):
        cp.rungs(("TMaze40",))


def test_tuned_parameters_reach_the_job_and_a_missing_result_is_not_defaulted(tmp_path: Path) -> None:
    tune_out = tmp_path / "tune"
    committed = tmp_path / "encoders_tuning.json"
    found = cp.tuning_results([GRU, MLP], committed, tune_out)
    assert found == {"gru": "not tuned yet", "mlp": "not tuned yet"}
    write_best(tune_out, GRU, best(GRU, trials=3))
    assert (
        cp.tuning_results([GRU], committed, tune_out)["gru"] == f"tuning incomplete (3 of {cp.TRIALS} trials)"
    )
    write_best(tune_out, GRU, {**best(GRU), "study": "v2-gru-00000000"})
    assert "other settings" in str(cp.tuning_results([GRU], committed, tune_out)["gru"])
    write_best(tune_out, GRU, best(GRU))
    tuned = cp.tuning_results([GRU, MLP], committed, tune_out)
    assert tuned["mlp"] == "not tuned yet" and isinstance(tuned["gru"], cp.Tuned)
    job = cp.make_job(cp.rung("TMaze10"), GRU, cp.TUNED, 0, tmp_path, tuned["gru"])  # type: ignore[arg-type]
    assert job.spec["ppo"] == {"anneal_horizon": cp.ANNEAL_HORIZON, "learning_rate": 1e-3, "ent_coef": 0.02,
                               "seq_len": 4}  # fmt: skip
    assert parse_spec(job.spec["encoder"]) == {"policy": "gru", "hidden_size": 12}  # the knob, applied
    with pytest.raises(ValueError, match="needs its tuning result"):
        cp.make_job(cp.rung("TMaze10"), MLP, cp.TUNED, 0, tmp_path)
    with pytest.raises(UserError, match="unknown parameters \\['mem_len'\\]"):
        cp.tuned_config(GRU, best(GRU, mem_len=8), "hand.json")
    with pytest.raises(UserError, match=r"seq_len = 2\.5"):
        cp.tuned_config(GRU, best(GRU, seq_len=2.5), "hand.json")
    committed.write_text("[1, 2]")
    with pytest.raises(UserError, match="'encoders' object"):
        cp.tuning_results([GRU], committed, tune_out)


def test_a_tuned_reach_below_a_rungs_memory_is_raised_to_cover_it(tmp_path: Path) -> None:
    """The tuned variant's covering rule: a reach knob (mem_len, max_cache, store_size) below the rung's memory
    becomes memory + 1; a reach that covers it, a capacity knob and the untuned variant are left alone."""
    tuned = cp.tuned_config(GTRXL, best(GTRXL, hidden_size=None, mem_len=20) | {"params": {
        "learning_rate": 1e-3, "ent_coef": 0.02, "seq_len": 4, "mem_len": 20}}, "hand.json")  # fmt: skip
    short, long = cp.rung("TMaze10"), cp.rung("TMaze100")
    assert parse_spec(cp.make_job(short, GTRXL, cp.TUNED, 0, tmp_path, tuned).spec["encoder"]) == {
        "memory_options": {"mem_len": 20}
    }
    assert parse_spec(cp.make_job(long, GTRXL, cp.TUNED, 0, tmp_path, tuned).spec["encoder"]) == {
        "memory_options": {"mem_len": 101}
    }
    assert cp.make_job(long, GTRXL, cp.UNTUNED, 0, tmp_path).spec["encoder"] == ""  # the defaults stay
    cache = 'attention=gaussian_prior;position=xl_relative;memory=None;attention_options={"max_cache": 4}'
    assert parse_spec(cp.covering_spec(cache, 10))["attention_options"] == {"max_cache": 11}
    assert cp.covering_spec(cache, 4) == cache  # covers k = 4 already (distance 3 from the current step)
    assert cp.covering_spec(GRU.spec, 400) == GRU.spec  # hidden_size: a capacity, not a reach
    kernel = "attention=performer;position=rope;memory=None"  # n_features: a capacity
    assert cp.covering_spec(kernel, 400) == kernel
    assert cp.covering_spec(MLP.spec, 400) == MLP.spec  # no knob


def test_the_tuning_commands_are_the_tuners_with_the_same_settings_for_every_encoder(tmp_path: Path) -> None:
    """Each command parses (scripts/tune.py's own CLI) into the study settings: same task, budget, trials,
    objective and schedule for every encoder; the encoder and the study name are its own."""
    import tyro

    from rl_transformers.backbone.cli import cli_registry

    parsed = []
    for e in (GTRXL, GRU):
        args = stages.tune_command(e, tmp_path)
        assert args[:2] == ["python", "scripts/tune.py"]
        cfg = tyro.cli(TuneConfig, args=args[2:], registry=cli_registry())
        assert cfg.encoder == e.spec and cfg.name == cp.study_name(e) and cfg.out == tmp_path
        parsed.append(dataclasses.replace(cfg, encoder="", study_name=None))
    s = cp.tuning_settings()
    assert parsed[0] == parsed[1]
    cfg = parsed[0]
    assert (
        cfg.space.param_tolerance == cp.TUNING_SPACE.param_tolerance
    )  # the study's capacity range, not the default
    assert (cfg.env_id, cfg.total_timesteps, cfg.n_trials, cfg.objective) == (
        s["env_id"],
        s["budget"],
        cp.TRIALS,
        "mean",
    )
    assert cfg.ppo == PPOConfig(anneal_horizon=cp.ANNEAL_HORIZON) and cp.TRIALS >= 8
    assert cp.study_name(GRU) != cp.study_name(dataclasses.replace(GRU, spec="policy=gru;hidden_size=9"))


@pytest.fixture(autouse=True)
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning space of these tests: windows 4 and 8 (of the tiny runs' 8-step updates)."""
    monkeypatch.setattr(cp, "TUNING_SPACE", SearchSpace(seq_len=(4, 8)))


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One corridor-2 T-Maze rung of 2 updates of 2 envs x 8 steps, one seed, an evaluation after each update."""
    rung = cp.Rung("TMaze2", "rlt/TMaze-v0", "T-Maze", 2, -0.9, memory=2, env_kwargs={"corridor_length": 2})
    monkeypatch.setattr(cp, "RUNGS", (rung,))
    monkeypatch.setattr(cp, "TUNING_TASK", "TMaze2")
    monkeypatch.setattr(cp, "BATCH", 16)
    monkeypatch.setattr(cp, "EVALUATIONS", 2)
    monkeypatch.setattr(cp, "SEEDS", (0,))
    monkeypatch.setattr(cp, "JOB_EXTRAS", {"num_envs": 2, "eval_episodes": 2})
    monkeypatch.setattr(cp, "PPO_RECIPE", {**cp.PPO_RECIPE, "num_steps": 8, "seq_len": 8, "num_minibatches": 1,
                                           "update_epochs": 1})  # fmt: skip
    monkeypatch.setattr(report, "REPS", 50)
    return tmp_path


def test_a_tiny_stage_runs_resumes_and_rebuilds_from_its_records(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real runs (GRU untuned and tuned from a hand-made best.json); the MLP has no tuning result and is
    reported "not tuned yet". The tuned run trained with the tuned values; both with the fixed horizon. A dry run
    writes nothing; a second run has nothing left; a fresh checkout (no run directories, no local tuning)
    restores the committed records and rebuilds the same documents byte for byte."""
    docs, out = tiny / "docs", tiny / "runs"
    cfg = configure(stages.ConfirmConfig, encoders=("gru",), seeds=(0,), out=out, docs=docs)
    write_best(cfg.tune_out, GRU, best(GRU))
    lines: list[str] = []
    dry = stages.run_confirm(changed(cfg, dry_run=True), lines.append, rows=[GRU, MLP])
    assert dry["todo"] == 2 and not docs.exists()
    assert {p.name for p in out.rglob("*")} == {
        "tune",
        cp.study_name(GRU),
        "best.json",
    }  # only the hand-made one
    assert any("in all" in line and "core-hours" in line for line in lines)
    with pytest.raises(UserError, match=r"seeds \[7\] are not test seeds"):
        stages.run_confirm(changed(cfg, seeds=(0, 7)), lines.append, rows=[GRU, MLP])
    with pytest.raises(UserError, match=r"limits the run stage only") as err:
        stages.run_confirm(changed(cfg, stage="tune", stop_starting_after_h=1.0), lines.append)
    assert err.value.source == "--stop-starting-after-h"
    with pytest.raises(UserError, match=r"positive number of hours, got 0"):
        stages.run_confirm(changed(cfg, stop_starting_after_h=0.0), lines.append, rows=[GRU, MLP])
    assert stages.run_confirm(cfg, lines.append, rows=[GRU, MLP])["records"] == 2
    published = json.loads((docs / "encoders.json").read_text())
    assert sorted(r["preset"] for r in published) == [cp.TUNED, cp.UNTUNED]
    for r in published:
        run = json.loads(
            (out / r["preset"] / "ppo" / "TMaze2" / "gru" / "s0" / "run" / "config.json").read_text()
        )
        assert run["ppo"]["anneal_horizon"] == cp.ANNEAL_HORIZON and r["env_steps"] == 32
        tuned = r["preset"] == cp.TUNED
        assert run["ppo"]["learning_rate"] == (1e-3 if tuned else 3e-4)
        assert run["ppo"]["seq_len"] == (4 if tuned else 8) and run["policy"]["hidden_size"] == (
            12 if tuned else 8
        )
    markdown = (docs / "encoders.md").read_text()
    assert "PARTIAL: 2 of 4 runs finished; 1 of 2 encoders tuned" in markdown
    assert (
        "| `mlp` | not tuned yet |" in markdown
        and "| `mlp` | – | not tuned yet | – | not tuned yet |" in markdown
    )
    saved = json.loads(cfg.tuning_file.read_text())
    assert saved["encoders"]["gru"]["params"]["hidden_size"] == 12 and "mlp" not in saved["encoders"]
    assert stages.run_confirm(cfg, lines.append, rows=[GRU, MLP])["records"] == 2  # resume: nothing to run
    assert "0 to run" in next(line for line in reversed(lines) if line.startswith("confirmation"))

    shutil.rmtree(out)  # a fresh checkout: the committed documents and tuning file, no runs, no local tuning
    readme = tiny / "README.md"
    readme.write_text(f"# x\n\n{headline.BEGIN}\nold\n{headline.END}\n\nafter\n")
    stages.run_confirm(changed(cfg, report_only=True, readme=readme), lines.append, rows=[GRU, MLP])
    assert "\nold\n" in readme.read_text() and "left alone: its headline follows" in lines[-1]  # other docs
    monkeypatch.setattr(stages, "REPO_DOCS", docs)
    stages.run_confirm(changed(cfg, report_only=True, readme=readme), lines.append, rows=[GRU, MLP])
    assert any("restored 2 finished runs" in line for line in lines)
    assert (docs / "encoders.md").read_text() == markdown
    block = readme.read_text()  # the README's headline follows the rebuilt page
    assert "2 of 4 runs finished" in block and "\n- T-Maze, tuned: " in block and "old" not in block
    assert block.endswith(f"{headline.END}\n\nafter\n") and any(
        "rewrote the encoder-study" in x for x in lines
    )
    assert json.loads((docs / "encoders.json").read_text()) == published
    assert not list(out.rglob("stdout.log"))  # restored, not run
    stale = out / cp.UNTUNED / "ppo" / "TMaze2" / "gru" / "s0"
    (stale / "result.json").rename(stale / "result.stale.json")  # moved aside: no longer a finished run
    with pytest.raises(UserError, match="1 of the 2 committed ones would be lost"):
        stages.run_confirm(changed(cfg, report_only=True), lines.append, rows=[GRU, MLP])
    assert (docs / "encoders.md").read_text() == markdown  # nothing written


def test_the_tune_stage_runs_the_missing_studies_and_commits_their_results(tiny: Path) -> None:
    """A fake tuner (the command's study writes best.json) stands in for Optuna: only untuned encoders are tuned,
    each with its own exact command, and their results join the committed tuning file."""
    cfg = configure(stages.ConfirmConfig, stage="tune", out=tiny / "runs", docs=tiny / "docs")
    write_best(cfg.tune_out, GRU, best(GRU))
    ran: list[list[str]] = []

    def fake(args: list[str], log_path: Path) -> int:
        ran.append(args)
        name = args[args.index("--study-name") + 1]
        assert name == cp.study_name(MLP) and log_path.name == f"{name}.log"
        entry = best(MLP, learning_rate=5e-4)
        del entry["params"]["hidden_size"]  # the MLP has no context knob
        write_best(cfg.tune_out, MLP, entry)
        return 0

    tuned = cp.tuning_results([GRU, MLP], cfg.tuning_file, cfg.tune_out)
    lines: list[str] = []
    stages.tune_stage(cfg, [GRU, MLP], tuned, lines.append, runner=fake)
    assert ran == [stages.tune_command(MLP, cfg.tune_out)]
    saved = json.loads(cfg.tuning_file.read_text())
    assert (
        sorted(saved["encoders"]) == ["gru", "mlp"]
        and saved["encoders"]["mlp"]["params"]["learning_rate"] == 5e-4
    )


def test_an_interrupted_tuning_study_is_reported_as_resumable_not_failed() -> None:
    import signal

    assert stages.tune_outcome(0) == "tuned"
    for code in (130, -signal.SIGINT, -signal.SIGTERM):  # tune.py's Ctrl-C exit; killed by a signal
        assert stages.tune_outcome(code).startswith("interrupted") and "resume" in stages.tune_outcome(code)
    assert stages.tune_outcome(1) == "FAILED (1)" and stages.tune_outcome(2) == "FAILED (2)"


def test_changed_tuning_settings_move_committed_results_aside(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result tuned under other settings (here: another pruner warm-up) is never read as this one's: the
    committed file keeps it under 'previous', starts the new settings empty, and the tuner is told the warm-up."""
    cfg = configure(stages.ConfirmConfig, stage="tune", out=tiny / "runs", docs=tiny / "docs")
    write_best(cfg.tune_out, GRU, best(GRU))
    stages.collect_tuning(cfg, [GRU])
    old = json.loads(cfg.tuning_file.read_text())
    assert sorted(old["encoders"]) == ["gru"] and "previous" not in old
    args = stages.tune_command(GRU, cfg.tune_out)
    assert args[args.index("--pruner-warmup-steps") + 1] == str(cp.TUNING_PRUNER_WARMUP)

    monkeypatch.setattr(cp, "TUNING_PRUNER_WARMUP", cp.TUNING_PRUNER_WARMUP // 2)
    assert isinstance(cp.tuning_results([GRU], cfg.tuning_file, cfg.tune_out)["gru"], str)  # other settings
    lines: list[str] = []
    stages.collect_tuning(cfg, [GRU], lines.append)
    new = json.loads(cfg.tuning_file.read_text())
    assert new["encoders"] == {} and new["settings"]["pruner_warmup_steps"] == cp.TUNING_PRUNER_WARMUP
    assert new["previous"] == [{"settings": old["settings"], "encoders": old["encoders"]}]
    assert any("moved to 'previous'" in line for line in lines)
