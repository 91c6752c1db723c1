#!/usr/bin/env bash
# The GPU benchmark suite on a CUDA machine without a package registry, in about 7 minutes (8 at most):
#   bash benchmarks/gpu/run.sh OUT_DIR [more benchmarks/bench_gpu.py flags]
#   bash benchmarks/gpu/run.sh OUT_DIR --dry-run      # every stage at toy sizes on the CPU (the test suite runs it)
# Installs the carried wheels (benchmarks/gpu/prepare.sh put them in .whl/) into a private folder when gymnasium or
# tyro is missing, then runs benchmarks/bench_gpu.py from this checkout (no pip install of the project needed).
# RLT_GIT_COMMIT names the commit when the copy carries no .git (as on a lent GPU). The suite's own budget
# (--budget-s, 420 s) stops it starting new stages; RLT_TIME_LIMIT_S (480) then ends it (SIGINT, then KILL):
# every stage finished by then is already in OUT_DIR/results.json. Every timed attention row records the
# command, commit and device (results.json) and the kernels it ran and its real FLOPs (columns backends,
# real_flops, real_tflops: rl_transformers/bench/kernels.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: bash benchmarks/gpu/run.sh OUT_DIR [flags]}
shift
PY=${PYTHON:-python3}
WHEELS=${RLT_WHEELS:-.whl}
if ! "$PY" -c "import gymnasium, tyro" 2>/dev/null; then
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "error: gymnasium / tyro are not installed and $WHEELS holds no wheels; run benchmarks/gpu/prepare.sh" \
             "on a machine with PyPI and carry $WHEELS" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rlt-site \
        "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/rlt-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu \
    --format=csv 2>/dev/null || true
exec timeout --signal=INT --kill-after=15 "${RLT_TIME_LIMIT_S:-480}" \
    "$PY" benchmarks/bench_gpu.py --out "$OUT_DIR" --git-commit "${RLT_GIT_COMMIT:-}" "$@"
