"""Pieces of the cleanrl comparison that need no cleanrl: rate parsing, equal parameter counts, params helper."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from torch import nn

from benchmarks.studies.ppo_reference import OUR_MODELS, our_config, steady_rate
from rl_transformers.utils.params import count_parameters, format_parameters

CLEANRL_POM_PARAMETERS = 88_579
"""cleanrl's ProofofMemory Agent, counted by hand: encoder 3*64+64; per layer 3*64*64 (bias-free q, k, v shared
by heads) + 64*64+64 (fc_out) + 3*128 (LayerNorms) + 64*64+64 (FFN) = 20,992, x 4; post-TrXL 64*64+64;
actor 64*2+2; critic 64+1."""


def test_cleanrl_count_by_hand() -> None:
    layer = 3 * 64 * 64 + (64 * 64 + 64) + 3 * 128 + (64 * 64 + 64)
    assert (3 * 64 + 64) + 4 * layer + (64 * 64 + 64) + (64 * 2 + 2) + (64 + 1) == CLEANRL_POM_PARAMETERS


def test_steady_rate_excludes_the_warmup_iterations() -> None:
    # iteration i ends at elapsed time t_i; cleanrl prints int(i * batch / t_i)
    batch, times = 2048, {1: 4.0, 2: 6.0, 3: 8.0, 4: 10.0}
    out = "\n".join(f"{i:9} SPS={int(i * batch / t):4} return=0.1 length=3" for i, t in times.items())
    rate = steady_rate("noise line\n" + out, batch, warmup=1)
    assert rate == pytest.approx(3 * batch / (10.0 - 4.0), rel=2e-3)  # (4 - 1) iterations in 6 s
    assert steady_rate(out, batch, warmup=0) == pytest.approx(4 * batch / 10.0, rel=2e-3)
    with pytest.raises(ValueError, match="SPS"):
        steady_rate("no lines", batch, warmup=1)
    with pytest.raises(ValueError, match="more than 4 iterations"):
        steady_rate(out, batch, warmup=4)


@pytest.mark.parametrize("name", list(OUR_MODELS))
def test_our_models_are_within_two_percent_of_cleanrls_count(name: str) -> None:
    from rl_transformers.policies.gtrxl import make_policy

    cfg = our_config(OUR_MODELS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy = make_policy(cfg.policy, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2))
    n = count_parameters(policy)
    assert abs(n / CLEANRL_POM_PARAMETERS - 1) < 0.02, (name, n)


def test_count_parameters_counts_shared_tensors_once_and_skips_frozen() -> None:
    a = nn.Linear(3, 4)  # 16
    b = nn.Linear(4, 2)  # 10
    model = nn.Sequential(a, b, a)
    assert count_parameters(model) == 26
    b.weight.requires_grad_(False)
    assert count_parameters(model) == 18 and count_parameters(model, trainable_only=False) == 26
    assert (
        format_parameters(88_579) == "88,579 (88.6k)" and format_parameters(2_500_000) == "2,500,000 (2.50M)"
    )


def test_cleanrl_source_names_the_files_and_commit(tmp_path) -> None:
    import hashlib
    import subprocess

    from benchmarks.studies.ppo_reference import cleanrl_source

    for name, text in (("ppo_trxl.py", "print('trxl')\n"), ("pom_env.py", "ENV = 1\n")):
        (tmp_path / name).write_text(text)
    outside = cleanrl_source(tmp_path)
    assert outside["git_commit"] is None
    assert outside["sha256"] == {
        "ppo_trxl.py": hashlib.sha256(b"print('trxl')\n").hexdigest(),
        "pom_env.py": hashlib.sha256(b"ENV = 1\n").hexdigest(),
    }
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "cleanrl"]):
        subprocess.run([*git, *cmd], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert cleanrl_source(tmp_path) == {**outside, "git_commit": head}


def test_results_md_names_the_cleanrl_code_or_says_it_was_not_recorded() -> None:
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_ppo_vs_cleanrl.py"
    spec = importlib.util.spec_from_file_location("bench_ppo_vs_cleanrl", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    machine = {
        "device_name": "cpu",
        "cores": 2,
        "torch_version": "2.13.0",
        "git_sha": "abc",
        "loadavg": [0.5],
    }
    row = {"model": "cleanrl ppo_trxl", "status": "ok", "parameters": 88_579, "steps_per_s": 2000.0,
           "steps_per_s_rounds": [2000.0]}  # fmt: skip
    report = {"command": "python benchmarks/bench_ppo_vs_cleanrl.py", "machine": machine, "warmup": 1, "updates": 4,
              "rounds": 1, "rows": [row], "ppo": {"num_steps": 128, "num_minibatches": 8, "update_epochs": 4}}  # fmt: skip
    assert "- cleanrl: code not recorded" in module.render(report)
    source = {"git_commit": "f" * 40, "sha256": {"ppo_trxl.py": "a" * 64, "pom_env.py": "b" * 64}}
    text = module.render({**report, "cleanrl": source})
    assert (
        f"- cleanrl: commit {'f' * 40}; ppo_trxl.py sha256 {'a' * 12}, pom_env.py sha256 {'b' * 12}" in text
    )


def test_an_interpreter_without_cleanrls_dependencies_is_one_error_line_before_any_timing(tmp_path) -> None:
    """cleanrl's script needs its own dependencies: a missing one stops the comparison at once with an
    ``error:`` line naming the interpreter and the missing module (no traceback, no timing rounds first)."""
    import subprocess
    import sys

    for name in ("ppo_trxl.py", "pom_env.py"):
        (tmp_path / name).write_text("import cleanrl_dependency_that_is_missing\n")
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_ppo_vs_cleanrl.py", "--cleanrl-dir", str(tmp_path), "--rounds", "1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error:") and "Traceback" not in out.stderr
    assert "cleanrl_dependency_that_is_missing" in out.stderr and "--cleanrl-python" in out.stderr
    assert "[round" not in out.stdout and not (tmp_path / "out").exists()


def test_compare_adds_compiled_rows_and_our_phase_rates(tmp_path, monkeypatch) -> None:
    """With ``compile``, each of our models is also measured with ``--compile`` (its config says so); our rows
    carry the median rollout and training rates, cleanrl's row only its one rate; the table shows both."""
    import importlib.util
    import sys
    from pathlib import Path

    from benchmarks.studies import ppo_reference as ref

    for name in ref.CLEANRL_FILES:
        (tmp_path / name).write_text("# stand-in\n")
    seen: list[bool] = []

    def fake_measure(cfg, attention, updates, warmup, timeout_s, env_modules=()):  # type: ignore[no-untyped-def]
        seen.append(cfg.compile)
        fast = 2.0 if cfg.compile else 1.0
        return {"status": "ok", "steps_per_s": 1000.0 * fast, "rollout_steps_per_s": 3000.0 * fast,
                "train_steps_per_s": 1500.0 + len(seen), "parameters": 89_000}  # fmt: skip

    monkeypatch.setattr(ref, "measure_one", fake_measure)
    monkeypatch.setattr(ref, "run_cleanrl", lambda *a, **k: {"status": "ok", "steps_per_s": 500.0})
    monkeypatch.setattr(ref, "cleanrl_parameters", lambda *a: 88_579)
    monkeypatch.setattr(ref, "cleanrl_source", lambda d: {"git_commit": None, "sha256": {}})
    result = ref.compare(tmp_path, "python", updates=1, warmup=1, rounds=3, log=lambda *_: None, compile=True)
    rows = {row["model"]: row for row in result["rows"]}
    assert set(rows) == {"cleanrl ppo_trxl", *OUR_MODELS, *(m + ref.COMPILED for m in OUR_MODELS)}
    assert seen.count(True) == seen.count(False) == 3 * len(OUR_MODELS)
    for name in OUR_MODELS:
        plain, compiled = rows[name], rows[name + ref.COMPILED]
        assert plain["speedup_vs_cleanrl"] == 2.0 and compiled["speedup_vs_cleanrl"] == 4.0
        assert compiled["rollout_steps_per_s"] == 6000.0 and compiled["config"] == OUR_MODELS[name]
        assert plain["train_steps_per_s"] > 1500.0
    assert "rollout_steps_per_s" not in rows["cleanrl ppo_trxl"]
    plain_only = ref.compare(tmp_path, "python", updates=1, warmup=1, rounds=1, log=lambda *_: None)
    assert len(plain_only["rows"]) == 1 + len(OUR_MODELS)

    spec = importlib.util.spec_from_file_location(
        "bench_script", Path(__file__).resolve().parents[3] / "benchmarks" / "bench_ppo_vs_cleanrl.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_script", script)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    machine = {"device_name": "cpu", "cores": 2, "torch_version": "x", "git_sha": "abc"}
    report = {"command": "c", "machine": machine, "updates": 1, "warmup": 1, "rounds": 3, **result}
    text = script.render(report)
    assert "| 6,000 / " in text and "| cleanrl ppo_trxl | 88,579 (1.000) | 500 |" in text
