#!/usr/bin/env bash
# The few-shot curve: from the default model, fine-tune on the first N Kleister-NDA train documents
# (configs/train/fewshot-kleister.json: 30 steps x 4 documents, LoRA continued from models/pipkie)
# and score Kleister-NDA dev-0; CPU time per N. Resumable: a finished N is skipped, a killed
# fine-tune resumes from its checkpoint, an evaluation from its predictions.
#   scripts/fewshot_kleister.sh [N...]        (default: 10 25 50)
# Outputs: results/fewshot/kleister-n<N>.json (+ .predictions.jsonl, .time: wall/user/sys seconds of
# the fine-tune), results/fewshot/kleister.json (the curve; N = 0 is the default model itself).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-../runs/fewshot-kleister}
MODEL=${MODEL:-models/pipkie}
KEYS=party,jurisdiction,effective_date,term
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p results/fewshot "$RUNS"
ev() {  # model, output json
  .venv/bin/pipkie evaluate --model "$1" --dataset kleister_nda --data-dir ../shared/data/kleister_nda \
    --split dev-0 --keys "$KEYS" --threads 1 --batch-size 4 --json "$2"
}
[ -f results/fewshot/kleister-n0.json ] || ev "$MODEL" results/fewshot/kleister-n0.json
for n in ${*:-10 25 50}; do
  out=$RUNS/n$n
  if [ ! -f "$out/model/pipkie.json" ]; then
    /usr/bin/time -f "%e %U %S" -o "results/fewshot/kleister-n$n.time" \
      .venv/bin/pipkie finetune --config configs/train/fewshot-kleister.json --init "$MODEL" \
      --limit "$n" --output-dir "$out"
  fi
  ev "$out/model" "results/fewshot/kleister-n$n.json"
done
.venv/bin/python - "$RUNS" <<'PY'
import json, pathlib, sys
runs, rows = pathlib.Path(sys.argv[1]), []
for f in sorted(pathlib.Path("results/fewshot").glob("kleister-n*.json"), key=lambda p: int(p.stem[10:])):
    n, r = int(f.stem[10:]), json.loads(f.read_text())
    row = {"n": n, "anls": r["anls"], "f1": r["f1"], "per_key": {k: v["anls"] for k, v in r["per_key"].items()}}
    t = f.with_suffix(".time")
    if n and t.exists():
        wall, user, sys_ = map(float, t.read_text().split()[-3:])
        summary = json.loads((runs / f"n{n}" / "summary.json").read_text())
        row.update(cpu_minutes=round((user + sys_) / 60, 1), train_seconds=summary["train_seconds"])
    rows.append(row)
pathlib.Path("results/fewshot/kleister.json").write_text(json.dumps(rows, indent=2))
print(f"{'N':>3} {'ANLS':>6} {'F1':>6} {'CPU min':>8}  per key ANLS")
for r in rows:
    keys = " ".join(f"{k} {100 * v:.1f}" for k, v in r["per_key"].items())
    print(f"{r['n']:>3} {100 * r['anls']:6.1f} {100 * r['f1']:6.1f} {r.get('cpu_minutes', 0):8.1f}  {keys}")
PY
