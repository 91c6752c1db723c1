#!/usr/bin/env bash
# Recoverable T-Maze corridor 400 by a two-stage curriculum, one seed after another:
#   stage 1: corridor 100 with its shipped recipe (rlt/TMazeAltLong-v0: XL memory 128, 64 envs, 2M steps);
#   stage 2: corridor 400 from stage 1's final weights (--init-from), XL memory 512, 256 steps per env, 500k
#            steps, recorded by compare_peer.py (greedy return of the final policy over 50 episodes); its
#            learning rate follows the tuning runs' schedule (annealed over 4M steps, of which 500k run).
# Between the stages transfer.py records the stage-1 policy at corridors 100 and 400 (zero-shot).
# Resumable: a seed whose stage 1 finished keeps it; compare_peer.py skips seeds it has recorded.
#
#   bash experiments/memory_tasks/curriculum_400.sh runs/c400_curriculum 30 32 34 36 38
set -euo pipefail
out=${1:?usage: curriculum_400.sh OUT SEED...}
shift
py=${PYTHON:-python}
mkdir -p "$out/transfer"
for seed in "$@"; do
    root=$out/stage1/s$seed
    if [ ! -f "$root.done" ]; then
        rm -rf "$root"
        "$py" scripts/train_gtrxl.py --env-id rlt/TMazeAltLong-v0 --seed "$seed" --threads 1 --run-root "$root" \
            --eval-every 0 --no-progress
        ls -d "$root"/ppo/rlt-TMazeAltLong-v0/*-s"$seed" > "$root.done"
    fi
    stage1=$(cat "$root.done")/checkpoints/last.pt
    if [ ! -f "$out/transfer/s$seed.json" ]; then
        "$py" -m experiments.memory_tasks.transfer "$stage1" --corridors 100 400 --out "$out/transfer/s$seed.json"
    fi
    "$py" scripts/compare_peer.py --arms gtrxl --episodes 50 --reference gtrxl --seeds "$seed" \
        --env-id rlt/TMazeAltLong-v0 --total-timesteps 500000 --solved 0.9 --out "$out/c400" \
        --extra=--init-from="$stage1" '--extra=--env-kwargs={"corridor_length": 400}' \
        '--extra=--backbone.memory-options={"mem_len": 512}' --extra=--ppo.num-steps=256 \
        --extra=--ppo.anneal-horizon=4000000
done
