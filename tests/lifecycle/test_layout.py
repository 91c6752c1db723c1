"""Layout: no import circles among the trainer and dataset modules (module-level imports, read with ``ast``), and
the shared env / evaluation helpers make ``rlt/`` envs without importing the PPO trainer."""

from __future__ import annotations

import ast
import importlib
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


def test_trainer_modules_stay_small_and_export_only_their_own_names() -> None:
    """One concern per module (≤ ~400 lines); no compatibility shims: a module's ``__all__`` lists only what it
    defines, no module resolves moved names lazily (``__getattr__``, the package's lazy index aside), and the
    names that moved out of ppo.py / dt.py / rollout.py / lifecycle.py are gone from there."""
    folder = ROOT / "rl_transformers" / "algos"
    sizes = {p.name: len(p.read_text().splitlines()) for p in folder.glob("*.py")}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]

    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(module_name(path))
        assert "__getattr__" not in vars(module), module.__name__
        for name in getattr(module, "__all__", ()):
            owner = getattr(getattr(module, name), "__module__", module.__name__)
            assert owner == module.__name__, f"{module.__name__}.{name} is re-exported from {owner}"

    from rl_transformers.algos import dt, lifecycle, ppo, rollout

    gone = {
        ppo: ["measure_throughput", "ppo_loss", "load_policy", "RESUME_BLOB", "run_dir_of", "PPOConfig"],
        dt: ["evaluate", "load_policy", "EvalResult", "_Window", "cleanup_distributed"],
        rollout: ["compute_gae", "SequenceBatch", "make_vec_env", "make_env_thunk", "evaluate_policy"],
        lifecycle: ["count_parameters", "saved_form", "_without_invocation_fields"],
    }
    for module, names in gone.items():
        assert [n for n in names if hasattr(module, n)] == [], module.__name__
    assert not hasattr(ppo.PPOTrainer, "_evaluate_batch")  # dead code, removed
