"""Decoding: PIP (one forward pass, optional Mask-Predict refinement) and the AR baselines.

All decoders take a batch of (document text, KeySchema) and return, per document, a dict
key -> `FieldResult(value, confidence, tokens)`; `value` is None for a missing field (`unknown`).

Confidence is the geometric mean of the chosen tokens' probabilities over the value's tokens and
the token that closes it (`<|pip_end|>`), i.e. exp(mean log p): 1.0 when every token was certain.

Batches are left-padded; position ids are given explicitly (count of real tokens so far), and the
attention mask is always explicit (transformers would otherwise guess packed sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from pipkie.attention import build_attention_mask
from pipkie.copyhead import FieldSpan, field_probs, get_head
from pipkie.schema import KeySchema
from pipkie.template import Encoded, TemplateBuilder


@dataclass
class FieldResult:
    value: str | None
    confidence: float
    tokens: list[int] = field(default_factory=list)


Prediction = dict[str, FieldResult]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention) of shape (batch, longest), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            attn[i, width - len(s):] = 1
    return ids, attn


def positions(attn: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """Position of each token = number of real tokens before it (+ start); pads repeat a neighbour."""
    pos = attn.cumsum(-1) - 1
    if start is not None:
        pos = pos + start[:, None]
    return pos.clamp(min=0)


def _geo_mean(probs: list[float]) -> float:
    if not probs:
        return 0.0
    return float(torch.tensor(probs).clamp_min(1e-12).log().mean().exp())


def _field_result(builder: TemplateBuilder, toks: list[int], probs: list[float]) -> FieldResult:
    n = next((i + 1 for i, t in enumerate(toks) if t == builder.end_id), len(toks))  # value + its end token
    return FieldResult(builder.decode_value(toks), _geo_mean(probs[:n]), toks[:n])


# ---------------------------------------------------------------------------------------------
# PIP
# ---------------------------------------------------------------------------------------------
def pip_forward(model, ids, attn, block_ids, keep, *, pattern: str, cache=None, start=None, hidden: bool = False,
                **model_inputs):
    """One forward pass; logits only at `keep` positions → (number kept, vocab), and with `hidden`
    the final hidden states (batch, length, H) too.

    model_inputs go to the model (a vision-language model's pixel_values, image_grid_thw…); its
    3D M-RoPE position ids are computed here (`rope_positions`), while the mask builder keeps the
    plain 2D positions."""
    pos = positions(attn[:, -ids.shape[1]:], start)
    mask = build_attention_mask(model, pattern, attn, query_length=ids.shape[1], block_ids=block_ids,
                                cache=cache, position_ids=pos)
    rope = rope_positions(model, ids, attn, model_inputs) if cache is None else pos
    out = model(input_ids=ids, attention_mask=mask, position_ids=rope, cache=cache,
                use_cache=cache is not None, logits_to_keep=keep, output_hidden_states=hidden, **model_inputs)
    logits = out.logits.reshape(-1, out.logits.shape[-1]).float()
    return (logits, out.hidden_states[-1]) if hidden else logits


def mix_copy(model, builder: TemplateBuilder, encs: list[Encoded], logits: torch.Tensor, hidden: torch.Tensor,
             offsets: list[int], images=None) -> torch.Tensor:
    """(number of slots, vocab): the copy head's generate/copy mixture (pipkie.copyhead) of each slot,
    written over `logits` (float32, consumed). hidden: (batch, width, H); offsets[r]: where row r's
    input_ids[0] sits in that width."""
    head = get_head(model)
    i = 0
    for r, e in enumerate(encs):
        start, end = builder.document_span(e.prefix_len, images[r] if images else None)
        stream = torch.tensor(builder.copy_stream(e.input_ids, start, end), dtype=torch.long)
        stream_ids = torch.tensor(e.input_ids, dtype=torch.long)[stream]
        for f in e.fields:
            span = FieldSpan(row=r, slots=torch.arange(f.start, f.start + f.length) + offsets[r],
                             stream=stream + offsets[r], stream_ids=stream_ids, end_id=builder.end_id)
            rows = logits[i: i + f.length]
            rows.copy_(field_probs(head, hidden, rows, span))  # over the logits: no second (slots, vocab) matrix
            i += f.length
    return logits


class OnePass:
    """PIP's forward pass over whole inputs (document + template, left-padded) in one call."""

    def __init__(self, model, builder, encs, *, pattern, images=None, model_inputs=None):
        self.model, self.builder, self.encs, self.pattern, self.images = model, builder, encs, pattern, images
        self.model_inputs = dict(model_inputs or {})
        self.ids, self.attn = left_pad([e.input_ids for e in encs], builder.pad_id)
        width = self.ids.shape[1]
        self.keep, self.block = _slot_mask(encs, width), _block_ids(encs, width)
        self.offsets = [width - len(e.input_ids) for e in encs]

    def slot_inputs(self) -> torch.Tensor:
        return self.ids[self.keep]

    def _forward(self, ids, copy: bool):
        return pip_forward(self.model, ids, self.attn, self.block, self.keep, pattern=self.pattern, hidden=copy,
                           **self.model_inputs)

    def __call__(self, slot_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """(number of slots, vocab) probabilities; slot_inputs replaces the slots' input tokens."""
        ids = self.ids
        if slot_inputs is not None:
            ids = ids.clone()
            ids[self.keep] = slot_inputs
        if get_head(self.model) is None:
            return self._forward(ids, False).softmax(-1)
        logits, hidden = self._forward(ids, True)
        return mix_copy(self.model, self.builder, self.encs, logits, hidden, self.offsets, self.images)


class SplitPass(OnePass):
    """The same computation in two calls, for `prefix_causal` attention (the document never sees the
    template): the causal prefixes once, with the plain causal kernel and a KV cache, then the
    templates on top of the cache (and again for each refinement pass). Every token is still
    processed once; the prefix runs as fast as any causal forward pass (`pipkie bench`'s floor).
    Prefixes are left-padded to width P, templates right-padded after them."""

    def __init__(self, model, builder, encs, *, pattern="prefix_causal", images=None, model_inputs=None):
        self.model, self.builder, self.encs, self.pattern, self.images = model, builder, encs, pattern, images
        self.model_inputs = {}
        ids1, attn1 = left_pad([e.input_ids[: e.prefix_len] for e in encs], builder.pad_id)
        self.P = P = ids1.shape[1]
        self.cache = DynamicCache(config=model.config)
        copy = get_head(model) is not None
        out = model(input_ids=ids1, attention_mask=attn1, position_ids=positions(attn1), cache=self.cache,
                    use_cache=True, logits_to_keep=1, output_hidden_states=copy)
        self.h1 = out.hidden_states[-1] if copy else None
        tails = [e.input_ids[e.prefix_len:] for e in encs]
        T = max(len(t) for t in tails)
        self.ids = torch.full((len(encs), T), builder.pad_id, dtype=torch.long)
        attn2 = torch.zeros((len(encs), T), dtype=torch.long)
        self.block = torch.zeros((len(encs), P + T), dtype=torch.long)
        self.keep = torch.zeros((len(encs), T), dtype=torch.bool)
        for i, (e, t) in enumerate(zip(encs, tails)):
            self.ids[i, : len(t)], attn2[i, : len(t)] = torch.tensor(t), 1
            self.block[i, P: P + len(e.blocks)] = torch.tensor(e.blocks)
            for f in e.fields:
                self.keep[i, f.start - e.prefix_len: f.start - e.prefix_len + f.length] = True
        self.attn = torch.cat([attn1, attn2], dim=1)
        self.pos = attn1.sum(-1, keepdim=True) + torch.arange(T)[None]  # continues each prefix's count
        self.offsets = [P - e.prefix_len for e in encs]

    def _forward(self, ids, copy: bool):
        mask = build_attention_mask(self.model, self.pattern, self.attn, query_length=ids.shape[1],
                                    block_ids=self.block, cache=self.cache, position_ids=self.pos)
        try:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=self.pos, cache=self.cache,
                             use_cache=True, logits_to_keep=self.keep, output_hidden_states=copy)
        finally:
            self.cache.crop(self.P - self.cache.get_seq_length())  # negative: back to the prefixes
        logits = out.logits.reshape(-1, out.logits.shape[-1]).float()
        return (logits, torch.cat([self.h1, out.hidden_states[-1]], dim=1)) if copy else logits


def rope_positions(model, ids, attn, model_inputs: dict) -> torch.Tensor:
    """Position ids for the model: 3D (M-RoPE) ones from `get_rope_index` for Qwen2-VL-style models
    given an image, else the usual count of real tokens."""
    inner = getattr(model, "model", None)
    if "image_grid_thw" not in model_inputs or not hasattr(inner, "get_rope_index"):
        return positions(attn)
    mm = (ids == model.config.image_token_id).int()
    model_inputs.setdefault("mm_token_type_ids", mm)
    pos, _ = inner.get_rope_index(ids, mm, image_grid_thw=model_inputs["image_grid_thw"], attention_mask=attn)
    return pos


def _block_ids(encs: list[Encoded], width: int) -> torch.Tensor:
    """0 over padding and prefix, the template's block ids after it (right-aligned like the ids)."""
    block = torch.zeros((len(encs), width), dtype=torch.long)
    for i, e in enumerate(encs):
        block[i, width - len(e.blocks):] = torch.tensor(e.blocks)
    return block


def _slot_mask(encs: list[Encoded], width: int) -> torch.Tensor:
    keep = torch.zeros((len(encs), width), dtype=torch.bool)
    for i, e in enumerate(encs):
        off = width - len(e.input_ids)
        for f in e.fields:
            keep[i, off + f.start: off + f.start + f.length] = True
    return keep


@torch.inference_mode()
def pip_decode(model, builder: TemplateBuilder, texts: list[str], schemas: list[KeySchema], *,
               pattern: str = "prefix_causal", refine_steps: int = 0, images: list[list[int]] | None = None,
               model_inputs: dict | None = None, split: bool | None = None) -> list[Prediction]:
    """Fill every mask slot of every document in one forward pass (+ `refine_steps` passes).

    `split` (default: whenever the pattern is prefix_causal and there is no image) runs the same pass
    as prefix, then template (`SplitPass`); otherwise the whole input goes through at once (`OnePass`).

    For a vision-language model, `images` gives each document's image placeholder tokens (placed
    after the instruction) and `model_inputs` the pixel inputs (pixel_values, image_grid_thw)."""
    encs = [builder.pip(t, s, image=(images[i] if images else None)) for i, (t, s) in enumerate(zip(texts, schemas))]
    if split is None:
        split = pattern == "prefix_causal" and not images and not model_inputs
    run = (SplitPass if split else OnePass)(model, builder, encs, pattern=pattern, images=images,
                                            model_inputs=model_inputs)
    conf, toks = run().max(-1)
    inputs = run.slot_inputs()
    rows = run.keep.nonzero()[:, 0]  # batch row of each slot, in the same order as the logits
    for step in range(1, refine_steps + 1):
        # Mask-Predict: re-mask the least confident (refine_steps - step + 1)/(refine_steps + 1) of
        # each row's slots, keep the rest as predicted, and predict the re-masked ones again.
        remask = torch.zeros_like(conf, dtype=torch.bool)
        for r in range(len(encs)):
            idx = (rows == r).nonzero()[:, 0]
            n = len(idx) * (refine_steps - step + 1) // (refine_steps + 1)
            if n:
                remask[idx[conf[idx].argsort()[:n]]] = True
        if not remask.any():
            break
        # re-masked slots get their mask input back, the others their prediction
        new_conf, new_toks = run(torch.where(remask, inputs, toks)).max(-1)
        conf = torch.where(remask, new_conf, conf)
        toks = torch.where(remask, new_toks, toks)
    return _collect(builder, encs, toks.tolist(), conf.tolist())


def _collect(builder, encs, toks: list[int], conf: list[float]) -> list[Prediction]:
    out, i = [], 0
    for e in encs:
        pred = {}
        for f in e.fields:
            pred[f.key] = _field_result(builder, toks[i: i + f.length], conf[i: i + f.length])
            i += f.length
        out.append(pred)
    return out


# ---- the cached-prefix route: encode a document once, then any number of key sets -------------
@dataclass
class DocumentCache:
    cache: DynamicCache
    length: int
    truncated: int
    ids: list[int] = field(default_factory=list)  # instruction + document + <|pip_answer|>
    hidden: torch.Tensor | None = None  # (1, length, H) final hidden states, kept for a copy head


@torch.inference_mode()
def encode_document(model, builder: TemplateBuilder, text: str, reserve: int = 512) -> DocumentCache:
    """Plain causal pass over instruction + document + <|pip_answer|>; `reserve` tokens are kept free
    for the templates that follow."""
    ids, cut = builder.prefix(text, reserve)
    cache = DynamicCache(config=model.config)
    x = torch.tensor([ids])
    copy = get_head(model) is not None
    out = model(input_ids=x, attention_mask=torch.ones_like(x), position_ids=torch.arange(len(ids))[None],
                cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=copy)
    return DocumentCache(cache, len(ids), cut, ids, out.hidden_states[-1] if copy else None)


@torch.inference_mode()
def pip_decode_cached(model, builder: TemplateBuilder, doc: DocumentCache, schema: KeySchema, *,
                      return_logits: bool = False):
    """PIP over a cached document: only the template block runs (prefix_causal attention). The cache
    is cropped back to the document afterwards, so it can serve the next key set."""
    if builder.template_length(schema) + doc.length > builder.max_length:
        raise ValueError("the template does not fit after the cached document (encode it with a larger reserve)")
    ids, slots, _, blocks = builder.pip_block(schema, offset=doc.length)
    enc = Encoded(doc.ids + ids, prefix_len=doc.length, fields=slots, blocks=blocks)
    x = torch.tensor([ids])
    attn = torch.ones((1, doc.length + len(ids)), dtype=torch.long)
    block = _block_ids([enc], attn.shape[1])
    keep = _slot_mask([enc], attn.shape[1])[:, doc.length:]
    copy = get_head(model) is not None and not return_logits
    try:
        out = pip_forward(model, x, attn, block, keep, pattern="prefix_causal", cache=doc.cache,
                          start=torch.tensor([doc.length]), hidden=copy)
    finally:
        doc.cache.crop(doc.length - doc.cache.get_seq_length())  # negative: drop the template block
    if return_logits:
        return out
    if copy:
        logits, hidden = out
        probs = mix_copy(model, builder, [enc], logits, torch.cat([doc.hidden, hidden], dim=1), [0])
    else:
        probs = out.softmax(-1)
    conf, toks = probs.max(-1)
    return _collect(builder, [enc], toks.tolist(), conf.tolist())[0]
