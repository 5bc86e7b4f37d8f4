"""The user-facing API: `Extractor.from_pretrained()` → `extractor.extract(document, keys=...)`.

    from pipkie import Extractor
    ex = Extractor.from_pretrained()                     # the shipped model (or a path)
    result = ex.extract("receipt.jpg", keys=["company", "date", "total"])
    result.fields["total"].value, .confidence, .boxes    # boxes: OCR words the value was read from
    print(result.to_json())

A document is a `Document`, a path or bytes (image, PDF, SROIE box file, JSON words, text; see
`pipkie.io.loaders`), or text (`text=`). `extract_many` decodes several documents in one forward pass
per batch. Each extracted value is grounded back to the OCR words that hold it (`pipkie.io.grounding`)
and returned with their boxes, relative to the page (0-1).

`decode` names a decoder of `pipkie.decoding.DECODERS`: `"pip"` (default); `"ar-free"` and
`"ar-forced"` run the model's AR baseline (`Settings.ar_baseline`, or `ar_model=`), loaded when
first asked for; a PIP model without one refuses AR decoding (`NoARBaseline`) rather than decode AR
with PIP weights. A document longer than the context is cut in its middle
(`TemplateBuilder.fit`): `truncated` and `dropped_tokens` say so; a value that filled its whole
budget is `truncated` on its field.

A list of the schema (`keys="company,items[name,quantity,price]"`, `pipkie.model.groups`) is, in
`fields`, a list of items in line order, each {field: Field} (value, confidence, boxes), grounded
item by item (`grounding.ground_items`); `Extraction.lists_truncated` names the lists that used
every item of their budget (maxItems: there may be more lines).

Confidences: a model whose `pipkie.json` has a `confidence_calibration` map (`pipkie calibrate`,
`pipkie.eval.calibration`) reports calibrated confidences, applied here and only here (`_field`,
`_items`), so `pipkie extract`, the service and `explain` agree; AR decodes use the AR baseline's
own map. The map is fitted on values, so a missing field's confidence (that the key is absent)
stays raw. Without a map every confidence is the decoder's, rounded to 4 decimals, as always.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from pipkie.decoding import get_decoder
from pipkie.decoding.abstain import thresholds
from pipkie.decoding.results import FieldResult
from pipkie.eval.calibration import calibrate
from pipkie.io.document import Document, Word, serialize
from pipkie.io.grounding import ground_items, locate
from pipkie.io.loaders import load_document
from pipkie.model.groups import ItemsResult
from pipkie.model.modeling import NoARBaseline, builder_for, default_model_path, load_model, model_for_decode
from pipkie.model.precision import compute_of
from pipkie.schema import KeySchema


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
    truncated: bool = False  # the value filled its whole budget (no end token inside it): maybe cut
    withheld: str | None = None  # the value read, answered unknown below its key's threshold (abstention)
    layout: bool = False  # a list item's field read off a line the decoder skipped, by its neighbours' layout


@dataclass
class Extraction:
    document: str
    fields: dict[str, Field | list[dict[str, Field]]]  # a list of the schema: its items, {field: Field} each
    decode: str
    seconds: float
    truncated: bool = False  # the document did not fit in the context: its middle was dropped
    dropped_tokens: int = 0  # how many document tokens were dropped
    lists_truncated: list[str] = field(default_factory=list)  # lists that filled all their items (maxItems)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.lists_truncated:  # flat results keep their JSON as it was
            d.pop("lists_truncated")
        for f in d["fields"].values():  # and so do fields nothing was withheld from (decoding.abstain)
            for out in [v for item in f for v in item.values()] if isinstance(f, list) else [f]:
                if out.get("withheld") is None:
                    out.pop("withheld", None)
                if not out.get("layout"):
                    out.pop("layout", None)
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)

    def values(self) -> dict[str, str | None | list[dict[str, str | None]]]:
        return {
            k: [{n: x.value for n, x in it.items()} for it in f] if isinstance(f, list) else f.value
            for k, f in self.fields.items()
        }

    def cut_fields(self) -> list[str]:
        """Fields whose value filled its whole budget ("items[2].name" for an item's)."""
        out = []
        for k, f in self.fields.items():
            if isinstance(f, list):
                out += [f"{k}[{i}].{n}" for i, it in enumerate(f) for n, x in it.items() if x.truncated]
            elif f.truncated:
                out.append(k)
        return out


def _confidence(r: FieldResult, cal: dict | None) -> float:
    """What a field reports: its value's confidence under the map `cal` (None: raw), rounded."""
    return round(r.confidence if r.value is None else calibrate(r.confidence, cal), 4)


def _boxes(words: list[Word]) -> list[Box]:
    return [Box(w.page, w.box[0] / 1000, w.box[1] / 1000, w.box[2] / 1000, w.box[3] / 1000, w.text) for w in words]


class Extractor:
    def __init__(
        self,
        model,
        tokenizer,
        settings,
        *,
        threads: int = 1,
        ocr: str = "rapidocr",
        name: str = "",
        ar_model: str | None = None,
    ):
        """`name`: the model's directory (its `ar_baseline` is relative to it); `ar_model`: an AR model
        directory for AR decodes instead of that baseline."""
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.builder = builder_for(tokenizer, settings)
        self.threads, self.ocr, self.name = threads, ocr, name
        self.ar_model = ar_model
        self._ar = None  # (model, builder) of the AR baseline, once loaded
        self._ar_settings = None  # the AR baseline's Settings (its calibration and abstention)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        *,
        threads: int = 1,
        ocr: str = "rapidocr",
        ar_model: str | Path | None = None,
        compute: str | None = None,
    ) -> Extractor:
        """Load a pipkie model directory (default: the shipped model, or $PIPKIE_MODEL); `compute`:
        the layers' precision, auto (default), float32 or bfloat16 (`pipkie.model.precision`; its AR
        baseline too)."""
        torch.set_num_threads(threads)
        path = str(path or default_model_path())
        model, tokenizer, settings = load_model(path, pad_vocab=True, compute=compute)
        return cls(
            model,
            tokenizer,
            settings,
            threads=threads,
            ocr=ocr,
            name=path,
            ar_model=str(ar_model) if ar_model else None,
        )

    def decoder(self, decode: str):
        """(model, builder) that `decode` runs on: this model for PIP (or an AR model's own AR
        decodes), else its AR baseline, loaded on first use. Raises ValueError (NoARBaseline) when
        there is none, or for an unknown decoder."""
        dec = get_decoder(decode)
        if dec.objective == "pip" and self.settings.objective == "ar":
            raise ValueError(
                f"{self.name or 'this model'} is an AR model (objective 'ar'): decode it with ar-free or ar-forced"
            )
        if dec.objective == "pip" or self.settings.objective == "ar":
            return self.model, self.builder
        if self._ar is None:
            if self.ar_model:
                path = self.ar_model
            elif self.settings.ar_baseline and not Path(self.name).is_dir():
                raise NoARBaseline(
                    f"cannot find the AR baseline {self.settings.ar_baseline!r}: the model's "
                    "directory is not known (load it with Extractor.from_pretrained)"
                )
            else:
                path = model_for_decode(self.name or "this model", decode, self.settings)
            model, tok, settings = load_model(path, pad_vocab=True, compute=compute_of(self.model))
            if settings.objective != "ar":
                raise ValueError(f"the AR baseline {path} is not an AR model (objective {settings.objective!r})")
            self._ar = (model, builder_for(tok, settings))
            self._ar_settings = settings
        return self._ar

    def settings_for(self, decode: str):
        """The Settings of the model that `decode` runs on (`decoder`): this model's, or for AR
        decodes of a PIP model its AR baseline's (loaded if it is not yet)."""
        model, _ = self.decoder(decode)
        return self.settings if model is self.model else self._ar_settings

    def calibration(self, decode: str) -> dict | None:
        """The confidence map of the model that `decode` runs on."""
        return self.settings_for(decode).confidence_calibration

    def abstention(self, decode: str) -> dict[str, float]:
        """Per key, the confidence below which the model that `decode` runs on answers unknown."""
        return thresholds(self.settings_for(decode).abstention)

    def schema(self, keys=None, schema=None) -> KeySchema:
        """The keys asked for, else the model's own (`KeySchema.resolve`)."""
        return KeySchema.resolve(keys, schema, default=self.settings.keys)

    def load(self, document, **kw) -> Document:
        if isinstance(document, Document):
            return document
        return load_document(document, ocr=self.ocr, threads=self.threads, **kw)

    def extract(
        self,
        document,
        keys=None,
        *,
        schema=None,
        decode: str = "pip",
        refine_steps: int = 0,
        snap: bool = True,
        abstain: bool = True,
        text: str | None = None,
        trace: list | None = None,
    ) -> Extraction:
        doc = Document(id="text", text=text) if text is not None else self.load(document)
        return self.extract_many(
            [doc],
            keys,
            schema=schema,
            decode=decode,
            refine_steps=refine_steps,
            snap=snap,
            abstain=abstain,
            trace=trace,
        )[0]

    def extract_many(
        self,
        documents: Iterable,
        keys=None,
        *,
        schema=None,
        decode: str = "pip",
        refine_steps: int = 0,
        snap: bool = True,
        abstain: bool = True,
        batch_size: int = 8,
        trace: list | None = None,
    ) -> list[Extraction]:
        """Extract from every document, `batch_size` at a time (one PIP pass per batch). `trace` (a
        list): receives per document the copy head's {key: CopyTrace} (PIP; `pipkie.decoding.pip`).
        `abstain`: apply the model's abstention thresholds (`Settings.abstention`); False answers every
        value the model reads."""
        dec = get_decoder(decode)
        model, builder = self.decoder(decode)
        cal = self.calibration(decode)
        below = self.abstention(decode) if abstain else {}
        ks = self.schema(keys, schema)
        docs = [self.load(d) for d in documents]
        reserved = dec.reserved(builder, ks)  # next to the document: what `TemplateBuilder.fit` keeps free
        out: list[Extraction] = []
        for i in range(0, len(docs), batch_size):
            chunk = docs[i : i + batch_size]
            texts = [serialize(d) for d in chunk]
            t0 = time.perf_counter()
            traced = [] if trace is not None else None
            with torch.inference_mode():
                preds = dec(
                    model,
                    builder,
                    texts,
                    [ks] * len(chunk),
                    pattern=self.settings.pattern,
                    refine_steps=refine_steps,
                    snap=snap,
                    abstain=below,
                    trace=traced,
                )
            if trace is not None:
                trace.extend(traced or [{} for _ in chunk])  # (no copy head, or an AR decoder: nothing traced)
            dt = (time.perf_counter() - t0) / len(chunk)
            for d, t, p in zip(chunk, texts, preds):
                dropped = builder.overflow(t, reserved, answer=dec.objective == "pip")
                fields = {
                    k: self._items(d, r, cal) if isinstance(r, ItemsResult) else self._field(d, r, cal)
                    for k, r in p.items()
                }
                out.append(
                    Extraction(
                        d.id,
                        fields,
                        dec.name,
                        dt,
                        truncated=dropped > 0,
                        dropped_tokens=dropped,
                        lists_truncated=[k for k, r in p.items() if isinstance(r, ItemsResult) and r.truncated],
                    )
                )
        return out

    @staticmethod
    def _field(doc: Document, r: FieldResult, cal: dict | None = None) -> Field:
        """A field with its boxes; its confidence under the map `cal` (`_confidence`)."""
        conf = _confidence(r, cal)
        if r.value is None or not doc.words:
            return Field(r.value, conf, truncated=r.truncated, withheld=r.withheld)
        g = locate(r.value, doc)
        return Field(r.value, conf, _boxes(g.words), g.method, truncated=r.truncated)

    @staticmethod
    def _items(doc: Document, r: ItemsResult, cal: dict | None = None) -> list[dict[str, Field]]:
        """A list's items with their boxes, grounded in line order (`grounding.ground_items`); each
        item field's confidence under the map `cal` (`_confidence`)."""
        found = ground_items(r.value, doc) if doc.words else [{} for _ in r.items]
        return [
            {
                n: Field(
                    x.value,
                    _confidence(x, cal),
                    _boxes(g[n].words) if n in g else [],
                    g[n].method if n in g else "none",
                    truncated=x.truncated,
                    layout=x.layout,
                )
                for n, x in it.items()
            }
            for it, g in zip(r.items, found)
        ]
