"""Metrics: ANLS and SROIE-style exact-match precision/recall/F1, overall and per key.

- Normalisation (both metrics): surrounding whitespace trimmed, inner runs of whitespace collapsed
  to one space. ANLS is also case-insensitive (as in DocVQA); exact match is case-sensitive (as in
  SROIE task 3).
- ANLS of one field: 1 - Levenshtein(pred, gold) / max(len(pred), len(gold)), set to 0 when that
  normalised distance is ≥ 0.5 (threshold τ = 0.5); a field missing on both sides scores 1, missing
  on one side 0. With several gold values (multi-valued keys) the best match counts.
- Exact match: micro over fields; a prediction counts when it equals a gold value. Precision over
  non-missing predictions, recall over non-missing gold values.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from rapidfuzz.distance import Levenshtein

_WS = re.compile(r"\s+")


def normalize(text: str | None) -> str:
    return _WS.sub(" ", text or "").strip()


def anls_score(pred: str | None, gold: str | list[str] | None, threshold: float = 0.5) -> float:
    golds = [g for g in (gold if isinstance(gold, list) else [gold]) if normalize(g)]
    p = normalize(pred).lower()
    if not golds:
        return 1.0 if not p else 0.0
    if not p:
        return 0.0
    best = 0.0
    for g in golds:
        g = normalize(g).lower()
        nl = Levenshtein.distance(p, g) / max(len(p), len(g))
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


@dataclass
class Scores:
    """Accumulates (prediction, gold) pairs; `summary()` gives overall and per-key numbers."""

    threshold: float = 0.5
    anls_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tp: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_pred: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_gold: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, key: str, pred: str | None, gold: str | list[str] | None) -> float:
        s = anls_score(pred, gold, self.threshold)
        self.anls_sum[key] += s
        self.count[key] += 1
        golds = [normalize(g) for g in (gold if isinstance(gold, list) else [gold]) if normalize(g)]
        p = normalize(pred)
        self.n_pred[key] += bool(p)
        self.n_gold[key] += bool(golds)
        self.tp[key] += bool(p) and p in golds
        return s

    def add_document(self, pred: dict[str, str | None], gold: dict[str, str | list[str] | None], keys) -> None:
        for k in keys:
            self.add(k, pred.get(k), gold.get(k))

    @staticmethod
    def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
        p = tp / n_pred if n_pred else 0.0
        r = tp / n_gold if n_gold else 0.0
        return dict(precision=p, recall=r, f1=2 * p * r / (p + r) if p + r else 0.0)

    def summary(self) -> dict:
        keys = sorted(self.count)
        n = sum(self.count.values())
        out = dict(anls=sum(self.anls_sum.values()) / n if n else 0.0, n_fields=n)
        out.update(self._prf(sum(self.tp.values()), sum(self.n_pred.values()), sum(self.n_gold.values())))
        out["per_key"] = {
            k: dict(anls=self.anls_sum[k] / self.count[k], n=self.count[k],
                    exact=self.tp[k] / self.count[k], **self._prf(self.tp[k], self.n_pred[k], self.n_gold[k]))
            for k in keys
        }
        return out
