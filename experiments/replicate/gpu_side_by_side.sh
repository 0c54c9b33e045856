#!/usr/bin/env bash
# The one-GPU replication with its runs side by side: the commands `make replicate-gpu`'s
# sweeps expand to, but the three windows train at once, then the five Table 1 methods and
# the two SFT variants at once. A 2M-parameter model keeps one H100 mostly idle (one run:
# ~5 steps/s of 64K tokens, under 2% MFU), so this is how the measured run fitted a 30-minute
# GPU lease (docs/replication.md, "The one-GPU run"). From the project root:
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
for L in 1024 2048 4096; do
  python -m longctx pretrain experiments/replicate/gpu_base.yaml data.window=$L train.out_dir=$R/pretrain/w$L \
    log.run_name=replicate_gpu_w$L $LOG > $R/logs/pretrain_w$L.log 2>&1 &
  running[$!]=pretrain_w$L
done
wait_all
for M in rope string self_extend dca ntk; do
  python -m longctx niah $R/pretrain/w4096/checkpoints/last.ckpt experiments/replicate/gpu_table1.yaml \
    eval.out_dir=$R/table1/name=$M log.run_name=replicate_gpu_table1_$M eval.position_method.name=$M $LOG \
    > $R/logs/table1_$M.log 2>&1 &
  running[$!]=table1_$M
done
for V in normal skipalign; do
  python -m longctx sft experiments/replicate/gpu_sft.yaml train.out_dir=$R/sft/$V log.run_name=replicate_gpu_sft_$V \
    sft.variant=$V $LOG > $R/logs/sft_$V.log 2>&1 &
  running[$!]=sft_$V
done
wait_all
if [ ${#failed[@]} -gt 0 ]; then echo "failed: ${failed[*]} (logs in $R/logs/)"; exit 1; fi
echo "all runs done; logs in $R/logs/"
