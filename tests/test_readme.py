"""The README's examples run as written (backbone; load -> predict -> SB3 evaluate_policy; the DT wrapper on
a tiny run made here, copied to where the README's commands put runs, since the examples load the newest run
there), and the README keeps its two commands."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.api.conftest import dt_dataset, dt_run, ppo_run, runs_root  # noqa: F401  (fixtures)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_backbone_example_runs(capsys) -> None:
    text = README.read_text()
    block = re.search(r"<!-- readme-example: start -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README lost its backbone example"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 12
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "full" in printed and "torch.Size([8, 16, 64]) torch.Size([8, 1, 64])" in printed


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make train" in text and "make test" in text and "scripts/train_gtrxl.py" in text
    makefile = (README.parent / "Makefile").read_text()
    assert "scripts/train_gtrxl.py" in makefile and "pytest" in makefile


def _example(name: str) -> str:
    block = re.search(
        rf"<!-- readme-example-{name}: start -->\s*```python\n(.*?)```", README.read_text(), re.S
    )
    assert block, f"README lost its {name} example"
    code = block.group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 11
    assert "<" not in code, "an example with a placeholder does not run as written"
    return code


def _as_readme_run(run_dir: Path, folder: Path) -> Path:
    """A copy of ``run_dir`` in ``folder``, the folder the README's command writes that run to."""
    copy = folder / run_dir.name
    shutil.copytree(run_dir, copy)
    return copy


def test_readme_ppo_example_runs_on_a_real_run(ppo_run, tmp_path, monkeypatch, capsys) -> None:  # noqa: F811
    code = _example("ppo")
    assert "runs/ppo/rlt-CartPoleNoVel-v0/" in code  # the run the README's CartPoleNoVel command makes
    _as_readme_run(ppo_run.run_dir, tmp_path / "runs" / "ppo" / "rlt-CartPoleNoVel-v0")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert re.search(r"return \d+\.\d ± \d+\.\d", capsys.readouterr().out)


def test_readme_dt_example_runs_on_a_real_run(dt_run, tmp_path, monkeypatch, capsys) -> None:  # noqa: F811
    code = _example("dt")
    assert "runs/dt/rlt-cartpole-medium-expert-v0/" in code  # the offline quickstart's run
    _as_readme_run(dt_run.run_dir, tmp_path / "runs" / "dt" / "rlt-cartpole-medium-expert-v0")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert re.search(r"return \d+", capsys.readouterr().out)


def test_readme_examples_load_the_newest_run(ppo_run, tmp_path, monkeypatch) -> None:  # noqa: F811
    """The examples' max(glob(...)) picks the run started last (names are <YYYYmmdd-HHMMSS>-s<seed>)."""
    folder = tmp_path / "runs" / "ppo" / "rlt-CartPoleNoVel-v0"
    newest = _as_readme_run(ppo_run.run_dir, folder)
    for older in ("20000101-000000-s1", "19991231-235959-s9"):
        (folder / older).mkdir()
    code = _example("ppo").split("env = ", 1)[0]  # up to the load
    seen: list[str] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("rl_transformers.load", lambda path, *a, **k: seen.append(str(path)))
    exec(compile(code, "README.md", "exec"), {})
    assert seen == [str(newest.relative_to(tmp_path))]


def test_readme_commands_have_no_bare_run_placeholder() -> None:
    """Quickstart commands run as pasted: a <run> or <dataset> left there is a command that fails."""
    text = README.read_text()
    quick = text.split("## Quickstart: online", 1)[1].split("## The backbone in ten lines", 1)[0]
    blocks = re.findall(r"```(?:bash|python)\n(.*?)```", quick, re.S)
    assert len(blocks) >= 4
    for block in blocks:
        assert "<run>" not in block and "<dataset>" not in block, block
    usage = (README.parent / "docs" / "usage.md").read_text()
    assert (
        "<run>" in usage.split("## Runs, checkpoints", 1)[1].split("##", 1)[0]
    )  # the user guide explains it
