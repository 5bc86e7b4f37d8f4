"""Pseudo-labels again at another threshold for some keys, from a `pipkie label` folder's manifest.

    python scripts/relabel_pseudo.py ../runs/pseudo/wildreceipt_unlabeled \
        ../runs/ocr/wildreceipt_unlabeled ../runs/pseudo/wr_store50 --min-confidence store_name=0.5

`pipkie label` records every answer and its confidence in `labels.jsonl`, kept or not; this copies the
labelled documents to a new folder and adds the named keys' answers at or above their new threshold
(documents with no field yet are taken from the OCR words folder), without running the model again.
Only lowers a threshold: fields already kept stay. The manifest does not record whether an answer
was cut at its slot budget, so an answer cut there is kept too (`pipkie label` drops it).
Used by rounds 34 and 35 (results/prereg-round34.md): the round-20 teacher's store names on more photos.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from pipkie.data.words import read_words
from pipkie.train.label import DOCS, doc_file_name, manifest_rows, write_doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labelled", type=Path, help="a `pipkie label` output folder (docs/ and labels.jsonl)")
    ap.add_argument("words", type=Path, help="the OCR words folder it was labelled from")
    ap.add_argument("out", type=Path, help="new folder (must not exist)")
    ap.add_argument("--min-confidence", required=True, help="key=threshold[,key=threshold], e.g. store_name=0.5")
    args = ap.parse_args()
    thresholds = {k: float(v) for k, v in (p.split("=") for p in args.min_confidence.split(","))}
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: give a new folder")
    shutil.copytree(args.labelled / DOCS, args.out / DOCS)
    for manifest in args.labelled.glob("labels*.jsonl"):  # every shard's, as `manifest_rows` reads them
        shutil.copy(manifest, args.out / manifest.name)
    docs = {d.id: d for d in read_words(args.words, "all")}
    added = dict.fromkeys(thresholds, 0)
    for row in manifest_rows(args.labelled):
        for key, t in thresholds.items():
            answer = row["answers"].get(key)
            if answer and answer[0] is not None and answer[1] >= t:
                write_doc(args.out / DOCS / doc_file_name(row["id"]), docs[row["id"]], {key: answer[0]})
                added[key] += 1
    n = len(list((args.out / DOCS).glob("*.json")))
    print(f"{n} documents; values of {', '.join(f'{k} at >= {t}: {added[k]}' for k, t in thresholds.items())}")


if __name__ == "__main__":
    main()
