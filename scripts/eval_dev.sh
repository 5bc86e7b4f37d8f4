#!/usr/bin/env bash
# The development evaluations behind every model choice (never the test split):
#   MODEL=models/pipkie TAG=new scripts/eval_dev.sh [pip|ar-forced|ar-free] [suite...]
# suites: wr-sroie (WildReceipt dev, SROIE keys, dataset OCR), wr-images (the same from the images,
# rapidocr, cached in $OCR_CACHE), wr-open (keys tel,time,subtotal,tax), sroie-dev (59 receipts
# carved from SROIE train), kleister (Kleister-NDA dev-0), wr-items (WildReceipt dev line items,
# items[name,quantity,price]), gen-items (the same on 100 held-out generated receipts),
# wr-sroie-typed / wr-images-typed / wr-open-typed / sroie-dev-typed (the same keys with value types: date:date, total:money, tel:phone,
# time:time, subtotal:money, tax:money; wr-items-typed / gen-items-typed: price:money; `pipkie.decoding.types`);
# wr-items-priced / gen-items-priced: the typed price required (`price:money!`: an item without one is
# left out, `Group.required`). Default: the first five.
# Since session 34 a key written plainly takes the type its name implies (`decoding.types.implied_type`:
# date, time, total, subtotal, tax, tel, price), so wr-sroie reads as wr-sroie-typed did, wr-open as
# wr-open-typed, wr-items as wr-items-typed; TEXT=1 writes every key `:text` (untyped, as before).
# Outputs: results/dev/<suite>-<decode>-$TAG.json (+ .predictions.jsonl, resumed only under the
# same settings) and a reliability diagram for the WildReceipt suites.
# Precision: the default's (`--compute auto`: bfloat16 where the CPU runs it natively, else float32);
# PIPKIE_COMPUTE=float32 gives the float32 numbers docs/RESULTS.md reports unless it says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL=model directory}
TAG=${TAG:?set TAG=name of the outputs}
DECODE=${1:-pip}
shift || true
SUITES=${*:-wr-sroie wr-images wr-open sroie-dev kleister}
THREADS=${THREADS:-1}
WR=${WR:-../shared/data/wildreceipt_dev}
OCR_CACHE=${OCR_CACHE:-../runs/ocr/wrdev-cache}  # made by scripts/rebuild_runs.sh wrdev-ocr
BATCH=${BATCH:-4}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
mkdir -p results/dev
ev() {
  local suite=$1; shift
  if [ -n "${TEXT:-}" ]; then  # every key written plainly made `:text` (untyped); typed keys as written
    local args=() prev=
    for a in "$@"; do
      [ "$prev" = --keys ] && [[ "$a" != *:* ]] && a=$(sed -E 's/([^][,]+)([],]|$)/\1:text\2/g' <<<"$a")
      args+=("$a"); prev=$a
    done
    set -- "${args[@]}"
  fi
  .venv/bin/pipkie evaluate --model "$MODEL" --decode "$DECODE" --threads "$THREADS" --batch-size "$BATCH" \
    --json "results/dev/$suite-$DECODE-$TAG.json" "$@"
}
wr_sroie=(--dataset wildreceipt --data-dir "$WR" --split dev --keys company,date,address,total
          --key-map company=store_name,address=store_addr)
for suite in $SUITES; do
  case "$suite" in
    wr-sroie)  ev "$suite" "${wr_sroie[@]}" --reliability "results/dev/$suite-$DECODE-$TAG.reliability.png" ;;
    wr-images) ev "$suite" "${wr_sroie[@]}" --ocr rapidocr --ocr-cache "$OCR_CACHE" ;;
    wr-open)   ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev --keys tel,time,subtotal,tax \
                 --reliability "results/dev/$suite-$DECODE-$TAG.reliability.png" ;;
    wr-sroie-typed) ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev \
                 --keys company,date:date,address,total:money --key-map company=store_name,address=store_addr ;;
    wr-images-typed) ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev \
                 --keys company,date:date,address,total:money --key-map company=store_name,address=store_addr \
                 --ocr rapidocr --ocr-cache "$OCR_CACHE" ;;
    wr-open-typed) ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev \
                 --keys tel:phone,time:time,subtotal:money,tax:money ;;
    sroie-dev) ev "$suite" --dataset sroie --data-dir ../shared/data/sroie --split dev --keys company,date,address,total ;;
    sroie-dev-typed) ev "$suite" --dataset sroie --data-dir ../shared/data/sroie --split dev \
                 --keys company,date:date,address,total:money ;;
    wr-items)  ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev --keys "items[name,quantity,price]" ;;
    gen-items) ev "$suite" --dataset generated --data-dir world_receipts --split dev --limit 100 \
                 --keys "items[name,quantity,price]" ;;
    wr-items-typed) ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev --keys "items[name,quantity,price:money]" ;;
    wr-items-priced) ev "$suite" --dataset wildreceipt --data-dir "$WR" --split dev --keys "items[name,quantity,price:money!]" ;;
    gen-items-priced) ev "$suite" --dataset generated --data-dir world_receipts --split dev --limit 100 \
                 --keys "items[name,quantity,price:money!]" ;;
    gen-items-typed) ev "$suite" --dataset generated --data-dir world_receipts --split dev --limit 100 \
                 --keys "items[name,quantity,price:money]" ;;
    kleister)  ev "$suite" --dataset kleister_nda --data-dir ../shared/data/kleister_nda --split dev-0 \
                 --keys party,jurisdiction,effective_date,term ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
  esac
done
