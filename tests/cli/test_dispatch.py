"""The ``rlt`` dispatcher (rl_transformers/cli/__init__.py): its listing, its refusals, the entry point that
pyproject.toml declares, ``python -m rl_transformers.cli``, and that it imports nothing heavy before a command
runs. Each case runs in a fresh interpreter (the module list of this one is the test session's)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from rl_transformers.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
SEVEN = ["train-ppo", "train-dt", "evaluate", "make-dataset", "tune", "study", "bench"]


def rlt(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rl_transformers.cli ARGS`` (or ``python -c CODE``) with this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "rl_transformers.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_help_lists_the_seven_commands_one_line_each() -> None:
    done = rlt("--help")
    assert done.returncode == 0 and done.stderr == ""
    block = done.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in block.splitlines()]
    assert listed == SEVEN == list(COMMANDS)
    for name in SEVEN:  # one line: the name, then its summary
        (line,) = [x for x in done.stdout.splitlines() if x.startswith(f"  {name} ")]
        assert line.split(None, 1)[1] == COMMANDS[name].summary
    assert rlt("-h").stdout == done.stdout


@pytest.mark.parametrize(("args", "said"), [((), "no command given"), (("trian-ppo",), "unknown command")])
def test_no_or_an_unknown_command_names_the_choices_and_exits_2(args: tuple[str, ...], said: str) -> None:
    done = rlt(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert said in done.stderr and "Traceback" not in done.stderr
    assert "valid: " + ", ".join(SEVEN) in done.stderr
    assert ("did you mean 'train-ppo'?" in done.stderr) == bool(args)


def test_main_returns_2_for_an_unknown_command_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "train-ppo" in capsys.readouterr().out


def test_pyproject_declares_the_entry_point_and_it_resolves() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["scripts"]["rlt"]
    module, _, attr = target.partition(":")
    assert (module, attr) == ("rl_transformers.cli", "main")
    assert getattr(importlib.import_module(module), attr) is main and callable(main)


def test_the_console_scripts_call_runs_a_command() -> None:
    """What the installed ``rlt`` script does (``sys.exit(main())``), with ``sys.argv`` as the shell gives it:
    the command sees ``rlt <command>`` as its program name."""
    code = "import sys; sys.argv = ['/venv/bin/rlt', *sys.argv[1:]]; from rl_transformers.cli import main; sys.exit(main())"
    done = rlt("train-dt", "--help", code=code)
    assert done.returncode == 0 and done.stdout.startswith("usage: rlt train-dt [-h]")


def test_the_command_modules_exist_and_define_command() -> None:
    """Every table entry names a module with ``command()`` (found without importing it: the table is data)."""
    for name, cmd in COMMANDS.items():
        path = ROOT.joinpath(*cmd.module.split(".")).with_suffix(".py")
        assert "\ndef command() -> int:" in path.read_text(), name
        assert (ROOT / "scripts" / f"{cmd.script}.py").is_file(), name


OPTIONAL = ("minari", "h5py", "matplotlib", "scipy", "stable_baselines3")


def test_the_core_imports_no_optional_package() -> None:
    """Lean core: the package, the PPO trainer and the dispatcher import none of the extras' packages; ``rlt
    --help`` imports not even torch."""
    code = (
        "import sys, io, contextlib\n"
        "import rl_transformers.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rl_transformers.cli.main(['--help'])\n"
        "print('torch' in sys.modules)\n"
        "import rl_transformers, rl_transformers.algos.ppo\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    done = rlt(code=code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["False", "[]"]


def test_the_lean_core_check_sees_an_optional_import() -> None:
    """The check above can fail: importing the offline table's interval pulls scipy in."""
    code = (
        "import sys\n"
        "from rl_transformers.agents.offline_table import _interval\n"
        "_interval([1.0, 2.0])\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    done = rlt(code=code)
    assert done.returncode == 0, done.stderr
    assert "scipy" in done.stdout


SLOW_COMMAND = """
import sys
from rl_transformers.cli import COMMANDS, Command, main
COMMANDS["slow"] = Command("slow_command", "imports for a minute", "slow")
sys.exit(main(["slow"]))
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGINT")
def test_ctrl_c_while_a_command_imports_is_one_line_and_130(tmp_path: Path) -> None:
    """``rlt`` installs the start-up hook before it imports the command (torch: seconds), as the scripts do: a
    SIGINT in that window is one line and exit status 130 (a stand-in command module sleeps while importing)."""
    from rl_transformers.startup import MESSAGE
    from tests.safety.test_startup_interrupt import _interrupt_after_first_line

    (tmp_path / "slow_command.py").write_text('print("imported", flush=True)\nimport time\ntime.sleep(60)\n')
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    env.pop("RLT_DEBUG", None)
    done = _interrupt_after_first_line([sys.executable, "-c", SLOW_COMMAND], tmp_path, env)
    assert done.returncode == 130 and done.stderr.strip() == MESSAGE, done.stderr[-2000:]
