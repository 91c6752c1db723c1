"""The README's examples run as written (backbone; load -> predict -> SB3 evaluate_policy; the DT wrapper on
a tiny run made here), and the README keeps its two commands."""

from __future__ import annotations

import re
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
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    return code


def test_readme_ppo_example_runs_on_a_real_run(ppo_run, capsys) -> None:  # noqa: F811
    code = _example("ppo").replace('"runs/ppo/rlt-CartPoleNoVel-v0/<run>"', repr(str(ppo_run.run_dir)))
    assert str(ppo_run.run_dir) in code
    exec(compile(code, "README.md", "exec"), {})
    assert re.search(r"return \d+\.\d ± \d+\.\d", capsys.readouterr().out)


def test_readme_dt_example_runs_on_a_real_run(dt_run, capsys) -> None:  # noqa: F811
    code = _example("dt").replace('"runs/dt/<dataset>/<run>"', repr(str(dt_run.run_dir)))
    assert str(dt_run.run_dir) in code
    exec(compile(code, "README.md", "exec"), {})
    assert re.search(r"return \d+", capsys.readouterr().out)
