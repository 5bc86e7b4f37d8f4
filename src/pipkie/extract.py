"""The user-facing API: `Extractor.from_pretrained()` → `extractor.extract(document, keys=...)`.

    from pipkie import Extractor
    ex = Extractor.from_pretrained()                     # the shipped model (or a path)
    result = ex.extract("receipt.jpg", keys=["company", "date", "total"])
    result.fields["total"].value, .confidence, .boxes    # boxes: OCR words the value was read from
    print(result.to_json())

A document is a `Document`, a path or bytes (image, PDF, SROIE box file, JSON words, text; see
`pipkie.loaders`), or text (`text=`). `extract_many` decodes several documents in one forward pass
per batch. Each extracted value is grounded back to the OCR words that hold it (`pipkie.grounding`)
and returned with their boxes, relative to the page (0-1).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from pipkie.ar import ar_decode
from pipkie.decode import FieldResult, pip_decode
from pipkie.document import Document, Word, serialize
from pipkie.grounding import locate
from pipkie.loaders import load_document
from pipkie.modeling import builder_for, default_model_path, load_model
from pipkie.schema import KeySchema

DECODES = ("pip", "ar", "ar-forced")


@dataclass
class Box:
    page: int
    x0: float  # relative to the page width/height, 0-1
    y0: float
    x1: float
    y1: float
    text: str


@dataclass
class Field:
    value: str | None
    confidence: float
    boxes: list[Box] = field(default_factory=list)
    grounding: str = "none"  # how the boxes were found: exact | fuzzy | none


@dataclass
class Extraction:
    document: str
    fields: dict[str, Field]
    decode: str
    seconds: float
    truncated: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)

    def values(self) -> dict[str, str | None]:
        return {k: f.value for k, f in self.fields.items()}


def _boxes(words: list[Word]) -> list[Box]:
    return [Box(w.page, w.box[0] / 1000, w.box[1] / 1000, w.box[2] / 1000, w.box[3] / 1000, w.text) for w in words]


class Extractor:
    def __init__(self, model, tokenizer, settings, *, threads: int = 1, ocr: str = "rapidocr", name: str = ""):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.builder = builder_for(tokenizer, settings)
        self.threads, self.ocr, self.name = threads, ocr, name

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, threads: int = 1, ocr: str = "rapidocr") -> "Extractor":
        """Load a pipkie model directory (default: the shipped model, or $PIPKIE_MODEL)."""
        torch.set_num_threads(threads)
        path = str(path or default_model_path())
        model, tokenizer, settings = load_model(path, pad_vocab=True)
        return cls(model, tokenizer, settings, threads=threads, ocr=ocr, name=path)

    def schema(self, keys=None, schema=None) -> KeySchema:
        if schema is not None:
            return KeySchema.parse(schema)
        if keys is not None:
            return KeySchema.parse(keys)
        if self.settings.keys:
            return KeySchema.parse(self.settings.keys)
        raise ValueError("give keys= or schema= (this model has no default keys)")

    def load(self, document, **kw) -> Document:
        if isinstance(document, Document):
            return document
        return load_document(document, ocr=self.ocr, threads=self.threads, **kw)

    def extract(self, document, keys=None, *, schema=None, decode: str = "pip", refine_steps: int = 0,
                text: str | None = None) -> Extraction:
        doc = Document(id="text", text=text) if text is not None else self.load(document)
        return self.extract_many([doc], keys, schema=schema, decode=decode, refine_steps=refine_steps)[0]

    def extract_many(self, documents: Iterable, keys=None, *, schema=None, decode: str = "pip",
                     refine_steps: int = 0, batch_size: int = 8) -> list[Extraction]:
        if decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}")
        ks = self.schema(keys, schema)
        docs = [self.load(d) for d in documents]
        out: list[Extraction] = []
        for i in range(0, len(docs), batch_size):
            chunk = docs[i: i + batch_size]
            texts = [serialize(d) for d in chunk]
            lengths = [len(self.builder.document_ids(t)) for t in texts]
            t0 = time.perf_counter()
            with torch.inference_mode():
                if decode == "pip":
                    preds = pip_decode(self.model, self.builder, texts, [ks] * len(chunk),
                                       pattern=self.settings.pattern, refine_steps=refine_steps)
                else:
                    preds = ar_decode(self.model, self.builder, texts, [ks] * len(chunk),
                                      mode="free" if decode == "ar" else "forced")
            dt = (time.perf_counter() - t0) / len(chunk)
            # document tokens that fit (as in TemplateBuilder.prefix): the template (PIP) or the answer
            # budget (AR), the instruction and <|pip_answer|> are reserved
            reserved = self.builder.template_length(ks) if decode == "pip" else self.builder.ar_reserved(ks)
            room = self.builder.max_length - reserved - len(self.builder.instruction_ids) - 1
            for d, p, n in zip(chunk, preds, lengths):
                out.append(Extraction(d.id, {k: self._field(d, r) for k, r in p.items()}, decode, dt,
                                      truncated=n > room))
        return out

    @staticmethod
    def _field(doc: Document, r: FieldResult) -> Field:
        if r.value is None or not doc.words:
            return Field(r.value, round(r.confidence, 4))
        g = locate(r.value, doc)
        return Field(r.value, round(r.confidence, 4), _boxes(g.words), g.method)
