#!/bin/bash
# The designs sweep's reduced-scale screen: each arm over experiments/designs/base.yaml with
# the overrides below, one after another; hybrid_olmo_nope is SIGKILLed after its step-40
# checkpoint and continued with train.resume=auto.
cd <repository>
export PYTHONPATH=src
OUT=runs/designs_screen
SCREEN="train.max_steps=120 train.global_batch_tokens=1536 train.warmup_steps=10 train.checkpoint_every_steps=40 probe.fi_every_steps=40 probe.answer_every_steps=40 probe.niah_every_steps=120 log.every_steps=10 train.resume=auto"
arm() {  # arm NAME [background]
  echo "== $1 start $(date -u +%FT%TZ)" >> $OUT/times.log
  /usr/bin/time -f "$1 wall %e s" -a -o $OUT/times.log .venv/bin/python -m longctx pretrain experiments/designs/base.yaml inherit=designs/$1.yaml $SCREEN train.out_dir=$OUT/$1 >> $OUT/$1.log 2>&1
  echo "== $1 exit $? $(date -u +%FT%TZ)" >> $OUT/times.log
}
arm rope
arm gated
arm hybrid_olmo_rope
# the kill: start, wait for the step-40 checkpoint, SIGKILL the process group, resume
( setsid bash -c "$(declare -f arm); OUT=$OUT; SCREEN='$SCREEN'; export PYTHONPATH=src; arm hybrid_olmo_nope" ) &
while ! ls $OUT/hybrid_olmo_nope/checkpoints/step-0000040.ckpt >/dev/null 2>&1; do sleep 2; done
sleep 1
PG=$(pgrep -f "train.out_dir=$OUT/hybrid_olmo_nope" | head -1)
echo "== hybrid_olmo_nope KILL pid $PG at $(date -u +%FT%TZ)" >> $OUT/times.log
kill -KILL -- -$(ps -o pgid= $PG | tr -d ' ')
wait
arm hybrid_olmo_nope
arm hybrid_qwen3next
echo "== all done $(date -u +%FT%TZ)" >> $OUT/times.log
