#!/bin/bash
# Second driver: the three hybrid arms side by side (one thread each), then gated once rope
# has ended; hybrid_olmo_nope is SIGKILLed after its step-40 checkpoint and resumed.
cd <repository>
export PYTHONPATH=src
OUT=runs/designs_screen
SCREEN="train.max_steps=120 train.global_batch_tokens=1536 train.warmup_steps=10 train.checkpoint_every_steps=40 probe.fi_every_steps=40 probe.answer_every_steps=40 probe.niah_every_steps=120 log.every_steps=10 train.resume=auto"
arm() {  # arm NAME THREADS
  echo "== $1 start $(date -u +%FT%TZ) threads $2" >> $OUT/times.log
  OMP_NUM_THREADS=$2 /usr/bin/time -f "$1 wall %e s" -a -o $OUT/times.log .venv/bin/python -m longctx pretrain experiments/designs/base.yaml inherit=designs/$1.yaml $SCREEN train.out_dir=$OUT/$1 >> $OUT/$1.log 2>&1
  echo "== $1 exit $? $(date -u +%FT%TZ)" >> $OUT/times.log
}
arm hybrid_olmo_rope 1 &
arm hybrid_qwen3next 1 &
( setsid bash -c "$(declare -f arm); OUT=$OUT; SCREEN='$SCREEN'; export PYTHONPATH=src; arm hybrid_olmo_nope 1" ) &
KILLED=$!
while ! ls $OUT/hybrid_olmo_nope/checkpoints/step-0000040.ckpt >/dev/null 2>&1; do sleep 2; done
sleep 1
echo "== hybrid_olmo_nope KILL group $KILLED at $(date -u +%FT%TZ)" >> $OUT/times.log
kill -KILL -- -$KILLED
wait $KILLED
arm hybrid_olmo_nope 1 &
while kill -0 9930 2>/dev/null; do sleep 5; done
arm gated 1 &
wait
echo "== all done $(date -u +%FT%TZ)" >> $OUT/times.log
