#!/usr/bin/env bash
# Evaluate the PIP model and the AR baseline on the SROIE test split (all 347 receipts).
# Each run is resumable (predictions are appended to results/*.predictions.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/sroie}
PIP=${PIP:-models/pipkie-sroie}
AR=${AR:-runs/smollm2-ar/model}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
case "${1:-all}" in
  pip)       .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --decode pip --model "$PIP" --batch-size 4 --threads 1 --json results/sroie-pip.json ;;
  pip-refine) .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --decode pip --refine-steps 2 --model "$PIP" --batch-size 4 --threads 1 --json results/sroie-pip-refine2.json ;;
  ar-forced) .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --decode ar-forced --model "$AR" --batch-size 8 --threads 1 --json results/sroie-ar-forced.json ;;
  ar)        .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --decode ar --model "$AR" --batch-size 8 --threads 1 --json results/sroie-ar-free.json ;;
  all) for m in pip ar-forced ar; do "$0" $m; done ;;
esac
