"""The README's backbone example runs as written, and the README keeps its two commands."""

from __future__ import annotations

import re
from pathlib import Path

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
