"""Autoregressive baselines: greedy decoding with a KV cache, batched with left padding.

- `free`: after `<|pip_answer|>` the model writes the whole answer, headers (`"\\n" key ":"`) included,
  each value closed by `<|pip_end|>`, until eos (or the answer budget of the template runs out).
- `forced`: the decoder writes each header itself and the model generates only value tokens, up to
  `<|pip_end|>` or the key's budget (a value closed by its budget is `truncated`, as in PIP). The
  header tokens are fed in the same forward step as the token that closed the previous value, so
  forcing costs no extra steps.

One step feeds every unfinished row a chunk (its last token, plus any forced tokens); chunks are
left-padded to the same width with masked pads, so every row's last real token sits in the last
column and `logits_to_keep=1` gives each row its next-token logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from pipkie.decode import FieldResult, Prediction, _field_result, _geo_mean, left_pad, positions
from pipkie.schema import KeySchema
from pipkie.template import TemplateBuilder


@dataclass
class _Row:
    keys: list
    budgets: list[int]
    free: bool
    limit: int  # most tokens this row may generate
    field_idx: int = 0
    toks: list[int] = field(default_factory=list)  # generated tokens of the current value (forced) / all (free)
    probs: list[float] = field(default_factory=list)
    results: dict = field(default_factory=dict)
    n_generated: int = 0
    done: bool = False
    fixed_length: bool = False


@dataclass
class ARStats:
    steps: int = 0  # forward passes after the prefill
    generated: int = 0  # tokens the model generated


@torch.inference_mode()
def ar_decode(model, builder: TemplateBuilder, texts: list[str], schemas: list[KeySchema], *,
              mode: str = "forced", stats: ARStats | None = None, fixed_length: bool = False) -> list[Prediction]:
    """Greedy AR decoding. `fixed_length` (forced mode, benchmarks only) ignores `<|pip_end|>` and
    generates every key's full budget, to time AR on values of a chosen length."""
    if mode not in ("free", "forced"):
        raise ValueError("mode must be 'free' or 'forced'")
    free = mode == "free"
    rows, chunks = [], []
    for text, schema in zip(texts, schemas):
        enc = builder.ar_prompt(text, schema)
        keys = list(schema)
        budgets = [builder.budget(k) for k in keys]
        rows.append(_Row(keys, budgets, free, limit=builder.ar_reserved(schema), fixed_length=fixed_length))
        chunks.append(enc.input_ids + ([] if free else builder.answer_header(keys[0])))
    ids, attn = left_pad(chunks, builder.pad_id)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=attn, position_ids=positions(attn), cache=cache,
                use_cache=True, logits_to_keep=1)
    seen = attn.sum(-1)  # real tokens per row so far
    stats = stats or ARStats()
    while True:
        probs = out.logits[:, -1].float().softmax(-1)
        conf, nxt = probs.max(-1)
        chunks = [_advance(builder, r, int(t), float(p)) if not r.done else [] for r, t, p in
                  zip(rows, nxt.tolist(), conf.tolist())]
        if all(r.done for r in rows):
            stats.generated += sum(r.n_generated for r in rows)
            break
        step, step_attn = left_pad([c or [builder.pad_id] for c in chunks], builder.pad_id)
        step_attn[[i for i, c in enumerate(chunks) if not c]] = 0
        attn = torch.cat([attn, step_attn], dim=1)
        pos = positions(step_attn, seen)
        seen = seen + step_attn.sum(-1)
        out = model(input_ids=step, attention_mask=attn, position_ids=pos, cache=cache,
                    use_cache=True, logits_to_keep=1)
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
    if (tok != builder.end_id or r.fixed_length) and len(r.toks) < r.budgets[r.field_idx]:
        return [tok]
    # The value is closed: by the model (end token) or by its budget (we feed the end token).
    fed = [builder.end_id] if tok == builder.end_id and not r.fixed_length else [tok, builder.end_id]
    key = r.keys[r.field_idx].name
    r.results[key] = _field_result(builder, r.toks, r.probs)
    r.field_idx += 1
    r.toks, r.probs = [], []
    if r.field_idx == len(r.keys):
        r.done = True
        return []
    return fed + builder.answer_header(r.keys[r.field_idx])


def _finish(builder: TemplateBuilder, r: _Row) -> Prediction:
    if not r.free:
        return {k.name: r.results.get(k.name, FieldResult(None, 0.0)) for k in r.keys}
    return parse_free_answer(builder, r.toks, r.probs, [k.name for k in r.keys])


def parse_free_answer(builder: TemplateBuilder, toks: list[int], probs: list[float], keys: list[str]) -> Prediction:
    """Split a free answer at `<|pip_end|>`; each piece reads `\\nkey: value`. Keys the model did not
    write are missing (confidence 0); keys outside the schema are ignored. A last piece that nothing
    closed (the answer ran out of its token budget) is `truncated`."""
    results: Prediction = {}
    start = 0
    for i, t in enumerate(toks + [builder.end_id]):
        if t != builder.end_id and t != builder.eos_id and i < len(toks):
            continue
        piece = builder.tok.decode(toks[start:i], skip_special_tokens=True)
        key, sep, value = piece.strip().partition(":")
        if sep and key.strip() in keys and key.strip() not in results:
            value = value.strip()
            value = None if not value or value == "unknown" else value
            results[key.strip()] = FieldResult(value, _geo_mean(probs[start: i + 1]), toks[start:i + 1],
                                               truncated=i == len(toks) and value is not None)
        start = i + 1
        if i < len(toks) and t == builder.eos_id:
            break
    return {k: results.get(k, FieldResult(None, 0.0)) for k in keys}
