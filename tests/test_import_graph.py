"""The library's imports go one way, form no circle and name only what the imported module defines.

Every module of ``rl_transformers``, ``envs`` and ``offline_data`` is parsed with :mod:`ast` (nothing is
imported). An import is **module-level** (also inside a module-level ``if`` / ``try``), **type-checking**
(under ``if TYPE_CHECKING:``) or **function-level** (inside a ``def``: a deferred import, allowed when it keeps
the layer order). Three rules:

(a) the layers, lowest first: ``utils`` (with the standard-library-only root modules ``startup`` and ``tags``)
    < ``logging`` < ``backbone`` < ``runs`` < ``policies`` < ``envs`` < ``offline_data`` < ``algos`` < ``agents`` <
    ``study`` < ``tune`` and ``bench`` < ``cli`` (the ``rlt`` command, on top: nothing imports it; it imports
    its commands lazily). A module imports its own package or
    lower layers only, at every level; ``utils`` imports nothing of this repository but ``utils``;
(b) no circle: the graph of module-level and type-checking imports has no strongly connected component of
    more than one module;
(c) ``from M import name`` names what ``M`` defines (a function, class or assignment of ``M``, or a submodule
    of the package ``M``), not a name ``M`` itself imports: a package ``__init__`` (an index) is the only
    module read through for names it imports.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rl_transformers", "envs", "offline_data")

LAYERS: dict[str, int] = {
    "rl_transformers.utils": 0,
    "rl_transformers.startup": 0,
    "rl_transformers.tags": 0,
    "rl_transformers.logging": 1,
    "rl_transformers.backbone": 2,
    "rl_transformers.runs": 3,
    "rl_transformers.policies": 4,
    "envs": 5,
    "offline_data": 6,
    "rl_transformers.algos": 7,
    "rl_transformers.agents": 8,
    "rl_transformers.study": 9,
    "rl_transformers.tune": 10,
    "rl_transformers.bench": 10,
    "rl_transformers.cli": 11,
}
"""Layer of each part: a module imports modules of its own part or of a lower layer (same number, other part:
refused, so ``tune`` and ``bench`` do not import each other), except in the base layer."""
BASE = 0
"""The base layer: ``utils`` and the standard-library-only root modules (``run_cli`` removes the start-up hook of
:mod:`rl_transformers.startup`, which must not import ``utils``: it runs before anything heavy is imported)."""


@dataclass(frozen=True)
class Import:
    """One imported module (``name`` is the imported attribute for ``from module import name``, else None)."""

    importer: str
    module: str
    name: str | None
    level: str  # "module", "type-checking" or "function"
    line: int


def module_files() -> dict[str, Path]:
    """Every module of the library by dotted name (a package by its own name, from its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = module_files()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, level: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, level
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, "function")
        elif isinstance(child, ast.If) and level == "module" and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), "type-checking")
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), "module")
        else:
            yield from _walk(child, level)


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(importer: str) -> list[Import]:
    """The library modules ``importer`` imports (third-party and standard-library imports are left out)."""
    out = []
    for node, level in _walk(TREES[importer], "module"):
        if isinstance(node, ast.Import):
            out += [
                Import(importer, a.name, None, level, node.lineno) for a in node.names if a.name in MODULES
            ]
            continue
        source = _absolute(importer, node)
        if source not in MODULES:
            continue
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in MODULES:
                out.append(Import(importer, sub, None, level, node.lineno))
            else:
                out.append(Import(importer, source, alias.name, level, node.lineno))
    return out


IMPORTS = [imp for module in MODULES for imp in imports_of(module)]


def part_of(module: str) -> str | None:
    """The layered part a module belongs to (None: the root ``rl_transformers`` package, an index)."""
    best = None
    for part in LAYERS:
        if (module == part or module.startswith(part + ".")) and (best is None or len(part) > len(best)):
            best = part
    return best


def layer_violations() -> set[str]:
    found = set()
    for imp in IMPORTS:
        mine, theirs = part_of(imp.importer), part_of(imp.module)
        if mine is None or theirs is None or mine == theirs:
            continue
        if LAYERS[theirs] > LAYERS[mine] or (LAYERS[theirs] == LAYERS[mine] and LAYERS[mine] != BASE):
            found.add(f"layer: {imp.importer} imports {imp.module} ({imp.level}-level)")
    return found


def circles() -> list[list[str]]:
    """Strongly connected components (Tarjan) of more than one module, over module-level and type-checking
    imports."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.module != imp.importer:
            edges[imp.importer].add(imp.module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def circle_violations() -> set[str]:
    return {"circle: " + " <-> ".join(component) for component in circles()}


def defined_names(module: str) -> set[str]:
    """Names a module binds itself at top level (functions, classes, assignments, loop / with targets)."""
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)

    def scan(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    targets(target)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets(stmt.target)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                targets(stmt.target)
                scan(stmt.body)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                scan(stmt.body)
            elif isinstance(stmt, ast.If):
                scan(stmt.body)
                scan(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                scan(stmt.body)
                for handler in stmt.handlers:
                    scan(handler.body)
                scan(stmt.orelse)
                scan(stmt.finalbody)

    scan(TREES[module].body)
    return names


def name_violations() -> set[str]:
    found = set()
    for imp in IMPORTS:
        if imp.name is None or imp.name == "*" or is_package(imp.module):
            continue
        if imp.name not in defined_names(imp.module):
            found.add(f"name: {imp.importer} imports {imp.name} from {imp.module}, which does not define it")
    return found


def violations() -> set[str]:
    return layer_violations() | circle_violations() | name_violations()


def test_parts_cover_every_module() -> None:
    """Every module but the root package's index belongs to a layered part (a new part must be placed)."""
    assert [m for m in MODULES if part_of(m) is None] == ["rl_transformers"]


def test_imports_follow_the_layers_without_circles() -> None:
    found = sorted(violations())
    assert not found, "\n".join(found)


def test_utils_imports_no_other_part() -> None:
    """``utils`` is the bottom: besides the standard library, torch and third-party packages it imports only
    ``utils`` and the standard-library-only root modules (at any level)."""
    bad = [
        imp
        for imp in IMPORTS
        if part_of(imp.importer) == "rl_transformers.utils"
        and part_of(imp.module)
        not in ("rl_transformers.utils", "rl_transformers.startup", "rl_transformers.tags")
    ]
    assert not bad, bad
    base = ("rl_transformers.startup", "rl_transformers.tags")
    assert not [imp for imp in IMPORTS if imp.importer in base], (
        "startup / tags must stay standard-library only"
    )


def test_function_level_imports_are_reported() -> None:
    """Deferred imports are allowed but listed (``pytest -s`` shows them); each keeps the layer order, which
    :func:`test_imports_follow_the_layers_without_circles` checks."""
    deferred = sorted(
        f"{imp.importer}:{imp.line} -> {imp.module}"
        for imp in IMPORTS
        if imp.level == "function" and part_of(imp.importer) != part_of(imp.module)
    )
    print(f"{len(deferred)} function-level imports across parts:\n" + "\n".join(deferred))
    assert all(" -> " in line for line in deferred)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from rl_transformers.study import tuner_probe\n", "layer"),
        ("from rl_transformers.utils.errors import UserError\nx = UserError\n", None),
    ],
)
def test_the_checks_catch_a_planted_violation(source: str, expected: str | None) -> None:
    """A module of ``utils`` importing ``study`` is refused; one importing ``utils`` is not (checks of the
    checker: it is given a parsed module, not a file)."""
    name = "rl_transformers.utils._planted"
    MODULES[name] = MODULES["rl_transformers.utils.errors"]
    TREES[name] = ast.parse(source)
    planted = imports_of(name)
    try:
        IMPORTS.extend(planted)
        found = [v for v in layer_violations() if name in v]
    finally:
        for imp in planted:
            IMPORTS.remove(imp)
        del MODULES[name], TREES[name]
    assert bool(found) == (expected == "layer"), found


@pytest.mark.parametrize("package", ["rl_transformers.study", "rl_transformers.tune"])
def test_the_package_index_names_every_module(package: str) -> None:
    """The package docstring indexes each of its modules (``:mod:`~package.module```), and only those."""
    doc = ast.get_docstring(TREES[package]) or ""
    named = set(re.findall(rf":mod:`~{re.escape(package)}\.(\w+)`", doc))
    modules = {m.rsplit(".", 1)[1] for m in MODULES if m.startswith(package + ".") and m.count(".") == 2}
    assert named == modules, f"not indexed: {sorted(modules - named)}; not modules: {sorted(named - modules)}"
