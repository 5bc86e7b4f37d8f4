"""Calibration of field confidences: can a user act on them?

Over every predicted (non-missing) value of an evaluation: a value is *right* when it equals the
gold value ignoring whitespace and case (`pipkie.eval.metrics.loose_exact`). Reported:
- `ece`: expected calibration error over `bins` equal-width confidence bins,
  Σ_b (n_b / n) · |accuracy_b − mean confidence_b|;
- `high_share`: the share of predicted values with confidence ≥ `high` (0.9), and `high_exact`:
  how often those are right (what "trust values above 0.9" buys);
- `bins`: per bin its range, count, mean confidence and accuracy (the reliability diagram's data).
A field answered `unknown` has no value to trust, so it is left out (its miss shows in recall).

Recalibration (`fit_calibration`, `calibrate`, `cross_fit`): a map from a field's raw confidence to
one that a user can act on, fitted on labelled predictions (`pipkie calibrate`) and saved with the
model (`Settings.confidence_calibration`), which `Extractor` applies to every field it reports.

The family is **temperature scaling of the log-confidence**, `c' = c ** (1 / T)`. A field's
confidence is the geometric mean of its tokens' probabilities, `c = exp(mean log p)`, so dividing
that mean log-probability by T is exactly temperature scaling (Guo et al., 2017) applied where the
confidence lives: T < 1 lowers every confidence (an over-confident model), T > 1 raises them. It is
one parameter, strictly monotone (the ranking of values, hence every "accept above a threshold"
curve, is unchanged; only where the thresholds sit moves) and keeps 0 and 1 where they are. T is
fitted by minimising the negative log-likelihood of right/wrong under the calibrated confidence;
that likelihood is convex in 1/T, so a golden-section search over log T finds its minimum without
any optimiser library. Platt scaling on log c (`sigmoid(a · log c + b)`) was the two-parameter
alternative; it caps every confidence at sigmoid(b) < 1, so on a model that is wrong even on its
surest values it leaves nothing above a high threshold to act on, and it was not kept.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from pathlib import Path

from pipkie.eval.metrics import loose_exact, values


def calibration_pairs(rows: Iterable[dict], keys: list[str]) -> list[tuple[float, bool]]:
    """(confidence, right) of each predicted value in predictions-file rows (`pred`, `gold`,
    `confidence` per key)."""
    pairs = []
    for r in rows:
        for k in keys:
            pred = r["pred"].get(k)
            if values(pred):
                pairs.append((float(r["confidence"][k]), loose_exact(pred, r["gold"].get(k))))
    return pairs


def calibration(pairs: list[tuple[float, bool]], bins: int = 10, high: float = 0.9) -> dict:
    n = len(pairs)
    table = []
    ece = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [(c, ok) for c, ok in pairs if lo <= c < hi or (b == bins - 1 and c == hi)]
        if inside:
            conf = sum(c for c, _ in inside) / len(inside)
            acc = sum(ok for _, ok in inside) / len(inside)
            ece += len(inside) / n * abs(acc - conf)
        else:
            conf = acc = None
        table.append(dict(lo=lo, hi=hi, n=len(inside), confidence=conf, accuracy=acc))
    top = [ok for c, ok in pairs if c >= high]
    return dict(
        n_values=n,
        ece=ece if n else None,
        accuracy=sum(ok for _, ok in pairs) / n if n else None,
        high=high,
        high_share=len(top) / n if n else None,
        high_exact=sum(top) / len(top) if top else None,
        bins=table,
    )


METHODS = ("temperature",)
# Confidences are stored rounded to 4 decimals: a stored 1.0 stands for anything from 0.99995 up, and
# a wrong value at exactly 1.0 would make the likelihood of every finite temperature infinite.
_TOP = 1 - 5e-5
_BOTTOM = 1e-6


def check_calibration(cal: dict | None) -> dict | None:
    """`cal` when it is a usable map (None: no map); ValueError saying what is wrong otherwise."""
    if cal is None:
        return None
    if not isinstance(cal, dict) or cal.get("method") not in METHODS:
        raise ValueError(f"confidence_calibration: expected {{'method': one of {list(METHODS)}, ...}}, got {cal!r}")
    t = cal.get("T")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"confidence_calibration: T must be a positive number, got {t!r}")
    return cal


def calibrate(confidence: float, cal: dict | None) -> float:
    """The calibrated confidence of a raw one under the map `cal` (None: the raw one, unchanged)."""
    if cal is None:
        return confidence
    return float(confidence) ** (1.0 / cal["T"]) if confidence > 0 else 0.0


def calibrated_pairs(pairs: list[tuple[float, bool]], cal: dict | None) -> list[tuple[float, bool]]:
    return [(calibrate(c, cal), ok) for c, ok in pairs]


def temperature_nll(pairs: list[tuple[float, bool]], t: float) -> float:
    """Mean negative log-likelihood of right/wrong under `c ** (1 / t)`."""
    total = 0.0
    for c, ok in pairs:
        log_p = math.log(min(max(c, _BOTTOM), _TOP)) / t  # log of the calibrated confidence, < 0
        total -= log_p if ok else math.log(-math.expm1(log_p))  # log(1 - p), exact near p = 1
    return total / len(pairs)


def fit_temperature(pairs: list[tuple[float, bool]], lo: float = 1e-2, hi: float = 1e2, tol: float = 1e-6) -> float:
    """The T in [lo, hi] that minimises `temperature_nll`: golden-section search over log T (the
    likelihood is convex in 1/T, so unimodal in log T). ValueError without pairs; all right or all
    wrong has no interior minimum, and T ends at the bound the data push it to."""
    if not pairs:
        raise ValueError("no predicted values to fit a calibration on")
    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = temperature_nll(pairs, math.exp(x1)), temperature_nll(pairs, math.exp(x2))
    while b - a > tol:
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = temperature_nll(pairs, math.exp(x1))
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = temperature_nll(pairs, math.exp(x2))
    return math.exp((a + b) / 2)


def fit_calibration(pairs: list[tuple[float, bool]], fitted_on: str = "") -> dict:
    """The map to save in a model's `confidence_calibration`: method, T, what it was fitted on, and
    how many values (`n`) the fit saw."""
    return dict(method="temperature", T=round(fit_temperature(pairs), 6), fitted_on=fitted_on, n=len(pairs))


def document_folds(ids: Iterable[str], k: int, seed: int = 0) -> list[set[str]]:
    """`ids` dealt into `k` folds of (nearly) equal size, in an order shuffled by `seed` (sorted
    first, so the folds do not depend on the files' row order)."""
    order = sorted(set(ids))
    random.Random(seed).shuffle(order)
    return [set(order[i::k]) for i in range(k)]


def pairs_by_document(rows: Iterable[dict], keys: list[str]) -> dict[str, list[tuple[float, bool]]]:
    """`calibration_pairs` grouped by the rows' document `id` (what cross-fitting splits on)."""
    out: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        out.setdefault(r["id"], []).extend(calibration_pairs([r], keys))
    return out


def cross_fit(by_doc: dict[str, list[tuple[float, bool]]], k: int = 2, seed: int = 0) -> dict:
    """The map judged on documents it was not fitted on: the documents of `by_doc`
    (`pairs_by_document`) split into `k` folds (`document_folds`), a map fitted on all folds but one
    scores that one, and the held-out calibrated values of every fold are pooled. Returns `raw` and
    `calibrated` (`calibration` of the same values before and after), and per fold its documents,
    values and fitted T."""
    if k < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {k}")
    folds = document_folds(by_doc, k, seed)
    if any(not f for f in folds):
        raise ValueError(f"{len(by_doc)} documents cannot make {k} folds")
    raw, held_out, per_fold = [], [], []
    for fold in folds:
        test = [p for d in sorted(fold) for p in by_doc[d]]
        t = fit_temperature([p for d, ps in by_doc.items() if d not in fold for p in ps])
        raw += test
        held_out += calibrated_pairs(test, dict(method="temperature", T=t))
        per_fold.append(dict(docs=len(fold), values=len(test), T=t))
    return dict(k=k, seed=seed, raw=calibration(raw), calibrated=calibration(held_out), folds=per_fold)


def _file_keys(rows: list[dict], keys: list[str] | None) -> list[str]:
    """`keys`, else the gold keys of the first row; lists of items left out (no single confidence)."""
    from pipkie.eval.evaluate import list_keys  # (evaluate imports this module)

    lists = list_keys(rows)
    return [k for k in keys or list(rows[0]["gold"]) if k not in lists]


def calibrate_files(
    fit: list[str | Path],
    *,
    keys: list[str] | None = None,
    score: Iterable[str | Path] = (),
    folds: int = 0,
    seed: int = 0,
) -> dict:
    """`pipkie calibrate`: fit a map on the values of the predictions files `fit` (over `keys`,
    default each file's gold keys) and report, as `calibration` summaries before (`raw`) and after
    (`calibrated`): each fitted file (in-sample: what the map was fitted to), with `folds` ≥ 2 the
    pooled held-out values of cross-fitting over the fitted files' documents (`cross_fit`: the
    honest number), and each `score` file (not fitted on: transfer to other keys or data)."""
    from pipkie.eval.store import read_predictions

    def load(path):
        rows = read_predictions(path)
        if not rows:
            raise ValueError(f"{path}: no predictions")
        return rows, _file_keys(rows, keys)

    fitted = [(Path(p), *load(p)) for p in fit]
    pairs = [x for _, rows, ks in fitted for x in calibration_pairs(rows, ks)]
    cal = fit_calibration(pairs, fitted_on=", ".join(f"{p.name} ({','.join(ks)})" for p, _, ks in fitted))

    def report(name, ks, ps, role):
        return dict(
            file=name, keys=ks, role=role, raw=calibration(ps), calibrated=calibration(calibrated_pairs(ps, cal))
        )

    sets = [report(p.name, ks, calibration_pairs(rows, ks), "fitted on") for p, rows, ks in fitted]
    out = dict(map=cal, sets=sets)
    if folds:
        by_doc: dict[str, list[tuple[float, bool]]] = {}
        for _, rows, ks in fitted:
            for d, ps in pairs_by_document(rows, ks).items():
                by_doc.setdefault(d, []).extend(ps)
        out["cross_fit"] = cross_fit(by_doc, folds, seed)
    for p in score:
        rows, ks = load(p)
        sets.append(report(Path(p).name, ks, calibration_pairs(rows, ks), "scored"))
    return out


def format_calibration(result: dict) -> str:
    """`calibrate_files`' result as a markdown table (raw vs calibrated per set) under the map."""
    m = result["map"]
    lines = [
        f"map: c' = c ** (1 / T), T = {m['T']:.4f}, fitted on {m['n']} values of {m['fitted_on']}",
        "",
        "| set | values | confidences | ECE | share ≥ 0.9 | exact ≥ 0.9 |",
        "|---|---|---|---|---|---|",
    ]

    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}%"

    def rows(name, raw, calibrated):
        for what, c in (("raw", raw), ("calibrated", calibrated)):
            ece = "—" if c["ece"] is None else f"{c['ece']:.3f}"
            lines.append(
                f"| {name} | {c['n_values']} | {what} | {ece} | {pct(c['high_share'])} | {pct(c['high_exact'])} |"
            )

    sets = result["sets"]
    for s in (s for s in sets if s["role"] == "fitted on"):
        rows(f"{s['file']} (fitted on: in-sample)", s["raw"], s["calibrated"])
    if "cross_fit" in result:
        cf = result["cross_fit"]
        ts = ", ".join(f"{f['T']:.4f}" for f in cf["folds"])
        docs = sum(f["docs"] for f in cf["folds"])
        rows(f"held out: {cf['k']}-fold over {docs} documents (seed {cf['seed']}; T {ts})", cf["raw"], cf["calibrated"])
    for s in (s for s in sets if s["role"] == "scored"):
        rows(f"{s['file']} ({','.join(s['keys'])}; not fitted on)", s["raw"], s["calibrated"])
    return "\n".join(lines)


def reliability_diagram(cal: dict, out: str | Path, title: str = "") -> Path:
    """A PNG: accuracy per confidence bin against the diagonal, with each bin's count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 5))
    width = cal["bins"][0]["hi"] - cal["bins"][0]["lo"]
    filled = [b for b in cal["bins"] if b["n"]]
    ax.bar(
        [b["lo"] for b in filled],
        [b["accuracy"] for b in filled],
        width=width,
        align="edge",
        edgecolor="black",
        color="#4c72b0",
        label="exact (space/case-insensitive)",
    )
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    for b in filled:
        ax.text(b["lo"] + width / 2, min(b["accuracy"], 0.93) + 0.02, str(b["n"]), ha="center", fontsize=7)
    ece = f"ECE {cal['ece']:.3f}" if cal["ece"] is not None else "no values"
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="confidence",
        ylabel="share of values right",
        title=f"{title}\n{ece}, {cal['n_values']} values".strip(),
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
