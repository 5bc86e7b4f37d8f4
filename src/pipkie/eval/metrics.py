"""Metrics: ANLS and SROIE-style exact-match precision/recall/F1, overall and per key.

- Normalisation (both metrics): surrounding whitespace trimmed, inner runs of whitespace collapsed
  to one space. ANLS is also case-insensitive (as in DocVQA); exact match is case-sensitive (as in
  SROIE task 3).
- Values are lists. A gold field is the list of its values (`Document.fields[key]`: one for most
  keys, several for a multi-valued key such as Kleister's `party` or WildReceipt's `prod_item`); a
  prediction is split on `" | "`, the separator `Document.value` writes between values in training
  targets. Predicted and gold values are matched one to one (each gold value used at most once),
  the matching that maximises the summed ANLS (`scipy.optimize.linear_sum_assignment`).
- ANLS of one value pair: 1 - Levenshtein(pred, gold) / max(len(pred), len(gold)), set to 0 when
  that normalised distance is ≥ 0.5 (threshold τ = 0.5). ANLS of a field: the matched pairs' sum
  divided by max(number predicted, number of gold values), so a missing or surplus value costs as
  much as a wrong one; a field missing on both sides scores 1, missing on one side 0. For one value
  on each side this is plain ANLS.
- Exact match: micro over values; a predicted value counts when it equals a gold value not already
  matched (the size of the multiset intersection). Precision over non-missing predicted values,
  recall over gold values. A field is `exact` when its predicted and gold values are the same
  non-empty multiset.
- `loose_exact`: the same comparison ignoring all whitespace and case, the notion of "right" used
  for calibration (WildReceipt's transcriptions carry no spaces: `KOREANRESTAURANT`).
- ANLS ignoring whitespace (`anls_nospace`, reported beside ANLS): the same ANLS on values with all
  whitespace removed. An OCR engine that writes `KOREAN RESTAURANT` for WildReceipt's gold
  `KOREANRESTAURANT` read it right; plain ANLS charges the space as an edit. Reported, never the
  headline: datasets whose gold has spaces score (almost) the same under both.
- Line items (lists of objects, `ItemScores`): a document's predicted and gold items are matched
  one to one by the Hungarian method on the similarity of their names (ANLS of the `name` field, or
  of the list's first field when it has none; ties broken towards equal prices; two items that both
  lack a name compare by their prices). A matched pair is a true positive when its name ANLS is ≥
  0.8 (both missing: 1) and, when prices are asked for, its prices are equal (normalised,
  case-sensitive; both missing counts as equal). Precision over predicted items,
  recall over gold items, F1, micro over documents; per field, the mean ANLS over the matched pairs
  (pairs whose names have ANLS > 0).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from rapidfuzz.distance import Levenshtein
from scipy.optimize import linear_sum_assignment

_WS = re.compile(r"\s+")
SEPARATOR = " | "  # between the values of a multi-valued field (pipkie.io.document.Document.value)

Value = str | list[str] | None


def normalize(text: str | None) -> str:
    return _WS.sub(" ", text or "").strip()


def values(value: Value) -> list[str]:
    """A field as its list of normalised, non-empty values: a string is split on `" | "`."""
    items = value if isinstance(value, list) else normalize(value).split(SEPARATOR)
    return [v for v in (normalize(x) for x in items) if v]


def _anls_pair(p: str, g: str, threshold: float) -> float:
    p, g = p.lower(), g.lower()
    nl = Levenshtein.distance(p, g) / max(len(p), len(g))
    return 1.0 - nl if nl < threshold else 0.0


def anls_score(pred: Value, gold: Value, threshold: float = 0.5) -> float:
    """ANLS of one field: values matched one to one, averaged over max(len(pred), len(gold))."""
    ps, gs = values(pred), values(gold)
    if not ps or not gs:
        return float(not ps and not gs)
    if len(ps) == len(gs) == 1:
        return _anls_pair(ps[0], gs[0], threshold)
    sim = np.array([[_anls_pair(p, g, threshold) for g in gs] for p in ps])
    rows, cols = linear_sum_assignment(sim, maximize=True)
    return float(sim[rows, cols].sum()) / max(len(ps), len(gs))


def exact_matches(pred: Value, gold: Value) -> int:
    """Predicted values equal (after normalisation) to a distinct gold value."""
    return sum((Counter(values(pred)) & Counter(values(gold))).values())


def loose_exact(pred: Value, gold: Value) -> bool:
    """The predicted values are the gold values, ignoring whitespace and case (both non-empty)."""
    squash = lambda v: sorted(_WS.sub("", x).casefold() for x in values(v))  # noqa: E731
    p = squash(pred)
    return bool(p) and p == squash(gold)


@dataclass(frozen=True)
class FieldScore:
    """One field's contribution to every metric (what `Scores` sums and the bootstrap resamples)."""

    anls: float
    tp: int  # exact value matches
    n_pred: int  # non-missing predicted values
    n_gold: int  # gold values
    exact: bool  # same non-empty multiset of values
    anls_nospace: float  # ANLS of the values with their whitespace removed


def _no_space(vs: list[str]) -> list[str]:
    return [x for x in (_WS.sub("", v) for v in vs) if x]


def score_field(pred: Value, gold: Value, threshold: float = 0.5) -> FieldScore:
    ps, gs = values(pred), values(gold)
    tp = exact_matches(ps, gs)
    return FieldScore(
        anls_score(ps, gs, threshold),
        tp,
        len(ps),
        len(gs),
        bool(ps) and tp == len(ps) == len(gs),
        anls_score(_no_space(ps), _no_space(gs), threshold),
    )


def prf(tp: float, n_pred: float, n_gold: float) -> dict[str, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return dict(precision=p, recall=r, f1=2 * p * r / (p + r) if p + r else 0.0)


@dataclass
class Scores:
    """Accumulates (prediction, gold) pairs; `summary()` gives overall and per-key numbers."""

    threshold: float = 0.5
    anls_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tp: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_pred: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_gold: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_exact: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    nospace_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, key: str, pred: Value, gold: Value) -> float:
        s = score_field(pred, gold, self.threshold)
        self.anls_sum[key] += s.anls
        self.nospace_sum[key] += s.anls_nospace
        self.count[key] += 1
        self.tp[key] += s.tp
        self.n_pred[key] += s.n_pred
        self.n_gold[key] += s.n_gold
        self.n_exact[key] += s.exact
        return s.anls

    def add_document(self, pred: dict[str, Value], gold: dict[str, Value], keys) -> None:
        for k in keys:
            self.add(k, pred.get(k), gold.get(k))

    def summary(self) -> dict:
        keys = sorted(self.count)
        n = sum(self.count.values())
        out = dict(anls=sum(self.anls_sum.values()) / n if n else 0.0, n_fields=n)
        out["anls_nospace"] = sum(self.nospace_sum.values()) / n if n else 0.0
        out.update(prf(sum(self.tp.values()), sum(self.n_pred.values()), sum(self.n_gold.values())))
        out["per_key"] = {
            k: dict(
                anls=self.anls_sum[k] / self.count[k],
                anls_nospace=self.nospace_sum[k] / self.count[k],
                n=self.count[k],
                exact=self.n_exact[k] / self.count[k],
                **prf(self.tp[k], self.n_pred[k], self.n_gold[k]),
            )
            for k in keys
        }
        return out


ITEM_NAME_ANLS = 0.8  # a matched item counts when its name's ANLS is at least this (and its price is exact)


def match_items(
    pred: list[dict], gold: list[dict], name: str = "name", price: str | None = "price", threshold: float = 0.5
) -> list[tuple[int, int, float]]:
    """(predicted index, gold index, similarity) of the one-to-one matching of items that maximises the
    summed name ANLS (prices equal break ties; two items without a name compare by their prices);
    only pairs of similarity > 0."""
    if not pred or not gold:
        return []

    def similarity(p: dict, g: dict) -> float:
        if not values(p.get(name)) and not values(g.get(name)) and price is not None:
            return anls_score(p.get(price), g.get(price), threshold)  # two nameless lines: by their prices
        return anls_score(p.get(name), g.get(name), threshold)

    sim = np.array([[similarity(p, g) for g in gold] for p in pred])
    tie = np.array([[float(price is not None and _same(p.get(price), g.get(price))) for g in gold] for p in pred])
    rows, cols = linear_sum_assignment(sim + 1e-3 * tie, maximize=True)
    return [(int(r), int(c), float(sim[r, c])) for r, c in zip(rows, cols) if sim[r, c] > 0]


def _same(a, b) -> bool:
    return normalize(a) == normalize(b)


@dataclass
class ItemScores:
    """Accumulates the items of one list over documents (see the module docstring)."""

    fields: tuple[str, ...]
    threshold: float = 0.5
    tp: int = 0
    n_pred: int = 0
    n_gold: int = 0
    n_docs: int = 0
    n_matched: int = 0
    anls_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def name(self) -> str:
        return "name" if "name" in self.fields else self.fields[0]

    def add(self, pred: list[dict] | None, gold: list[dict] | None) -> int:
        """Score one document's items; returns its true positives."""
        pred, gold = list(pred or []), list(gold or [])
        price = "price" if "price" in self.fields else None
        tp = 0
        for i, j, _ in match_items(pred, gold, self.name, price, self.threshold):
            p, g = pred[i], gold[j]
            name_anls = anls_score(p.get(self.name), g.get(self.name), self.threshold)
            tp += name_anls >= ITEM_NAME_ANLS and (price is None or _same(p.get(price), g.get(price)))
            self.n_matched += 1
            for f in self.fields:
                self.anls_sum[f] += anls_score(p.get(f), g.get(f), self.threshold)
        self.tp += tp
        self.n_pred += len(pred)
        self.n_gold += len(gold)
        self.n_docs += 1
        return tp

    def summary(self) -> dict:
        m = self.n_matched
        return dict(
            prf(self.tp, self.n_pred, self.n_gold),
            tp=self.tp,
            n_pred=self.n_pred,
            n_gold=self.n_gold,
            n_docs=self.n_docs,
            n_matched=m,
            per_field={f: (self.anls_sum[f] / m if m else 0.0) for f in self.fields},
        )
