"""experiments/ beside the library: not installed with the package, and every experiment says how to run it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def installed_packages() -> list[str]:
    """The packages ``pip install .`` installs: pyproject's package discovery, run on this checkout."""
    section = (
        (ROOT / "pyproject.toml")
        .read_text()
        .split("[tool.setuptools.packages.find]", 1)[1]
        .split("\n[", 1)[0]
    )
    found = dict(re.findall(r"^(include|exclude)\s*=\s*(\[.*?\])", section, re.MULTILINE | re.DOTALL))
    assert "include" in found, section  # Python 3.10 has no tomllib: the table's lists are Python literals
    return find_packages(str(ROOT), include=ast.literal_eval(found["include"]),
                         exclude=ast.literal_eval(found.get("exclude", "()")))  # fmt: skip


def test_experiments_are_not_installed() -> None:
    packages = installed_packages()
    assert "rl_transformers.study" in packages and "envs" in packages  # the discovery really ran
    assert [p for p in packages if p.split(".")[0] in ("experiments", "tests", "scripts")] == []


def test_the_installed_package_never_imports_experiments() -> None:
    """The library must work installed, where experiments/ does not exist."""
    found = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "rl_transformers").rglob("*.py"))
        if re.search(r"^\s*(from|import)\s+experiments\b", p.read_text(), re.MULTILINE)
    ]
    assert found == []


def test_every_experiment_has_a_readme_naming_its_command() -> None:
    """Each experiments/<name>/ with code runs as ``python -m experiments.<name>.run``, and its README says so in
    a shell block; a records-only folder's README names the command that produced its records."""
    folders = sorted(p for p in EXPERIMENTS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert {"encoder_screening", "encoder_study", "memory_probe", "offline_memory"} <= {
        p.name for p in folders
    }
    for folder in folders:
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder.relative_to(ROOT)} has no README.md"
        blocks = "\n".join(re.findall(r"```(?:bash|sh)\n(.*?)```", readme.read_text(), re.DOTALL))
        if (folder / "run.py").exists():
            assert (folder / "__init__.py").exists(), f"{folder.name} is not a package: -m cannot run it"
            assert f"python -m experiments.{folder.name}.run" in blocks, f"{readme} does not name its command"
        else:
            assert re.search(r"python (scripts/\w+\.py|-m [\w.]+)", blocks), f"{readme} names no command"
    index = (EXPERIMENTS / "README.md").read_text()
    assert [p.name for p in folders if f"]({p.name}/README.md)" not in index] == []
