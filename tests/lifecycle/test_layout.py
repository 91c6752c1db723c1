"""Layout: no import circles among the trainer and dataset modules (module-level imports, read with ``ast``), and
the shared env / evaluation helpers make ``rlt/`` envs without importing the PPO trainer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("offline_data", "rl_transformers/algos", "rl_transformers/utils")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def module_level_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` imported at module level (function-level, lazy imports excluded)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): module_level_imports(p, known) - {module_name(p)} for p in files}


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "offline_data.scores" in graph["offline_data.episode"]  # one way only
    assert not graph["offline_data.scores"] & {"offline_data.episode"}
    assert find_cycle(graph) is None, find_cycle(graph)


def test_shared_env_helpers_make_rlt_envs_without_the_ppo_trainer() -> None:
    code = (
        "import sys\n"
        "from rl_transformers.algos.env_util import make_env_thunk\n"
        "import rl_transformers.algos.dt, rl_transformers.algos.evaluation\n"
        "env = make_env_thunk('rlt/TMazeShort-v0')()\n"
        "print(env.spec.id, 'rl_transformers.algos.ppo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["rlt/TMazeShort-v0", "False"]


def test_trainer_modules_stay_small_and_old_import_paths_work() -> None:
    """One concern per module (≤ ~400 lines); names that moved out of ppo.py / dt.py / rollout.py are still
    importable from there (the same objects)."""
    sizes = {
        p.name: len(p.read_text().splitlines()) for p in (ROOT / "rl_transformers" / "algos").glob("*.py")
    }
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]

    from rl_transformers.algos import (
        dt,
        dt_checkpoint,
        dt_logging,
        dt_setup,
        ppo,
        ppo_update,
        rollout,
        storage,
        throughput,
    )

    assert ppo.ppo_loss is ppo_update.ppo_loss and ppo.make_adam is ppo_update.make_adam
    assert ppo.measure_throughput is throughput.measure_throughput  # lazy: throughput imports ppo
    assert dt.load_policy is dt_checkpoint.load_policy and dt.REQUIRED_KEYS is dt_checkpoint.REQUIRED_KEYS
    assert (
        dt.default_return_scale is dt_setup.default_return_scale and dt.target_label is dt_setup.target_label
    )
    assert dt._Window is dt_logging.Window
    for name in ("RolloutStorage", "SequenceBatch", "compute_gae", "state_signature"):
        assert getattr(rollout, name) is getattr(storage, name)
