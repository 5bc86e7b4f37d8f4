"""Paired bootstrap over documents: is system A better than system B on the same documents?

    r = compare_files("pip.predictions.jsonl", "ar.predictions.jsonl", metric="anls")
    r["overall"]  # {"a": .946, "b": .941, "diff": .005, "lo": -.006, "hi": .017, "p_le_0": .19}

Both files are `pipkie evaluate` predictions files. The documents both scored are resampled with
replacement `samples` times (seeded, so a claim can be re-checked to the digit); each resample is
scored for A and for B *on the same documents*, so that how hard the documents are cancels out of
the difference. The metric is recomputed on each resample as the headline number is computed
(not a mean of per-document numbers): `anls` = Σ field ANLS / number of fields (`anls-nospace`: the
same with whitespace removed from both sides, `pipkie.eval.metrics`), `exact` = micro
exact-match F1 = 2·TP / (predicted values + gold values), `items` = item F1 of each list
(`items[name,quantity,price]`: items matched one to one, `pipkie.eval.metrics.ItemScores`) =
2·TP / (predicted items + gold items). Reported: A's and B's value on all
documents, `diff` = A − B, the percentile interval of the resampled differences (95% by default),
and `p_le_0`, the share of resamples where A − B ≤ 0. An interval that contains 0 means the data
do not show a difference. The same for each key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipkie.eval.metrics import ItemScores, score_field
from pipkie.eval.store import read_predictions

METRICS = ("anls", "anls-nospace", "exact", "items")


def _parts(rows: list[dict], keys: list[str], metric: str, fields: dict | None = None) -> np.ndarray:
    """(documents, keys, parts) additive per-document parts of the metric, per key (`fields`: each
    list's item fields, for `items`)."""
    out = np.zeros((len(rows), len(keys), 2 if metric.startswith("anls") else 3))
    for i, r in enumerate(rows):
        for j, k in enumerate(keys):
            pred, gold = r["pred"].get(k), r["gold"].get(k)
            if metric == "items":
                tp = ItemScores(tuple(fields[k])).add(pred, gold)
                out[i, j] = (tp, len(pred or []), len(gold or []))
                continue
            s = score_field(pred, gold)
            if metric.startswith("anls"):
                out[i, j] = (s.anls if metric == "anls" else s.anls_nospace, 1.0)
            else:
                out[i, j] = (s.tp, s.n_pred, s.n_gold)
    return out


def _statistic(sums: np.ndarray, metric: str) -> np.ndarray:
    """The metric from summed parts (..., parts)."""
    if metric.startswith("anls"):
        return sums[..., 0] / np.maximum(sums[..., 1], 1e-12)
    denominator = sums[..., 1] + sums[..., 2]
    return np.where(denominator > 0, 2 * sums[..., 0] / np.maximum(denominator, 1e-12), 0.0)


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    metric: str = "anls",
    *,
    samples: int = 10000,
    seed: int = 0,
    level: float = 0.95,
    block: int = 500,
) -> list[dict]:
    """Bootstrap of A − B from per-document parts `a`, `b` of shape (documents, groups, parts);
    one result per group (all resamples shared by every group)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if a.shape != b.shape or not len(a):
        raise ValueError("A and B need the same non-empty set of documents")
    if samples < 1:
        raise ValueError("samples must be at least 1")
    rng = np.random.default_rng(seed)
    n = len(a)
    diffs = []
    for start in range(0, samples, block):
        idx = rng.integers(0, n, size=(min(block, samples - start), n))
        diffs.append(_statistic(a[idx].sum(1), metric) - _statistic(b[idx].sum(1), metric))
    d = np.concatenate(diffs)  # (samples, groups)
    sa, sb = _statistic(a.sum(0), metric), _statistic(b.sum(0), metric)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(d, [tail, 100 - tail], axis=0)
    return [
        dict(
            a=float(sa[g]),
            b=float(sb[g]),
            diff=float(sa[g] - sb[g]),
            lo=float(lo[g]),
            hi=float(hi[g]),
            p_le_0=float((d[:, g] <= 0).mean()),
        )
        for g in range(a.shape[1])
    ]


def compare_rows(
    rows_a: list[dict],
    rows_b: list[dict],
    *,
    metric: str = "anls",
    samples: int = 10000,
    seed: int = 0,
    level: float = 0.95,
    keys: list[str] | None = None,
) -> dict:
    """Paired bootstrap of two sets of predictions rows over the documents both scored."""
    by_b = {r["id"]: r for r in rows_b}
    common = [r for r in rows_a if r["id"] in by_b]
    if not common:
        raise ValueError("the two predictions files have no document in common")
    from pipkie.eval.evaluate import list_keys

    lists = list_keys(common + [by_b[r["id"]] for r in common])  # list name -> its items' fields
    if metric == "items":
        keys = keys or list(lists)
    else:  # a list of items has no ANLS of its own: --metric items scores it
        keys = keys or [k for k in common[0]["gold"] if k in by_b[common[0]["id"]]["gold"]]
        if keys and all(k in lists for k in keys):
            raise ValueError(f"{', '.join(keys)}: lists of items; compare them with --metric items")
        keys = [k for k in keys if k not in lists]
    if not keys:
        raise ValueError("the two predictions files have no key in common")
    for r in common:
        other = by_b[r["id"]]
        bad = [k for k in keys if r["gold"].get(k) != other["gold"].get(k)]
        if bad:
            raise ValueError(
                f"document {r['id']}: the files score {bad[0]!r} against different gold values "
                "(different data or key maps): they cannot be compared"
            )
    pa = _parts(common, keys, metric, lists)
    pb = _parts([by_b[r["id"]] for r in common], keys, metric, lists)
    groups = (
        np.concatenate([pa.sum(1, keepdims=True), pa], axis=1),
        np.concatenate([pb.sum(1, keepdims=True), pb], axis=1),
    )
    res = paired_bootstrap(*groups, metric, samples=samples, seed=seed, level=level)
    return dict(
        metric=metric,
        n_docs=len(common),
        only_a=len(rows_a) - len(common),
        only_b=len(by_b) - len(common),
        samples=samples,
        seed=seed,
        level=level,
        keys=keys,
        overall=res[0],
        per_key=dict(zip(keys, res[1:])),
    )


def compare_files(a: str | Path, b: str | Path, **kw) -> dict:
    out = compare_rows(read_predictions(a), read_predictions(b), **kw)
    return dict(out, a_file=str(a), b_file=str(b))


def format_comparison(r: dict) -> str:
    pct = lambda x: f"{100 * x:+.2f}"  # noqa: E731
    head = (
        f"paired bootstrap over {r['n_docs']} documents ({r['samples']} resamples, seed {r['seed']}), "
        f"metric {r['metric']}: A − B with its {100 * r['level']:.0f}% interval"
    )
    lines = [head, f"{'':<12}{'A':>8}{'B':>8}{'A − B':>9}  interval          P(A−B≤0)", "-" * 64]
    for name, x in [("all", r["overall"]), *r["per_key"].items()]:
        lines.append(
            f"{name:<12}{100 * x['a']:>8.2f}{100 * x['b']:>8.2f}{pct(x['diff']):>9}  "
            f"[{pct(x['lo'])}, {pct(x['hi'])}]{x['p_le_0']:>12.3f}"
        )
    if r["only_a"] or r["only_b"]:
        lines.append(f"note: {r['only_a']} document(s) only in A and {r['only_b']} only in B were left out")
    return "\n".join(lines)
