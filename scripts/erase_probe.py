"""How often a model answers `unknown` when the value is not in the document: SROIE dev receipts
with one field's words erased (`pipkie.train.erase`), every SROIE key asked, the erased one scored.

    python scripts/erase_probe.py models/pipkie results/dev/erase-probe-r5.jsonl --keys address,total

Prints, per erased key, how many answered `unknown` of the receipts where the value could be
erased; writes one JSON line per (receipt, key) with the prediction. SROIE dev only (the split
carved from train): a diagnostic for choosing models, never a test split.
"""

from __future__ import annotations

import argparse
import json

import torch

from pipkie.data import read_dataset
from pipkie.decoding.pip import pip_decode
from pipkie.io.document import serialize
from pipkie.model.modeling import builder_for, load_model
from pipkie.schema import KeySchema
from pipkie.train.erase import erase_field

KEYS = "company,date,address,total"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", help="JSON lines: id, erased key, prediction")
    ap.add_argument("--keys", default=KEYS, help="the keys to erase, one at a time (default: all four)")
    ap.add_argument("--data-dir", default="../shared/data/sroie")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads: {torch.get_num_threads()}")
    docs = list(read_dataset("sroie", args.data_dir, "dev"))
    model, tok, settings = load_model(args.model, pad_vocab=True)
    builder = builder_for(tok, settings)
    schema = KeySchema.resolve(KEYS)
    summary = {}
    with open(args.out, "w", encoding="utf-8") as out, torch.inference_mode():
        for key in args.keys.split(","):
            n = unknown = 0
            for doc in docs:
                erased = erase_field(doc, key)
                if erased is None:
                    continue
                pred = pip_decode(model, builder, [serialize(erased)], [schema], pattern=settings.pattern)[0]
                value = pred[key].value
                n, unknown = n + 1, unknown + (value is None)
                out.write(json.dumps({"id": doc.id, "key": key, "pred": value}) + "\n")
            summary[key] = {"unknown": unknown, "erased": n}
            print(f"{key}: unknown {unknown} of {n}", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
