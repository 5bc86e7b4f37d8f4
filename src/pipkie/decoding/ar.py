"""Autoregressive baselines: greedy decoding with a KV cache, batched with left padding.

- `free`: after `<|pip_answer|>` the model writes the whole answer, headers (`"\\n" key ":"`) included,
  each value closed by `<|pip_end|>`, until eos (or the answer budget of the template runs out).
- `forced`: the decoder writes each header itself and the model generates only value tokens, up to
  `<|pip_end|>` or the key's budget (a value closed by its budget is `truncated`, as in PIP). The
  header tokens are fed in the same forward step as the token that closed the previous value, so
  forcing costs no extra steps.

One step feeds every unfinished row a chunk (its last token, plus any forced tokens); chunks are
left-padded to the same width with masked pads, so every row's last real token sits in the last
column, whose final state gives each row its next token (`slot_head.greedy`: the same LM head as PIP's).

Lists (`pipkie.model.groups`): the answer goes on with `"\nitems 1 name:" value <|pip_end|>` … item by
item; forced decoding writes each item's headers and ends a list when an item's first field is
closed at once (`<|pip_end|>` right after its header), free decoding reads the headers it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from pipkie.decoding.base import Decoder
from pipkie.decoding.pip import final_hidden, left_pad, positions
from pipkie.decoding.results import FieldResult, Prediction, field_result, geo_mean
from pipkie.decoding.slot_head import greedy
from pipkie.model.groups import ar_steps, collect, parse_free_item
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema


@dataclass
class _Row:
    schema: KeySchema
    steps: list  # pipkie.model.groups.Step: every value a forced decoder asks for, in order
    free: bool
    limit: int  # most tokens this row may generate
    field_idx: int = 0
    toks: list[int] = field(default_factory=list)  # generated tokens of the current value (forced) / all (free)
    probs: list[float] = field(default_factory=list)
    results: dict = field(default_factory=dict)
    items: dict = field(default_factory=dict)  # list name -> [(item, field, FieldResult, stop)]
    n_generated: int = 0
    done: bool = False
    fixed_length: bool = False


@dataclass
class ARStats:
    steps: int = 0  # forward passes after the prefill
    generated: int = 0  # tokens the model generated


@torch.inference_mode()
def ar_decode(
    model,
    builder: TemplateBuilder,
    texts: list[str],
    schemas: list[KeySchema],
    *,
    mode: str = "forced",
    stats: ARStats | None = None,
    fixed_length: bool = False,
) -> list[Prediction]:
    """Greedy AR decoding. `fixed_length` (forced mode, benchmarks only) ignores `<|pip_end|>` and
    generates every key's full budget, to time AR on values of a chosen length."""
    if mode not in ("free", "forced"):
        raise ValueError("mode must be 'free' or 'forced'")
    free = mode == "free"
    rows, chunks = [], []
    for text, schema in zip(texts, schemas):
        enc = builder.ar_prompt(text, schema)
        steps = ar_steps(builder, schema)
        rows.append(_Row(schema, steps, free, limit=builder.ar_reserved(schema), fixed_length=fixed_length))
        chunks.append(enc.input_ids + ([] if free else steps[0].header))
    ids, attn = left_pad(chunks, builder.pad_id)
    cache = DynamicCache(config=model.config)
    last = final_hidden(model, ids, attn, positions(attn), cache)[:, -1]
    seen = attn.sum(-1)  # real tokens per row so far
    stats = stats or ARStats()
    while True:
        conf, nxt = greedy(model, last)  # the LM head's argmax (pipkie.decoding.slot_head)
        chunks = [
            _advance(builder, r, int(t), float(p)) if not r.done else []
            for r, t, p in zip(rows, nxt.tolist(), conf.tolist())
        ]
        if all(r.done for r in rows):
            stats.generated += sum(r.n_generated for r in rows)
            break
        step, step_attn = left_pad([c or [builder.pad_id] for c in chunks], builder.pad_id)
        step_attn[[i for i, c in enumerate(chunks) if not c]] = 0
        attn = torch.cat([attn, step_attn], dim=1)
        pos = positions(step_attn, seen)
        seen = seen + step_attn.sum(-1)
        last = final_hidden(model, step, attn, pos, cache)[:, -1]
        stats.steps += 1
    return [_finish(builder, r) for r in rows]


def _advance(builder: TemplateBuilder, r: _Row, tok: int, prob: float) -> list[int]:
    """Record the generated token; return the chunk to feed next ([] when the row is finished)."""
    r.n_generated += 1
    r.toks.append(tok)
    r.probs.append(prob)
    if r.free:
        if tok == builder.eos_id or r.n_generated >= r.limit:
            r.done = True
            return []
        return [tok]
    step = r.steps[r.field_idx]
    if (tok != builder.end_id or r.fixed_length) and len(r.toks) < step.budget:
        return [tok]
    # The value is closed: by the model (end token) or by its budget (we feed the end token).
    fed = [builder.end_id] if tok == builder.end_id and not r.fixed_length else [tok, builder.end_id]
    result = field_result(builder, r.toks, r.probs)
    r.field_idx += 1
    if step.group is None:
        r.results[step.key] = result
    else:
        stop = step.first and r.toks[0] == builder.end_id and not r.fixed_length  # no more items
        r.items.setdefault(step.group, []).append((step.item, step.field, result, stop))
        while stop and r.field_idx < len(r.steps) and r.steps[r.field_idx].group == step.group:
            r.field_idx += 1  # the list's other items are not asked for
    r.toks, r.probs = [], []
    if r.field_idx == len(r.steps):
        r.done = True
        return []
    return fed + r.steps[r.field_idx].header


def _finish(builder: TemplateBuilder, r: _Row) -> Prediction:
    if r.free:
        return parse_free_answer(builder, r.toks, r.probs, r.schema.names, r.schema)
    out = {k.name: r.results.get(k.name, FieldResult(None, 0.0)) for k in r.schema}
    for g in r.schema.groups:
        out[g.name] = collect(g, r.items.get(g.name, []), lambda: FieldResult(None, 0.0))
    return out


def parse_free_answer(
    builder: TemplateBuilder, toks: list[int], probs: list[float], keys: list[str], schema: KeySchema | None = None
) -> Prediction:
    """Split a free answer at `<|pip_end|>`; each piece reads `\\nkey: value`. Keys the model did not
    write are missing (confidence 0); keys outside the schema are ignored. A last piece that nothing
    closed (the answer ran out of its token budget) is `truncated`. With the schema's lists: pieces
    `\\nitems 3 name: value` fill item 3 (under `item_headers="first"`, ` price: value` after it
    too); an item's first field with nothing after its header ends the list."""
    results: Prediction = {}
    items: dict[str, list] = {}
    ended: set[str] = set()
    start, last = 0, None  # last: (group, item) of the latest item header ("first" headers continue it)
    first_only = builder.item_headers == "first"
    for i, t in enumerate(toks + [builder.end_id]):
        if t != builder.end_id and t != builder.eos_id and i < len(toks):
            continue
        piece = builder.tok.decode(toks[start:i], skip_special_tokens=True)
        key, sep, value = piece.strip().partition(":")
        key, raw = key.strip(), value.strip()
        value = None if not raw or raw == "unknown" else raw
        result = FieldResult(
            value, geo_mean(probs[start : i + 1]), toks[start : i + 1], truncated=i == len(toks) and value is not None
        )
        item = parse_free_item(schema, key) if sep and schema is not None and schema.groups else None
        if item is None and first_only and sep and last is not None and key in last[0].names[1:]:
            item = (last[0], last[1], key)  # " price: value" continues the item named last
        last = item[:2] if item is not None else last
        if sep and key in keys and key not in results:
            results[key] = result
        elif item is not None and item[0].name not in ended:
            g, n, name = item
            stop = name == g.fields[0].name and not raw
            ended.update([g.name] if stop else [])
            if all((n, name) != (m, f) for m, f, _, _ in items.get(g.name, [])):
                items.setdefault(g.name, []).append((n, name, result, stop))
        start = i + 1
        if i < len(toks) and t == builder.eos_id:
            break
    out = {k: results.get(k, FieldResult(None, 0.0)) for k in keys}
    for g in schema.groups if schema is not None else ():
        entries = sorted(items.get(g.name, []), key=lambda e: (e[0], not e[3]))  # a stop ends before its item
        out[g.name] = collect(g, entries, lambda: FieldResult(None, 0.0))
    return out


class ARDecoder(Decoder):
    """`ar_decode` in one mode ("free" or "forced") on an AR model."""

    objective = "ar"

    def __init__(self, mode: str, help: str):
        self.mode, self.name, self.help = mode, f"ar-{mode}", help

    def decode(
        self, model, builder, texts, schemas, *, pattern="prefix_causal", refine_steps=0, trace=None, stats=None
    ):
        return ar_decode(model, builder, texts, schemas, mode=self.mode, stats=stats)

    def encode(self, builder, text, schema):
        return builder.ar_prompt(text, schema)

    def reserved(self, builder, schema):
        return builder.ar_reserved(schema)


AR_FREE = ARDecoder("free", "the AR baseline writes the whole answer, keys and values")
AR_FORCED = ARDecoder("forced", "the decoder writes the keys, the AR baseline the values")
