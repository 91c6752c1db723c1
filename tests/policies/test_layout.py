"""Layout of the policies package: no import circles, old import paths still work."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


# --- Decision Transformer: network, spaces, padding, fused forward, rollout agent in separate modules -----

DT_MODULES = ("decision_transformer", "dt_fast", "dt_padding", "dt_rollout", "dt_spaces")


def test_decision_transformer_modules_import_graph() -> None:
    """The network imports the four helpers; they import nothing back (dt_rollout only for type hints)."""
    graph = {name: _imports(PACKAGE / f"{name}.py") for name in DT_MODULES}
    assert graph == {
        "decision_transformer": {"dt_fast", "dt_padding", "dt_rollout", "dt_spaces"},
        "dt_fast": set(),
        "dt_padding": set(),
        "dt_rollout": {"dt_padding"},
        "dt_spaces": set(),
    }
    assert "decision_transformer" in _type_checking_imports(PACKAGE / "dt_rollout.py")


def _type_checking_imports(path: Path) -> set[str]:
    """Policies modules imported inside a module-level ``if TYPE_CHECKING:`` block."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                module = (inner.module or "") if isinstance(inner, ast.ImportFrom) else ""
                if module.startswith("rl_transformers.policies."):
                    found.add(module.rsplit(".", 1)[1])
    return found


@pytest.mark.parametrize("first", ["dt_rollout", "decision_transformer"])
def test_decision_transformer_modules_import_in_either_order(first: str) -> None:
    """A fresh interpreter imports either module first without a partially-initialised-module error."""
    other = "decision_transformer" if first == "dt_rollout" else "dt_rollout"
    code = (
        f"import rl_transformers.policies.{first}, rl_transformers.policies.{other}\n"
        "from rl_transformers.policies.decision_transformer import DTAgent as old\n"
        "from rl_transformers.policies.dt_rollout import DTAgent as new\n"
        "assert old is new\n"
        "print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent.parent
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_old_decision_transformer_import_paths_still_work() -> None:
    from rl_transformers.agents import dt_agent
    from rl_transformers.policies import decision_transformer as dt
    from rl_transformers.policies import dt_padding, dt_rollout, dt_spaces

    assert dt.DTAgent is dt_rollout.DTAgent and dt_agent.DTAgent is dt_rollout.DTAgent
    assert dt.pad_steps is dt_padding.pad_steps and dt.last_index is dt_padding.last_index
    assert dt.Padding is dt_padding.Padding and dt.PADDINGS == dt_padding.PADDINGS == ("right", "left")
    assert dt.space_to_dict is dt_spaces.space_to_dict and dt.space_from_dict is dt_spaces.space_from_dict
    assert set(dt.__all__) >= {"DTAgent", "DecisionTransformer", "pad_steps", "space_to_dict"}
