#!/usr/bin/env bash
# The dependency floors hold: a second venv with the *lowest* versions pyproject.toml allows of gymnasium, tyro,
# minari and stable-baselines3 (these two in the offline extra) (torch==2.13.0 first, the CPU wheel, as in
# `make venv`; everything else newest)
# runs a smoke subset of the tests that reaches each of them: the tyro CLI, SAME_STEP vector envs and a PPO /
# DT run (gymnasium), Minari datasets, SB3 policies. The floors are read from pyproject.toml itself, so raising
# or lowering one there is what this tests. Usage: bash .ci/lowest.sh (or `make lowest`); the venv is
# .venv/lowest (kept between runs; LOWEST_FRESH=1 rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv/lowest
PY=${PY:-python3}
# it lives inside the main venv's folder (ignored by git, removed by make clean): make that one first, or
# `make venv` would find .venv and skip creating it
test -x .venv/bin/python || { echo "error: .venv is not set up; run make venv first" >&2; exit 1; }
if [ "${LOWEST_FRESH:-0}" = 1 ]; then rm -rf "$VENV"; fi
test -d "$VENV" || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
# gymnasium>=1.1 -> gymnasium==1.1, from the core dependencies and the offline extra (minari, SB3); other
# extras' copies of a name are skipped: the floor is the core one
"$VENV/bin/python" - >"$VENV/floors.txt" <<'PYEOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["offline"]
for dep in deps:
    m = re.fullmatch(r"\s*(gymnasium|tyro|minari|stable-baselines3)\s*>=\s*([0-9][0-9.]*)\s*", dep)
    if m:
        print(f"{m[1]}=={m[2]}")
PYEOF
test "$(wc -l <"$VENV/floors.txt")" -eq 4 || { echo "error: expected 4 floors in pyproject.toml, got:"; cat "$VENV/floors.txt"; exit 1; }
"$VENV/bin/pip" install -q -e ".[dev,offline]" -c "$VENV/floors.txt"
"$VENV/bin/python" - "$VENV/floors.txt" <<'PYEOF'
import sys
from importlib.metadata import version
from packaging.version import Version
for line in open(sys.argv[1]):
    name, want = line.strip().split("==")
    got = version(name)
    if Version(got) != Version(want):
        sys.exit(f"error: {name} {got} installed, the floor is {want}")
    print(f"lowest: {name} {got}")
PYEOF
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout 900 \
    tests/runs/test_run_flags.py \
    tests/algos/test_rollout.py \
    tests/algos/test_truncation_bootstrap.py \
    tests/offline_data/test_minari_io.py \
    tests/offline_data/test_sb3_state.py
