"""The study page's numbers are computed from the records it is built from, not typed into the code."""

from __future__ import annotations

from experiments.encoder_screening import notes
from rl_transformers.study import suite


def run(name: str, task: str, seed: int, curve: list, algo: str = "ppo", wall_s: float = 3600.0) -> dict:
    return {"algo": algo, "task": task, "encoder_name": name, "seed": seed, "score": max(v for _, v in curve),
            "final_return": curve[-1][1], "curve": curve, "wall_s": wall_s}  # fmt: skip


def flat(text: str) -> str:
    """The text with its line breaks (wrapping) as spaces."""
    return " ".join(text.split())


def test_notes_follow_the_records() -> None:
    same = [[16384.0, 0.1], [32768.0, 0.5]]
    records = [run("gtrxl", "T", s, same) for s in (0, 1)] + [
        run("early_exit", "T", 0, same),
        run("early_exit", "T", 1, [[16384.0, 0.2], [32768.0, 0.5]]),  # differs at its first evaluation only
        run("routing", "TMaze10", 1, [[10240.0, 0.625]]),
    ]
    text = flat(notes.notes(records, {}, {"preset": "full", "expected": {"ppo": 10}}))
    assert "They differ only at the first evaluation (16k steps) of 1 of its 2 runs" in text
    assert "2 of 2 scores and 2 of 2 final returns are equal" in text
    assert "Cost: 5 of 10 runs took 5.0 core-hours" in text  # 5 runs of one hour each
    assert "seed 1 reaches 0.62 with the fix" in text
    records[3] = run("early_exit", "T", 1, [[16384.0, 0.1], [32768.0, 0.75]])  # now at the last evaluation
    text = flat(notes.notes(records, {}, {"preset": "full", "expected": {"ppo": 5}}))
    assert "They differ at steps 33k of 1 of its 2 runs" in text and "1 of 2 scores" in text
    assert "Cost: all 5 runs took 5.0 core-hours" in text


def test_the_offline_note_names_the_rows_that_coincide_and_their_spread() -> None:
    aggs = {"offline": {"encoders": {"full": {"iqm": 0.25}, "bigbird": {"iqm": 0.5}}}}
    task = suite.OFFLINE[0].name
    records = [run(n, task, s, [[500.0, 10.0 + s + (n == "full")]], algo="dt")
               for n in ("full", "local", "bigbird") for s in (0, 1)]  # fmt: skip
    text = flat(notes.notes(records, aggs, {"preset": "full", "expected": {}}))
    assert "`bigbird` and `local` give identical runs" in text
    assert "`full` 11.5 vs theirs 10.5; offline IQM `full` 0.250 vs theirs 0.500" in text


def test_the_caveat_gives_the_command_of_the_study_protocol_and_the_recorded_scores() -> None:
    records = [run("gtrxl", "RepeatPreviousEasy", s, [[16384.0, -0.5 + 0.01 * s]]) for s in (0, 1, 2)]
    text = flat(notes.caveat(records))
    task = next(t for t in suite.ONLINE if t.name == "RepeatPreviousEasy")
    command = (f"python scripts/train_gtrxl.py --env-id {task.env_id} --total-timesteps {task.budget['full']} "
               f"--eval-every {task.eval_every['full']} --backbone.position rope --seed 0")  # fmt: skip
    assert command in text and "--total-timesteps 196608 --eval-every 16384" in command
    assert "its MMER is -0.50 to -0.48 here" in text and "GRU scores not run here" in text
    assert "one untuned recipe at 197k steps" in text and "the request for a confirmation stage" in text
