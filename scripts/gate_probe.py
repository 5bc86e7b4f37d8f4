"""What the copy head does at a value's first slot on WildReceipt dev, per SROIE key, for receipts
with and without the key: the gate (weight of the LM head against the copy), the LM head's
probability of ` unknown`, the mixture's, and the copy's likeliest start.

    python scripts/gate_probe.py models/pipkie OUT.jsonl     # then summarise OUT.jsonl per key

Session 13, shipped round 5: the gate is ~0.01 whether the key is there or not, so `unknown`
(which only the LM head can write) never wins the first slot."""

import json
import sys

import torch

from pipkie.decoding.pip import OnePass
from pipkie.decoding.slot_head import lm_logits, mixture
from pipkie.eval.gold import load_documents
from pipkie.io.document import serialize as _ser  # noqa: N813
from pipkie.model.copyhead import FieldSpan, get_head, start_gate_past, stream_keys
from pipkie.model.modeling import builder_for, load_model
from pipkie.schema import KeySchema

torch.set_num_threads(2)  # printed: benchmarks and probes state their threads
print(f"threads: {torch.get_num_threads()}")
docs, _ = load_documents("wildreceipt", "../shared/data/wildreceipt_dev", "dev")
model, tok, settings = load_model(sys.argv[1] if len(sys.argv) > 1 else "models/pipkie", pad_vocab=True)
b = builder_for(tok, settings)
keymap = {"company": "store_name", "address": "store_addr", "date": "date", "total": "total"}
schema = KeySchema.resolve("company,date,address,total")
unk = b._ids(" unknown")[0]
head = get_head(model)
out = open(sys.argv[2] if len(sys.argv) > 2 else "gate_probe.jsonl", "w")
with torch.inference_mode():
    for d in docs:
        run = OnePass(model, b, [b.pip(_ser(d), schema)], pattern=settings.pattern)
        h, slots = run._hidden(run.ids)
        e = run.encs[0]
        start, end = b.document_span(e.prefix_len, None)
        stream = torch.tensor(b.copy_stream(e.input_ids, start, end, e.seam), dtype=torch.long)
        sids = torch.tensor(e.input_ids)[stream]
        keys = stream_keys(head, h[0], stream + run.offsets[0])
        row = {"id": d.id}
        for f in e.fields:
            span = FieldSpan(
                row=0,
                slots=torch.arange(f.start, f.start + f.length) + run.offsets[0],
                stream=stream + run.offsets[0],
                stream_ids=sids,
                end_id=b.end_id,
                keys=keys,
            )
            p, g, past = start_gate_past(head, h, span)
            lg = lm_logits(model, h[0, f.start + run.offsets[0]][None])
            mix = mixture(lg, p, g, past, span)[0]
            lmp = lg.float().softmax(-1)[0]
            gold = d.fields.get(keymap[f.key])
            row[f.key] = dict(
                gold=bool(gold),
                gate0=float(g[0]),
                lm_unk=float(lmp[unk]),
                mix_unk=float(mix[unk]),
                mix_top=float(mix.max()),
                pmax=float(p.max()),
            )
        out.write(json.dumps(row) + "\n")
        out.flush()
