#!/usr/bin/env bash
# Rebuild the derived data the training configs and dev suites read from ../runs (a new checkout has
# none of it): resumable, each step skips what is already there.
#   scripts/rebuild_runs.sh [step...]      steps: wrdev-ocr unlabeled-ocr sums pseudo (default: all, in order)
# - wrdev-ocr      rapidocr words of WildReceipt dev's 100 images -> ../runs/ocr/wrdev-cache
#                  (the wr-images suites of scripts/eval_dev.sh; ~3 min on 2 cores), at the engine's
#                  default line score (0.9 since session 33; the results before it read 0.5's words)
# - unlabeled-ocr  rapidocr words of the 1,297 unlabelled photos -> ../runs/ocr/wildreceipt_unlabeled
#                  (stage-1 self-supervision, `source: self`; ~26 min on 2 cores), at line score 0.5
#                  (`--min-score 0.5`), as every shipped model up to round 20 was trained on them
# - sums           item lists that add up to the receipt's total, no model -> ../runs/pseudo/wildreceipt_sums
#                  (`pipkie label-items`; seconds)
# - pseudo         the default model's confident answers (>= 0.9) -> ../runs/pseudo/wildreceipt_unlabeled
#                  (`pipkie label`; ~46 min on 2 threads). Rounds 12-20 were trained on round 5's labels:
#                  labels made now come from $MODEL (default: the shipped model), so they differ.
# Two OCR shards run side by side (one core each); THREADS sets the model's threads for `pseudo`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-../runs}
DATA=${DATA:-../shared/data}
THREADS=${THREADS:-2}
MODEL=${MODEL:-models/pipkie}
STEPS=${*:-wrdev-ocr unlabeled-ocr sums pseudo}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
P=.venv/bin/pipkie

ocr2() {  # ocr2 SRC OUT [pipkie ocr options]: two shards side by side
  "$P" ocr "$1" --out "$2" --threads 1 --shard 0/2 "${@:3}" &
  local a=$!
  "$P" ocr "$1" --out "$2" --threads 1 --shard 1/2 "${@:3}"
  wait "$a"
}

for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    wrdev-ocr) ocr2 "$DATA/wildreceipt_dev" "$RUNS/ocr/wrdev-cache" ;;
    unlabeled-ocr) ocr2 "$DATA/wildreceipt_unlabeled" "$RUNS/ocr/wildreceipt_unlabeled" --min-score 0.5 ;;
    sums) "$P" label-items "$RUNS/ocr/wildreceipt_unlabeled" --out "$RUNS/pseudo/wildreceipt_sums" ;;
    pseudo)
      "$P" label "$RUNS/ocr/wildreceipt_unlabeled" --out "$RUNS/pseudo/wildreceipt_unlabeled" --model "$MODEL" \
        --keys "company,date:date,address,total:money" --store-as company=store_name,address=store_addr \
        --min-confidence 0.9 --threads "$THREADS"
      "$P" label "$RUNS/ocr/wildreceipt_unlabeled" --out "$RUNS/pseudo/wildreceipt_unlabeled" --model "$MODEL" \
        --keys "tel:phone,time:time" --min-confidence 0.9 --threads "$THREADS"
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done ($(date -u +%H:%M:%S))"
