#!/usr/bin/env bash
# The one-GPU replication with its runs side by side: the commands `make replicate-gpu`'s
# sweeps expand to, but the three windows x seeds train at once, then per seed the five
# Table 1 methods and the three SFT arms at once. A 2M-parameter model keeps one H100 mostly idle (one run:
# ~5 steps/s of 64K tokens, under 2% MFU), so this is how the measured run fitted a 30-minute
# GPU lease (docs/replication_log.md, 2026-11-24, the one-GPU run). From the project root:
#
#     bash experiments/replicate/gpu_side_by_side.sh            # W&B offline
#     LOG=log.wandb_mode=disabled bash experiments/replicate/gpu_side_by_side.sh   # no wandb installed
#     python -m longctx.analysis.replication_report runs/replicate_gpu --docs docs --name gpu
#
# Logs go to runs/replicate_gpu/logs/; a failing run is reported at the end, the rest go on.
set -u
R=runs/replicate_gpu
LOG=${LOG:-log.wandb_mode=offline}
mkdir -p $R/logs
failed=()
wait_all() {  # wait for every background run, remembering the ones that failed
  for pid in "${!running[@]}"; do wait "$pid" || failed+=("${running[$pid]}"); done
  running=()
}
declare -A running
SEEDS=${SEEDS:-10 11 12}  # the verdict seeds of sweeps/replicate_gpu*.yaml
for S in $SEEDS; do
  for L in 1024 2048 4096; do
    python -m longctx pretrain experiments/replicate/gpu_base.yaml data.window=$L train.seed=$S \
      train.out_dir=$R/pretrain/w${L}_s$S log.run_name=replicate_gpu_w${L}_s$S $LOG > $R/logs/pretrain_w${L}_s$S.log 2>&1 &
    running[$!]=pretrain_w${L}_s$S
  done
done
wait_all
for S in $SEEDS; do
  for M in rope string self_extend dca ntk; do
    python -m longctx niah $R/pretrain/w4096_s$S/checkpoints/last.ckpt experiments/replicate/gpu_table1.yaml \
      eval.out_dir=$R/table1/s$S/name=$M log.run_name=replicate_gpu_table1_${M}_s$S eval.position_method.name=$M $LOG \
      > $R/logs/table1_${M}_s$S.log 2>&1 &
    running[$!]=table1_${M}_s$S
  done
  for A in normal-none normal-ntk skipalign-ntk; do
    python -m longctx sft experiments/replicate/gpu_sft.yaml init=$R/pretrain/w4096_s$S/checkpoints/last.ckpt \
      train.seed=$S train.out_dir=$R/sft/$A/s$S log.run_name=replicate_gpu_sft_${A}_s$S \
      sft.variant=${A%-*} sft.rope_extension=${A#*-} $LOG > $R/logs/sft_${A}_s$S.log 2>&1 &
    running[$!]=sft_${A}_s$S
  done
  wait_all
done
if [ ${#failed[@]} -gt 0 ]; then echo "failed: ${failed[*]} (logs in $R/logs/)"; exit 1; fi
echo "all runs done; logs in $R/logs/"
