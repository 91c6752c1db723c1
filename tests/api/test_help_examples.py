"""Every script's ``--help`` shows its usage examples one per line, as they are written in its docstring.

tyro (like argparse's default formatter) joins the consecutive lines of a paragraph into one, so examples must
be an indented block; a backslash continuation in a non-raw docstring joins two source lines before tyro sees
them. Each example line is read from the script's *source* (the docstring as typed), so both faults show: the
line no longer appears by itself in the help text the user gets.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
COMMAND = re.compile(r"^\s*(python|torchrun)\s")
INVOCATION = re.compile(r"(?<![\"'=])\bpython scripts/")
"""A command that starts a script (one quoted inside another command's argument is not a new example)."""


def documented_in(script: Path) -> Path:
    """Where the script's help text is written: the package module of its ``rlt`` command for a thin wrapper
    (``from M import command``), else the script itself."""
    for node in ast.parse(script.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "command" for a in node.names):
            return ROOT.joinpath(*node.module.split(".")).with_suffix(".py")
    return script


def example_lines(script: Path) -> list[str]:
    """The command lines of the module docstring, as they appear in the source file."""
    source = documented_in(script).read_text(encoding="utf-8")
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant), f"{script.name}: no docstring"
    segment = ast.get_source_segment(source, node) or ""
    lines = [line.strip() for line in segment.splitlines() if COMMAND.match(line.lstrip('r"'))]
    # an escaped backslash (a shell line continuation) shows as one; a lone one at the end of a line of a
    # non-raw docstring joins it with the next line, which the comparison with --help then catches
    return lines if segment.startswith("r") else [line.replace("\\\\", "\\") for line in lines]


def help_text(script: Path) -> str:
    env = dict(os.environ, COLUMNS="250", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_script_is_covered() -> None:
    assert len(SCRIPTS) >= 10 and ROOT / "scripts" / "evaluate.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_help_shows_each_example_on_its_own_line(script: Path) -> None:
    examples = example_lines(script)
    assert examples, f"{script.name}: its docstring shows no example command"
    lines = [line.strip() for line in help_text(script).splitlines()]
    for example in examples:
        assert example in lines, (
            f"{script.name} --help does not show this example on a line of its own:\n{example}"
        )
    for line in lines:
        if INVOCATION.search(line):
            assert COMMAND.match(line), f"{script.name} --help: an example starts mid-line: {line!r}"
            assert len(INVOCATION.findall(line)) == 1, (
                f"{script.name} --help: examples run together: {line!r}"
            )


def test_the_check_bites_on_a_reflowed_docstring(tmp_path: Path) -> None:
    """Unindented examples (the old evaluate.py) are joined by tyro: the test above would fail on them."""
    script = tmp_path / "demo.py"
    script.write_text(
        '"""Demo.\n\npython scripts/demo.py --a 1\npython scripts/demo.py --a 2\n"""\n'
        "from dataclasses import dataclass\n\nimport tyro\n\n\n@dataclass\nclass A:\n    a: int = 0\n\n\n"
        "tyro.cli(A, description=__doc__)\n"
    )
    lines = [line.strip() for line in help_text(script).splitlines()]
    assert example_lines(script) == ["python scripts/demo.py --a 1", "python scripts/demo.py --a 2"]
    assert "python scripts/demo.py --a 1" not in lines
    assert any(len(INVOCATION.findall(line)) == 2 for line in lines)
