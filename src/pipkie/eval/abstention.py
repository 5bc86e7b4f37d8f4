"""Fitting abstention thresholds: below which confidence should a key answer `unknown`?

    fit = fit_abstention(rows, ["company", "address", "date", "total"])   # {"method", "thresholds", ...}
    r = abstain_files(["wr-dev.predictions.jsonl"], folds=5)              # fitted + cross-fitted gain

A value scored by ANLS earns its ANLS when answered and, answered `unknown`, earns 1 when the key
is absent and 0 when it is not. For each key the threshold t (from `GRID`; 0 = never withhold) is
the one that maximises the key's summed ANLS over labelled predictions when every value of raw
confidence below t is answered `unknown` (`pipkie.decoding.abstain.withhold`); ties go to the lower
threshold, so a key only gets one when it helps. A key's threshold is kept only when it is above 0.

The gain on the very predictions it was fitted on is optimistic, so `cross_fit` also reports it
*cross-fitted*: the documents are split into `folds` (seeded), each fold's values are withheld
under thresholds fitted on the other folds, and the resulting predictions are compared with the
raw ones by the paired bootstrap over documents (`pipkie.eval.compare.compare_rows`). That is the
number that says whether the map will help on documents like these that it has not seen.

Rows are `pipkie evaluate` predictions-file rows (`pred`, `confidence`, `gold` per key). They hold
raw values: evaluation decodes without the model's thresholds and reports their effect beside
(`summarize`'s `abstained`), so a map can always be refitted from them.
"""

from __future__ import annotations

from pathlib import Path

from pipkie.decoding.abstain import METHOD
from pipkie.eval.metrics import anls_score, values

GRID = (0.0, *(round(0.3 + 0.05 * i, 2) for i in range(14)))  # 0, 0.30, 0.35, ..., 0.95


def _withheld(row: dict, key: str, t: float) -> bool:
    """The row answers `key` with a value of raw confidence below `t`."""
    return bool(values(row["pred"].get(key))) and float(row["confidence"].get(key, 1.0)) < t


def withhold_rows(rows: list[dict], thresholds: dict[str, float]) -> list[dict]:
    """Rows with each value whose confidence is below its key's threshold answered `unknown`."""
    out = []
    for r in rows:
        pred = dict(r["pred"])
        for k, t in thresholds.items():
            if _withheld(r, k, t):
                pred[k] = None
        out.append({**r, "pred": pred})
    return out


def _gain(rows: list[dict], key: str, t: float) -> float:
    """Summed ANLS of `key` over `rows` with values below `t` withheld."""
    return sum(anls_score(None if _withheld(r, key, t) else r["pred"].get(key), r["gold"].get(key)) for r in rows)


def fit_thresholds(rows: list[dict], keys: list[str]) -> dict[str, float]:
    """Per key, the `GRID` threshold that maximises its ANLS on `rows` (only those above 0)."""
    if not rows:
        raise ValueError("no predictions to fit abstention thresholds on")
    best = {k: max(GRID, key=lambda t, k=k: (round(_gain(rows, k, t), 9), -t)) for k in keys}
    return {k: t for k, t in best.items() if t > 0}


def fit_abstention(rows: list[dict], keys: list[str], *, fitted_on: str = "") -> dict:
    """A `Settings.abstention` map fitted on `rows`."""
    return dict(method=METHOD, thresholds=fit_thresholds(rows, keys), fitted_on=fitted_on, n=len(rows))


def cross_fit(rows: list[dict], keys: list[str], *, folds: int = 5, seed: int = 0) -> list[dict]:
    """Rows whose values are withheld under thresholds fitted on the other folds (module docstring;
    folds by document id, as calibration's: `pipkie.eval.calibration.document_folds`)."""
    from pipkie.eval.calibration import document_folds

    if folds < 2 or folds > len(rows):
        raise ValueError(f"{len(rows)} documents cannot make {folds} folds (cross-fitting needs 2 or more)")
    out = []
    for fold in document_folds((r["id"] for r in rows), folds, seed):
        train = [r for r in rows if r["id"] not in fold]
        out += withhold_rows([r for r in rows if r["id"] in fold], fit_thresholds(train, keys))
    return out


def _flat(gold) -> bool:
    """A flat key's gold (None or a list of strings), not a list of items (dicts)."""
    return gold is None or all(isinstance(v, str) for v in gold)


def abstain_files(
    predictions: list[str | Path], keys: list[str] | None = None, *, folds: int = 5, seed: int = 0
) -> dict:
    """Fit on the rows of `predictions` (one or more predictions files, their documents pooled) and
    report the fitted map, the gain on those rows, and the cross-fitted gain with its interval."""
    from pipkie.eval.compare import compare_rows
    from pipkie.eval.store import read_predictions

    rows = [r for p in predictions for r in read_predictions(p)]
    if not rows:
        raise ValueError(f"{', '.join(map(str, predictions))}: no predictions")
    keys = keys or sorted({k for r in rows for k, v in r["gold"].items() if _flat(v)})
    fit = fit_abstention(rows, keys, fitted_on=", ".join(f"{Path(p).name} ({','.join(keys)})" for p in predictions))
    fitted = compare_rows(withhold_rows(rows, fit["thresholds"]), rows)
    crossed = compare_rows(cross_fit(rows, keys, folds=folds, seed=seed), rows)
    return dict(map=fit, keys=keys, fitted=fitted, cross_fitted=crossed, folds=folds, seed=seed)


def format_abstention(result: dict) -> str:
    ts = result["map"]["thresholds"]
    fitted, crossed = result["fitted"]["overall"], result["cross_fitted"]["overall"]
    lines = [
        f"abstention fitted on {result['map']['n']} documents: "
        + (", ".join(f"{k} below {t:.2f}" for k, t in ts.items()) if ts else "no key gains from a threshold"),
        f"ANLS {100 * fitted['b']:.1f} -> {100 * fitted['a']:.1f} on the documents it was fitted on "
        f"({100 * fitted['diff']:+.1f})",
        f"cross-fitted ({result['folds']} folds, seed {result['seed']}): {100 * crossed['diff']:+.1f} "
        f"[{100 * crossed['lo']:+.1f}, {100 * crossed['hi']:+.1f}] (paired bootstrap over documents)",
    ]
    return "\n".join(lines)
