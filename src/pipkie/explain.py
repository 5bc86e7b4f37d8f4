"""What chose an extracted value: the copy head's pointer and the attention of the field's slots.

    from pipkie import Extractor
    from pipkie.explain import explain
    from pipkie.io.heatmap import draw_heatmap
    ex = Extractor.from_pretrained()
    e = explain(ex, "receipt.jpg", "total")          # Explanation
    e.value, e.confidence                             # exactly what `ex.extract` returns
    e.top_starts(5), e.top(5)                         # where the copy head says the value starts; attention
    draw_heatmap(e, "receipt.jpg", "heat.png")        # both as heat maps on the page, side by side

How: the field is decoded by `Extractor.extract` itself (same template, same pass, copy head
included), so the value and confidence are extract's. That pass also hands back the copy head's
start distribution for each field (`pipkie.decoding.pip.CopyTrace`): p_start over the document's copy
stream, the probability that the value starts at each token. With a copy head this is what chose
the value: slot j copies the token j places after the start (unless its gate leans on the LM head).

Beside it, the attention of the field's slots: the same input run once more with eager attention
(the only kind that returns attention probabilities; the model is switched back after, and each
layer's weights are cut to the field's rows as it runs, see `_slot_attention`), averaged over
layers, heads and slots: one weight per input position, normalised to sum to 1 over the document's
tokens (`document_share`: how much of it went to the document at all). Attention is a hint of where
the model looked, not a proof of why it answered: heads that park their attention on a "sink" token
and layers that mix positions both blur the picture.

Both are mapped to words the same way: an input position is a token of the serialized document
(`TemplateBuilder.fit`'s `kept`; a document cut to fit keeps its head and tail), the token's
characters come from the tokenizer's offsets (`TemplateBuilder.document_offsets`), and characters
belong to the OCR words `serialize` wrote there; a token's weight is shared equally by the words
it overlaps. Whitespace tokens belong to no word, except that a value starting on a token of spaces
alone starts at the word after it (SmolLM2 writes " 85.54" as " " "8" "5"…).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pipkie.decoding.pip import _block_ids, left_pad, positions
from pipkie.io.document import Document, Word, reading_order_lines, serialize
from pipkie.model.attention import build_attention_mask
from pipkie.schema import KeySchema

Weighted = list[tuple[Word, float]]


@dataclass
class Explanation:
    document: str
    key: str
    value: str | None  # as `Extractor.extract` returns it
    confidence: float
    # every document word (serialize order) with its share of the slots' document attention (sum 1)
    words: Weighted = field(default_factory=list)
    # document tokens as (text, char start, char end, weight), same normalisation as `words`
    tokens: list[tuple[str, int, int, float]] = field(default_factory=list)
    document_share: float = 0.0  # attention mass on document tokens before normalisation (0-1)
    slots: int = 0  # mask slots averaged over
    truncated: int = 0  # document tokens cut to fit the context (they get no weight)
    copy_head: bool = False  # the model has one: `starts` is what chose the value
    # every document word with the copy head's probability that the value starts in it (sum ≤ 1)
    starts: Weighted = field(default_factory=list)
    # copy-stream tokens as (text, char start, char end, p_start)
    start_tokens: list[tuple[str, int, int, float]] = field(default_factory=list)
    value_truncated: bool = False  # the value filled its whole budget

    def top(self, n: int = 10) -> Weighted:
        """The n words with the most attention, heaviest first."""
        return sorted(self.words, key=lambda wv: -wv[1])[:n]

    def top_starts(self, n: int = 10) -> Weighted:
        """The n words where the copy head most expects the value to start, likeliest first."""
        return sorted(self.starts, key=lambda wv: -wv[1])[:n]

    def page_weights(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for w, v in self.starts if self.starts else self.words:
            out[w.page] = out.get(w.page, 0.0) + v
        return out

    def to_dict(self, top: int | None = None) -> dict:
        def listing(ws):
            return [
                {"text": w.text, "page": w.page, "box": [v / 1000 for v in w.box], "weight": round(x, 5)} for w, x in ws
            ]

        return {
            "document": self.document,
            "key": self.key,
            "value": self.value,
            "confidence": round(self.confidence, 4),
            "value_truncated": self.value_truncated,
            "document_share": round(self.document_share, 4),
            "slots": self.slots,
            "truncated": self.truncated,
            "copy_head": self.copy_head,
            "starts": listing(self.top_starts(top) if top else self.starts),
            "words": listing(self.top(top) if top else self.words),
        }


def word_spans(doc: Document) -> tuple[str, list[tuple[int, int, Word]]]:
    """The serialized text and the character span of each word in it (the same text as `serialize`)."""
    if doc.text is not None:
        return doc.text, []
    parts: list[str] = []
    spans: list[tuple[int, int, Word]] = []
    pos = 0
    for line in reading_order_lines(doc.words):
        kept = [w for w in line if w.text.strip()]
        if not kept:
            continue
        if parts:
            parts.append("\n")
            pos += 1
        for i, w in enumerate(kept):
            if i:
                parts.append(" ")
                pos += 1
            spans.append((pos, pos + len(w.text), w))
            parts.append(w.text)
            pos += len(w.text)
    text = "".join(parts)
    if text != serialize(doc):  # serialize changed: a wrong map is worse than none
        raise RuntimeError("explain: word spans no longer match pipkie.io.document.serialize")
    return text, spans


@contextmanager
def eager_attention(model):
    """Run `model` with eager attention (the only kind that returns attention probabilities)."""
    prev = getattr(model.config, "_attn_implementation", None)
    if prev == "eager":
        yield model
        return
    if not hasattr(model, "set_attn_implementation"):
        raise RuntimeError(
            "this transformers version cannot switch attention implementation; "
            "load the model with attn_implementation='eager'"
        )
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(prev or "sdpa")


def _schema_for(extractor, key: str, keys=None, schema=None) -> KeySchema:
    """The keys asked for (they must include `key`), else the model's keys if `key` is one, else `key`
    alone: the template `extract` would decode."""
    default = list(getattr(extractor.settings, "keys", None) or [])
    ks = KeySchema.resolve(keys, schema, default=default if key in default else [key])
    if key not in ks.names:
        raise ValueError(f"key {key!r} is not among the keys asked for ({', '.join(ks.names)})")
    return ks


class _WordMap:
    """Input positions of one encoded document → its tokens' characters → the words there."""

    def __init__(self, builder, enc, source: str, spans):
        self.source, self.enc = source, enc
        self.start = builder.document_span(enc.prefix_len)[0]
        self.offsets = builder.document_offsets(source)
        self.owner = [-1] * len(source)  # char -> index in spans
        for i, (s, e, _) in enumerate(spans):
            self.owner[s:e] = [i] * (e - s)
        self.n_words = len(spans)

    def span(self, p: int) -> tuple[int, int] | None:
        """Characters of the document token at input position p (None: the cut marker)."""
        k = self.enc.kept[p - self.start]
        return self.offsets[k] if k >= 0 else None

    def spread(self, weights: dict[int, float], spaces_to_next: bool = False):
        """{input position: weight} → (weight per word, [(token text, start, end, weight)]).
        `spaces_to_next`: a token of spaces alone counts for the word after it (a value's start)."""
        per_word, tokens = [0.0] * self.n_words, []
        for p, w in weights.items():
            span = self.span(p)
            if span is None:
                continue
            s, e = span
            tokens.append((self.source[s:e], s, e, w))
            hit = sorted({self.owner[c] for c in range(s, min(e, len(self.owner))) if self.owner[c] >= 0})
            if (
                spaces_to_next
                and not hit
                and "\n" not in self.source[s:e]
                and e < len(self.owner)
                and self.owner[e] >= 0
            ):
                hit = [self.owner[e]]  # a space token (" " before digits, a line's leading space): the next word
            for i in hit:
                per_word[i] += w / len(hit)
        return per_word, tokens


@torch.inference_mode()
def explain(extractor, document, key: str, *, keys=None, schema=None, text: str | None = None) -> Explanation:
    """Why `key` got its value: the copy head's start distribution and the slots' attention over
    the document's words (see the module docstring); value and confidence are `extract`'s.

    The field is decoded among `keys`/`schema` when given (it must be one of them), else among the
    model's default keys when `key` is one of them, else alone (with field blocks a field's answer
    does not depend on the others; with a shared template block it does)."""
    doc = Document(id="text", text=text) if text is not None else extractor.load(document)
    ks = _schema_for(extractor, key, keys, schema)
    builder = extractor.builder
    source, spans = word_spans(doc)
    trace: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation is reported in Explanation.truncated
        result = extractor.extract_many([doc], schema=ks, decode="pip", trace=trace)[0]
        enc = builder.pip(source, ks)  # the input extract ran (TemplateBuilder is deterministic)
    words = _WordMap(builder, enc, source, spans)
    slots = next(f for f in enc.fields if f.key == key)
    got = result.fields[key]

    starts, start_tokens = [0.0] * len(spans), []
    copy = trace[0].get(key) if trace else None
    if copy is not None:
        starts, start_tokens = words.spread(dict(zip(copy.stream, copy.p_start)), spaces_to_next=True)

    weights = _attention(extractor, enc, torch.arange(slots.start, slots.start + slots.length))
    n_doc = len(enc.kept)
    doc_w = weights[words.start : words.start + n_doc]
    share = float(doc_w.sum())
    doc_w = doc_w / share if share > 0 else doc_w
    word_w, tokens = words.spread(dict(zip(range(words.start, words.start + n_doc), doc_w.tolist())))
    ws = [w for _, _, w in spans]
    return Explanation(
        doc.id,
        key,
        got.value,
        got.confidence,
        list(zip(ws, word_w)),
        tokens,
        share,
        slots.length,
        enc.truncated,
        copy is not None,
        list(zip(ws, starts)),
        start_tokens,
        got.truncated,
    )


def _attention(extractor, enc, rows: torch.Tensor) -> torch.Tensor:
    """(input length,) attention of the `rows` queries, averaged over layers, heads and rows."""
    model, builder = extractor.model, extractor.builder
    ids, attn = left_pad([enc.input_ids], builder.pad_id)
    block = _block_ids([enc], ids.shape[1])
    with eager_attention(model):
        pos = positions(attn)
        mask = build_attention_mask(
            model, extractor.settings.pattern, attn, query_length=ids.shape[1], block_ids=block, position_ids=pos
        )
        _, per_layer = _slot_attention(model, rows, input_ids=ids, attention_mask=mask, position_ids=pos)
    return torch.stack(per_layer).mean(dim=(0, 1))  # (layers, slots, kv) -> (kv,)


def _slot_attention(model, rows: torch.Tensor, **inputs):
    """(logits, [per layer: attention of the `rows` queries averaged over heads, (slots, kv)]).

    Each attention module's weights are cut down to the slot rows as the layer runs (forward hooks
    on the `*.self_attn` modules, which return (output, weights) under eager attention), so a long
    document never holds layers x heads x length^2 probabilities at once. Models without such
    modules fall back to `output_attentions=True`."""
    per_layer: list[torch.Tensor] = []

    def hook(module, args, output):
        w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if isinstance(w, torch.Tensor) and w.dim() == 4:
            per_layer.append(w[0, :, rows, :].float().mean(0))

    handles = [m.register_forward_hook(hook) for name, m in model.named_modules() if name.endswith("self_attn")]
    try:
        out = model(**inputs)
    finally:
        for h in handles:
            h.remove()
    if not per_layer:
        out = model(**inputs, output_attentions=True)
        if not out.attentions or out.attentions[0] is None:
            raise RuntimeError("the model returned no attention weights (eager attention not in effect)")
        per_layer = [a[0, :, rows, :].float().mean(0) for a in out.attentions]
    return out.logits, per_layer
