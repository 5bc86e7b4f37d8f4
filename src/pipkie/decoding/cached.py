"""PIP over a cached document: encode a document once (a plain causal pass, its KV cache kept),
then fill any number of key sets' templates on top of it, each costing its template alone.

Valid for `prefix_causal` attention, where the document never sees the template, so its keys and
values are those of a plain causal pass (`pipkie.model.attention`). Same predictions as
`pip_decode` on the whole input (tests/test_copyhead.py, tests/test_attention.py, tests/test_items.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from pipkie.decoding.pip import _block_ids, _slot_mask, final_hidden, lm_logits, pip_hidden, predict_slots
from pipkie.decoding.results import collect
from pipkie.model.copyhead import get_head
from pipkie.model.template import Encoded, TemplateBuilder
from pipkie.schema import KeySchema


@dataclass
class DocumentCache:
    cache: DynamicCache
    length: int
    truncated: int
    ids: list[int] = field(default_factory=list)  # instruction + document + <|pip_answer|>
    hidden: torch.Tensor | None = None  # (1, length, H) final hidden states, kept for a copy head
    seam: tuple[int, int] | None = None  # the cut marker's positions (a document cut to fit)


@torch.inference_mode()
def encode_document(model, builder: TemplateBuilder, text: str, reserve: int = 512) -> DocumentCache:
    """Plain causal pass over instruction + document + <|pip_answer|>; `reserve` tokens are kept free
    for the templates that follow."""
    fit = builder.fit(text, reserve)
    ids = fit.ids
    cache = DynamicCache(config=model.config)
    x = torch.tensor([ids])
    h = final_hidden(model, x, torch.ones_like(x), torch.arange(len(ids))[None], cache)
    return DocumentCache(cache, len(ids), fit.cut, ids, h if get_head(model) is not None else None, fit.seam)


@torch.inference_mode()
def pip_decode_cached(
    model, builder: TemplateBuilder, doc: DocumentCache, schema: KeySchema, *, return_logits: bool = False
):
    """PIP over a cached document: only the template block runs (prefix_causal attention). The cache
    is cropped back to the document afterwards, so it can serve the next key set."""
    if builder.template_length(schema) + doc.length > builder.max_length:
        raise ValueError("the template does not fit after the cached document (encode it with a larger reserve)")
    ids, slots, _, blocks = builder.pip_block(schema, offset=doc.length)
    enc = Encoded(doc.ids + ids, prefix_len=doc.length, fields=slots, blocks=blocks, seam=doc.seam)
    x = torch.tensor([ids])
    attn = torch.ones((1, doc.length + len(ids)), dtype=torch.long)
    block = _block_ids([enc], attn.shape[1])
    keep = _slot_mask([enc], attn.shape[1])[:, doc.length :]
    try:
        h = pip_hidden(
            model, x, attn, block, pattern="prefix_causal", cache=doc.cache, start=torch.tensor([doc.length])
        )
    finally:
        doc.cache.crop(doc.length - doc.cache.get_seq_length())  # negative: drop the template block
    if return_logits:
        return lm_logits(model, h[keep])
    hidden = torch.cat([doc.hidden, h], dim=1) if doc.hidden is not None else h
    conf, toks = predict_slots(model, builder, [enc], hidden, h[keep], [0])
    return collect(builder, [enc], toks.tolist(), conf.tolist(), [schema])[0]
