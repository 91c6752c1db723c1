"""The encoder study's second edition, confirmation stage (issue 27): its plan, tuned parameters read as data, the
"did not separate" rule, the normalized AUC of its documents, the tuning commands, and a tiny stage run end to
end through the study's worker (real PPO runs on a corridor-2 T-Maze) with resume and restore."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from rl_transformers.algos.ppo_config import PPOConfig
from rl_transformers.study import confirm, confirm_report
from rl_transformers.study import confirm_headline as headline
from rl_transformers.study import confirm_plan as cp
from rl_transformers.study.encoders import Encoder, parse_spec
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

    from rl_transformers.utils.cli import cli_registry

    parsed = []
    for e in (GTRXL, GRU):
        args = confirm.tune_command(e, tmp_path)
        assert args[:2] == ["python", "scripts/tune.py"]
        cfg = tyro.cli(TuneConfig, args=args[2:], registry=cli_registry())
        assert cfg.encoder == e.spec and cfg.name == cp.study_name(e) and cfg.out == tmp_path
        parsed.append(dataclasses.replace(cfg, encoder="", study_name=None))
    s = cp.tuning_settings()
    assert parsed[0] == parsed[1]
    cfg = parsed[0]
    assert (cfg.env_id, cfg.total_timesteps, cfg.n_trials, cfg.objective) == (
        s["env_id"],
        s["budget"],
        cp.TRIALS,
        "mean",
    )
    assert cfg.ppo == PPOConfig(anneal_horizon=cp.ANNEAL_HORIZON) and cp.TRIALS >= 8
    assert cp.study_name(GRU) != cp.study_name(dataclasses.replace(GRU, spec="policy=gru;hidden_size=9"))


def record(task: str, name: str, variant: str, seed: int, final: float, curve: list | None = None) -> dict:
    return {"task": task, "encoder_name": name, "preset": variant, "seed": seed, "final_return": final,
            "curve": curve if curve is not None else [[cp.rung(task).budget, final]]}  # fmt: skip


def test_tasks_where_every_encoder_is_at_random_or_at_the_max_do_not_separate(monkeypatch) -> None:
    monkeypatch.setattr(confirm_report, "REPS", 50)
    found = []
    for seed in (0, 1):
        found += [
            record("PositionOnlyCartPoleEasy", n, cp.UNTUNED, seed, 0.97 + 0.01 * seed) for n in ("a", "b")
        ]
        found += [
            record("RepeatPreviousMedium", n, cp.UNTUNED, seed, -0.48 - 0.02 * seed) for n in ("a", "b")
        ]
        found += [record("RepeatPreviousEasy", "a", cp.UNTUNED, seed, 1.0),
                  record("RepeatPreviousEasy", "b", cp.UNTUNED, seed, -0.5)]  # fmt: skip
    split = confirm_report.separation(found)
    assert "of the maximum 1" in str(split["PositionOnlyCartPoleEasy"])
    assert "of the random score -0.5" in str(split["RepeatPreviousMedium"])
    assert split["RepeatPreviousEasy"] is None and split["TMaze10"] is None  # separates / no record yet
    aggs = confirm_report.family_aggregates(found)
    assert aggs["RepeatPrevious"]["tasks"] == ["RepeatPreviousEasy"] and aggs["control"]["tasks"] == []
    assert aggs["RepeatPrevious"]["final"][f"a ({cp.UNTUNED})"][0] == 1.0
    assert aggs["RepeatPrevious"]["final"][f"b ({cp.UNTUNED})"][0] == 0.0
    # one cell moving away from the maximum makes the control separate
    found.append(record("PositionOnlyCartPoleEasy", "c", cp.UNTUNED, 0, 0.5))
    assert confirm_report.separation(found)["PositionOnlyCartPoleEasy"] is None
    # T-Maze: a memoryless policy scores 0.5 (on schedule, a coin-flip turn); nobody above it remembered nothing
    maze = [record("TMaze100", n, cp.UNTUNED, 0, v) for n, v in (("a", 0.5), ("b", 0.0), ("c", 0.54))]
    assert "best memoryless score 0.5" in str(confirm_report.separation(maze)["TMaze100"])
    maze.append(record("TMaze100", "d", cp.UNTUNED, 0, 0.9))
    assert confirm_report.separation(maze)["TMaze100"] is None
    assert cp.rung("RepeatPreviousHard").memoryless is None  # no better than random without memory


def test_the_documents_auc_is_the_closed_form_on_the_rungs_scale() -> None:
    """The curve starts at the random score at step 0 and holds its last value: RepeatPreviousEasy (random -0.5,
    max 1) at the max from half the budget on gives 0.5 * 1 / 2 + 0.5 * 1 = 0.75; T-Maze 10 halfway between
    random and max from a quarter of the budget on gives 0.25 * 0.5 / 2 + 0.75 * 0.5 = 0.4375."""
    easy = cp.rung("RepeatPreviousEasy")
    assert confirm_report.auc(record(easy.name, "a", cp.UNTUNED, 0, 1.0, [[easy.budget // 2, 1.0]])) == 0.75
    maze = cp.rung("TMaze10")
    half = (maze.low + maze.high) / 2
    got = confirm_report.auc(record(maze.name, "a", cp.UNTUNED, 0, half, [[maze.budget // 4, half]]))
    assert got == pytest.approx(0.4375)


@pytest.mark.parametrize(("env_id", "expected"), [
    ("rlt/popgym-RepeatPreviousEasy-v0", cp.RANDOM_REPEAT),
    ("rlt/popgym-PositionOnlyCartPoleEasy-v0", cp.RANDOM_CARTPOLE),
])  # fmt: skip
def test_the_random_scores_are_what_a_random_policy_gets(env_id: str, expected: float) -> None:
    import gymnasium as gym
    import numpy as np

    import envs  # noqa: F401

    env = gym.make(env_id)
    env.action_space.seed(123)
    returns = []
    for episode in range(150):
        env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    se = float(np.std(returns)) / np.sqrt(len(returns))
    assert abs(float(np.mean(returns)) - expected) < 4 * se + 0.005


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
    monkeypatch.setattr(confirm_report, "REPS", 50)
    return tmp_path


def test_a_tiny_stage_runs_resumes_and_rebuilds_from_its_records(tiny: Path) -> None:
    """Two real runs (GRU untuned and tuned from a hand-made best.json); the MLP has no tuning result and is
    reported "not tuned yet". The tuned run trained with the tuned values; both with the fixed horizon. A dry run
    writes nothing; a second run has nothing left; a fresh checkout (no run directories, no local tuning)
    restores the committed records and rebuilds the same documents byte for byte."""
    docs, out = tiny / "docs", tiny / "runs"
    cfg = confirm.ConfirmConfig(encoders=("gru",), seeds=(0,), out=out, docs=docs)
    write_best(cfg.tune_out, GRU, best(GRU))
    lines: list[str] = []
    dry = confirm.run_confirm(dataclasses.replace(cfg, dry_run=True), lines.append, rows=[GRU, MLP])
    assert dry["todo"] == 2 and not docs.exists()
    assert {p.name for p in out.rglob("*")} == {
        "tune",
        cp.study_name(GRU),
        "best.json",
    }  # only the hand-made one
    assert any("in all" in line and "core-hours" in line for line in lines)
    with pytest.raises(UserError, match=r"seeds \[7\] are not test seeds"):
        confirm.run_confirm(dataclasses.replace(cfg, seeds=(0, 7)), lines.append, rows=[GRU, MLP])
    assert confirm.run_confirm(cfg, lines.append, rows=[GRU, MLP])["records"] == 2
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
    assert confirm.run_confirm(cfg, lines.append, rows=[GRU, MLP])["records"] == 2  # resume: nothing to run
    assert "0 to run" in next(line for line in reversed(lines) if line.startswith("confirmation"))

    shutil.rmtree(out)  # a fresh checkout: the committed documents and tuning file, no runs, no local tuning
    readme = tiny / "README.md"
    readme.write_text(f"# x\n\n{headline.BEGIN}\nold\n{headline.END}\n\nafter\n")
    confirm.run_confirm(
        dataclasses.replace(cfg, report_only=True, readme=readme), lines.append, rows=[GRU, MLP]
    )
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
    with pytest.raises(UserError, match="would lose 1 committed records"):
        confirm.run_confirm(dataclasses.replace(cfg, report_only=True), lines.append, rows=[GRU, MLP])
    assert (docs / "encoders.md").read_text() == markdown  # nothing written


def test_the_tune_stage_runs_the_missing_studies_and_commits_their_results(tiny: Path) -> None:
    """A fake tuner (the command's study writes best.json) stands in for Optuna: only untuned encoders are tuned,
    each with its own exact command, and their results join the committed tuning file."""
    cfg = confirm.ConfirmConfig(stage="tune", out=tiny / "runs", docs=tiny / "docs")
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
    confirm.tune_stage(cfg, [GRU, MLP], tuned, lines.append, runner=fake)
    assert ran == [confirm.tune_command(MLP, cfg.tune_out)]
    saved = json.loads(cfg.tuning_file.read_text())
    assert (
        sorted(saved["encoders"]) == ["gru", "mlp"]
        and saved["encoders"]["mlp"]["params"]["learning_rate"] == 5e-4
    )


def test_changed_tuning_settings_move_committed_results_aside(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result tuned under other settings (here: another pruner warm-up) is never read as this one's: the
    committed file keeps it under 'previous', starts the new settings empty, and the tuner is told the warm-up."""
    cfg = confirm.ConfirmConfig(stage="tune", out=tiny / "runs", docs=tiny / "docs")
    write_best(cfg.tune_out, GRU, best(GRU))
    confirm.collect_tuning(cfg, [GRU])
    old = json.loads(cfg.tuning_file.read_text())
    assert sorted(old["encoders"]) == ["gru"] and "previous" not in old
    args = confirm.tune_command(GRU, cfg.tune_out)
    assert args[args.index("--pruner-warmup-steps") + 1] == str(cp.TUNING_PRUNER_WARMUP)

    monkeypatch.setattr(cp, "TUNING_PRUNER_WARMUP", cp.TUNING_PRUNER_WARMUP // 2)
    assert isinstance(cp.tuning_results([GRU], cfg.tuning_file, cfg.tune_out)["gru"], str)  # other settings
    lines: list[str] = []
    confirm.collect_tuning(cfg, [GRU], lines.append)
    new = json.loads(cfg.tuning_file.read_text())
    assert new["encoders"] == {} and new["settings"]["pruner_warmup_steps"] == cp.TUNING_PRUNER_WARMUP
    assert new["previous"] == [{"settings": old["settings"], "encoders": old["encoders"]}]
    assert any("moved to 'previous'" in line for line in lines)


def test_the_plateau_line_names_gru_and_the_best_tuned_encoder() -> None:
    """Issue 27.3: the last quarter's gain of the mean evaluation, for GRU and the best tuned encoder."""
    r = cp.rung("RepeatPreviousEasy")
    b = r.budget
    found = [
        record(r.name, "gru", cp.UNTUNED, s, 0.52, [[b // 2, 0.0], [3 * b // 4, 0.5], [b, 0.52]])
        for s in (0, 1)
    ]
    found += [record(r.name, "x", cp.TUNED, 0, 0.6, [[3 * b // 4, 0.2], [b - 2048, 0.3], [b, 0.6]]),
              record(r.name, "y", cp.TUNED, 0, 0.1, [[3 * b // 4, 0.0], [b, 0.1]])]  # fmt: skip
    text = confirm_report.plateau_text(r, confirm_report.cells(found))
    assert "`gru` untuned +0.02;" in text and "`x` tuned +0.40 (still rising)" in text and "`y`" not in text
    assert confirm_report.last_quarter_gain(record(r.name, "z", cp.TUNED, 0, 0.1, [[b, 0.1]])) is None


def test_a_tuning_study_whose_best_trial_stayed_at_chance_is_marked_no_signal() -> None:
    """The tuning table flags an encoder whose best trial scored within SEPARATION of the tuning task's random
    score (nothing learned in any trial: its "tuned" parameters are a draw), and only that one."""
    low = cp.rung(cp.tuning_settings()["task"]).low
    tuned = {
        "gru": cp.tuned_config(GRU, {**best(GRU), "value": low + 0.3}, "gru.json"),
        "mlp": cp.tuned_config(
            MLP,
            {
                **best(MLP),
                "params": {"learning_rate": 1e-3, "ent_coef": 0.02, "seq_len": 4},
                "value": low + 0.04,
            },
            "mlp.json",
        ),
    }
    lines = confirm_report.tuning_lines([GRU, MLP], tuned)
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| `")}
    assert "no signal" in rows["`mlp`"] and "no signal" not in rows["`gru`"]
    note = [line for line in lines if line.startswith("**No signal**")]
    assert len(note) == 1 and "`mlp`" in note[0] and "`gru`" not in note[0]
    assert not confirm_report.no_tuning_signal(low + 0.06, low) and confirm_report.no_tuning_signal(
        low - 0.04, low
    )
    assert not confirm_report.no_tuning_signal(None, low)  # no score: nothing to judge
    lines = confirm_report.tuning_lines([GRU], {"gru": tuned["gru"]})
    assert not any(line.startswith("**No signal**") for line in lines)


def test_every_committed_confirmation_record_is_restored_by_the_plan(tmp_path: Path) -> None:
    """The committed docs/results/encoders.json against today's plan (with the committed tuning results): every
    record matches a job, so a fresh checkout resumes from all of them (a plan change that orphans a record
    fails here, not on the next machine)."""
    from rl_transformers.study import files, records

    docs = Path(__file__).resolve().parents[2] / "docs" / "results"
    rows = cp.encoder_rows()
    tuned = cp.tuning_results(rows, docs / files.TUNING, tmp_path / "tune")
    assert all(isinstance(t, cp.Tuned) for t in tuned.values()), tuned
    jobs = cp.plan(cp.RUNGS, [*rows, *cp.CANDIDATES], cp.SEEDS, tuned, tmp_path / "runs")
    restored = records.restore(jobs, docs / files.RECORDS, dry_run=True)
    assert len(restored) == len(json.loads((docs / files.RECORDS).read_text())) > 0
    superseded = json.loads((docs / files.SUPERSEDED).read_text())["records"]
    assert not {r["key"] for r in superseded} & {j.spec["key"] for j in jobs}  # never the plan's


def test_candidate_defaults_run_untuned_only_and_are_reported_as_such(tmp_path: Path) -> None:
    """Issue 27.5: GTrXL with one setting changed (rope; a separate critic) on every rung, untuned only; their
    specs are what train_gtrxl.py would run with that flag."""
    from rl_transformers.study.encoders import policy_config

    names = [e.name for e in cp.CANDIDATES]
    assert names == ["gtrxl_rope", "gtrxl_critic"]
    assert policy_config(cp.CANDIDATES[0].spec).backbone.position == "rope"
    assert policy_config(cp.CANDIDATES[1].spec).critic == "separate"
    tuned = {"gru": cp.tuned_config(GRU, best(GRU), "gru.json")}
    jobs = cp.plan((cp.rung("TMaze10"),), [GRU, *cp.CANDIDATES], (0,), tuned, tmp_path)
    assert sorted((j.spec["encoder_name"], j.spec["preset"]) for j in jobs) == sorted(
        [("gru", cp.UNTUNED), ("gru", cp.TUNED)] + [(n, cp.UNTUNED) for n in names]
    )
    found = [record("TMaze10", n, cp.UNTUNED, 0, 1.0) for n in ("gru", *names)]
    page = confirm_report.markdown(found, [GRU], tuned, "cmd", confirm_report.family_aggregates(found, reps=50),
                                   candidates=cp.CANDIDATES)  # fmt: skip
    row = next(line for line in page.splitlines() if line.startswith("| `gtrxl_rope` | 1.00 (1/3) |"))
    assert row.count("untuned only") == 2  # final and AUC, tuned columns
    assert f"PARTIAL: 3 of {len(cp.RUNGS) * len(cp.SEEDS) * (2 + len(names))} runs" in page
    assert "**Candidate defaults**" in page and "`gtrxl_critic` (`critic=separate`)" in page
    assert "| `gtrxl_rope` | untuned |" in page and "| `gtrxl_rope` | tuned |" not in page  # the verdict


def test_the_ladder_stops_after_a_rung_that_did_not_separate_with_all_its_runs() -> None:
    """The probe's stop rule on the ladder: TMaze400 and RepeatPreviousHard are not run once the rung before
    them finished every planned run without separating; an unfinished rung stops nothing."""
    planned = {r.name: 2 for r in cp.RUNGS}
    walk = [record("TMaze100", n, cp.UNTUNED, 0, 0.0) for n in ("a", "b")]  # on schedule, never turns
    assert confirm_report.stopped_rungs(walk[:1], planned) == {}  # 1 of 2 runs: not yet
    stopped = confirm_report.stopped_rungs(walk, planned)
    assert list(stopped) == ["TMaze400"] and "TMaze100 (memory 100) did not separate" in stopped["TMaze400"]
    chance = [record("RepeatPreviousMedium", n, cp.UNTUNED, 0, -0.5) for n in ("a", "b")]
    assert list(confirm_report.stopped_rungs(chance, planned)) == ["RepeatPreviousHard"]
    learnt = [*walk[:1], record("TMaze100", "b", cp.UNTUNED, 0, 1.0)]
    assert confirm_report.stopped_rungs(learnt, planned) == {}
    walk = [
        record("TMaze100", "gru", v, seed, 0.0) for v in cp.VARIANTS for seed in cp.SEEDS
    ]  # all 6 planned
    page = confirm_report.markdown(walk, [GRU], {}, "cmd", confirm_report.family_aggregates(walk, reps=20))
    assert "### TMaze400 — **stopped** (TMaze100 (memory 100) did not separate with all its runs)" in page
    assert "memory 400: stopped (a shorter memory did not separate)" in page


def test_the_dry_run_says_what_the_stop_rule_would_save(tmp_path: Path) -> None:
    cfg = confirm.ConfirmConfig(out=str(tmp_path / "runs"), docs=str(tmp_path / "docs"), dry_run=True)
    tuned = {"gru": cp.tuned_config(GRU, best(GRU), "gru.json")}
    rungs = (cp.rung("RepeatPreviousMedium"), cp.rung("RepeatPreviousHard"))
    todo = cp.plan(rungs, [GRU], (0,), tuned, tmp_path / "runs")
    hard = [j for j in todo if j.spec["task"] == "RepeatPreviousHard"]
    lines: list[str] = []
    confirm.dry_run_report(cfg, [GRU], tuned, todo, lines.append, frozenset({"RepeatPreviousEasy"}))
    saving = [line for line in lines if "stop rule" in line]
    want = sum(j.spec["budget"] / confirm.ASSUMED_STEPS_PER_S + confirm.START_S for j in hard) / 3600
    assert saving == [f"  (if RepeatPreviousMedium does not separate, the stop rule skips the longer rungs: "
                      f"-{want:.2f} core-hours)"]  # fmt: skip
    lines.clear()
    known = frozenset({"RepeatPreviousEasy", "RepeatPreviousMedium"})
    confirm.dry_run_report(cfg, [GRU], tuned, todo, lines.append, known)
    assert not [line for line in lines if "stop rule" in line]  # it separates already: nothing to skip
