"""How good are `pipkie label --sum-to` item labels? Label a labelled dataset's words, score the kept runs.

    python scripts/check_item_labels.py prepare ../runs/wrdev-words          # WildReceipt dev, gold stripped
    pipkie label ../runs/wrdev-words --out ../runs/wrdev-label \
        --keys "subtotal:money,total:money,items[name,quantity,price:money]" --sum-to subtotal,total
    python scripts/check_item_labels.py score ../runs/wrdev-label

Prints, per receipt whose list was kept, the run kept and the amounts read, then item P/R/F1
(`pipkie.eval.metrics.ItemScores`) of the kept runs and of the same receipts' unchecked lists.
"""

import argparse
import json
from pathlib import Path

from pipkie.data import read_dataset
from pipkie.eval.metrics import ItemScores
from pipkie.train.keys import document_items
from pipkie.train.label import manifest_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("prepare", "score"))
    p.add_argument("folder", type=Path, help="prepare: where the words go; score: pipkie label's --out")
    p.add_argument("--dataset", default="wildreceipt")
    p.add_argument("--data-dir", default="../shared/data/wildreceipt_dev")
    p.add_argument("--split", default="dev")
    a = p.parse_args()
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


if __name__ == "__main__":
    main()
