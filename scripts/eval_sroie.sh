#!/usr/bin/env bash
# Evaluate the shipped PIP model and its AR baseline on the SROIE test split (all 347 receipts).
#   scripts/eval_sroie.sh pip|pip-refine|ar-forced|ar-free|all [more pipkie evaluate options]
#   PIP=dir AR=dir TAG=-compact scripts/eval_sroie.sh pip      # other models; TAG names the outputs
#   FRESH=1 scripts/eval_sroie.sh pip                          # decode everything again
# Outputs: results/sroie-<decoder>$TAG.json and .predictions.jsonl. An interrupted run resumes, but
# only from predictions made under the same settings (model weights, keys, decoder, data): a file
# left by another model, such as one committed to the repository, is set aside and every receipt is
# decoded again (pipkie evaluate says why). Decoder names: pip, ar-free, ar-forced.
# Precision: the default's (`--compute auto`: bfloat16 where the CPU runs it natively, else float32);
# PIPKIE_COMPUTE=float32 gives the float32 numbers docs/RESULTS.md reports unless it says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/sroie}
PIP=${PIP:-models/pipkie}
AR=${AR:-models/pipkie-ar}
TAG=${TAG:-}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
mode=${1:-all}
shift || true
need() {
  [ -f "$1/pipkie.json" ] || { echo "error: no pipkie model at $1 (set $2=DIR)" >&2; exit 2; }
  [ -d "$DATA" ] || { echo "error: SROIE not found at $DATA (set DATA=DIR)" >&2; exit 2; }
}
run() {
  .venv/bin/pipkie evaluate --dataset sroie --data-dir "$DATA" --split test --threads "$THREADS" \
    ${FRESH:+--fresh} "$@"
}
case "$mode" in
  pip)        need "$PIP" PIP; run --decode pip --model "$PIP" --batch-size 4 --json "results/sroie-pip$TAG.json" "$@" ;;
  pip-refine) need "$PIP" PIP; run --decode pip --refine-steps 2 --model "$PIP" --batch-size 4 --json "results/sroie-pip-refine2$TAG.json" "$@" ;;
  ar-forced)  need "$AR" AR; run --decode ar-forced --model "$AR" --batch-size 8 --json "results/sroie-ar-forced$TAG.json" "$@" ;;
  ar-free) need "$AR" AR; run --decode ar-free --model "$AR" --batch-size 8 --json "results/sroie-ar-free$TAG.json" "$@" ;;
  all) for m in pip ar-forced ar-free; do "$0" "$m" "$@"; done ;;
  *) echo "usage: $0 pip|pip-refine|ar-forced|ar-free|all [pipkie evaluate options]" >&2; exit 2 ;;
esac
