"""Calibration of field confidences: can a user act on them?

Over every predicted (non-missing) value of an evaluation: a value is *right* when it equals the
gold value ignoring whitespace and case (`pipkie.eval.metrics.loose_exact`). Reported:
- `ece`: expected calibration error over `bins` equal-width confidence bins,
  Σ_b (n_b / n) · |accuracy_b − mean confidence_b|;
- `high_share`: the share of predicted values with confidence ≥ `high` (0.9), and `high_exact`:
  how often those are right (what "trust values above 0.9" buys);
- `bins`: per bin its range, count, mean confidence and accuracy (the reliability diagram's data).
A field answered `unknown` has no value to trust, so it is left out (its miss shows in recall).
"""

from __future__ import annotations

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
