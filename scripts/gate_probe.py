"""What the copy head does at a value's first slot on WildReceipt dev, per SROIE key, for receipts
with and without the key: the gate (weight of the LM head against the copy), the absent score's
p_absent (past at slot 0), the LM head's probability of ` unknown`, the mixture's, and the copy's
likeliest start.

    python scripts/gate_probe.py models/pipkie OUT.jsonl [--threads 2]

Prints, per key, the median of each number for receipts with and without the key; writes one JSON
line per receipt. Session 13, shipped round 5: the gate is ~0.01 whether the key is there or not,
so `unknown` (which only the LM head could write then) never won the first slot."""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from pipkie.decoding.pip import OnePass
from pipkie.decoding.slot_head import lm_logits, mixture
from pipkie.eval.gold import load_documents
from pipkie.io.document import serialize
from pipkie.model.copyhead import FieldSpan, get_head, start_gate_past, stream_keys
from pipkie.model.modeling import builder_for, load_model
from pipkie.schema import KeySchema

KEYMAP = {"company": "store_name", "address": "store_addr", "date": "date", "total": "total"}
NUMBERS = ("gate0", "absent", "lm_unk", "mix_unk", "pmax", "lse")


def probe(model, builder, settings, doc, schema) -> dict:
    """One receipt → {key: {gold, gate0, absent, lm_unk, mix_unk, mix_top, pmax, lse}}."""
    head = get_head(model)
    run = OnePass(model, builder, [builder.pip(serialize(doc), schema)], pattern=settings.pattern)
    h, _ = run._hidden(run.ids)
    e, off = run.encs[0], run.offsets[0]
    start, end = builder.document_span(e.prefix_len, None)
    stream = torch.tensor(builder.copy_stream(e.input_ids, start, end, e.seam), dtype=torch.long)
    sids = torch.tensor(e.input_ids)[stream]
    keys = stream_keys(head, h[0], stream + off)
    row = {"id": doc.id}
    for f in e.fields:
        slots = torch.arange(f.start, f.start + f.length) + off
        span = FieldSpan(0, slots, stream + off, sids, builder.end_id, keys=keys, absent_id=builder.unknown_id)
        p, g, past = start_gate_past(head, h, span)
        scores = head.span_logits(h[0, slots[0]], keys)[0]
        lg = lm_logits(model, h[0, slots[0]][None])
        lmp = lg.float().softmax(-1)[0]
        mix = mixture(lg, p, g, past, span)[0]
        row[f.key] = dict(
            gold=bool(doc.fields.get(KEYMAP[f.key])),
            gate0=float(g[0]),
            absent=float(past[0]),
            lm_unk=float(lmp[builder.unknown_id]),
            mix_unk=float(mix[builder.unknown_id]),
            mix_top=float(mix.max()),
            pmax=float(p.max()),
            lse=float(scores.logsumexp(-1)),  # what the absent score competes with
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="models/pipkie")
    ap.add_argument("out", nargs="?", default="gate_probe.jsonl")
    ap.add_argument("--data-dir", default="../shared/data/wildreceipt_dev")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads: {torch.get_num_threads()}")
    docs, _ = load_documents("wildreceipt", args.data_dir, "dev")
    model, tok, settings = load_model(args.model, pad_vocab=True)
    builder = builder_for(tok, settings)
    schema = KeySchema.resolve(",".join(KEYMAP))
    rows = []
    with torch.inference_mode(), open(args.out, "w") as out:
        for d in docs:
            rows.append(probe(model, builder, settings, d, schema))
            out.write(json.dumps(rows[-1]) + "\n")
            out.flush()
    for k in KEYMAP:
        for gold in (True, False):
            sel = [r[k] for r in rows if r[k]["gold"] == gold]
            if sel:
                med = ", ".join(f"{n} {statistics.median(x[n] for x in sel):.3f}" for n in NUMBERS)
                print(f"{k:8s} {'present' if gold else 'absent ':8s} n={len(sel):3d}  {med}")


if __name__ == "__main__":
    main()
