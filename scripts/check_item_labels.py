"""How good are `pipkie label --sum-to` item labels? Label a labelled dataset's words, score the kept runs.

    python scripts/check_item_labels.py prepare ../runs/wrdev-words          # WildReceipt dev, gold stripped
    pipkie label ../runs/wrdev-words --out ../runs/wrdev-label \
        --keys "subtotal:money,total:money,items[name,quantity,price:money]" --sum-to subtotal,total
    python scripts/check_item_labels.py score ../runs/wrdev-label

Prints, per receipt whose list was kept, the run kept and the amounts read, then item P/R/F1
(`pipkie.eval.metrics.ItemScores`) of the kept runs and of the same receipts' unchecked lists.

    pipkie label-items ../runs/wrdev-words --out ../runs/wrdev-sums       # arithmetic alone, no model
    python scripts/check_item_labels.py sums ../runs/wrdev-sums [--nospace]

Item P/R/F1 of the lists `pipkie label-items` found (`pipkie.train.sum_items`), and their lengths;
`--nospace`: names and prices compared without spaces (rapidocr's words have them, WildReceipt's
gold has none). For the words of the images: `prepare --ocr-cache ../runs/ocr/wrdev-cache`.
"""

import argparse
import json
from pathlib import Path

from pipkie.data import read_dataset
from pipkie.eval.gold import load_documents
from pipkie.eval.metrics import ItemScores
from pipkie.train.keys import document_items
from pipkie.train.label import manifest_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("prepare", "score", "sums"))
    p.add_argument("folder", type=Path, help="prepare: where the words go; score: pipkie label's --out")
    p.add_argument("--dataset", default="wildreceipt")
    p.add_argument("--data-dir", default="../shared/data/wildreceipt_dev")
    p.add_argument("--split", default="dev")
    p.add_argument("--ocr-cache", help="prepare: the words rapidocr read from the images (cached), not the dataset's")
    p.add_argument("--nospace", action="store_true", help="sums: compare without spaces")
    a = p.parse_args()
    if a.ocr_cache:
        docs, _ = load_documents(a.dataset, a.data_dir, a.split, ocr="rapidocr", ocr_cache=a.ocr_cache)
    else:
        docs = list(read_dataset(a.dataset, a.data_dir, a.split))
    if a.what == "prepare":
        a.folder.mkdir(parents=True, exist_ok=True)
        for d in docs:
            record = {**d.to_dict(), "normalized": True}
            record.pop("fields", None)
            (a.folder / f"{d.id.replace('/', '_')}.json").write_text(json.dumps(record, ensure_ascii=False))
        print(f"wrote {len(docs)} documents to {a.folder}")
        return
    gold = {d.id: document_items(d) for d in docs}
    if a.what == "sums":
        sums(a.folder, gold, a.nospace)
        return
    rows = manifest_rows(a.folder)
    fields = ("name", "quantity", "price")
    kept, unchecked = ItemScores(fields), ItemScores(fields)
    for r in rows:
        lists = [v for v in r["answers"].values() if isinstance(v, dict) and "kept" in v]
        if not lists or lists[0]["kept"] is None:
            continue
        start, end = lists[0]["kept"]
        items = lists[0]["items"]
        kept.add(items[start:end], gold[r["id"]])
        unchecked.add(items, gold[r["id"]])
        amounts = {k: v for k, v in r["answers"].items() if not isinstance(v, dict)}
        print(f"{r['id']}: kept items {start}-{end - 1} of {len(items)}, gold {len(gold[r['id']])}, read {amounts}")
    for name, s in (("kept runs", kept), ("same receipts, unchecked lists", unchecked)):
        m = s.summary()
        print(
            f"{name}: {s.n_docs} of {len(rows)} receipts, item F1 {100 * m['f1']:.1f} "
            f"(P {100 * m['precision']:.1f}, R {100 * m['recall']:.1f}; {m['tp']} of {m['n_pred']} items)"
        )


def sums(folder: Path, gold: dict, nospace: bool) -> None:
    squeeze = (lambda v: v.replace(" ", "") if v else v) if nospace else (lambda v: v)
    scores, lengths = ItemScores(("name", "quantity", "price")), []
    for d in read_dataset("words", folder, "docs"):
        items = [{k: squeeze(v) for k, v in it.items()} for it in document_items(d)]
        scores.add(items, [{k: squeeze(v) for k, v in it.items()} for it in gold[d.id]])
        lengths.append(len(items))
    m = scores.summary()
    print(
        f"lists that add up: {len(lengths)} of {len(gold)} receipts, {sum(lengths)} items "
        f"({sum(lengths) / max(1, len(lengths)):.1f} per list), item F1 {100 * m['f1']:.1f} "
        f"(P {100 * m['precision']:.1f}, R {100 * m['recall']:.1f}); ANLS of matched fields "
        + ", ".join(f"{k} {100 * v:.1f}" for k, v in m["per_field"].items())
    )


if __name__ == "__main__":
    main()
