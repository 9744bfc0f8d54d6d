#!/bin/bash
# Real-model fault case: the ConGen job's driver is SIGKILLed mid-run (past its step-50 checkpoint) and the
# same command is run again; it must resume from the checkpoint and end within seed noise of the uninterrupted run
# (results/congen-minilm-l3-mpnet-base.json, same config and seed).
#   bash scripts/fault_driver_kill.sh            # logs in /tmp/fault1.log, /tmp/fault2.log
set -u
cd "$(dirname "$0")/.."
CMD=(python jobs/congen.py --set train.lr=1e-4 --run-dir runs/congen-fault-driver-killed --results-dir /tmp/res-fault)
"${CMD[@]}" > /tmp/fault1.log 2>&1 &
pid=$!
until grep -q "step 8[0-9]/186" /tmp/fault1.log; do
  sleep 2
  kill -0 "$pid" 2>/dev/null || { echo "the job ended before step 80"; exit 1; }
done
kill -9 "$pid" && echo "driver SIGKILLed at $(grep -o 'step 8[0-9]/186' /tmp/fault1.log | head -1)"
sleep 5; ray stop --force > /dev/null 2>&1; sleep 3   # the local Ray the dead driver started
"${CMD[@]}" > /tmp/fault2.log 2>&1 && grep "resuming from\|7-STS" /tmp/fault2.log
