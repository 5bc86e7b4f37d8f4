"""The PIP decoder: one forward pass over the answer template, optional Mask-Predict refinement.

Every decoder (this one and `pipkie.decoding.ar`) takes a batch of (document text, KeySchema) and
returns, per document, a dict key -> `FieldResult(value, confidence, tokens)`; `value` is None for
a missing field (`unknown`). A list of the schema (`pipkie.model.groups`) maps to an `ItemsResult`:
its items, each a dict field -> FieldResult, in document order (`.value`: the list of {field: value}).

Confidence is the geometric mean of the chosen tokens' probabilities over the value's tokens and
the token that closes it (`<|pip_end|>`), i.e. exp(mean log p): 1.0 when every token was certain.
A value that fills its whole budget (no end token inside it) may have been cut: `truncated`.

Batches are left-padded; position ids are given explicitly (count of real tokens so far), and the
attention mask is always explicit (transformers would otherwise guess packed sequences).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from pipkie.decoding.base import Decoder
from pipkie.decoding.items import ItemPlacer, put_copied, read_on, stream_lines
from pipkie.decoding.results import Prediction, collect
from pipkie.decoding.slot_head import choose, lm_logits
from pipkie.decoding.types import is_typed, typed_start
from pipkie.model.attention import build_attention_mask, causal_rows, template_chunks, template_start
from pipkie.model.copyhead import FieldSpan, copy_distributions, get_head, start_gate_past, stream_keys
from pipkie.model.template import Encoded, TemplateBuilder
from pipkie.schema import KeySchema


@dataclass
class CopyTrace:
    """What the copy head computed for one field (`pip_decode(trace=...)`): where its value starts."""

    key: str
    stream: list[int]  # input positions of the copy stream (document tokens without line breaks)
    p_start: list[float]  # the start distribution over those positions
    gate: list[float]  # per slot: weight of the LM head against the copy (1 = generate)
    past: list[float]  # per slot: probability that the value has ended before it


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention) of shape (batch, longest), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            attn[i, width - len(s) :] = 1
    return ids, attn


def positions(attn: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """Position of each token = number of real tokens before it (+ start); pads repeat a neighbour."""
    pos = attn.cumsum(-1) - 1
    if start is not None:
        pos = pos + start[:, None]
    return pos.clamp(min=0)


# ---------------------------------------------------------------------------------------------
# PIP
# ---------------------------------------------------------------------------------------------
def final_hidden(model, ids, attention_mask, position_ids, cache=None, **model_inputs) -> torch.Tensor:
    """(batch, length, H) the model's final hidden states (after its last norm: the LM head's input),
    from its decoder alone: no logits, and no per-layer states kept (`output_hidden_states` would keep
    all of them, 30 × (batch, length, H) for SmolLM2)."""
    decoder = getattr(model, model.base_model_prefix)
    out = decoder(
        input_ids=ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=cache is not None,
        **model_inputs,
    )
    return out.last_hidden_state


def pip_hidden(model, ids, attn, block_ids, *, pattern: str, cache=None, start=None, **model_inputs):
    """One forward pass under PIP's attention pattern -> (batch, length, H) final hidden states.

    model_inputs go to the model (a vision-language model's pixel_values, image_grid_thw…); its
    3D M-RoPE position ids are computed here (`rope_positions`), while the mask builder keeps the
    plain 2D positions."""
    pos = positions(attn[:, -ids.shape[1] :], start)
    mask = build_attention_mask(
        model, pattern, attn, query_length=ids.shape[1], block_ids=block_ids, cache=cache, position_ids=pos
    )
    rope = rope_positions(model, ids, attn, model_inputs) if cache is None else pos
    c = causal_rows(model, pattern, attn, block_ids, cache)
    chunks = template_chunks(mask, c or template_start(model, pattern, block_ids, cache))
    if c or chunks:  # the prefix rows on the causal kernel, the template's run by run (pipkie.model.attention)
        model_inputs = {**model_inputs, "pip_causal_rows": c, "pip_row_chunks": chunks}
    return final_hidden(model, ids, mask, rope, cache, **model_inputs)


def pip_forward(
    model, ids, attn, block_ids, keep, *, pattern: str, cache=None, start=None, hidden: bool = False, **model_inputs
):
    """`pip_hidden` + the LM head at the `keep` positions → logits (number kept, vocab), and with
    `hidden` the final hidden states (batch, length, H) too."""
    h = pip_hidden(model, ids, attn, block_ids, pattern=pattern, cache=cache, start=start, **model_inputs)
    logits = lm_logits(model, h[keep])
    return (logits, h) if hidden else logits


def predict_slots(
    model,
    builder: TemplateBuilder,
    encs: list[Encoded],
    hidden: torch.Tensor,
    slot_hidden,
    offsets: list[int],
    images=None,
    *,
    lazy: bool = True,
    trace: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) of every slot, (number of slots,) each, in the order of `slot_hidden`
    (number of slots, H). hidden: (batch, width, H); offsets[r]: where row r's input_ids[0] sits in
    that width. Without a copy head: the LM head's argmax. With one: the argmax of the copy head's
    generate/copy mixture (pipkie.model.copyhead).

    `lazy`: a field's slots from its first one with past_j > 0.5 on are `<|pip_end|>` whatever the
    LM head says (see `copyhead.start_gate_past`), and nothing after a value's end token reaches
    the result, so the LM head runs only on the slots up to that one (on SROIE, half of them: a
    tenth of the pass is the LM head). The skipped slots get `<|pip_end|>` with confidence past_j, a
    lower bound; refinement, which ranks all slots by confidence, asks for every slot (lazy=False).

    `trace`: a list that receives, per row, {key: CopyTrace} (positions in that row's input_ids);
    rows stay empty without a copy head."""
    head = get_head(model)
    if head is None:
        if trace is not None:
            trace[:] = [{} for _ in encs]
        return lm_logits(model, slot_hidden).softmax(-1).max(-1)
    # `total`: where a field's answer starts in the returned arrays (`FieldSlots.width` each);
    # `phys`: where its slots start in `slot_hidden` (`FieldSlots.length` each; the same but for span fields)
    fields, need, spans, typed, total, phys = [], [], [], [], 0, 0
    if trace is not None:
        trace[:] = []
    for r, e in enumerate(encs):
        start, end = builder.document_span(e.prefix_len, images[r] if images else None)
        stream = torch.tensor(builder.copy_stream(e.input_ids, start, end, e.seam), dtype=torch.long)
        stream_ids = torch.tensor(e.input_ids, dtype=torch.long)[stream]
        keys = stream_keys(head, hidden[r], stream + offsets[r])  # (M, d), shared by the row's fields
        if trace is not None:
            trace.append({})
        lists = any(f.group for f in e.fields)
        placer = ItemPlacer(stream, stream_ids, builder.space_ids, builder.blank_ids) if lists else None
        lines = placer.lines if placer is not None else None  # the row's line numbers, once (typed keys)
        for f in e.fields:
            span = FieldSpan(
                row=r,
                slots=torch.arange(f.start, f.start + f.length) + offsets[r],
                stream=stream + offsets[r],
                stream_ids=stream_ids,
                end_id=builder.end_id,
                keys=keys,
                absent_id=builder.unknown_id if f.may_be_absent else -1,
                span=f.span,
            )
            place = None
            if f.group is None:
                p_start, gate, past = start_gate_past(head, hidden, span)
            else:  # a list's field: where it may start depends on the items before it (decoding.items)
                p_start, gate, past, p_len = copy_distributions(head, hidden, span, placer.allow(f))
                place = placer.place(f, p_start, p_len)
            if trace is not None:
                trace[-1][f.key] = CopyTrace(f.key, stream.tolist(), p_start.tolist(), gate.tolist(), past.tolist())
            ended = (past > 0.5).nonzero()
            n = min(int(ended[0]) + 1, f.length) if lazy and len(ended) else f.length
            fields.append((total, n, span, p_start, gate, past))
            if place is not None:
                spans.append((total, f.width, place, gate, placer, f))
            if f.type is not None:
                lines = stream_lines(stream) if lines is None else lines
                typed.append((total, f.width, f.type, p_start, stream_ids, lines, f.group is not None))
            need.append(torch.arange(phys, phys + n))
            total, phys = total + f.width, phys + f.length
    chosen = choose(model, slot_hidden[torch.cat(need)], [(n, span, p, g, past) for _, n, span, p, g, past in fields])
    conf = torch.empty(total, device=slot_hidden.device)
    toks = torch.full((total,), builder.end_id, dtype=torch.long, device=slot_hidden.device)
    j = 0
    for i, n, _, _, _, past in fields:
        conf[i : i + len(past)] = past  # skipped slots: <|pip_end|> with p >= past
        conf[i : i + n], toks[i : i + n] = chosen[0][j : j + n], chosen[1][j : j + n]
        j += n
    read_on(toks, conf, spans, builder.end_id)
    for i, k, place, gate, placer, _ in spans:
        placer.write_span(toks, conf, i, k, place, gate, builder.end_id)
    for i, k, kind, p_start, stream_ids, lines, in_list in typed:
        retype(builder, toks, conf, i, k, kind, p_start, stream_ids, lines, in_list)
    return conf, toks


def retype(builder, toks, conf, i: int, k: int, kind: str, p_start, stream_ids, lines, in_list: bool = False) -> bool:
    """A typed field's k slots from i (in place): a value not of its type becomes the copy head's
    likeliest start where one begins (`decoding.types.typed_start`; a list's field searches only
    where `decoding.items` let it start: its item's line), or `unknown` when none of its top starts
    has one; the confidence is that start's probability (`items.put_copied`). A list's field writes
    `unknown` out (an empty column), since `<|pip_end|>` in a first field would end the list. True
    when the slots changed."""
    value = builder.decode_value(toks[i : i + k].tolist())
    if value is None or is_typed(kind, value):
        return False
    found = typed_start(kind, builder.tok.decode, stream_ids, lines, p_start)
    if found is None:  # unknown, as sure as the copy head was that no start is the value's
        toks[i : i + k] = builder.end_id
        if in_list:
            unknown = builder.value_ids(None, k - 1)
            toks[i : i + len(unknown)] = torch.tensor(unknown, dtype=toks.dtype)
        conf[i : i + k] = 1.0 - float(p_start.max()) if len(p_start) else 1.0
        return True
    m, n, prob = found
    put_copied(toks, conf, i, k, stream_ids[m : m + n], prob, builder.end_id)
    return True


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

    def _hidden(self, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(whole rows' hidden states (batch, width, H), the slots' (number of slots, H))."""
        h = pip_hidden(self.model, ids, self.attn, self.block, pattern=self.pattern, **self.model_inputs)
        return h, h[self.keep]

    def __call__(self, slot_inputs: torch.Tensor | None = None, *, lazy: bool = True, trace: list | None = None):
        """(confidence, token) of every slot (`predict_slots`); slot_inputs replaces the slots' input tokens."""
        ids = self.ids
        if slot_inputs is not None:
            ids = ids.clone()
            ids[self.keep] = slot_inputs
        hidden, slots = self._hidden(ids)
        return predict_slots(
            self.model, self.builder, self.encs, hidden, slots, self.offsets, self.images, lazy=lazy, trace=trace
        )


class SplitPass(OnePass):
    """The same computation in two calls, for `prefix_causal` attention (the document never sees the
    template): the causal prefixes once, with the plain causal kernel and a KV cache, then the
    templates on top of the cache (and again for each refinement pass). Every token is still
    processed once, and a refinement pass costs the template alone. For a single pass, two calls cost
    more than one on a CPU (SROIE, batch 1, 2 threads: 1.05 s vs 0.95 s for the forward, the floor
    0.93 s: the template's call runs its matrix products on ~120 rows, far below full efficiency),
    so `pip_decode` uses it only to refine. Prefixes are left-padded to width P, templates
    right-padded after them."""

    def __init__(self, model, builder, encs, *, pattern="prefix_causal", images=None, model_inputs=None):
        self.model, self.builder, self.encs, self.pattern, self.images = model, builder, encs, pattern, images
        self.model_inputs = {}
        ids1, attn1 = left_pad([e.input_ids[: e.prefix_len] for e in encs], builder.pad_id)
        self.P = P = ids1.shape[1]
        self.cache = DynamicCache(config=model.config)
        self.h1 = final_hidden(model, ids1, attn1, positions(attn1), self.cache)
        tails = [e.input_ids[e.prefix_len :] for e in encs]
        T = max(len(t) for t in tails)
        self.ids = torch.full((len(encs), T), builder.pad_id, dtype=torch.long)
        attn2 = torch.zeros((len(encs), T), dtype=torch.long)
        self.block = torch.zeros((len(encs), P + T), dtype=torch.long)
        self.keep = torch.zeros((len(encs), T), dtype=torch.bool)
        for i, (e, t) in enumerate(zip(encs, tails)):
            self.ids[i, : len(t)], attn2[i, : len(t)] = torch.tensor(t), 1
            self.block[i, P : P + len(e.blocks)] = torch.tensor(e.blocks)
            for f in e.fields:
                self.keep[i, f.start - e.prefix_len : f.start - e.prefix_len + f.length] = True
        self.attn = torch.cat([attn1, attn2], dim=1)
        self.pos = attn1.sum(-1, keepdim=True) + torch.arange(T)[None]  # continues each prefix's count
        self.offsets = [P - e.prefix_len for e in encs]

    def _hidden(self, ids):
        mask = build_attention_mask(
            self.model,
            self.pattern,
            self.attn,
            query_length=ids.shape[1],
            block_ids=self.block,
            cache=self.cache,
            position_ids=self.pos,
        )
        try:
            h2 = final_hidden(self.model, ids, mask, self.pos, self.cache)
        finally:
            self.cache.crop(self.P - self.cache.get_seq_length())  # negative: back to the prefixes
        return torch.cat([self.h1, h2], dim=1), h2[self.keep]


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
        block[i, width - len(e.blocks) :] = torch.tensor(e.blocks)
    return block


def _slot_mask(encs: list[Encoded], width: int) -> torch.Tensor:
    keep = torch.zeros((len(encs), width), dtype=torch.bool)
    for i, e in enumerate(encs):
        off = width - len(e.input_ids)
        for f in e.fields:
            keep[i, off + f.start : off + f.start + f.length] = True
    return keep


@torch.inference_mode()
def pip_decode(
    model,
    builder: TemplateBuilder,
    texts: list[str],
    schemas: list[KeySchema],
    *,
    pattern: str = "prefix_causal",
    refine_steps: int = 0,
    images: list[list[int]] | None = None,
    model_inputs: dict | None = None,
    split: bool | None = None,
    trace: list | None = None,
) -> list[Prediction]:
    """Fill every mask slot of every document in one forward pass (+ `refine_steps` passes).

    `split` runs the same pass as prefix, then template (`SplitPass`), so that refinement passes
    run the template alone; otherwise the whole input goes through at once (`OnePass`, faster for a
    single pass). Default: split when refining under prefix_causal attention without an image.

    For a vision-language model, `images` gives each document's image placeholder tokens (placed
    after the instruction) and `model_inputs` the pixel inputs (pixel_values, image_grid_thw).

    `trace` (a list) receives, per document, {key: CopyTrace} of the copy head's last pass (its start
    distribution over the document; empty dicts without a copy head): what `pipkie.explain` shows."""
    encs = [builder.pip(t, s, image=(images[i] if images else None)) for i, (t, s) in enumerate(zip(texts, schemas))]
    if split is None:
        split = refine_steps > 0 and pattern == "prefix_causal" and not images and not model_inputs
    run = (SplitPass if split else OnePass)(
        model, builder, encs, pattern=pattern, images=images, model_inputs=model_inputs
    )
    if refine_steps and any(f.span for e in encs for f in e.fields):
        raise ValueError(
            "refinement re-reads the slots' tokens, and this model reads a list's values as spans longer "
            "than their slots (item_slots): decode it with refine_steps=0"
        )
    conf, toks = run(lazy=refine_steps == 0, trace=trace)
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
        new_conf, new_toks = run(torch.where(remask, inputs, toks), lazy=False, trace=trace)
        conf = torch.where(remask, new_conf, conf)
        toks = torch.where(remask, new_toks, toks)
    return collect(builder, encs, toks.tolist(), conf.tolist(), schemas)


class PipDecoder(Decoder):
    name, objective, refines = "pip", "pip", True
    help = "one parallel pass over the answer template (refine_steps: Mask-Predict passes on top)"

    def decode(
        self, model, builder, texts, schemas, *, pattern="prefix_causal", refine_steps=0, trace=None, stats=None
    ):
        return pip_decode(model, builder, texts, schemas, pattern=pattern, refine_steps=refine_steps, trace=trace)

    def encode(self, builder, text, schema):
        return builder.pip(text, schema)

    def reserved(self, builder, schema):
        return builder.template_length(schema)


PIP = PipDecoder()
