#!/usr/bin/env bash
# Recoverable T-Maze corridor 400 by a curriculum, one seed after another:
#   stage 1: corridor 100 with its shipped recipe (rlt/TMazeAltLong-v0: XL memory 128, 64 envs, 2M steps);
#   then, for each corridor L in $VIA (default none), $VIA_STEPS steps (default 500k) at L from the previous
#            stage's final weights, with an XL memory of 128*L/100 steps (with $STOP_AT set, stopped as the last);
#   last: corridor $LAST (default 400) from the previous stage's final weights (--init-from), an XL memory of
#            128*LAST/100 steps (512 at 400), 256 steps per env, $STAGE2_STEPS steps (default 500k), recorded by
#            compare_peer.py in OUT/c$LAST/ (greedy return of the final policy over 50 episodes; the run folder,
#            checkpoints included, is kept in OUT/c$LAST/runs/ for a later stage); with $STOP_AT set, the last
#            stage evaluates every $EVAL_EVERY steps (default 50k) and stops once an evaluation reaches $STOP_AT
#            (--stop-at), so its final policy is that one; with $SAVE_EVERY set, the last stage checkpoints every
#            that many steps and resumes from its last checkpoint when the same command runs again, keeping
#            $KEEP_CHECKPOINTS checkpoints (default 1; more for probing the run's checkpoints while it goes on).
# Every stage after the first keeps the tuning runs' learning-rate schedule (annealed over 4M steps) and 256 steps
# per env. Between stage 1 and the rest transfer.py records the stage-1 policy at corridors 100 and $LAST
# (zero-shot). Resumable: a seed's finished stages are kept; compare_peer.py skips seeds it has recorded.
#
#   bash experiments/memory_tasks/curriculum_400.sh runs/c400_curriculum 30 32 34 36 38
#   VIA=200 bash experiments/memory_tasks/curriculum_400.sh runs/c400_via200 30 32
#   STAGE2_STEPS=1500000 STOP_AT=0.9 bash experiments/memory_tasks/curriculum_400.sh runs/c400_long 30 32
#   VIA=400 LAST=1000 bash experiments/memory_tasks/curriculum_400.sh runs/c1000 30
#   SAVE_EVERY=250000 KEEP_CHECKPOINTS=80 VIA=400 LAST=1000 bash experiments/memory_tasks/curriculum_400.sh runs/c1000 30
set -euo pipefail
out=${1:?usage: curriculum_400.sh OUT SEED...}
shift
py=${PYTHON:-python}
later=(--ppo.num-steps=256 --ppo.anneal-horizon=4000000)
corridor=${LAST:-400}
stop=()
if [ -n "${STOP_AT:-}" ]; then
    stop=(--eval-every="${EVAL_EVERY:-50000}" --stop-at="$STOP_AT")
fi
save=()
if [ -n "${SAVE_EVERY:-}" ]; then
    save=(--save-every="$SAVE_EVERY" --extra=--keep-checkpoints="${KEEP_CHECKPOINTS:-1}")
fi
mkdir -p "$out/transfer"

# train_stage ROOT SEED FLAG...: one train_gtrxl.py run in ROOT unless ROOT.done names its finished run folder
train_stage() {
    local root=$1 seed=$2
    shift 2
    if [ ! -f "$root.done" ]; then
        rm -rf "$root"
        "$py" scripts/train_gtrxl.py --env-id rlt/TMazeAltLong-v0 --seed "$seed" --threads 1 --run-root "$root" \
            --eval-every 0 --no-progress "$@"
        ls -d "$root"/ppo/rlt-TMazeAltLong-v0/*-s"$seed" > "$root.done"
    fi
}

for seed in "$@"; do
    train_stage "$out/stage1/s$seed" "$seed"
    stage1=$(cat "$out/stage1/s$seed.done")/checkpoints/last.pt
    if [ ! -f "$out/transfer/s$seed.json" ]; then
        "$py" -m experiments.memory_tasks.transfer "$stage1" --corridors 100 "$corridor" \
            --out "$out/transfer/s$seed.json"
    fi
    from=$stage1
    for via in ${VIA:-}; do
        root=$out/c$via/s$seed
        train_stage "$root" "$seed" --init-from="$from" --total-timesteps="${VIA_STEPS:-500000}" \
            --env-kwargs="{\"corridor_length\": $via}" \
            --backbone.memory-options="{\"mem_len\": $((128 * via / 100))}" "${later[@]}" \
            ${stop[@]+"${stop[@]}"}
        from=$(cat "$root.done")/checkpoints/last.pt
    done
    "$py" scripts/compare_peer.py --arms gtrxl --episodes 50 --reference gtrxl --seeds "$seed" \
        --env-id rlt/TMazeAltLong-v0 --total-timesteps "${STAGE2_STEPS:-500000}" --solved 0.9 \
        --out "$out/c$corridor" --keep-runs --extra=--init-from="$from" \
        "--extra=--env-kwargs={\"corridor_length\": $corridor}" \
        "--extra=--backbone.memory-options={\"mem_len\": $((128 * corridor / 100))}" "${later[@]/#/--extra=}" \
        ${stop[@]+"${stop[@]/#/--extra=}"} ${save[@]+"${save[@]}"}
done
