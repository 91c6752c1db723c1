"""Optional packages (rl_transformers/utils/extras.py): each is declared in the extra the table names and not in
the core; a missing one is one UserError naming it and its pip line; no library module imports one at import
time, and every function that imports one asks :func:`need` first."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

from rl_transformers.utils import extras
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.extras import OPTIONAL, install_hint, need

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_each_optional_package_is_in_its_extra_and_not_in_the_core() -> None:
    core = names(PROJECT["dependencies"])
    for module, entry in OPTIONAL.items():
        assert entry.package in names(EXTRAS[entry.extra]), (module, entry)
        assert entry.package not in core, f"{entry.package} is optional but still a core dependency"


def test_the_all_extra_and_the_set_up_install_every_user_extra() -> None:
    (everything,) = EXTRAS["all"]
    listed = set(everything.split("[", 1)[1].rstrip("]").split(","))
    assert {"offline", "plots", "study", "video"} <= listed and listed <= set(EXTRAS)
    assert everything.startswith(PROJECT["name"] + "[")
    makefile = (ROOT / "Makefile").read_text()
    (installed,) = re.findall(r'pip install -q -e "\.\[([\w,-]+)\]"', makefile)
    assert {"offline", "plots", "study"} <= set(installed.split(","))


def test_a_missing_package_is_one_line_with_its_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError) as info:
        need("h5py", "reading a D4RL .hdf5 file")
    assert str(info.value) == (
        "reading a D4RL .hdf5 file needs h5py, which is not installed: pip install 'rl-transformers[offline]' "
        "(in a checkout: pip install -e '.[offline]')"
    )
    with pytest.raises(UserError, match=r"matplotlib.*\[plots\].*, or --no-plots$"):
        need("matplotlib", "--plots", alternative="or --no-plots")


def test_an_installed_package_passes() -> None:
    need("h5py", "reading")  # the test environment installs every extra
    assert install_hint("study").startswith("pip install 'rl-transformers[study]'")


def test_a_library_function_refuses_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real caller: a Minari dataset id without minari."""
    from offline_data import minari_io

    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda n: None if n == "minari" else real(n))
    with pytest.raises(UserError, match=r"a Minari dataset id needs minari.*\[offline\]"):
        minari_io.validate_dataset_id("rlt/cartpole/medium-v0")


# -- the imports themselves ----------------------------------------------------------------------------------
LIBRARY = sorted(p for pkg in ("rl_transformers", "envs", "offline_data") for p in (ROOT / pkg).rglob("*.py"))
UNGUARDED = ("rl_transformers/study/", "rl_transformers/tune/")
"""Parts left to their command's up-front check: the study's reports (``rlt study`` checks rliable and
matplotlib before it runs anything: rl_transformers/cli/study.py) and the tuner (Optuna throughout: ``rlt tune``
checks it first, rl_transformers/tune/command.py)."""


def optional_imports(node: ast.AST) -> list[tuple[str, int]]:
    """(top-level optional package, line) of the imports directly in ``node``'s body (not nested functions)."""
    found = []
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            found += [(a.name.split(".")[0], child.lineno) for a in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
            found.append((child.module.split(".")[0], child.lineno))
    return [(m, line) for m, line in found if m in OPTIONAL]


def needs_before(function: ast.AST, module: str, line: int) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "need"
        and isinstance(n.args[0], ast.Constant)
        and n.args[0].value == module
        and n.lineno < line
        for n in ast.walk(function)
    )


def test_no_module_imports_an_optional_package_at_import_time() -> None:
    bad = []
    for path in LIBRARY:
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.If, ast.Try))]
        bad += [f"{path.relative_to(ROOT)}:{line} {m}" for n in top for m, line in optional_imports(n)]
    assert bad == []


def test_every_function_importing_an_optional_package_asks_need_first() -> None:
    bad = []
    for path in LIBRARY:
        rel = str(path.relative_to(ROOT))
        if rel.startswith(UNGUARDED):
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bad += [
                    f"{rel}:{line} {m}" for m, line in optional_imports(fn) if not needs_before(fn, m, line)
                ]
    assert bad == []


def test_the_guard_check_sees_an_unguarded_import() -> None:
    fn = ast.parse("def f():\n    import h5py\n    need('h5py', 'x')\n").body[0]
    assert optional_imports(fn) == [("h5py", 2)] and not needs_before(fn, "h5py", 2)
    fn = ast.parse("def f():\n    need('h5py', 'x')\n    import h5py\n").body[0]
    assert needs_before(fn, "h5py", 3)
