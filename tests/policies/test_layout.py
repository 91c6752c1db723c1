"""Layout of the policies package: no import circles, old import paths still work."""

from __future__ import annotations

import ast
from pathlib import Path

import rl_transformers.policies as policies

PACKAGE = Path(policies.__file__).parent


def _imports(path: Path) -> set[str]:
    """Modules of rl_transformers.policies imported at module level by ``path`` (function bodies excluded)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("rl_transformers.policies.")
        ):
            found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rl_transformers.policies."):
                    found.add(alias.name.rsplit(".", 1)[1])
    return found


def test_policies_modules_import_no_circle() -> None:
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert graph["recurrent"] == {"cores"}, graph["recurrent"]
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"import circle: {' -> '.join([*visiting, name])}"
        if name in done or name not in graph:
            return
        visiting.append(name)
        for dep in graph[name]:
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in graph:
        visit(name)


def test_old_gtrxl_import_paths_still_work() -> None:
    from rl_transformers.policies import actor_critic, cores, gtrxl, packing

    assert gtrxl.ActorCritic is actor_critic.ActorCritic
    assert gtrxl.Packing is packing.Packing
    assert gtrxl.Core is cores.Core and gtrxl.ContextCore is cores.ContextCore
    assert gtrxl.CoreOutput is cores.CoreOutput and gtrxl.replay_exactness is cores.replay_exactness
    assert issubclass(gtrxl.GTrXLPolicy, actor_critic.ActorCritic)
