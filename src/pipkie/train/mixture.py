"""A training mixture: documents drawn from several sources by weight, each made into instances.

    mixture = Mixture.from_config(cfg.mixture, seed=cfg.seed)
    source, doc = mixture.draw(rng)

A source (one entry of `TrainConfig.mixture`) is a dict:

    {"source": "dataset", "name": "sroie", "data_dir": "../shared/data/sroie", "split": "train_nodev", "weight": 0.2}
    {"source": "world_receipts", "n": 20000, "weight": 0.4}        # pipkie.data.receipts
    {"source": "invoices", "n": 4000, "weight": 0.1}
    {"source": "forms", "n": 4000, "weight": 0.05}                 # pipkie.data.synthetic
    {"source": "receipts_my", "n": 4000, "weight": 0.05}           # SROIE-like synthetic receipts
    {"source": "self", "name": "words", "data_dir": "runs/ocr/wildreceipt_unlabeled", "weight": 0.1}

Every source except `self` is key/value supervised (its documents' fields, under varied key names:
`pipkie.train.keys`); `self` sources are unlabelled text, made into span-copy templates (a few
words of the document as the key, the words that follow as the value), which teach "find this
place and copy what follows" on real OCR output. `absent_pool` lists the keys a source's documents
may lack (answered `unknown`). Optional per source: `variation` (key renaming probability),
`ask_missing` (how often a key of `absent_pool` the document lacks is asked, relative to a present
key: `pipkie.train.keys.sample_schemas`; default 0), `always_ask` (keys asked in every template of a
document that has them; default none, which changes no draw), `first_line_keys` (keys taught only on
documents whose value starts on the first line: a data set that labels them by another convention, such as
SROIE's registered company name under a brand or a `TAX INVOICE` header, where a user asks for the name
printed on top; default none; round 33 tried it on SROIE's company: docs/RESULTS.md "Rounds 32 and 33"),
`erase` (the share of its documents drawn with one field's words taken out and that key asked,
answered `unknown`: `pipkie.train.erase`; default 0, which changes no draw),
`limit`, `noise` (OCR character noise for generated sources), `rules` (the share of a generated
source's documents printed with dashed rule lines: `pipkie.data.layout.lay_out`; default 1),
`items` (the share of its templates that ask for the line items of documents that have them,
`items[name, quantity, price]`-style lists: `pipkie.model.groups`; default `TrainConfig.items`, 0).
With no share of items, no draw changes: a mixture trains on exactly the batches it did before
lists existed.

Synthetic documents are generated lazily and cached by index (document i depends only on the seed
and i), so a run of any length draws from the same fixed set. Test splits are refused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pipkie.data.generated import GENERATED, generate
from pipkie.io.document import Document, serialize
from pipkie.train.erase import maybe_erase
from pipkie.train.keys import document_items, sample_item_schema, sample_schemas

OPTIONS = {  # what a mixture entry may say (the module docstring)
    "source", "weight", "name", "data_dir", "split", "limit", "n",
    "absent_pool", "variation", "ask_missing", "always_ask", "first_line_keys", "noise", "items", "erase",
    "rules",
}  # fmt: skip


@dataclass
class Source:
    kind: str  # "dataset" | "self" | one of GENERATED
    weight: float
    options: dict = field(default_factory=dict)
    docs: list[Document] | None = None  # a dataset's documents (None for generated sources)
    n: int = 0
    cache: dict[int, Document] = field(default_factory=dict)

    @property
    def supervised(self) -> bool:
        return self.kind != "self"

    def get(self, i: int, seed: int) -> Document:
        if self.docs is not None:
            return self.docs[i]
        if i not in self.cache:  # document i depends only on (seed, i): generate just that one
            noise, rules = float(self.options.get("noise", 0.0)), float(self.options.get("rules", 1.0))
            self.cache[i] = generate(self.kind, i, seed, noise, rules)
        return self.cache[i]


class Mixture:
    def __init__(self, sources: list[Source], seed: int = 0):
        if not sources:
            raise ValueError("the mixture has no sources")
        self.sources, self.seed = sources, seed
        total = sum(s.weight for s in sources)
        if total <= 0:
            raise ValueError("mixture weights must add up to more than 0")
        self.cum = []
        acc = 0.0
        for s in sources:
            acc += s.weight / total
            self.cum.append(acc)

    @classmethod
    def from_config(cls, entries: list[dict], seed: int = 0) -> Mixture:
        from pipkie.data import read_dataset

        sources = []
        for e in entries:
            unknown = set(e) - OPTIONS
            if unknown:  # a misspelt option would otherwise be ignored without a word
                raise ValueError(f"unknown mixture option(s) {sorted(unknown)}: known are {', '.join(sorted(OPTIONS))}")
            e = dict(e)
            kind, weight = e.pop("source", None), float(e.pop("weight", 1.0))
            if kind in ("dataset", "self"):
                split = e.get("split", "train")
                if "test" in split:
                    raise ValueError(f"refusing to train on a test split ({e.get('name')}:{split})")
                docs = list(read_dataset(e["name"], e["data_dir"], split, limit=e.get("limit")))
                if kind == "self":
                    docs = [d for d in docs if len(serialize(d).split()) >= 8]
                if not docs:
                    raise ValueError(f"mixture source {e.get('name')}:{split} has no documents")
                sources.append(Source(kind, weight, e, docs, len(docs)))
            elif kind in GENERATED:
                sources.append(Source(kind, weight, e, None, int(e.get("n", 1000))))
            else:
                raise ValueError(f"unknown mixture source {kind!r}: dataset, self or one of {', '.join(GENERATED)}")
        return cls(sources, seed)

    def draw(self, rng: random.Random) -> tuple[Source, Document]:
        u = rng.random()
        s = next((s for s, c in zip(self.sources, self.cum) if u <= c), self.sources[-1])
        return s, s.get(rng.randrange(s.n), self.seed + 1)

    def draw_document(self, rng: random.Random) -> tuple[Source, Document, str | None]:
        """`draw` + the source's `erase` share: (source, document, the erased key or None)."""
        source, doc = self.draw(rng)
        doc, erased = maybe_erase(doc, rng, float(source.options.get("erase", 0.0)))
        return source, doc, erased


def item_share(source: Source, default: float = 0.0) -> float:
    """The share of a source's templates that ask for line items (its `items` option, else `default`)."""
    return float(source.options.get("items", default)) if source.supervised else 0.0


def templates(
    source: Source,
    doc: Document,
    rng: random.Random,
    n: int,
    *,
    value_len,
    key_dropout: float,
    absent: float,
    variation: float = 0.5,
    describe: float = 0.2,
    items: float = 0.0,
    item_room: int | None = None,
    erased: str | None = None,
    item_budgets: dict[str, int] | None = None,
    item_slots: int = 0,
):
    """n (schema, values) answer templates for one drawn document (see the module docstring).
    `items`: the default share of item templates (`item_share`); `item_room`: template tokens that fit
    next to this document (needed when the share is above 0 and the document has items); `erased`:
    the key whose value was taken out of the document (`draw_document`), asked as a present key is
    and answered `unknown` (such a document gets flat templates only); `item_budgets`: a list field's
    base slots by canonical field and `item_slots` a span field's slots (`keys.sample_item_schema`)."""
    if source.supervised:
        fields = {k: doc.value(k) for k in doc.fields if not k.startswith("items.")}
        for k in source.options.get("first_line_keys", ()):
            if fields.get(k) and not starts_on_first_line(doc, fields[k]):
                del fields[k]
        kw = dict(
            absent_pool=tuple(source.options.get("absent_pool", ())),
            variation=float(source.options.get("variation", variation)),
            ask_missing=float(source.options.get("ask_missing", 0.0)),
            always_ask=tuple(source.options.get("always_ask", ())),
            describe=describe,
            key_dropout=key_dropout,
            absent=absent,
            value_len=value_len,
        )
        share = item_share(source, items)
        lines = document_items(doc) if share > 0 else []
        if not lines or erased:  # the only path without a share of items: the draws of the flat templates alone
            return sample_schemas(fields, rng, n, erased=(erased,) if erased else (), **kw)
        if item_room is None:
            raise ValueError("item templates need item_room (the template tokens that fit next to the document)")
        return [
            sample_item_schema(
                fields, lines, rng, room=item_room, base_budgets=item_budgets, item_slots=item_slots, **kw
            )
            if rng.random() < share
            else sample_schemas(fields, rng, 1, **kw)[0]
            for _ in range(n)
        ]
    return span_templates(doc, rng, n, value_len=value_len)


def starts_on_first_line(doc: Document, value: str) -> bool:
    """Whether the value's first word is on the document's first line (as serialized for the model)."""
    return value.split()[0] in serialize(doc).split("\n", 1)[0]


def span_templates(doc: Document, rng: random.Random, n: int, *, value_len, spans: int = 3):
    """Self-supervised templates: key = 1-4 words of a line, value = the 1-6 words after them."""
    import re

    from pipkie.schema import Key, KeySchema, SchemaError

    words = serialize(doc).split()
    out = []
    for _ in range(n):
        keys, values = [], {}
        for _ in range(spans):
            i = rng.randrange(1, max(2, len(words) - 1))
            k = rng.randint(1, 4)
            name = re.sub(r"[^A-Za-z0-9_.\- ]", " ", " ".join(words[max(0, i - k) : i]))
            name = " ".join(name.split())[:40]
            value = " ".join(words[i : i + rng.randint(1, 6)])
            if not name or name.lower() in {x.name.lower() for x in keys}:
                continue
            try:
                keys.append(Key(name, None, min(64, value_len(value) + 1 + rng.choice((0, 2, 8)))))
            except SchemaError:
                continue
            values[name] = value
        if keys:
            out.append((KeySchema(tuple(keys)), values))
    return out
