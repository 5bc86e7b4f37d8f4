"""Which document words a field's mask slots look at: attention heat maps for one extracted field.

    from pipkie import Extractor
    from pipkie.explain import explain, draw_heatmap
    ex = Extractor.from_pretrained()
    e = explain(ex, "receipt.jpg", "total")          # Explanation
    e.value, e.top(5)                                 # the value and the 5 most attended words
    draw_heatmap(e, "receipt.jpg", "heat.png")        # words coloured by weight on the page

How: the document goes through the same PIP template as `Extractor.extract` (one forward pass, the
model's attention pattern), run with eager attention so that the attention probabilities come back
(the model is switched to eager for the call and switched back after; each layer's weights are
cut to the field's rows as it runs, see `_slot_attention`, else `output_attentions=True`).
For the asked field, the attention rows of its mask slots are averaged over layers, heads and
slots: one weight per input position. The document's positions are mapped back to characters of
the serialized text through the tokenizer's offsets, and characters to the OCR words that
`serialize` wrote there; a token's weight is shared equally by the words it overlaps. Weights are
normalised to sum to 1 over the document's tokens (so word weights sum to 1 less what went to
whitespace-only tokens such as line breaks); `document_share` is how much of the slots' attention
went to the document at all (the rest went to the instruction, the template and the slots).

Attention is a hint of where the model looked, not a proof of why it answered: heads that park
their attention on a "sink" token and layers that mix positions both blur the picture.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import torch
from PIL import Image, ImageDraw, ImageFont

from pipkie.attention import build_attention_mask
from pipkie.decode import _block_ids, _field_result, left_pad, positions
from pipkie.document import Document, Word, reading_order_lines, serialize
from pipkie.schema import KeySchema

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp", ".webp", ".pdf"}


@dataclass
class Explanation:
    document: str
    key: str
    value: str | None
    confidence: float
    # every document word (serialize order) with its share of the slots' document attention (sum 1)
    words: list[tuple[Word, float]] = field(default_factory=list)
    # document tokens as (text, char start, char end, weight), same normalisation as `words`
    tokens: list[tuple[str, int, int, float]] = field(default_factory=list)
    document_share: float = 0.0  # attention mass on document tokens before normalisation (0-1)
    slots: int = 0  # mask slots averaged over
    truncated: int = 0  # document tokens cut to fit the context (they get no weight)

    def top(self, n: int = 10) -> list[tuple[Word, float]]:
        """The n words with the most weight, heaviest first."""
        return sorted(self.words, key=lambda wv: -wv[1])[:n]

    def page_weights(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for w, v in self.words:
            out[w.page] = out.get(w.page, 0.0) + v
        return out

    def to_dict(self, top: int | None = None) -> dict:
        words = self.top(top) if top else self.words
        return {
            "document": self.document, "key": self.key, "value": self.value,
            "confidence": round(self.confidence, 4), "document_share": round(self.document_share, 4),
            "slots": self.slots, "truncated": self.truncated,
            "words": [{"text": w.text, "page": w.page, "box": [v / 1000 for v in w.box], "weight": round(x, 5)}
                      for w, x in words],
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
        raise RuntimeError("explain: word spans no longer match pipkie.document.serialize")
    return text, spans


@contextmanager
def eager_attention(model):
    """Run `model` with eager attention (the only kind that returns attention probabilities)."""
    prev = getattr(model.config, "_attn_implementation", None)
    if prev == "eager":
        yield model
        return
    if not hasattr(model, "set_attn_implementation"):
        raise RuntimeError("this transformers version cannot switch attention implementation; "
                           "load the model with attn_implementation='eager'")
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(prev or "sdpa")


def _schema_for(extractor, key: str, keys=None, schema=None) -> KeySchema:
    if keys is not None or schema is not None:
        ks = extractor.schema(keys, schema)
        if key not in ks.names:
            raise ValueError(f"key {key!r} is not among the keys asked for ({', '.join(ks.names)})")
        return ks
    default = list(getattr(extractor.settings, "keys", None) or [])
    return KeySchema.parse(default if key in default else [key])


@torch.inference_mode()
def explain(extractor, document, key: str, *, keys=None, schema=None, text: str | None = None) -> Explanation:
    """Attention of `key`'s mask slots over the document's words (see the module docstring).

    The field is decoded among `keys`/`schema` when given (it must be one of them), else among the
    model's default keys when `key` is one of them, else alone: with a shared template block, what
    a field attends to depends on the other keys asked for.
    """
    doc = Document(id="text", text=text) if text is not None else extractor.load(document)
    ks = _schema_for(extractor, key, keys, schema)
    builder, tok, model = extractor.builder, extractor.tokenizer, extractor.model
    source, spans = word_spans(doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation is reported in Explanation.truncated
        enc = builder.pip(source, ks)
    try:
        offsets = tok(source, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except (NotImplementedError, TypeError, ValueError) as e:
        raise RuntimeError(f"explain needs a fast tokenizer with offsets ({e})") from e
    start = len(builder.instruction_ids)
    n_doc = enc.prefix_len - start - 1  # document tokens kept (instruction + doc + <|pip_answer|>)
    offsets = [tuple(o) for o in offsets[:n_doc]]

    ids, attn = left_pad([enc.input_ids], builder.pad_id)
    block = _block_ids([enc], ids.shape[1])
    slots = next(f for f in enc.fields if f.key == key)
    rows = torch.arange(slots.start, slots.start + slots.length)
    with eager_attention(model):
        pos = positions(attn)
        mask = build_attention_mask(model, extractor.settings.pattern, attn, query_length=ids.shape[1],
                                    block_ids=block, position_ids=pos)
        logits, per_layer = _slot_attention(model, rows, input_ids=ids, attention_mask=mask, position_ids=pos)
    # (layers, slots, kv), already averaged over heads -> mean over layers and slots -> (kv,)
    weights = torch.stack(per_layer).mean(dim=(0, 1))
    probs = logits[0, rows].float().softmax(-1)
    conf, toks = probs.max(-1)
    result = _field_result(builder, toks.tolist(), conf.tolist())

    doc_w = weights[start: start + n_doc]
    share = float(doc_w.sum())
    doc_w = doc_w / share if share > 0 else doc_w
    owner = [-1] * len(source)  # char -> index in spans
    for i, (s, e, _) in enumerate(spans):
        owner[s:e] = [i] * (e - s)
    word_w = [0.0] * len(spans)
    tokens = []
    for (s, e), w in zip(offsets, doc_w.tolist()):
        tokens.append((source[s:e], s, e, w))
        hit = sorted({owner[c] for c in range(s, min(e, len(owner))) if owner[c] >= 0})
        for i in hit:
            word_w[i] += w / len(hit)
    return Explanation(doc.id, key, result.value, float(result.confidence),
                       [(w, x) for (_, _, w), x in zip(spans, word_w)], tokens, share, slots.length, enc.truncated)


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


# ---------------------------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------------------------
def page_image(doc: Document, page: int = 0, source: Union[str, Path, Image.Image, None] = None) -> Image.Image:
    """The page as an RGB image: the document's own image (`doc.images`), else `source` when it is an
    image or a PDF (or a PIL image), else a white page of the document's size with its words written
    in their boxes (for JSON words, box files without their image, text)."""
    from pipkie.grounding import _page_image

    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if page < len(doc.images) and doc.images[page] and Path(doc.images[page]).exists():
        return _page_image(doc, doc.images[page], page)
    if source is not None and Path(source).suffix.lower() in IMAGE_SUFFIXES and Path(source).exists():
        return _page_image(doc, source, page)
    return blank_page(doc, page)


def blank_page(doc: Document, page: int = 0) -> Image.Image:
    """A white page (the page's size, scaled to 1000-2000 px on its long side) with the words in grey."""
    w, h = doc.page_sizes[page] if page < len(doc.page_sizes) else (1000, 1000)
    scale = min(max(1.0, 1000 / max(w, h)), 2000 / max(w, h))
    im = Image.new("RGB", (max(1, round(w * scale)), max(1, round(h * scale))), "white")
    canvas = ImageDraw.Draw(im)
    sx, sy = im.width / 1000, im.height / 1000
    for word in doc.words:
        if word.page != page:
            continue
        x0, y0, x1, y1 = word.box
        size = max(8, int((y1 - y0) * sy * 0.8))
        canvas.text((x0 * sx, y0 * sy), word.text, fill="#555555", font=_font(size))
    return im


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType
        return ImageFont.load_default()


def _heat(r: float) -> tuple[int, int, int]:
    """0 -> pale yellow, 1 -> deep red."""
    stops = [(255, 237, 160), (254, 178, 76), (240, 59, 32), (165, 0, 38)]
    x = min(max(r, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    t = x - i
    return tuple(round(a + (b - a) * t) for a, b in zip(stops[i], stops[i + 1]))


def draw_heatmap(expl: Explanation, doc_or_source, out_path: Union[str, Path], *, page: int | None = None,
                 doc: Document | None = None, top: int = 5) -> Path:
    """Colour each word of the page by its weight (yellow = little, red = most), outline the `top`
    heaviest, add a banner with the key, value and attention share, and save to `out_path`.

    `doc_or_source`: the image/PDF path (or PIL image) of the page, or the Document itself (its
    image, else a drawn page). Pass `doc` too when the first argument is a path so the page size
    and images are known. `page`: default the page holding the most weight.
    """
    if isinstance(doc_or_source, Document):
        doc, source = doc_or_source, None
    else:
        source = doc_or_source
    doc = doc or Document(id=expl.document, words=[w for w, _ in expl.words])
    if page is None:
        pw = expl.page_weights()
        page = max(pw, key=pw.get) if pw else 0
    im = page_image(doc, page, source).convert("RGBA")
    sx, sy = im.width / 1000, im.height / 1000
    overlay = Image.new("RGBA", im.size, (0, 0, 0, 0))
    canvas = ImageDraw.Draw(overlay)
    on_page = [(w, x) for w, x in expl.words if w.page == page]
    peak = max((x for _, x in on_page), default=0.0) or 1.0
    for w, x in sorted(on_page, key=lambda wx: wx[1]):
        r = x / peak
        x0, y0, x1, y1 = (w.box[0] * sx, w.box[1] * sy, w.box[2] * sx, w.box[3] * sy)
        canvas.rectangle((x0, y0, x1, y1), fill=(*_heat(r), round(40 + 170 * r ** 0.5)),
                         outline=(120, 120, 120, 160), width=1)
    line_w = max(2, im.width // 300)
    for w, _ in sorted(on_page, key=lambda wx: -wx[1])[:top]:
        canvas.rectangle((w.box[0] * sx, w.box[1] * sy, w.box[2] * sx, w.box[3] * sy),
                         outline=(165, 0, 38, 255), width=line_w)
    im = Image.alpha_composite(im, overlay).convert("RGB")

    # banner: key = value, share of attention on the document, colour scale
    font = _font(max(12, min(28, im.width // 45)))
    lines = [f"{expl.key} = {expl.value!r}  (confidence {expl.confidence:.2f})",
             f"attention of {expl.slots} mask slots: {expl.document_share:.0%} on the document"
             + (f", page {page + 1}" if len(doc.page_sizes) > 1 else "")
             + (f", {expl.truncated} tokens truncated" if expl.truncated else "")]
    probe = ImageDraw.Draw(im)
    line_h = max(probe.textbbox((0, 0), s, font=font)[3] for s in lines) + 6
    bar_h = max(8, line_h // 2)
    banner = Image.new("RGB", (im.width, line_h * len(lines) + bar_h + 16), "white")
    bd = ImageDraw.Draw(banner)
    for i, s in enumerate(lines):
        bd.text((8, 4 + i * line_h), s, fill="black", font=font)
    y = line_h * len(lines) + 8
    width = min(300, im.width - 16)
    for i in range(width):
        bd.line((8 + i, y, 8 + i, y + bar_h), fill=_heat(i / max(1, width - 1)))
    full = Image.new("RGB", (im.width, banner.height + im.height), "white")
    full.paste(banner, (0, 0))
    full.paste(im, (0, banner.height))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    full.save(out)
    return out
