#!/usr/bin/env bash
# Evaluate a PIP model and the AR baseline on the SROIE test split (all 347 receipts).
# Each run is resumable (predictions are appended to results/*.predictions.jsonl).
#   scripts/eval_sroie.sh pip|pip-refine|ar-forced|ar|all
#   PIP=dir AR=dir TAG=-compact scripts/eval_sroie.sh pip      # other models; TAG names the outputs
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/sroie}
PIP=${PIP:-models/pipkie-sroie}
AR=${AR:-runs/smollm2-ar/model}
TAG=${TAG:-}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
run() { .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --threads "$THREADS" "$@"; }
case "${1:-all}" in
  pip)        run --decode pip --model "$PIP" --batch-size 4 --json "results/sroie-pip$TAG.json" ;;
  pip-refine) run --decode pip --refine-steps 2 --model "$PIP" --batch-size 4 --json "results/sroie-pip-refine2$TAG.json" ;;
  ar-forced)  run --decode ar-forced --model "$AR" --batch-size 8 --json "results/sroie-ar-forced$TAG.json" ;;
  ar)         run --decode ar --model "$AR" --batch-size 8 --json "results/sroie-ar-free$TAG.json" ;;
  all) for m in pip ar-forced ar; do "$0" "$m"; done ;;
  *) echo "usage: $0 pip|pip-refine|ar-forced|ar|all" >&2; exit 2 ;;
esac
