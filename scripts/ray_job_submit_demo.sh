#!/usr/bin/env bash
# Runs a distillation job the cluster way, against a local head: `ray start --head`, `ray job submit` of
# jobs/congen.py (a small ConGen run: minilm-l3 <- minilm-l6, 512 captions, one epoch), `ray stop`. The whole
# output is what docs/ray-job-submit.log holds; docs/cluster.md shows the commands.
#
#   bash scripts/ray_job_submit_demo.sh [OUT_DIR] > /tmp/submit.log 2>&1    # OUT_DIR (default /tmp/submit)
#
# Send its output OUTSIDE the checkout: a file that grows inside the working directory while `ray job submit`
# packages it changes the package's hash between hashing and upload, and the job fails with "Failed to download
# runtime_env file package ... from the GCS". `ray stop` at the end stops every Ray process on this machine.
#
# Ray 2.60 turns token auth on whenever ~/.ray/auth_token exists, so the shell that starts the head and submits
# needs RAY_AUTH_MODE=token. The job runs in Ray's temporary copy of the working directory: its outputs get absolute
# paths, and MLflow's store is passed in the job's environment.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/submit}
mkdir -p "$OUT"
# shellcheck disable=SC1091
. .venv/bin/activate
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f ~/.ray/auth_token ] || ray get-auth-token --generate >/dev/null
ray start --head --num-cpus=2 --dashboard-host=127.0.0.1 >/dev/null || exit 1
set -x
ray job submit --address http://127.0.0.1:8265 --working-dir . \
  --runtime-env-json '{"excludes": ["runs/", "mlartifacts/", "mlflow.db", ".venv/", "results/"],
                       "env_vars": {"MLFLOW_TRACKING_URI": "sqlite:///'"$OUT"'/mlflow.db"}}' \
  -- python jobs/congen.py --set teacher=minilm-l6 --set data.max_sentences=512 --set train.epochs=1 \
     --set train.eval_every=4 --set train.checkpoint_every=4 --run-dir "$OUT/run" --results-dir "$OUT/results"
rc=$?
set +x
ray stop >/dev/null
exit $rc
